"""The report's half of S4 and S5 (the studies and their rules: :mod:`opdgrpo.plan.studies.consolidation`): the joint
run's held-out sizes, the matched-FLOP savings row, one panel per domain plus the mix panel at the pipeline's cost,
and the verdicts of ``<S>-share`` and ``<S>-savings``. S6 reads each cell of its map with :func:`matched_savings`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opdgrpo.plan.studies.consolidation import ConsolidationEntry, ConsolidationStudy
from opdgrpo.report.curves import ReportInputError, format_flops, format_pct, instance_seed, run_curve
from opdgrpo.report.matching import DEFAULT_SHARE_THRESHOLD, MatchRule, eval_sizes
from opdgrpo.report.plots import STEP0_CAPTION, Panel, render
from opdgrpo.report.savings import (
    SAVINGS_FLOOR,
    SAVINGS_KEYS,
    compute_savings,
    format_savings,
    savings_range,
    savings_sign,
)
from opdgrpo.report.uncertainty import FAILS, HOLDS, INCONCLUSIVE, UNMEASURED

from .base import StudyReport, Verdicts

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from opdgrpo.report.plots import Panel, PlotContext


class ConsolidationReport(StudyReport[ConsolidationEntry]):
    """Experts + multi-teacher OPD vs joint GRPO on the mix."""
    @property
    def study(self) -> ConsolidationStudy:
        return super().study   # type: ignore[return-value]

    def attach(self, entry: ConsolidationEntry, runs_dir: Path) -> None:
        """The joint run's held-out sizes (n prompts, k per set), for the standard error of the target."""
        entry["eval_sizes"] = eval_sizes(Path(runs_dir) / entry["joint"])

    def savings_row(self, spec: Mapping[str, Any], entry: ConsolidationEntry, curves: pd.DataFrame,
                    final_flops: Mapping[str, float]) -> dict[str, Any]:
        """The savings row of one per-seed entry: matched-FLOP savings with domains, paper values and status."""
        domains, rule, result = matched_savings(self.name, entry, curves, final_flops)
        return {
            "study": self.name,
            "domains": "+".join(domains),
            **savings_fields(result, rule),
            "paper_savings": self.study.paper.savings,
            "paper_distill_share": self.study.paper.distill_share,
            "share_threshold": float(entry.get("share_threshold", DEFAULT_SHARE_THRESHOLD)),
            "seed": instance_seed(dict(spec), dict(entry)),
        }

    def figures(self, entry: ConsolidationEntry, ctx: PlotContext) -> dict[str, Figure]:
        """Joint GRPO vs experts + multi-teacher OPD; one panel per domain, then a mix panel.

        Domain panels show each run on its own FLOPs. The mix panel charges the pipeline its full cost: the
        distillation curve is shifted right by the experts' total FLOPs (marked), and the matched points of the
        savings are starred.
        """
        domains = list(entry["domains"])
        joint, distill, experts = entry["joint"], entry["distill"], list(entry["experts"])
        runs = [(joint, "-", ctx.label(joint)), (distill, "--", ctx.label(distill))]
        for e in experts:  # experts often share a label ("GRPO"): name their training domains
            trained = run_curve(ctx.curves, e)["train_domains"].iloc[0]
            runs.append((e, ":", f"{ctx.label(e)} expert ({trained})"))
        panels = []
        for domain in domains:
            panel = Panel(title=domain, ylabel="held-out accuracy (%)")
            for run, ls, label in runs:
                try:
                    panel.lines.append(ctx.line(run, domain, label, linestyle=ls, color_key=run))
                except ValueError:
                    continue  # an expert need not evaluate the other domains
            panels.append(panel)
        panels.append(_mix_panel(self.name, entry, ctx))
        caption = (
            STEP0_CAPTION + " Mix panel: the distillation curve is shifted right by the experts' total training FLOPs "
            "(dash-dot line), so its x is the whole pipeline's cost."
        )
        return {f"{self.name}_accuracy": render(panels, f"{self.name}: {entry.get('title', self.name)}", caption)}

    def evaluate(self, entry: ConsolidationEntry, curves: pd.DataFrame,
                 savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
        """Distillation share and matched-FLOP savings, read from the study's savings row."""
        return _consolidation_verdicts(self.name, savings)



def matched_savings(key: str, entry: Mapping[str, Any], curves: pd.DataFrame,
                    final_flops: Mapping[str, float]) -> tuple[list[str], Any, dict[str, Any]]:
    """(domains, matching rule, :func:`~opdgrpo.report.savings.compute_savings`'s result) of one consolidation
    entry (``joint``, ``distill``, ``experts``, the matching keys): S4/S5's savings row and each cell of S6's map."""
    for field in ("joint", "distill", "experts"):
        if field not in entry:
            raise ReportInputError(f"report spec: study {key} is missing key '{field}'")
    try:
        rule = MatchRule.of(entry)
    except ValueError as exc:
        raise ReportInputError(f"report spec: study {key}: {exc}") from exc
    domains = list(entry.get("domains") or dict.fromkeys(run_curve(curves, entry["joint"])["eval_domain"]))
    result = compute_savings(
        curves, entry["joint"], entry["distill"], list(entry["experts"]), domains, rule.tolerance_points,
        {e: final_flops[e] for e in entry["experts"] if e in final_flops},
        smooth_window=rule.window, tolerance_se=rule.tolerance_se, min_joint_gain_se=rule.min_joint_gain_se,
        eval_sizes=entry.get("eval_sizes"),
    )
    return domains, rule, result


def savings_fields(result: Mapping[str, Any], rule: Any) -> dict[str, Any]:
    """The savings.csv fields of one :func:`~opdgrpo.report.savings.compute_savings` result: the deciding
    reading, its sign and status, the other direction's target and savings, and the matching rule."""
    other = result.get("other") or {}
    sign = savings_sign(result.get("savings"), result.get("savings_bound", ""))
    bound = result.get("savings_bound", "")
    return {
        **{k: result.get(k) for k in SAVINGS_KEYS},
        "savings_sign": sign,
        "joint_gain": result.get("joint_gain"),
        "min_joint_gain": result.get("min_joint_gain"),
        "other_direction": other.get("direction"),
        "other_target_accuracy": other.get("target_accuracy"),
        "other_savings": other.get("savings"),
        "other_savings_bound": other.get("savings_bound", ""),
        "status": ("figure" if not bound else f"{bound} bound") if result.get("savings") is not None else "none",
        "reason": result.get("reason", ""),
        "tolerance_points": rule.tolerance_points,
        "smooth_window": rule.window,
        "tolerance_se": rule.tolerance_se,
        "min_joint_gain_se": rule.min_joint_gain_se,
    }


def target_label(direction: str | None) -> str:
    """The target line's legend: whose best it is, or, over seeds that decided different ways, a mean of both kinds."""
    whose = {"joint": "target: joint GRPO's best (smoothed)", "pipeline": "target: the distillation's best (smoothed)"}
    return whose.get(str(direction), f"target: mean of the seeds' targets ({direction} decide)")


def _mix_panel(key: str, entry: ConsolidationEntry, ctx: PlotContext) -> Panel:
    """The mix panel: joint GRPO, and the distillation shifted right by the experts' FLOPs, with the matched points."""
    domains = list(entry["domains"])
    joint, distill, experts = entry["joint"], entry["distill"], list(entry["experts"])
    sav = ctx.savings.get(key, {})
    expert_flops = sav.get("expert_flops")
    if expert_flops is None:
        expert_flops = float(sum(run_curve(ctx.curves, e)["cumulative_flops"].max() for e in experts))
    mix = Panel(title=f"mix ({' + '.join(domains)}), pipeline cost", ylabel="mix accuracy (%)")
    mix.lines.append(ctx.line(joint, domains, ctx.label(joint), color_key=joint))
    shifted = ctx.line(distill, domains, f"{ctx.label(distill)} (+ experts' FLOPs)", linestyle="--", color_key=distill)
    shifted.flops = shifted.flops + expert_flops
    mix.lines.append(shifted)
    mix.vlines.append((expert_flops, f"experts' total {format_flops(expert_flops)}"))
    if sav.get("target_accuracy") is not None:
        level = sav.get("threshold_accuracy", sav["target_accuracy"])  # the target less the tolerance
        mix.hlines.append((100.0 * sav["target_accuracy"], target_label(sav.get("direction"))))
        # a threshold under 0% (a target within its tolerance of nothing) is reached by any curve: drawn on the axis
        label = "reached (target - tolerance)" if level >= 0.0 else "reached (target - tolerance < 0%: drawn at 0%)"
        reached = [sav.get("joint_flops"), sav.get("pipeline_flops") if sav.get("distill_flops") is not None else None]
        for i, flops in enumerate(f for f in reached if f is not None):   # a side that never reached it: no point
            mix.points.append((flops, 100.0 * max(level, 0.0), label if i == 0 else "_nolegend_"))
    return mix


def _consolidation_verdicts(key: str, savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
    """``<key>-share`` (:func:`_share_verdict`) and ``<key>-savings`` from the study's savings row (none without a
    row). Every savings reading, figure, bound or -inf, gives its seed's verdict and the range its savings may lie
    in, with the savings' least spread: over seeds one monotone interval decides (opdgrpo.report.claims._combine)."""

    sav = savings.get(key)
    if sav is None:
        return {}
    out: Verdicts = {}
    sv, bound = sav.get("savings"), sav.get("savings_bound") or ""
    read = f"{sav.get('direction')} direction{_tolerance_text(sav)}"
    out.update(_share_verdict(key, sav))
    txt = f"savings {format_savings(sv, bound)} ({read}): {sav.get('reason', '')}"
    if sv is None:
        out[f"{key}-savings"] = (txt, f"{UNMEASURED}: {sav.get('reason', 'savings undefined')}")
        return out
    sign = savings_sign(sv, bound)
    verdict = {"positive": HOLDS, "negative": f"{FAILS}: the pipeline costs more than joint GRPO"}.get(
        sign, f"{INCONCLUSIVE}: the bound {format_savings(sv, bound)} does not settle the sign")
    # the range the seed's savings may lie in: over seeds one monotone interval tests figures and bounds alike
    out[f"{key}-savings"] = (txt, verdict, savings_range(sv, bound), True, SAVINGS_FLOOR)
    return out


def _share_verdict(key: str, sav: Mapping[str, Any]) -> Verdicts:
    """``<key>-share``: the whole distillation run's FLOPs / the experts' (the paper's reading: its 5.2% and 8.0%
    are whole runs, so a share read only up to the match would flatter the claim) against ``share_threshold``,
    margin threshold - share; the share up to the match is shown beside it. Inconclusive where the distillation
    reached nothing beyond its start or joint GRPO's (nothing was consolidated: no cost of it to share). A row without the whole-run share (one
    written before it existed) is not measured."""
    limit = float(sav.get("share_threshold") or DEFAULT_SHARE_THRESHOLD)
    run, match, bound = sav.get("distill_share_run"), sav.get("distill_share"), sav.get("share_bound") or ""
    at_match = "n/a" if match is None else f"{'>= ' if bound else ''}{100 * match:.1f}%"
    txt = (f"experts {format_flops(sav.get('expert_flops'))}; whole distillation "
           f"{'n/a' if run is None else f'{100 * run:.1f}%'} of experts, up to the match {at_match} "
           f"(threshold {100 * limit:g}%)")
    if run is None:
        return {f"{key}-share": (txt, f"{UNMEASURED}: experts' FLOPs are 0 or the row has no whole-run share")}
    sv = sav.get("savings")
    if not sav.get("distill_flops") or (sv is not None and math.isinf(sv)):
        return {f"{key}-share": (txt, f"{INCONCLUSIVE}: the distillation reached nothing beyond its start or joint "
                                      "GRPO's, so there is no cost of consolidation to share")}
    return {f"{key}-share": (txt, HOLDS if run < limit else f"{FAILS}: the whole distillation costs "
                                  f"{100 * run:.1f}% >= {100 * limit:g}% of the experts", limit - run, True)}


def _tolerance_text(sav: Mapping[str, Any]) -> str:
    """`` (reached at >= 41.2%: smoothed over 3 points, 1 SE = 1.3 pts)``: how the match was read, for claims.md."""
    threshold, se = sav.get("threshold_accuracy"), sav.get("eval_se")
    if threshold is None:
        return ""
    se_txt = f", 1 SE = {100 * float(se):.2f} pts" if se is not None and se == se else ""
    return f" (reached at >= {format_pct(threshold)}: smoothed over {sav.get('smooth_window')} points{se_txt})"
