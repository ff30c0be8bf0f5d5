"""S5b: one external teacher (not a domain expert) distilled into the base student on all four domains at once
(conf/study/s5b.yaml).

**S5b**: a domain *collapses* when the OPD run's final held-out accuracy is below half its step-0 accuracy (the
paper's 0% on math and code is the extreme case); the claim holds when more than half of the domains collapse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from .base import ClaimDef, CostSheet, Study, Verdicts, into, study_student

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from opdgrpo.plan import Planner
    from opdgrpo.report.plots import PlotContext


class S5bEntry(TypedDict):
    """Report-spec entry of S5b."""

    title: str
    domains: list[str]
    teacher_model: str
    opd: str


class S5b(Study[S5bEntry]):
    name = "S5b"
    keys = frozenset({"domains", "teacher", "steps", "mix"})
    claims = (
        ClaimDef(
            "S5b", "S5b",
            "OPD from a single external teacher on all four domains collapses on most of them",
            "collapses on most domains, 0% on math and code (external 8B teacher)",
        ),
    )
    direction_tests = (
        "**S5b** - a domain collapses when the final held-out accuracy is below half of step 0's; holds iff more "
        "than half collapse."
    )
    direction_tests_rank = 70
    run_keys = frozenset({"opd"})

    def plan(self, planner: Planner, s: Mapping[str, Any], seed: int) -> S5bEntry:
        """One OPD run from the external teacher on every domain at once (no experts)."""
        domains, t, st = list(s["domains"]), s["teacher"], study_student(s)
        mix = "+".join(domains)
        opd = planner.add_run(f"opd-{t}-{into(st)}{mix}-s{seed}", self.name, "opd", domains, seed, f"base:{st}",
                          {d: f"base:{t}" for d in domains}, {"steps": s.get("steps")}, label=f"OPD {t} (all domains)",
                          train_overrides={"mix": s.get("mix")})
        return S5bEntry(title=s["title"], domains=domains, teacher_model=t, opd=opd.id)

    def cost_rows(self, entry: S5bEntry, sheet: CostSheet) -> None:
        """The one run."""
        sheet.add(f"OPD {entry['teacher_model']} on {len(entry['domains'])} domains", [entry["opd"]])

    def figures(self, entry: S5bEntry, ctx: PlotContext) -> dict[str, Figure]:
        """One panel per domain (does it collapse?)."""
        from opdgrpo.report.plots import Panel, render

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
        from opdgrpo.report.curves import domain_curve, format_pct
        from opdgrpo.report.uncertainty import FAILS, HOLDS

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
        return {"S5b": (ours, HOLDS if share > 0.5 else f"{FAILS}: {collapsed}/{len(domains)} domains collapsed",
                        share - 0.5, True)}


STUDY = S5b()
