"""S5: S4 on four domains (conf/study/s5.yaml): one GRPO expert per domain, multi-teacher OPD of the four experts,
against joint GRPO on the four-domain mix. Claims and savings: :mod:`opdgrpo.plan.studies.consolidation`."""

from __future__ import annotations

from opdgrpo.plan.studies.base import ClaimDef
from opdgrpo.plan.studies.consolidation import ConsolidationStudy, PaperSavings


class S5(ConsolidationStudy):
    name = "S5"
    paper = PaperSavings(savings=0.316, distill_share=0.080, expert_eflop=14.4, distill_eflop=1.15)
    claims = (
        ClaimDef(
            "S5-share", "S5",
            "Distilling four domain experts costs a small fraction of training them",
            "experts 14.4 EFLOP, distillation 1.15 EFLOP (8.0% of the experts' cost)",
        ),
        ClaimDef(
            "S5-savings", "S5",
            "Experts + multi-teacher OPD match joint GRPO on the four-domain mix with fewer total FLOPs",
            "31.6% fewer total FLOPs than joint GRPO on the instance mix (about 15.55 vs 22.7 EFLOP)",
        ),
    )
    direction_tests = "**S5** - as S4 on four domains."
    direction_tests_rank = 60


STUDY = S5()
