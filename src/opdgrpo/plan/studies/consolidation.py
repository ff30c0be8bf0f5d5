"""Shared base of S4 and S5: one GRPO expert per domain, then multi-teacher OPD of the experts into the base
student, against joint GRPO on the mix of the same domains. The paper's headline: matched-FLOP savings
(:func:`opdgrpo.report.savings.compute_savings`; docs/method.md).

* **<S>-share**: distill share (distillation FLOPs to the target / experts' final FLOPs) < ``share_threshold``
  (15% by default, :data:`opdgrpo.report.matching.DEFAULT_SHARE_THRESHOLD`: the paper's "small fraction" is 5.2% and
  8.0%; any share below 100% would not test it). Margin: threshold - share.
* **<S>-savings**: savings = 1 - (experts' final FLOPs + distillation FLOPs to the target) / joint GRPO's FLOPs to
  the target > 0, the target being joint GRPO's best *smoothed* mix accuracy and "reaching" it coming within the
  evaluation's standard error (:mod:`opdgrpo.report.matching`, keys ``smooth_window``, ``tolerance_se``,
  ``tolerance``). A distillation that never reaches the target means the pipeline never matches joint GRPO: the
  claim does not hold.

A subclass sets the study's name, its claim rows and the paper's numbers (:class:`PaperSavings`); the report reads
the savings and judges both claims in :mod:`opdgrpo.report.studies.consolidation`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NotRequired, TypedDict

from opdgrpo.plan.naming import into, study_student
from opdgrpo.plan.studies.base import CostSheet, Study, check_smooth_window, matching_keys

if TYPE_CHECKING:
    from opdgrpo.plan.planner import Planner


class ConsolidationEntry(TypedDict):
    """Report-spec entry of S4 and S5."""

    title: str
    domains: list[str]
    joint: str            # joint GRPO on the mix
    distill: str          # multi-teacher OPD of the experts
    experts: list[str]    # one GRPO run per domain, in ``domains`` order
    tolerance: float      # accuracy points below the joint target still counted as matched
    smooth_window: NotRequired[int]       # evaluation points in the trailing moving average (absent: the default)
    tolerance_se: NotRequired[float]      # standard errors of one evaluation below the target still matched
    min_joint_gain_se: NotRequired[float]  # joint GRPO's best is the target only past this gain (standard errors)
    share_threshold: NotRequired[float]   # <S>-share holds below this distillation / experts share
    eval_sizes: NotRequired[dict[str, dict[str, list[float]]]]  # the joint run's held-out sizes (attached by the report)


@dataclass(frozen=True)
class PaperSavings:
    """The paper's figures for a consolidation study (its tables), shown beside ours in savings.csv/.md."""

    savings: float         # 1 - pipeline / joint
    distill_share: float   # distillation / experts
    expert_eflop: float
    distill_eflop: float


class ConsolidationStudy(Study[ConsolidationEntry]):
    """Experts + multi-teacher OPD vs joint GRPO on the mix."""

    run_keys = frozenset({"joint", "distill", "experts"})
    keys = frozenset({"domains", "student", "joint_steps", "distill_steps", "mix", "tolerance", "smooth_window",
                      "tolerance_se", "min_joint_gain_se", "share_threshold"})
    paper: ClassVar[PaperSavings]
    schema = {
        "type": "object",
        "properties": {
            "share_threshold": {"type": "number", "exclusiveMinimum": 0, "maximum": 1,
                                "description": "<S>-share holds when distillation FLOPs / experts' FLOPs is below "
                                               "this (the paper's 'small fraction': 5.2% and 8.0%)"},
            "min_joint_gain_se": {"type": "number", "minimum": 0,
                                  "description": "joint GRPO's best is the savings target only when it gained this "
                                                 "many standard errors of one evaluation over its start; otherwise "
                                                 "the savings are read at the distillation's best (docs/method.md)"},
            "distill_eval_every": {"type": ["integer", "null"], "minimum": 1,
                                   "description": "the distillation's evaluation cadence in steps; null or absent: "
                                                  "train.eval_every. A distillation of a few dozen steps needs a "
                                                  "finer one than the GRPO runs for its curve to have points to "
                                                  "smooth and to read the FLOPs to the target from"},
        },
    }

    def validate(self, cfg: dict[str, Any]) -> None:
        """``smooth_window`` must be odd (a trailing mean on an evaluation point); the schema checked the rest."""
        check_smooth_window(cfg, self.name)

    def plan(self, planner: Planner, s: Mapping[str, Any], seed: int) -> ConsolidationEntry:
        """One GRPO expert per domain (shared with S1/S3 and the other consolidation study), joint GRPO on the mix,
        multi-teacher OPD of the experts."""
        domains, st = list(s["domains"]), study_student(s)
        mix = "+".join(domains)
        train = {"mix": s.get("mix")}
        experts = [planner.grpo_expert(self.name, d, seed, st) for d in domains]
        joint = planner.add_run(f"grpo-{st}-{mix}-s{seed}", self.name, "grpo", domains, seed, f"base:{st}",
                            method_overrides={"steps": s.get("joint_steps")}, label="joint GRPO", train_overrides=train)
        distill = planner.add_run(f"opd-experts-{into(st)}{mix}-s{seed}", self.name, "opd", domains, seed, f"base:{st}",
                              {d: f"run:{e.id}" for d, e in zip(domains, experts)},
                              {"steps": s.get("distill_steps")}, label="multi-teacher OPD",
                              train_overrides={**train, "eval_every": s.get("distill_eval_every")})
        return ConsolidationEntry(title=s["title"], domains=domains, joint=joint.id, distill=distill.id,
                                  experts=[e.id for e in experts], **matching_keys(s))

    def cost_rows(self, entry: ConsolidationEntry, sheet: CostSheet) -> None:
        """The experts' total, the distillation, its share of the experts, joint GRPO, the pipeline (experts +
        distillation) and the savings 1 - pipeline / joint of the full runs."""
        experts, distill, joint = list(entry["experts"]), entry["distill"], entry["joint"]
        e, dist, j = sum(sheet.cost(r) for r in experts), sheet.cost(distill), sheet.cost(joint)
        sheet.add(f"experts' total ({len(experts)} GRPO)", experts)
        sheet.add("distillation", [distill])
        sheet.add("distillation / experts", [distill, *experts], "%", 100 * dist / e)
        sheet.add("joint GRPO", [joint])
        sheet.add("pipeline = experts + distillation", [*experts, distill])
        sheet.add("savings 1 - pipeline / joint (full runs)", [*experts, distill, joint], "%", 100 * (1 - (e + dist) / j))
