"""Rerun one seed's four-teacher distillation (S5) from a finished default run's experts with other settings, to see
what stops it short of its experts (docs/LOG.md, "Why the four-teacher distillation stopped short").

    python scripts/distill_probe.py NAME --steps 240 [--lr 2e-4] [--domains ifeval] [--results results] [--seed 0]

Writes /tmp/distill_probe/NAME (a normal run directory: evals.jsonl, ledger.jsonl with the per-step reverse KL).
``--domains`` keeps only those domains' teachers and prompts (one teacher, every prompt of a step from its domain).
"""

from __future__ import annotations

import argparse
import copy
import shutil
from pathlib import Path

from opdgrpo.config import compose
from opdgrpo.plan.build import build_plan
from opdgrpo.train.loop import train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--lr", type=float, default=None, help="default: the profile's methods.opd.lr")
    ap.add_argument("--domains", default=None, help="e.g. ifeval or math+code; default: all four")
    ap.add_argument("--results", default="results", help="the results_dir of the finished run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    plan = build_plan(compose(["profile=tiny", f"results_dir={args.results}"]))
    job = f"opd-experts-math+code+ifeval+knowledge-s{args.seed}"
    cfg = copy.deepcopy(plan.jobs[job].config)
    for teacher in cfg["teachers"].values():
        if not Path(teacher["path"]).is_dir():
            raise SystemExit(f"{teacher['path']}: no expert checkpoint; run the default DAG into {args.results} first")
    cfg["method"]["steps"] = args.steps
    if args.lr is not None:
        cfg["method"]["lr"] = args.lr
    cfg["train"]["eval_every"] = max(20, args.steps // 6)
    if args.domains:
        keep = args.domains.split("+")
        cfg["train_domains"], cfg["teachers"] = keep, {d: cfg["teachers"][d] for d in keep}
    out = Path("/tmp/distill_probe") / args.name
    shutil.rmtree(out, ignore_errors=True)
    train(cfg, out)


if __name__ == "__main__":
    main()
