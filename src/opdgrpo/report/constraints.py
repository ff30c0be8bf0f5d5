"""``constraints.md``: instruction following's pass rate per constraint kind (IFEval's instruction level), at each
run's first and last evaluation. The reward and ``curves.csv`` count a prompt as solved only when every constraint
holds (IFEval's prompt level); this table shows which constraints a method learned or lost on the way."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opdgrpo.report.curves import read_jsonl


def _rates_by_step(evals: Path) -> dict[int, dict[str, dict[str, float]]]:
    """step -> eval set -> constraint kind -> pass rate, for every evaluation step (empty where none is logged)."""
    out: dict[int, dict[str, dict[str, float]]] = {}
    for _, record in read_jsonl(evals):
        out.setdefault(int(record["step"]), {})
        for res in record.get("results", []):
            if isinstance(res, dict) and isinstance(res.get("constraint_rates"), dict):
                out.setdefault(int(record["step"]), {})[str(res["eval_set"])] = res["constraint_rates"]
    return out


def constraints_markdown(spec: Mapping[str, Any], runs_dir: Path) -> str:
    profile = spec.get("profile", "unknown")
    lines = [f"# Instruction following per constraint kind (profile `{profile}`)", "",
             "Pass rate of each constraint kind over the held-out prompts that carry it, at the run's first "
             "evaluation -> its last (avg@k samples). Measured from this run's `evals.jsonl` files.", ""]
    rows: list[tuple[str, str, dict[str, float], dict[str, float]]] = []
    for entry in spec.get("runs", []):
        evals = Path(runs_dir) / str(entry["run"]) / "evals.jsonl"
        if not evals.is_file():
            continue
        by_step = _rates_by_step(evals)
        if not by_step:
            continue
        first, last = by_step[min(by_step)], by_step[max(by_step)]  # a set missing at either end gets no row
        for eval_set in sorted(set(first) & set(last)):
            rows.append((str(entry.get("label", entry["run"])) + f" ({entry['run']})", eval_set, first[eval_set], last[eval_set]))
    if not rows:
        return "\n".join(lines + ["No run evaluates a domain with constraint kinds.", ""])
    kinds = sorted({k for _, _, a, b in rows for k in (*a, *b)})
    lines += ["| run | set | " + " | ".join(kinds) + " |", "|---|---|" + "---|" * len(kinds)]
    for run, eval_set, a, b in rows:
        cells = [f"{100 * a[k]:.0f} -> {100 * b[k]:.0f}%" if k in a and k in b else "n/a" for k in kinds]
        lines.append(f"| {run} | {eval_set} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [""])
