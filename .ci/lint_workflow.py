"""`snakemake --lint` on the repository's workflow, failing on any lint but the known false positives below.

Snakemake 9.27 prints lints as text only (`--lint json` is ignored by its CLI) and exits 1 whenever it prints one,
so this reads the text: "Lints for rule <name> (...):" headers, then "    * <title>:" lines. Run from the
repository root: `python .ci/lint_workflow.py`.
"""

from __future__ import annotations

import re
import subprocess
import sys

#: (rule name pattern, lint title pattern) -> why the lint does not apply here.
ALLOWED = {
    (r".*", r"Specify a conda environment or container for each rule\."):
        "the jobs run this repository's package (pip install -e .) with the interpreter that runs Snakemake "
        "(OPDGRPO in workflow/rules/common.smk); there is no per-rule software environment to declare",
    (r"tokenizer|model_tokenizer|pretrain|difficulty|grpo|opd|report",
     r"Shell command directly uses variable (OPDGRPO|PYTHON|LAUNCH_CMD) from outside of the rule"):
        "OPDGRPO, PYTHON and LAUNCH_CMD are how a job is started (this interpreter's path, `-m opdgrpo.cli`, "
        "torchrun), not parameters of the computation: as params they would enter Snakemake's params rerun trigger, "
        "and spelled into the shell text its code trigger, and rerun every job whenever the venv moves",
    (r"tokenizer|report", r"Param (out|runs) is a prefix of input or output file but hardcoded"):
        "run directories hold files no rule declares (checkpoints, ledgers), so the workflow needs the shared "
        "filesystem Snakemake assumes anyway; and a param derived from input/output leaves the params rerun "
        "trigger, which would rerun these jobs (and everything after them) in every existing results directory",
}


def lints(text: str) -> list[tuple[str, str]]:
    found, rule = [], None
    for line in text.splitlines():
        header = re.match(r"Lints for (?:rule (\S+) \(.*|snakefile (.+)):$", line)
        if header:
            rule = header.group(1) or f"snakefile {header.group(2)}"
            continue
        item = re.match(r"    \* (.+?):?$", line)
        if item and rule is not None:
            found.append((rule, item.group(1)))
    return found


def main() -> int:
    done = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], capture_output=True, text=True)
    text = done.stdout + done.stderr
    found = lints(text)
    if done.returncode != 0 and not found:
        print(text, file=sys.stderr)
        print("snakemake --lint failed without printing lints (see above)", file=sys.stderr)
        return 1
    unexpected = [(rule, title) for rule, title in found
                  if not any(re.fullmatch(r, rule) and re.fullmatch(t, title) for r, t in ALLOWED)]
    for rule, title in unexpected:
        print(f"snakemake --lint: rule {rule}: {title}", file=sys.stderr)
    if unexpected:
        print(text, file=sys.stderr)
        return 1
    print(f"snakemake --lint: {len(found)} known false positives (.ci/lint_workflow.py says why), nothing else")
    return 0


if __name__ == "__main__":
    sys.exit(main())
