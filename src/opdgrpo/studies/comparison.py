"""Shared base of S1 and S1b: per domain, the student's GRPO run against OPD runs from external teachers.

Both studies write the same report-spec entry (:class:`ComparisonEntry`), cost rows, figure (one panel per
compared domain) and accuracy-per-FLOP test (:func:`loses_per_flop`); they differ in the teachers they plan and in
S1b's extra length claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from .base import CostSheet, Study, check_smooth_window

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from opdgrpo.report.plots import Panel, PlotContext


class Comparison(TypedDict):
    """One compared domain: its GRPO run and the OPD runs set against it."""

    domain: str
    grpo: str
    opd: dict[str, str]          # legend label ("OPD teacher_m") -> OPD run
    teacher: NotRequired[str]    # S1b: the external teacher's own GRPO run (listed in the cost rows, not counted)


class ComparisonEntry(TypedDict):
    """Report-spec entry of S1 and S1b."""

    title: str
    comparisons: list[Comparison]
    base_length_run: NotRequired[str | None]   # never planned; a hand-written spec may name the base student's run
    smooth_window: NotRequired[int]            # peaks read from centred moving averages over this many points


class ComparisonStudy(Study[ComparisonEntry]):
    """S1-style study: GRPO vs external-teacher OPD per domain."""

    run_keys = frozenset({"grpo", "opd", "teacher", "base_length_run"})

    def validate(self, cfg: dict[str, Any]) -> None:
        """``smooth_window`` must be odd (a centred window); the schema checked the rest."""
        check_smooth_window(cfg, self.name)

    def cost_rows(self, entry: ComparisonEntry, sheet: CostSheet) -> None:
        """Each run, and OPD's multiple of GRPO; a GRPO-trained teacher's own run listed as not counted."""
        for c in entry["comparisons"]:
            d = c["domain"]
            sheet.add(f"GRPO ({d})", [c["grpo"]])
            for label, run in c["opd"].items():
                sheet.add(f"{label} ({d})", [run])
                sheet.add(f"{label} / GRPO ({d})", [run, c["grpo"]], "x", sheet.cost(run) / sheet.cost(c["grpo"]))
            if c.get("teacher"):
                sheet.add(f"teacher's own GRPO ({d}, not counted)", [c["teacher"]])

    def figures(self, entry: ComparisonEntry, ctx: PlotContext) -> dict[str, Figure]:
        """GRPO vs external-teacher OPD, one panel per compared domain (in-domain accuracy)."""
        from opdgrpo.report.plots import render

        title = f"{self.name}: {entry.get('title', self.name)}"
        return {f"{self.name}_accuracy": render(_comparison_panels(entry, ctx, "accuracy"), title)}


def _comparison_panels(study: ComparisonEntry, ctx: PlotContext, value: str) -> list[Panel]:
    from opdgrpo.report.plots import Panel

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


def window_key(block: Mapping[str, Any]) -> dict[str, int]:
    """The ``smooth_window`` a study's conf block sets, for its report-spec entry (none: the report's default)."""
    return {"smooth_window": int(block["smooth_window"])} if block.get("smooth_window") is not None else {}


def loses_per_flop(study: ComparisonEntry, curves: pd.DataFrame) -> tuple:
    """The S1 test over a comparison entry: for every domain and OPD teacher, GRPO's best accuracy within the FLOPs
    of OPD's peak is at least that peak, both read from curves smoothed over the entry's ``smooth_window`` points
    (:mod:`opdgrpo.report.matching`: a peak of raw points is the luckiest draw). Returns (ours, verdict,
    margin = worst GRPO - OPD gap, strict=False)."""
    from opdgrpo.report.curves import domain_curve, format_flops, format_pct
    from opdgrpo.report.matching import DEFAULT_SMOOTH_WINDOW, smooth
    from opdgrpo.report.savings import best_point

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
            g_within = max(a for f, a in zip(grpo["cumulative_flops"], g_acc) if f <= f_opd)
            ok = g_within >= a_opd - 1e-9
            margins.append(g_within - a_opd)
            parts.append(
                f"{domain}, {label}: OPD peak {format_pct(a_opd)} at {format_flops(f_opd)} vs GRPO "
                f"{format_pct(g_within)} within that budget (GRPO best {format_pct(g_best[0])} at "
                f"{format_flops(g_best[1])})"
            )
            if not ok:
                failures.append(f"{domain}/{label}")
    return _loses_verdict(parts, failures, margins, window)


def _loses_verdict(parts: list[str], failures: list[str], margins: list[float], window: int) -> tuple:
    from opdgrpo.report.uncertainty import FAILS, HOLDS, UNMEASURED

    if not parts:
        return "no comparisons in the spec", f"{UNMEASURED}: the study lists no comparisons"
    parts[-1] += f" (curves smoothed over {window} points)"
    verdict = HOLDS if not failures else f"{FAILS}: OPD's peak beats GRPO at equal FLOPs on {', '.join(failures)}"
    return "; ".join(parts), verdict, min(margins), False
