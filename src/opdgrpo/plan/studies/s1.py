"""S1: external-teacher OPD against GRPO in each domain, one OPD run per teacher size (conf/study/s1.yaml).

Claim **S1**: for every compared domain and every OPD teacher, let OPD peak at accuracy ``a_opd`` (its best
evaluation point on its curve smoothed over ``smooth_window`` points, :mod:`opdgrpo.report.matching`, the first if
tied) at FLOPs ``F_opd``; GRPO's best smoothed accuracy over its evaluation points with cumulative FLOPs <= ``F_opd``
must be >= ``a_opd`` (accuracy of a domain = mean of its held-out sets). Holds iff true for all pairs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opdgrpo.plan.naming import into, study_student
from opdgrpo.plan.studies.base import ClaimDef
from opdgrpo.plan.studies.comparison import Comparison, ComparisonEntry, ComparisonStudy, window_key

if TYPE_CHECKING:
    from opdgrpo.plan.planner import Planner


class S1(ComparisonStudy):
    name = "S1"
    keys = frozenset({"domains", "teachers", "student", "smooth_window"})
    claims = (
        ClaimDef(
            "S1", "S1",
            "External-teacher OPD loses to GRPO per training FLOP (every domain, every teacher)",
            "code, Qwen3-4B-Base: GRPO 46.4% at 0.6 EFLOP; OPD with 8B teacher peaks at 36.7% at 45.7 EFLOP, "
            "with 32B teacher at 28.7% at 68.7 EFLOP (114x the compute, 17.7 points lower)",
        ),
    )
    direction_tests = (
        "**S1/S1b-acc** - for each domain and OPD teacher, GRPO's best accuracy at cumulative FLOPs <= "
        "those of OPD's peak (of OPD's first evaluation after its start, where the peak is its start: comparing at 0 "
        "FLOPs would set one base model's step 0 against itself) is >= OPD's peak accuracy, both on curves smoothed "
        "over the study's smooth_window evaluation points (holds iff for all pairs)."
    )
    direction_tests_rank = 10

    def plan(self, planner: Planner, s: Mapping[str, Any], seed: int) -> ComparisonEntry:
        """Per domain: the student's GRPO run (shared with S3/S4/S5) and one OPD run per external teacher."""
        comparisons, st = [], study_student(s)
        for d in s["domains"]:
            grpo = planner.grpo_expert(self.name, d, seed, st)
            opd = {}
            for t in s["teachers"]:
                label = f"OPD {t}"
                opd[label] = planner.add_run(f"opd-{t}-{into(st)}{d}-s{seed}", self.name, "opd", [d], seed, f"base:{st}",
                                         {d: f"base:{t}"}, label=label).id
            comparisons.append(Comparison(domain=d, grpo=grpo.id, opd=opd))
        return ComparisonEntry(title=s["title"], comparisons=comparisons, **window_key(s))


STUDY = S1()
