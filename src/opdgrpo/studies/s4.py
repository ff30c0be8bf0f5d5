"""S4: two-domain consolidation (conf/study/s4.yaml): GRPO experts on math and code, multi-teacher OPD of the
experts, against joint GRPO on the instance mix. Claims and savings: :mod:`opdgrpo.studies.consolidation`."""

from __future__ import annotations

from .base import ClaimDef
from .consolidation import ConsolidationStudy, PaperSavings


class S4(ConsolidationStudy):
    name = "S4"
    paper = PaperSavings(savings=0.420, distill_share=0.052, expert_eflop=10.7, distill_eflop=0.55)
    claims = (
        ClaimDef(
            "S4-share", "S4",
            "Distilling two domain experts into one student costs a small fraction of training them",
            "experts 10.7 EFLOP, distillation 0.55 EFLOP (5.2% of the experts' cost)",
        ),
        ClaimDef(
            "S4-savings", "S4",
            "Experts + multi-teacher OPD match joint GRPO on the math+code mix with fewer total FLOPs",
            "42.0% fewer total FLOPs than joint GRPO (about 11.25 vs 19.4 EFLOP)",
        ),
    )
    direction_tests = (
        "**S4** - savings = 1 - (experts' final FLOPs + distillation FLOPs to the target) / joint GRPO's FLOPs to the "
        "target > 0 (S4-savings), the target being joint GRPO's best mix accuracy on its smoothed curve and both runs "
        "reaching it when their smoothed curves come within the tolerance of it; distillation FLOPs / experts' FLOPs "
        "< the study's share_threshold (S4-share; 15% by default, about twice the paper's 5.2% and 8.0%, the 'small "
        "fraction' tested). Accuracy of a domain = mean of its held-out sets."
    )
    direction_tests_rank = 40


STUDY = S4()
