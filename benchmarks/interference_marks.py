"""Domain interference, measured: on the shared-form held-out prompts, which domain's marks each policy opens with.

For a results root of runs on domains with ``interference`` > 0 (docs/method.md, "Domain interference"), samples
``--k`` answers per shared-form held-out prompt from the base student and from every run's final checkpoint and
prints, per domain, the accuracy and the share of answers that open with each domain's marks (a domain without
interference is named by its pair; ``bare/other``: none).
A joint run that opens one domain's prompts with another domain's marks shows the conflict the knob builds in; an
expert that opens every shared prompt with its own marks has learnt the prefix, not the domain.

    python benchmarks/interference_marks.py results/tiny            # every run with a checkpoint
    python benchmarks/interference_marks.py results/tiny grpo-student-math+code-s0 --k 8
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import torch
import yaml

from opdgrpo.domains import build_domain
from opdgrpo.domains.base import SHARED_WRAPS, is_shared
from opdgrpo.train.rollout import sample_and_score


def _checkpoints(root: Path, runs: list[str]) -> dict[str, Path]:
    found = {"base": root / "base" / "student" / "checkpoint"}
    names = runs or sorted(p.name for p in (root / "runs").iterdir() if (p / "checkpoint").is_dir())
    return found | {name: root / "runs" / name / "checkpoint" for name in names}


def _domains(runs: dict[str, Path]):
    """The domains with interference > 0 in any of the runs' resolved configs."""
    blocks = {}
    for name, path in runs.items():
        if name != "base":
            blocks |= yaml.safe_load((path.parent / "config.yaml").read_text())["domains"]
    domains = {n: build_domain(d) for n, d in sorted(blocks.items()) if float(d.get("interference") or 0) > 0}
    if not domains:
        raise SystemExit("no run's config has a domain with interference > 0")
    return domains


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="results/<profile> with base/student and runs/")
    parser.add_argument("runs", nargs="*", help="run ids (default: every run with a checkpoint)")
    parser.add_argument("--k", type=int, default=4, help="answers per prompt")
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoints = _checkpoints(args.root, args.runs)
    domains = _domains(checkpoints)
    tasks = [t for d in domains.values() for ts in d.heldout_sets().values() for t in ts if is_shared(t)]
    marks = {d.SHARED_WRAP[0]: name for name, d in domains.items()} | {
        w[0]: w for w in SHARED_WRAPS if w[0] not in {d.SHARED_WRAP[0] for d in domains.values()}}
    rows = [t for t in tasks for _ in range(args.k)]
    print(f"| run | domain | shared prompts | accuracy | opening marks ({args.k} samples each, T={args.temperature}) |")
    print("|---|---|---|---|---|")
    for run, path in checkpoints.items():
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        with torch.no_grad():
            out = sample_and_score(model, tokenizer, domains, rows, max_new_tokens=32, temperature=args.temperature,
                                   generator=torch.Generator().manual_seed(0))
        for name in domains:
            mine = [i for i, t in enumerate(rows) if t.domain == name]
            opened = Counter(marks.get(out.texts[i].strip()[:1], "bare/other") for i in mine)
            accuracy = sum(float(out.rewards[i]) for i in mine) / len(mine)
            shares = ", ".join(f"{k} {v / len(mine):.2f}" for k, v in sorted(opened.items()))
            print(f"| {run} | {name} | {len(mine) // args.k} | {accuracy:.3f} | {shares} |")


if __name__ == "__main__":
    main()
