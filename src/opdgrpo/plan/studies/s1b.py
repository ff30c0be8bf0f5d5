"""S1b: the external teacher further trained with GRPO in the domain, then distilled (conf/study/s1b.yaml).

The teacher's own GRPO run is planned under the study label ``S1b-teacher`` and not counted in the
distillation's FLOPs, as in the paper.

* **S1b-acc**: the S1 test (:func:`~opdgrpo.plan.studies.comparison.loses_per_flop`) with the GRPO-trained teacher.
* **S1b-len**: OPD's mean response length at its final evaluation point > GRPO's at its final point (domain mean
  over held-out sets). The paper says "often", so it holds iff true for more than half of the domain x teacher pairs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opdgrpo.plan.naming import into, study_student
from opdgrpo.plan.studies.base import ClaimDef
from opdgrpo.plan.studies.comparison import Comparison, ComparisonEntry, ComparisonStudy, window_key

if TYPE_CHECKING:
    from opdgrpo.plan.planner import Planner


class S1b(ComparisonStudy):
    name = "S1b"
    keys = frozenset({"domains", "teacher", "teacher_steps", "student", "smooth_window"})
    claims = (
        ClaimDef(
            "S1b-acc", "S1b",
            "With the teacher further trained by GRPO, OPD still loses to GRPO per training FLOP",
            "OPD still generally loses to GRPO per training FLOP",
        ),
        ClaimDef(
            "S1b-len", "S1b",
            "External-teacher OPD inflates the student's response length",
            "external-teacher OPD often inflates response length",
        ),
    )
    direction_tests = (
        "**S1b-len** - OPD's final mean response length > GRPO's final, in more than half of S1b's pairs (the paper "
        "says 'often')."
    )
    direction_tests_rank = 20

    def plan(self, planner: Planner, s: Mapping[str, Any], seed: int) -> ComparisonEntry:
        """Per domain: the student's GRPO run, the teacher's own GRPO run, and OPD from that trained teacher."""
        comparisons, t, st = [], s["teacher"], study_student(s)
        for d in s["domains"]:
            grpo = planner.grpo_expert(self.name, d, seed, st)
            teacher = planner.add_run(f"grpo-{t}-{d}-s{seed}", f"{self.name}-teacher", "grpo", [d], seed, f"base:{t}",
                                  method_overrides={"steps": s.get("teacher_steps")}, label=f"GRPO {t} (teacher)")
            label = f"OPD {t}+GRPO"
            opd = planner.add_run(f"opd-{t}_grpo-{into(st)}{d}-s{seed}", self.name, "opd", [d], seed, f"base:{st}",
                              {d: f"run:{teacher.id}"}, label=label)
            comparisons.append(Comparison(domain=d, grpo=grpo.id, opd={label: opd.id}, teacher=teacher.id))
        return ComparisonEntry(title=s["title"], comparisons=comparisons, **window_key(s))


STUDY = S1b()
