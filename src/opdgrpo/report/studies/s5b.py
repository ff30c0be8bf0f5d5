"""The report's half of S5b (the study and its rule: :mod:`opdgrpo.plan.studies.s5b`): one panel per domain, and how
many domains collapsed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opdgrpo.plan.studies.s5b import S5bEntry
from opdgrpo.report.curves import domain_curve, format_pct
from opdgrpo.report.plots import Panel, render
from opdgrpo.report.uncertainty import FAILS, HOLDS, resolution_floor

from .base import StudyReport, Verdicts

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from opdgrpo.report.plots import PlotContext


class S5bReport(StudyReport[S5bEntry]):
    name = "S5b"

    def figures(self, entry: S5bEntry, ctx: PlotContext) -> dict[str, Figure]:
        """One panel per domain (does it collapse?)."""
        run = entry["opd"]
        panels = []
        for domain in entry["domains"]:
            panel = Panel(title=domain, ylabel="held-out accuracy (%)")
            panel.lines.append(ctx.line(run, domain, ctx.label(run), linestyle="--"))
            panels.append(panel)
        return {f"{self.name}_accuracy": render(panels, f"{self.name}: {entry.get('title', self.name)}")}

    def evaluate(self, entry: S5bEntry, curves: pd.DataFrame,
                 savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
        """Count the domains whose final accuracy fell below half of step 0's."""
        run, domains = entry["opd"], list(entry["domains"])
        parts, collapsed = [], 0
        for d in domains:
            c = domain_curve(curves, run, d)
            first, last = float(c["accuracy"].iloc[0]), float(c["accuracy"].iloc[-1])
            down = last < 0.5 * first  # a domain at 0% from the start has nothing to collapse
            collapsed += down
            parts.append(f"{d} {format_pct(first)} -> {format_pct(last)}{' (collapsed)' if down else ''}")
        share = collapsed / len(domains)
        ours = f"step 0 -> final: {'; '.join(parts)} ({collapsed}/{len(domains)} collapsed)"
        # the margin moves in steps of 1 / domains: its rounding error (sd step / sqrt 12) is the interval's least
        # spread over seeds, so seeds that collapse the same count do not decide on a zero-width interval alone
        return {"S5b": (ours, HOLDS if share > 0.5 else f"{FAILS}: {collapsed}/{len(domains)} domains collapsed",
                        share - 0.5, True, resolution_floor(1.0 / len(domains)))}


REPORT = S5bReport()
