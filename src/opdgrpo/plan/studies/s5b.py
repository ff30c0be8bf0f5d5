"""S5b: one external teacher (not a domain expert) distilled into the base student on all four domains at once
(conf/study/s5b.yaml).

**S5b**: a domain *collapses* when the OPD run's final held-out accuracy is below half its step-0 accuracy (the
paper's 0% on math and code is the extreme case); the claim holds when more than half of the domains collapse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from opdgrpo.plan.naming import into, study_student
from opdgrpo.plan.studies.base import ClaimDef, CostSheet, Study

if TYPE_CHECKING:
    from opdgrpo.plan.planner import Planner


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


STUDY = S5b()
