"""S4: two-domain consolidation (conf/study/s4.yaml): GRPO experts on math and code, multi-teacher OPD of the
experts, against joint GRPO on the instance mix. Claims and savings: :mod:`opdgrpo.plan.studies.consolidation`."""

from __future__ import annotations

from opdgrpo.plan.studies.base import ClaimDef
from opdgrpo.plan.studies.consolidation import ConsolidationStudy, PaperSavings


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
        "target > 0 (S4-savings), both runs reaching the target when their smoothed mix accuracy comes within the "
        "tolerance of it. The target is joint GRPO's best smoothed mix accuracy (the paper's direction) when joint "
        "GRPO gained at least min_joint_gain_se (3) standard errors over its start, else the distillation's best "
        "(read the other way); a run that never reaches it gives a bound (<=, >=), which decides a seed only where it "
        "settles the sign; joint GRPO's start already at the pipeline's best gives -inf. Distillation FLOPs / experts' "
        "FLOPs < the study's share_threshold (S4-share; 15% by default, about twice the paper's 5.2% and 8.0%, the "
        "'small fraction' tested), inconclusive where the distillation reached nothing beyond its start. Accuracy of a "
        "domain = mean of its held-out sets."
    )
    direction_tests_rank = 40


STUDY = S4()
