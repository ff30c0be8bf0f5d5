"""The report's half of S1 and S1b: one panel per compared domain, and the accuracy-per-FLOP test
(:func:`loses_per_flop`) both studies' claims read."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opdgrpo.plan.studies.comparison import ComparisonEntry
from opdgrpo.report.curves import domain_curve, format_flops, format_pct
from opdgrpo.report.matching import DEFAULT_SMOOTH_WINDOW, smooth
from opdgrpo.report.plots import Panel, render
from opdgrpo.report.savings import best_point
from opdgrpo.report.uncertainty import FAILS, HOLDS, UNMEASURED

from .base import StudyReport

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from opdgrpo.report.plots import Panel, PlotContext


class ComparisonReport(StudyReport[ComparisonEntry]):
    """S1-style figure: GRPO vs external-teacher OPD per domain."""
    def figures(self, entry: ComparisonEntry, ctx: PlotContext) -> dict[str, Figure]:
        """GRPO vs external-teacher OPD, one panel per compared domain (in-domain accuracy)."""
        title = f"{self.name}: {entry.get('title', self.name)}"
        return {f"{self.name}_accuracy": render(_comparison_panels(entry, ctx, "accuracy"), title)}


def _comparison_panels(study: ComparisonEntry, ctx: PlotContext, value: str) -> list[Panel]:

    ylabel = "held-out accuracy (%)" if value == "accuracy" else "mean response length (tokens)"
    panels = []
    for comp in study.get("comparisons", []):
        domain = comp["domain"]
        panel = Panel(title=f"{domain}", ylabel=ylabel)
        runs = [(ctx.label(comp["grpo"]), comp["grpo"], "-")]
        runs += [(str(lbl), run, "--") for lbl, run in comp.get("opd", {}).items()]
        for label, run, ls in runs:
            panel.lines.append(ctx.line(run, domain, label, value, linestyle=ls))
        base = study.get("base_length_run")
        if value == "mean_response_length" and base:
            panel.hlines.append((float(ctx.series(base, domain, value).y[0]), f"base student ({base}, step 0)"))
        panels.append(panel)
    return panels


def loses_per_flop(study: ComparisonEntry, curves: pd.DataFrame) -> tuple:
    """The S1 test over a comparison entry: for every domain and OPD teacher, GRPO's best accuracy within the FLOPs
    of OPD's peak (:func:`compared_budget`: its first budget where the peak is its start) is at least that peak,
    both read from curves smoothed over the entry's ``smooth_window`` points
    (:mod:`opdgrpo.report.matching`: a peak of raw points is the luckiest draw). Returns (ours, verdict,
    margin = worst GRPO - OPD gap, strict=False)."""
    window = int(study.get("smooth_window", DEFAULT_SMOOTH_WINDOW))
    parts, failures, margins = [], [], []
    for comp in study.get("comparisons", []):
        domain = comp["domain"]
        grpo = domain_curve(curves, comp["grpo"], domain)
        g_acc = smooth(grpo["accuracy"].tolist(), window)
        g_best = best_point(grpo["cumulative_flops"], g_acc)
        for label, run in comp.get("opd", {}).items():
            opd = domain_curve(curves, run, domain)
            a_opd, f_opd = best_point(opd["cumulative_flops"], smooth(opd["accuracy"].tolist(), window))
            budget = compared_budget(f_opd, opd["cumulative_flops"].tolist())
            g_within = max(a for f, a in zip(grpo["cumulative_flops"], g_acc) if f <= budget)
            ok = g_within >= a_opd - 1e-9
            margins.append(g_within - a_opd)
            at = (f"at {format_flops(f_opd)}" if budget == f_opd
                  else f"at its start, compared at its first budget, {format_flops(budget)}")
            parts.append(
                f"{domain}, {label}: OPD peak {format_pct(a_opd)} {at} vs GRPO "
                f"{format_pct(g_within)} within that budget (GRPO best {format_pct(g_best[0])} at "
                f"{format_flops(g_best[1])})"
            )
            if not ok:
                failures.append(f"{domain}/{label}")
    return _loses_verdict(parts, failures, margins, window)


def compared_budget(peak_flops: float, opd_flops: list[float]) -> float:
    """The FLOPs GRPO is compared within: those of OPD's peak, or, where the peak is OPD's start (0 FLOPs), its first
    evaluation after it. OPD had that budget to improve and did not; comparing at 0 FLOPs would set GRPO's step-0
    evaluation against the same evaluation of the same base model, a tie that says nothing about either method."""
    if peak_flops > 0:
        return peak_flops
    return next((f for f in sorted(opd_flops) if f > 0), peak_flops)


def _loses_verdict(parts: list[str], failures: list[str], margins: list[float], window: int) -> tuple:

    if not parts:
        return "no comparisons in the spec", f"{UNMEASURED}: the study lists no comparisons"
    parts[-1] += f" (curves smoothed over {window} points)"
    verdict = HOLDS if not failures else f"{FAILS}: OPD's peak beats GRPO at equal FLOPs on {', '.join(failures)}"
    return "; ".join(parts), verdict, min(margins), False
