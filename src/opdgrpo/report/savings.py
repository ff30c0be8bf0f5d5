"""Matched-FLOP savings of consolidation by multi-teacher OPD against joint GRPO -- the paper's headline number.

This is our own implementation of the paper's matched-FLOP comparison (its code is not available); the definitions
below are the contract this module keeps (docs/method.md, "Savings that always answer"):

* A domain's accuracy is the mean of its held-out sets; the mix accuracy is the mean of the mix's domains
  (:func:`opdgrpo.report.curves.mix_accuracy`). Curves are *smoothed* (a trailing moving average over
  ``smooth_window`` evaluation points, :mod:`opdgrpo.report.matching`): a best single point would pick the luckiest
  of many noisy draws.
* **Reading at a target T**: threshold = T - slack, slack = ``tolerance``/100 + ``tolerance_se`` x SE(T), SE the
  standard error of one evaluation point's mix accuracy from the held-out sizes (n prompts, k samples, clustered by
  prompt through the design effect pass@2 gives) the runs recorded (:func:`opdgrpo.report.matching.mix_se`; unknown
  sizes: no SE term). **joint_flops** and **distill_flops** = the cumulative training FLOPs where each run's smoothed mix accuracy first reaches the
  threshold, linearly interpolated between evaluation points (the first point's FLOPs if it already does: no
  extrapolation). **expert_flops** = the experts' *final* cumulative training FLOPs (``done.json`` when the caller
  passes ``expert_final_flops``, else each expert's last evaluation point). **pipeline_flops** = expert_flops +
  distill_flops; **savings** = 1 - pipeline_flops / joint_flops; **distill_share_run** = the whole distillation
  run's FLOPs / expert_flops (the paper's share: its 5.2% and 8.0% are whole runs; what ``<S>-share`` tests) and
  **distill_share** = distill_flops / expert_flops (the share up to the match, shown beside it).
* **Censored readings.** A run that never reaches the threshold needs more than the FLOPs of its last evaluation:
  a distillation that never does gives an *upper bound* (savings <= 1 - (experts + its whole run) / joint_flops,
  share >= its whole run / experts), a joint run that never does a *lower bound* (savings >= 1 - pipeline / its
  whole run). A joint run whose start already reaches the threshold gives savings of minus infinity: the pipeline
  pays FLOPs for nothing the joint run lacks. ``savings_bound`` says which ("" for a figure).
* **Two directions.** The paper's: T = joint GRPO's best smoothed mix accuracy. It is quoted only when joint GRPO
  gained at least ``min_joint_gain_se`` standard errors of one evaluation (3 by default) over its start, its
  step-0 evaluation (the base model; the trailing window's first point is that evaluation itself): below
  that its best is noise around its start, its FLOPs to it are near 0 and the savings are ill-conditioned (a
  1.75-point gain gave -308%). Otherwise the comparison is read the other way: T = the distillation's best
  smoothed mix accuracy, and joint GRPO's FLOPs to reach it. Every seed so gets a figure or a bound; ``direction``
  says which decided, ``other`` holds the other reading. ``savings_sign`` (:func:`savings_sign`) is what a verdict
  can use: a figure's sign, a bound's where the bound settles it, else unknown.
* **tolerance** is absolute and in accuracy *points*: 1.0 means one percentage point, i.e. 0.01 as a fraction
  (0 by default); **tolerance_se** is in standard errors of one evaluation point (1 by default).

Also a CLI (``opdgrpo savings`` / ``python -m opdgrpo.report.savings``) that prints exactly one JSON object (minus
infinity as the string ``"-inf"``).
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
    format_flops,
    format_pct,
    load_final_flops,
    mix_accuracy,
    run_curve,
    set_accuracy,
)
from opdgrpo.report.matching import (
    DEFAULT_MIN_JOINT_GAIN_SE,
    DEFAULT_SMOOTH_WINDOW,
    DEFAULT_TOLERANCE_SE,
    EvalSizes,
    MatchRule,
    eval_sizes,
    mix_se,
    smooth,
    start_of,
)

#: Slack for comparing accuracies that went through a mean of floats (so a point equal to the target counts).
_EPS = 1e-9

#: One reading's keys (:func:`compute_savings` returns them for the deciding direction, and under ``other``).
SAVINGS_KEYS: list[str] = [
    "direction",
    "target_accuracy",
    "joint_flops",
    "pipeline_flops",
    "expert_flops",
    "distill_flops",
    "savings",
    "savings_bound",
    "distill_share",
    "share_bound",
    "distill_share_run",
    "threshold_accuracy",
    "eval_se",
]

#: Columns of savings.csv: one row per consolidation study and seed (:meth:`opdgrpo.plan.studies.base.Study.savings_row`),
#: the deciding direction's reading and the other's target and savings; plus a ``seed = all`` row with the range
#: over seeds when a study has several.
SAVINGS_COLUMNS: list[str] = [
    "study",
    "domains",
    "seed",
    "direction",
    "target_accuracy",
    "joint_flops",
    "expert_flops",
    "distill_flops",
    "pipeline_flops",
    "savings",
    "savings_bound",
    "savings_sign",
    "distill_share",
    "share_bound",
    "distill_share_run",
    "joint_gain",
    "min_joint_gain",
    "other_direction",
    "other_target_accuracy",
    "other_savings",
    "other_savings_bound",
    "paper_savings",
    "paper_distill_share",
    "status",
    "reason",
    "savings_min",
    "savings_max",
    "threshold_accuracy",
    "eval_se",
    "tolerance_points",
    "smooth_window",
    "tolerance_se",
    "min_joint_gain_se",
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
    min_joint_gain_se: float = DEFAULT_MIN_JOINT_GAIN_SE,
    eval_sizes: EvalSizes | None = None,
) -> dict[str, Any]:
    """Matched-FLOP savings of experts + multi-teacher OPD (``distill``) against joint GRPO (``joint``), read in the
    direction that decides (module docstring): a figure, or a bound where one side never reaches the other.

    ``domains`` defaults to every eval domain the joint run evaluates; ``tolerance`` is in accuracy points (1.0 =
    0.01 fraction); ``expert_final_flops`` maps an expert to its final cumulative training FLOPs (from
    ``done.json``), falling back to its last evaluation point; ``smooth_window``, ``tolerance_se``,
    ``min_joint_gain_se`` and ``eval_sizes`` (``{domain: {set: (n_prompts, k_eff)}}``) are the matching rule's
    (:mod:`opdgrpo.report.matching`).
    Returns the keys of :data:`SAVINGS_KEYS` for the deciding direction, ``reason`` (how to read it) and ``other``
    (the other direction's keys). Raises :class:`ReportInputError` naming the run or column when an input is missing.
    """
    missing_cols = [c for c in ("run", "step", "cumulative_flops", "eval_domain", "accuracy") if c not in curves]
    if missing_cols:
        raise ReportInputError(f"curves table is missing column(s) {missing_cols}")
    if not experts:
        raise ReportInputError("compute_savings: at least one expert run is needed")
    try:
        rule = MatchRule(window=smooth_window, tolerance_points=tolerance, tolerance_se=tolerance_se,
                         min_joint_gain_se=min_joint_gain_se)
    except ValueError as exc:
        raise ReportInputError(str(exc)) from exc
    for run in [joint, distill, *experts]:
        run_curve(curves, run)  # raises naming the run
    if domains is None:
        domains = list(dict.fromkeys(run_curve(curves, joint)["eval_domain"]))
    domains = list(domains)
    sides = {run: _smoothed_mix(curves, run, domains, rule.window) for run in (joint, distill)}
    best = {run: best_point(*sides[run]) for run in sides}
    if best[joint] is None:
        raise ReportInputError(f"joint run '{joint}' has no evaluation point covering all of {domains}")
    if best[distill] is None:
        raise ReportInputError(f"distillation run '{distill}' has no evaluation point covering all of {domains}")
    expert_flops = _expert_flops(curves, experts, expert_final_flops)

    def read(run: str) -> dict[str, Any]:   # at ``run``'s best, each set's binomial variance at its own accuracy there
        target = best[run][0]
        se = mix_se(target, eval_sizes, domains, set_accuracy(curves, run, domains, best[run][1]))
        return _read_at(target, se, rule, sides[joint], sides[distill], expert_flops)

    paper, reverse = read(joint), read(distill)
    start = start_of(_mix_curve(curves, joint, domains)["accuracy"])
    gain, least = best[joint][0] - start, rule.min_gain(paper["eval_se"])
    quoted = gain >= least - _EPS and (paper["joint_flops"] or 0.0) > 0
    decided, other = (paper, reverse) if quoted else (reverse, paper)
    decided["direction"], other["direction"] = ("joint", "pipeline") if quoted else ("pipeline", "joint")
    why = (f"joint GRPO gained {_pts(gain)} over its start, at least {_pts(least)} ({rule.min_joint_gain_se:g} SE): "
           "the target is its best" if quoted else
           f"joint GRPO gained {_pts(gain)} over its start, less than {_pts(least)} ({rule.min_joint_gain_se:g} SE), "
           "so its best is no target: read the other way, joint GRPO's FLOPs to the pipeline's best")
    return {**decided, "joint_gain": float(gain), "min_joint_gain": float(least),
            "reason": f"{why}; {decided['reading']}", "other": other}


def _pts(x: float) -> str:
    return f"{100 * x:.2f} pts"


def _read_at(target: float, se: float | None, rule: MatchRule, joint: tuple[list[float], list[float]],
             distill: tuple[list[float], list[float]], expert_flops: float) -> dict[str, Any]:
    """Both runs' FLOPs to one target (within the slack) and the savings they give: a figure, or a bound where a
    run never reaches it (censored at its last evaluation's FLOPs)."""
    threshold = target - rule.slack(se)
    joint_flops = first_crossing_flops(*joint, threshold)
    distill_flops = first_crossing_flops(*distill, threshold)
    joint_total, distill_total = _last_flops(joint), _last_flops(distill)
    out: dict[str, Any] = {"target_accuracy": float(target), "threshold_accuracy": float(threshold), "eval_se": se,
                           "joint_flops": joint_flops, "distill_flops": distill_flops, "expert_flops": expert_flops,
                           "pipeline_flops": None,
                           "savings": None, "savings_bound": "", "distill_share": None, "share_bound": "",
                           "distill_share_run": _ratio(distill_total, expert_flops)}
    if distill_flops is None:   # the pipeline costs more than experts + the whole distillation, if it ever gets there
        pipeline = expert_flops + distill_total
        out.update(pipeline_flops=pipeline, distill_share=_ratio(distill_total, expert_flops), share_bound="lower")
        if joint_flops:
            out.update(savings=1.0 - pipeline / joint_flops, savings_bound="upper",
                       reading=f"the distillation never reached {format_pct(threshold)}: pipeline > "
                               f"{format_flops(pipeline)}, savings at most the figure")
        else:
            out["reading"] = f"neither run reached {format_pct(threshold)} past its start: no comparison"
        return out
    pipeline = expert_flops + distill_flops
    out.update(pipeline_flops=pipeline, distill_share=_ratio(distill_flops, expert_flops))
    if joint_flops is None:     # joint GRPO costs more than its whole run, if it ever gets there
        out.update(savings=1.0 - pipeline / joint_total, savings_bound="lower",
                   reading=f"joint GRPO never reached {format_pct(threshold)}: joint > {format_flops(joint_total)}, "
                           "savings at least the figure")
    elif joint_flops <= 0:      # joint GRPO's start is already there: the pipeline's FLOPs buy nothing it lacks
        out.update(savings=-math.inf, reading=f"joint GRPO's start already reaches {format_pct(threshold)}: the "
                                              "pipeline pays its FLOPs for nothing the joint run lacks")
    else:
        out.update(savings=1.0 - pipeline / joint_flops,
                   reading=f"both reach {format_pct(threshold)}: pipeline {format_flops(pipeline)}, joint "
                           f"{format_flops(joint_flops)}")
    return out


def _ratio(num: float, den: float) -> float | None:
    return float(num / den) if den > 0 else None


def _last_flops(curve: tuple[list[float], list[float]]) -> float:
    """FLOPs of a run's last evaluation point with an accuracy (where its curve, and so what it reached, ends)."""
    return max(f for f, a in zip(*curve) if not math.isnan(a))


def savings_sign(savings: float | None, bound: str = "") -> str:
    """``positive`` / ``negative`` / ``unknown``: a figure's sign; an upper bound's when it is <= 0 (negative), a
    lower bound's when it is > 0 (positive), unknown otherwise; no figure is unknown."""
    if savings is None or (isinstance(savings, float) and math.isnan(savings)):
        return "unknown"
    if bound == "upper":
        return "negative" if savings <= 0 else "unknown"
    if bound == "lower":
        return "positive" if savings > 0 else "unknown"
    return "positive" if savings > 0 else "negative"


def finite_figures(readings: Sequence[tuple[float | None, str]]) -> list[float]:
    """The seeds' savings that are finite figures (no bound, not -inf): the values a mean, range or interval may use."""
    return [float(v) for v, bound in readings if v is not None and not bound and math.isfinite(v)]


#: The least spread the savings' interval over seeds may have (a fraction: 0.05 = 5 points of savings), so that seeds
#: that agree closely by chance do not decide alone; the smallest of 0.02, 0.05 and 0.10 whose simulated false
#: "holds" and false "does not hold" rates under the null (true savings 0, the tiny profile's S4 shapes and held-out
#: sizes, 3 seeds: ``benchmarks/null_savings.py``) are both at most 2.5%, chosen before reading any published run.
SAVINGS_FLOOR = 0.05


def savings_range(savings: float | None, bound: str = "") -> tuple[float, float]:
    """The values one seed's savings may have: a figure (or -inf) itself, an upper bound (-inf, v], a lower bound
    [v, inf); no reading any value. What :func:`sign_over_seeds` tests, so a bound never says more than a figure."""
    if savings is None or (isinstance(savings, float) and math.isnan(savings)):
        return -math.inf, math.inf
    v = float(savings)
    return {"upper": (-math.inf, v), "lower": (v, math.inf)}.get(bound, (v, v))


def sign_over_seeds(readings: Sequence[tuple[float | None, str]], floor: float = SAVINGS_FLOOR) -> str:
    """The savings' sign over seeds from per-seed ``(savings, savings_bound)``, by one test whatever each seed gives:
    the monotone 95% interval of the seeds' ranges (:func:`savings_range`,
    :func:`~opdgrpo.report.uncertainty.monotone_interval`, spread at least ``floor``) is ``positive`` above 0,
    ``negative`` at or below 0, else ``inconclusive``. Worsening a seed, or replacing a figure by a bound on it,
    never moves it towards ``positive`` nor makes it stronger. One seed: its own :func:`savings_sign` (unknown:
    inconclusive). The same rule claims.md applies to S4/S5-savings."""
    from opdgrpo.report.uncertainty import FAILS, HOLDS, interval_verdict, monotone_interval

    if not readings:
        return "inconclusive"
    if len(readings) == 1:
        sign = savings_sign(*readings[0])
        return "inconclusive" if sign == "unknown" else sign
    ranges = [savings_range(v, bound) for v, bound in readings]
    lo, hi = monotone_interval([r[0] for r in ranges], [r[1] for r in ranges], floor)
    return {HOLDS: "positive", FAILS: "negative"}.get(interval_verdict(lo, hi), "inconclusive")


def format_savings(savings: float | None, bound: str = "") -> str:
    """``-12.3%``, ``>= 40.1%``, ``<= -5.0%``, ``-inf`` or ``n/a``."""
    if savings is None or (isinstance(savings, float) and math.isnan(savings)):
        return "n/a"
    if math.isinf(savings):
        return "-inf" if savings < 0 else "inf"
    return {"upper": "<= ", "lower": ">= "}.get(bound, "") + f"{100 * savings:.1f}%"


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
        help=f"trailing moving average over this many (odd) evaluation points; 1: raw; default {DEFAULT_SMOOTH_WINDOW}",
    )
    p.add_argument(
        "--tolerance-se", type=float, default=DEFAULT_TOLERANCE_SE, metavar="SE",
        help="tolerance in standard errors of one evaluation point (needs --runs for the held-out sizes); "
             f"default {DEFAULT_TOLERANCE_SE:g}",
    )
    p.add_argument(
        "--min-joint-gain-se", type=float, default=DEFAULT_MIN_JOINT_GAIN_SE, metavar="SE",
        help="joint GRPO's best is the target only when it gained this many SE over its start; else the savings "
             f"are read at the distillation's best; default {DEFAULT_MIN_JOINT_GAIN_SE:g}",
    )
    p.add_argument(
        "--runs", type=Path, default=None, metavar="RUNS_DIR",
        help="optional runs directory: take experts' final FLOPs from done.json instead of their last eval point, "
             "and the held-out sizes (n prompts, k) of the joint run's evals.jsonl for the SE tolerance",
    )
    return p


def _strict_json(value: Any) -> Any:
    """``value`` with minus infinity (and NaN) as strings, so the CLI prints JSON every parser reads."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("-inf" if value < 0 else "inf")
    if isinstance(value, Mapping):
        return {k: _strict_json(v) for k, v in value.items()}
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: print exactly one JSON object (the :func:`compute_savings` dict) to stdout; errors exit 2."""
    args = build_parser().parse_args(argv)
    try:
        curves = _read_curves_csv(args.curves)
        final = load_final_flops(args.runs, args.experts) if args.runs is not None else None
        sizes = eval_sizes(args.runs / args.joint) if args.runs is not None else None
        result = compute_savings(
            curves, args.joint, args.distill, list(args.experts), args.domains, args.tolerance, final,
            smooth_window=args.smooth_window, tolerance_se=args.tolerance_se,
            min_joint_gain_se=args.min_joint_gain_se, eval_sizes=sizes,
        )
    except ReportInputError as exc:
        print(f"opdgrpo savings: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(_strict_json(result), allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
