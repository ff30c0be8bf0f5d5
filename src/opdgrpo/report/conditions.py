"""``conditions.md``: whether this run's world is one where the consolidation studies can be read at all.

The savings (S4, S5) compare two ways of learning several domains; they say something only where both ways learn.
docs/method.md ("Measurability conditions") fixes three conditions from the paper's setting, before any
run with them and never from a verdict; this table measures them on every seed, so a reader sees whether a verdict
rests on a world that meets them:

* **Experts learn**: every GRPO expert gains at least :data:`EXPERT_GAIN_SE` (4) standard errors of one evaluation in
  its own domain (the paper's experts gain 10-20 points).
* **Joint GRPO learns**: joint GRPO gains at least the study's ``min_joint_gain_se`` (3) standard errors on its mix,
  the same gain past which the savings take its best as their target (:mod:`opdgrpo.report.savings`).
* **The distillation reaches its experts**: in every domain of the mix, the multi-teacher distillation's best comes
  within :data:`DISTILL_SHORTFALL_SE` (1) standard error of that domain's expert's best (the paper's consolidated
  student matches its experts).

Gains are the best of the smoothed curve (the study's ``smooth_window``) minus the run's start, its step-0
evaluation: the base model every run of a seed starts from (the trailing window's first point is that evaluation
itself; a centred window averaged in step 20, by which most of a rise has happened). In standard errors of one evaluation point at the best
(:func:`opdgrpo.report.matching.mix_se`, from each run's recorded held-out sizes and the design effect its pass@2
gives: errors clustered by prompt).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from opdgrpo.report.curves import domain_curve, format_pct, instance_seed, mix_accuracy, run_curve, set_accuracy, study_instances
from opdgrpo.report.matching import DEFAULT_MIN_JOINT_GAIN_SE, MatchRule, eval_sizes, mix_se, smooth, start_of

#: An expert's gain in its own domain, in standard errors of one evaluation, for the world to count as one where
#: GRPO learns (docs/method.md, "Measurability conditions").
EXPERT_GAIN_SE = 4.0
#: The distillation's shortfall below an expert, in standard errors, that still counts as reaching it.
DISTILL_SHORTFALL_SE = 1.0
#: The studies whose runs the conditions read: the consolidation studies (experts, joint GRPO, their distillation).
STUDIES = ("S4", "S5")


def _raw_points(curves: pd.DataFrame, run: str, domains: Sequence[str]) -> tuple[list[float], list[float]]:
    """(cumulative FLOPs, accuracy) of a run's evaluation points on one domain or the mix of several, in step order
    (accuracy NaN where a point is incomplete)."""
    if len(domains) == 1:
        frame = domain_curve(curves, run, domains[0]).sort_values("step")
    else:
        frame = mix_accuracy(run_curve(curves, run), domains).sort_values("step", kind="stable")
    return [float(f) for f in frame["cumulative_flops"]], [float(a) for a in frame["accuracy"]]


def _raw_curve(curves: pd.DataFrame, run: str, domains: Sequence[str]) -> list[float]:
    """A run's accuracy on one domain or the mix of several, in step order (NaN where a point is incomplete)."""
    return _raw_points(curves, run, domains)[1]


def _curve(curves: pd.DataFrame, run: str, domains: Sequence[str], window: int) -> list[float]:
    """A run's smoothed accuracy on one domain or the mix of several, in step order."""
    return [a for a in smooth(_raw_curve(curves, run, domains), window) if not math.isnan(a)]


def _gain(curves: pd.DataFrame, run: str, domains: Sequence[str], window: int, runs_dir: Path) -> tuple[float, float, float | None]:
    """(start, best, SE at the best): the run's first evaluation unsmoothed, its smoothed curve's best on ``domains``,
    and the SE of one evaluation there, each held-out set's variance at its own accuracy at that point."""
    flops, raw = _raw_points(curves, run, domains)
    start = start_of(raw)
    smoothed = [(a, f) for a, f in zip(smooth(raw, window), flops) if not math.isnan(a)]
    best, at = max(smoothed, key=lambda point: point[0])
    return start, best, mix_se(best, eval_sizes(runs_dir / run), domains, set_accuracy(curves, run, domains, at))


def condition_rows(spec: Mapping[str, Any], curves: pd.DataFrame, runs_dir: Path) -> list[dict[str, Any]]:
    """One row per condition, study and seed (an expert shared by S4 and S5 once): what was measured, in points and
    in standard errors, the threshold, and whether it was met (``None`` where the held-out sizes are unknown)."""
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for key in STUDIES:
        entry = (spec.get("studies") or {}).get(key)
        if entry is None:
            continue
        for inst in study_instances(entry):
            window = MatchRule.of(inst).window
            domains, seed = list(inst["domains"]), instance_seed(dict(spec), dict(inst))
            bests: dict[str, tuple[float, float | None]] = {}
            for d, expert in zip(domains, inst["experts"]):
                first, best, se = _gain(curves, expert, [d], window, Path(runs_dir))
                bests[d] = (best, se)
                if expert not in seen:
                    seen.add(expert)
                    rows.append(_row(key, seed, f"expert {d} learns", expert, best - first, se, EXPERT_GAIN_SE,
                                     f"{format_pct(first)} -> {format_pct(best)}"))
            first, best, se = _gain(curves, inst["joint"], domains, window, Path(runs_dir))
            rows.append(_row(key, seed, "joint GRPO learns its mix", inst["joint"], best - first, se,
                             float(inst.get("min_joint_gain_se", DEFAULT_MIN_JOINT_GAIN_SE)),
                             f"{format_pct(first)} -> {format_pct(best)}"))
            for d in domains:
                reached = max(_curve(curves, inst["distill"], [d], window))
                expert_best, se = bests[d]
                rows.append(_row(key, seed, f"distillation reaches the {d} expert", inst["distill"],
                                 reached - expert_best, se, -DISTILL_SHORTFALL_SE,
                                 f"{format_pct(reached)} vs the expert's {format_pct(expert_best)}"))
    return rows


def study_conditions(spec: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The condition rows each consolidation study rests on: its own rows and the rows of its experts, which
    :func:`condition_rows` lists once, under the first study that names them (S5's math and code experts are S4's)."""
    experts = {r["run"]: r for r in rows if str(r["condition"]).startswith("expert ")}
    out: dict[str, list[Mapping[str, Any]]] = {}
    for key in STUDIES:
        entry = (spec.get("studies") or {}).get(key)
        if entry is None:
            continue
        mine = [r for r in rows if r["study"] == key]
        for inst in study_instances(entry):
            for run in inst.get("experts", []):
                row = experts.get(run)
                if row is not None and all(row is not m for m in mine):
                    mine.append(dict(row, seed=instance_seed(dict(spec), dict(inst))))
        out[key] = mine
    return out


def _kind(row: Mapping[str, Any]) -> str:
    """A condition's short name in a verdict cell: what it asks, with its threshold."""
    condition = str(row["condition"])
    if condition.startswith("expert "):
        return f"experts gain {row['threshold_se']:g} SE"
    if condition.startswith("joint "):
        return f"joint GRPO gains {row['threshold_se']:g} SE"
    return f"distillation within {-row['threshold_se']:g} SE of its experts"


def conditions_note(rows: Sequence[Mapping[str, Any]]) -> str:
    """One short line beside a verdict: ``conditions met (15/15)`` or ``conditions unmet: distillation within 1 SE of
    its experts in 1/6`` (met / measured, per kind of condition), so no verdict is read without the world it rests on;
    "" where no condition bears on it."""
    if not rows:
        return ""
    kinds: dict[str, list[Any]] = {}
    for r in rows:
        kinds.setdefault(_kind(r), []).append(r["met"])
    unmet = [f"{k} in {sum(m is True for m in v)}/{len(v)}" for k, v in kinds.items() if any(m is False for m in v)]
    unknown = sum(m is None for v in kinds.values() for m in v)
    tail = f" ({unknown} unmeasured: held-out sizes unknown)" if unknown else ""
    if unmet:
        return f"conditions unmet: {'; '.join(unmet)}{tail}"
    return f"conditions met ({sum(m is True for v in kinds.values() for m in v)}/{len(rows)}){tail}"


def _row(study: str, seed: Any, condition: str, run: str, diff: float, se: float | None, threshold: float,
         what: str) -> dict[str, Any]:
    in_se = diff / se if se else None
    return {"study": study, "seed": seed, "condition": condition, "run": run, "measured": what,
            "difference_points": 100 * diff, "in_se": in_se, "threshold_se": threshold,
            "met": None if in_se is None else bool(in_se >= threshold)}


def conditions_markdown(spec: Mapping[str, Any], curves: pd.DataFrame, runs_dir: Path,
                        rows: Sequence[Mapping[str, Any]] | None = None) -> str:
    """conditions.md: every measurability condition per study and seed, and how many were met (``rows``: those of
    :func:`condition_rows`, when the caller already measured them for the verdicts)."""
    rows = condition_rows(spec, curves, runs_dir) if rows is None else list(rows)
    lines = [f"# Measurability conditions (profile `{spec.get('profile', 'unknown')}`)", "",
             "Can the consolidation studies be read in this world? Conditions fixed before any run "
             "(docs/method.md, \"Measurability conditions\"): every GRPO expert gains at least "
             f"{EXPERT_GAIN_SE:g} standard errors (SE) of one evaluation in its own domain; joint GRPO gains at least "
             "`min_joint_gain_se` SE on its mix; in every domain the multi-teacher distillation's best comes within "
             f"{DISTILL_SHORTFALL_SE:g} SE of that domain's expert's best. Gains: the smoothed curve's best minus "
             "the run's start (its step-0 evaluation, unsmoothed); SE at the best, from the run's held-out sizes, "
             "clustered by prompt (the k samples of a prompt count as k_eff independent ones, read from pass@2). Measured from this run's run "
             "directories.", ""]
    if not rows:
        return "\n".join(lines + ["No consolidation study (S4, S5) in the report spec.", ""])
    met = [r for r in rows if r["met"]]
    lines += [f"**Met: {len(met)} of {len(rows)}.**", "",
              "| study | seed | condition | run | measured | difference | in SE | needs | met |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        in_se = "n/a" if r["in_se"] is None else f"{r['in_se']:+.1f}"
        needs = f">= {r['threshold_se']:+g} SE"
        verdict = "n/a" if r["met"] is None else ("yes" if r["met"] else "**no**")
        lines.append(f"| {r['study']} | {r['seed']} | {r['condition']} | {r['run']} | {r['measured']} "
                     f"| {r['difference_points']:+.1f} pts | {in_se} | {needs} | {verdict} |")
    return "\n".join(lines + [""])
