"""``opdgrpo flops``: the cost model's command line (estimate, calibrate, solve). Apart from :mod:`opdgrpo.cost.model`, so the
model and its solver (:mod:`opdgrpo.cost.solve`, which builds on it) import one way, and only the command line composes
configs and plans."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from opdgrpo.config import ConfigError
from opdgrpo.cost.model import (
    UNITS,
    _num,
    assumptions,
    calibrate,
    estimate_plan,
    read_measured,
    runs_table,
    studies_table,
    study_totals,
    write_csv,
    write_studies_csv,
)


def cmd_estimate(args) -> int:
    from opdgrpo.config import compose
    from opdgrpo.plan.build import build_plan

    overrides = ([f"profile={args.profile}"] if args.profile else []) + list(args.overrides)
    cfg = compose(overrides, args.conf_dir)
    plan = build_plan(cfg)
    estimates = estimate_plan(cfg, plan)
    if args.measured:
        for e in estimates:
            m = read_measured(plan.jobs[e.run].out_dir)
            m.pop("records", None)
            e.measured = m
    rows = study_totals(plan.report_spec, estimates)
    ledger = None
    if args.measured:   # finished runs only: a partial ledger is not the run's cost
        ledger = study_totals(plan.report_spec, estimates,
                              {e.run: e.measured["total"] for e in estimates if e.measured.get("steps") == e.steps})
    total = sum(e.total for e in estimates)
    print(f"# Predicted training FLOPs: profile `{cfg['profile']}`, {len(estimates)} runs, "
          f"{_num(total / UNITS[args.unit])} {args.unit} in all\n")
    print(assumptions(cfg) + "\n")
    print("## Runs\n")
    print(runs_table(estimates, args.unit) + "\n")
    print("## Studies\n")
    print(studies_table(rows, args.unit, ledger))
    if args.csv:
        write_csv(args.csv, estimates)
    if args.studies_csv:
        write_studies_csv(args.studies_csv, rows)
    return 0


def cmd_calibrate(args) -> int:
    import yaml

    from opdgrpo.config import compose
    from opdgrpo.plan.build import build_plan

    overrides = ([f"profile={args.profile}"] if args.profile else []) + list(args.overrides)
    cfg = compose(overrides, args.conf_dir)
    plan = build_plan(cfg)
    block = calibrate(plan)
    if not block.get("per_domain"):
        print(f"error: no finished single-domain GRPO run of the student under {plan.root}/runs to measure", file=sys.stderr)
        return 1
    print(f"# measured from the ledgers under {plan.root}/runs (student's single-domain GRPO runs); top level: "
          f"mean over domains")
    print(yaml.safe_dump({"cost_model": block}, sort_keys=False), end="")
    return 0


def cmd_solve(args) -> int:
    from opdgrpo.cost.solve import paper_analysis, solve_steps, steps_table

    if args.profile:
        from opdgrpo.config import compose
        from opdgrpo.plan.build import build_plan

        cfg = compose([f"profile={args.profile}", *args.overrides], args.conf_dir)
        print(f"# Steps that buy the paper's budgets: profile `{cfg['profile']}`\n\n{assumptions(cfg)}\n")
        print(steps_table(*solve_steps(cfg, build_plan(cfg))))
        return 0
    print(paper_analysis(prompt_tokens=args.prompt_tokens, response_tokens=args.response_tokens,
                         sequences_per_step=args.sequences_per_step))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="opdgrpo flops", description="Predict training FLOPs before anything runs.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("estimate", help="predicted FLOPs of every planned run and the studies' totals (markdown)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. cost_model.response_tokens=12 train.max_new_tokens=64")
    p.add_argument("--profile", help="the profile (same as the override profile=P)")
    p.add_argument("--conf-dir", type=Path, default=None)
    p.add_argument("--unit", choices=list(UNITS), default="EFLOP")
    p.add_argument("--csv", type=Path, help="also write one row per run (FLOPs unscaled) to this CSV")
    p.add_argument("--studies-csv", type=Path, help="also write the studies' totals to this CSV")
    p.add_argument("--measured", action="store_true",
                   help="add the ledger's cumulative FLOPs of runs already in results_dir, and prediction / ledger")
    p.set_defaults(func=cmd_estimate)
    p = sub.add_parser("calibrate", help="print a cost_model block measured from finished single-domain GRPO runs' ledgers")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. results_dir=/data/results")
    p.add_argument("--profile", help="the profile (same as the override profile=P)")
    p.add_argument("--conf-dir", type=Path, default=None)
    p.set_defaults(func=cmd_calibrate)
    p = sub.add_parser("solve", help="what settings reproduce the paper's EFLOP figures with the Qwen3 architectures")
    p.add_argument("--prompt-tokens", type=float, default=256)
    p.add_argument("--response-tokens", type=float, default=4096, help="generated tokens per sequence")
    p.add_argument("--sequences-per-step", type=int, default=512)
    p.add_argument("--profile", help="instead: the steps each run of this profile needs to spend the paper's budget "
                                     "(the paper profile's step counts come from here)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides with --profile")
    p.add_argument("--conf-dir", type=Path, default=None)
    p.set_defaults(func=cmd_solve)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in sub.choices:   # options and overrides in any order after the subcommand
        args = sub.choices[argv[0]].parse_intermixed_args(argv[1:])
    else:
        args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
