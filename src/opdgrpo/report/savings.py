"""Matched-FLOP savings of consolidation by multi-teacher OPD against joint GRPO -- the paper's headline number.

This is our own implementation of DESIGN.md's "Matched-FLOP savings" contract (the paper's code is not available);
the definitions below are the contract's, made precise where it leaves room:

* A domain's accuracy is the mean of its held-out sets; the mix accuracy is the mean of the mix's domains
  (:func:`opdgrpo.report.curves.mix_accuracy`).
* **target** = the joint-GRPO run's best mix accuracy on its *smoothed* curve (a centred moving average over
  ``smooth_window`` evaluation points, :mod:`opdgrpo.report.matching`), not its best single point, which would pick
  the luckiest of many noisy draws.
* **threshold** = target - slack, slack = ``tolerance``/100 + ``tolerance_se`` x SE(target), SE the binomial standard
  error of one evaluation point's mix accuracy from the held-out sizes (n prompts, k samples) the runs recorded
  (:func:`opdgrpo.report.matching.mix_se`; unknown sizes: no SE term).
* **joint_flops** = the joint run's cumulative training FLOPs where its smoothed mix accuracy first reaches the
  threshold, linearly interpolated between evaluation points (with no slack: the first point at the target).
* **expert_flops** = the sum of the experts' *final* cumulative training FLOPs (``done.json``/ledger when the caller
  passes ``expert_final_flops``, else each expert's last evaluation point).
* **distill_flops** = the distillation run's cumulative training FLOPs where its smoothed mix accuracy first reaches
  the same threshold, linearly interpolated between the evaluation point before and the first evaluation
  point at or above it; if the first evaluation point already reaches it, that point's FLOPs (no extrapolation).
* **pipeline_flops** = expert_flops + distill_flops; **savings** = 1 - pipeline_flops / joint_flops;
  **distill_share** = distill_flops / expert_flops.
* **tolerance** is absolute and in accuracy *points*: 1.0 means one percentage point, i.e. 0.01 as a fraction
  (0 by default); **tolerance_se** is in standard errors of one evaluation point (1 by default).
  ``smooth_window=1, tolerance_se=0, tolerance=0`` is the earlier rule: best single point, reached exactly.
* Never reached: ``savings`` is ``None`` and ``reason`` says why; every other known field is still reported.

Also a CLI (``opdgrpo savings`` / ``python -m opdgrpo.report.savings``) that prints exactly one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opdgrpo.report.curves import (
    CURVE_COLUMNS,
    ReportInputError,
    format_pct,
    load_final_flops,
    mix_accuracy,
    run_curve,
)
from opdgrpo.report.matching import (
    DEFAULT_SMOOTH_WINDOW,
    DEFAULT_TOLERANCE_SE,
    EvalSizes,
    MatchRule,
    eval_sizes,
    mix_se,
    smooth,
)

#: Slack for comparing accuracies that went through a mean of floats (so a point equal to the target counts).
_EPS = 1e-9

SAVINGS_KEYS: list[str] = [
    "target_accuracy",
    "joint_flops",
    "pipeline_flops",
    "expert_flops",
    "distill_flops",
    "savings",
    "distill_share",
    "threshold_accuracy",
    "eval_se",
]

#: Columns of savings.csv: one row per consolidation study and seed (:meth:`opdgrpo.studies.base.Study.savings_row`),
#: plus a ``seed = all`` row with the bootstrap interval when a study has several seeds.
SAVINGS_COLUMNS: list[str] = [
    "study",
    "domains",
    "target_accuracy",
    "joint_flops",
    "expert_flops",
    "distill_flops",
    "pipeline_flops",
    "savings",
    "distill_share",
    "paper_savings",
    "paper_distill_share",
    "tolerance_points",
    "status",
    "reason",
    "seed",
    "savings_lo",
    "savings_hi",
    "threshold_accuracy",
    "eval_se",
    "smooth_window",
    "tolerance_se",
    "share_threshold",
]


# ------------------------------------------------------------------------------------------------ curve primitives
def first_crossing_flops(flops: Sequence[float], accuracy: Sequence[float], threshold: float) -> float | None:
    """FLOPs where a curve first reaches ``threshold``, linearly interpolated; None if it never does.

    Points must be in step order; NaN accuracies (incomplete evaluation points) are dropped first, so the
    interpolation runs between the valid point before and the first valid point at/above the threshold. If the
    first valid point is already at/above, its FLOPs are returned (we never extrapolate before the first point).
    """
    pts = [(float(f), float(a)) for f, a in zip(flops, accuracy) if not math.isnan(float(a))]
    for i, (f, a) in enumerate(pts):
        if a >= threshold - _EPS:
            if i == 0:
                return f
            f0, a0 = pts[i - 1]
            if a <= a0:  # cannot happen (a0 < threshold <= a), guards a zero-width slope
                return f
            frac = min(max((threshold - a0) / (a - a0), 0.0), 1.0)
            return f0 + frac * (f - f0)
    return None


def best_point(flops: Sequence[float], accuracy: Sequence[float]) -> tuple[float, float] | None:
    """``(accuracy, flops)`` of a curve's best point, the first one if tied; None if every accuracy is NaN."""
    best: tuple[float, float] | None = None
    for f, a in zip(flops, accuracy):
        a = float(a)
        if math.isnan(a):
            continue
        if best is None or a > best[0] + _EPS:
            best = (a, float(f))
    return best


def _mix_curve(curves: pd.DataFrame, run: str, domains: Sequence[str]) -> pd.DataFrame:
    return mix_accuracy(run_curve(curves, run), domains).sort_values("step", kind="stable")


# ---------------------------------------------------------------------------------------------------------- savings
def compute_savings(
    curves: pd.DataFrame,
    joint: str,
    distill: str,
    experts: list[str],
    domains: list[str] | None = None,
    tolerance: float = 0.0,
    expert_final_flops: Mapping[str, float] | None = None,
    *,
    smooth_window: int = DEFAULT_SMOOTH_WINDOW,
    tolerance_se: float = DEFAULT_TOLERANCE_SE,
    eval_sizes: EvalSizes | None = None,
) -> dict[str, Any]:
    """Matched-FLOP savings of experts + multi-teacher OPD (``distill``) against joint GRPO (``joint``).

    See the module docstring for the exact definitions. ``domains`` defaults to every eval domain the joint run
    evaluates; ``tolerance`` is in accuracy points (1.0 = 0.01 fraction); ``expert_final_flops`` maps an expert to
    its final cumulative training FLOPs (from ``done.json``), falling back to its last evaluation point;
    ``smooth_window``, ``tolerance_se`` and ``eval_sizes`` (``{domain: {set: (n_prompts, k)}}``) are the matching
    rule's (:mod:`opdgrpo.report.matching`).
    Returns the keys of :data:`SAVINGS_KEYS`, plus ``reason`` when the target is not matched (``savings`` None).
    Raises :class:`ReportInputError` naming the run or column when an input is missing.
    """
    missing_cols = [c for c in ("run", "step", "cumulative_flops", "eval_domain", "accuracy") if c not in curves]
    if missing_cols:
        raise ReportInputError(f"curves table is missing column(s) {missing_cols}")
    if not experts:
        raise ReportInputError("compute_savings: at least one expert run is needed")
    try:
        rule = MatchRule(window=smooth_window, tolerance_points=tolerance, tolerance_se=tolerance_se)
    except ValueError as exc:
        raise ReportInputError(str(exc)) from exc
    for run in [joint, distill, *experts]:
        run_curve(curves, run)  # raises naming the run
    if domains is None:
        domains = list(dict.fromkeys(run_curve(curves, joint)["eval_domain"]))
    domains = list(domains)

    joint_f, joint_a = _smoothed_mix(curves, joint, domains, rule.window)
    best = best_point(joint_f, joint_a)
    if best is None:
        raise ReportInputError(f"joint run '{joint}' has no evaluation point covering all of {domains}")
    target = best[0]
    se = mix_se(target, eval_sizes, domains)
    threshold = target - rule.slack(se)
    joint_flops = first_crossing_flops(joint_f, joint_a, threshold)
    result: dict[str, Any] = {
        "target_accuracy": float(target),
        "joint_flops": float(joint_flops if joint_flops is not None else best[1]),
        "pipeline_flops": None,
        "expert_flops": _expert_flops(curves, experts, expert_final_flops),
        "distill_flops": None,
        "savings": None,
        "distill_share": None,
        "threshold_accuracy": float(threshold),
        "eval_se": se,
    }
    return _distill_side(result, curves, distill, domains, rule, tolerance)


def _smoothed_mix(curves: pd.DataFrame, run: str, domains: Sequence[str], window: int) -> tuple[list[float], list[float]]:
    """(cumulative FLOPs, smoothed mix accuracy) of a run's evaluation points in step order."""
    mix = _mix_curve(curves, run, domains)
    return [float(f) for f in mix["cumulative_flops"]], smooth(mix["accuracy"].tolist(), window)


def _expert_flops(curves: pd.DataFrame, experts: Sequence[str], final: Mapping[str, float] | None) -> float:
    """The experts' final cumulative training FLOPs: ``final`` where given, else each one's last evaluation point."""
    total, final = 0.0, dict(final or {})
    for run in experts:
        if run in final:
            total += float(final[run])
        else:
            rows = run_curve(curves, run)
            total += float(rows.loc[rows["step"].idxmax(), "cumulative_flops"])
    return total


def _distill_side(result: dict[str, Any], curves: pd.DataFrame, distill: str, domains: Sequence[str],
                  rule: MatchRule, tolerance: float) -> dict[str, Any]:
    """Fill in the distillation's FLOPs to the threshold, the pipeline, the share and the savings (or the reason)."""
    target, threshold = result["target_accuracy"], result["threshold_accuracy"]
    dist_f, dist_a = _smoothed_mix(curves, distill, domains, rule.window)
    distill_flops = first_crossing_flops(dist_f, dist_a, threshold)
    if distill_flops is None:
        reached = best_point(dist_f, dist_a)
        best_txt = format_pct(reached[0]) if reached else "n/a"
        se = result["eval_se"]
        se_txt = f" - {rule.tolerance_se:g} SE ({100 * se:.2f} pts)" if se else ""
        result["reason"] = (
            f"distillation run '{distill}' never reached the target mix accuracy {format_pct(threshold)} "
            f"(joint best {format_pct(target)} - tolerance {tolerance:g} pts{se_txt}, "
            f"{rule.window}-point smoothed curves); its smoothed best was {best_txt}"
        )
        return result
    expert_flops, joint_flops = result["expert_flops"], result["joint_flops"]
    pipeline = expert_flops + distill_flops
    result["distill_flops"] = float(distill_flops)
    result["pipeline_flops"] = float(pipeline)
    result["distill_share"] = float(distill_flops / expert_flops) if expert_flops > 0 else None
    if joint_flops <= 0:
        result["reason"] = (
            "joint run reached the target mix accuracy at 0 training FLOPs (no improvement over its "
            "initial model beyond the tolerance), so savings relative to it are undefined"
        )
        return result
    result["savings"] = float(1.0 - pipeline / joint_flops)
    return result


# -------------------------------------------------------------------------------------------------------------- CLI
def _read_curves_csv(path: Path) -> pd.DataFrame:
    if not Path(path).is_file():
        raise ReportInputError(f"{path}: curves file not found")
    df = pd.read_csv(path, dtype={"run": str, "study": str, "eval_domain": str, "eval_set": str})
    needed = ["run", "step", "cumulative_flops", "eval_domain", "accuracy"]
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise ReportInputError(f"{path}: missing column(s) {missing}")
    if "study" not in df.columns:
        df["study"] = ""
    df["study"] = df["study"].fillna("")
    if "eval_set" not in df.columns:
        df["eval_set"] = df["eval_domain"]
    if "mean_response_length" not in df.columns:
        df["mean_response_length"] = np.nan
    for col in CURVE_COLUMNS:
        if col not in df.columns:
            df[col] = ""
    return df


def build_parser() -> argparse.ArgumentParser:
    """Argument parser of ``opdgrpo savings``."""
    p = argparse.ArgumentParser(
        prog="opdgrpo savings",
        description="Matched-FLOP savings of experts + multi-teacher OPD vs joint GRPO; prints one JSON object.",
    )
    p.add_argument("--curves", type=Path, required=True, help="curves.csv written by `opdgrpo report`")
    p.add_argument("--joint", required=True, help="run id of the joint-GRPO run")
    p.add_argument("--distill", required=True, help="run id of the multi-teacher OPD run")
    p.add_argument("--experts", nargs="+", required=True, metavar="RUN", help="run ids of the per-domain experts")
    p.add_argument("--domains", nargs="+", default=None, help="domains of the mix (default: the joint run's)")
    p.add_argument(
        "--tolerance", type=float, default=0.0, metavar="POINTS",
        help="absolute tolerance in accuracy points (1.0 = one percentage point); default 0",
    )
    p.add_argument(
        "--smooth-window", type=int, default=DEFAULT_SMOOTH_WINDOW, metavar="POINTS",
        help=f"centred moving average over this many (odd) evaluation points; 1: raw; default {DEFAULT_SMOOTH_WINDOW}",
    )
    p.add_argument(
        "--tolerance-se", type=float, default=DEFAULT_TOLERANCE_SE, metavar="SE",
        help="tolerance in binomial standard errors of one evaluation point (needs --runs for the held-out sizes); "
             f"default {DEFAULT_TOLERANCE_SE:g}",
    )
    p.add_argument(
        "--runs", type=Path, default=None, metavar="RUNS_DIR",
        help="optional runs directory: take experts' final FLOPs from done.json instead of their last eval point, "
             "and the held-out sizes (n prompts, k) of the joint run's evals.jsonl for the SE tolerance",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: print exactly one JSON object (the :func:`compute_savings` dict) to stdout; errors exit 2."""
    args = build_parser().parse_args(argv)
    try:
        curves = _read_curves_csv(args.curves)
        final = load_final_flops(args.runs, args.experts) if args.runs is not None else None
        sizes = eval_sizes(args.runs / args.joint) if args.runs is not None else None
        result = compute_savings(
            curves, args.joint, args.distill, list(args.experts), args.domains, args.tolerance, final,
            smooth_window=args.smooth_window, tolerance_se=args.tolerance_se, eval_sizes=sizes,
        )
    except ReportInputError as exc:
        print(f"opdgrpo savings: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
