"""S3: self-teacher OPD (conf/study/s3.yaml). The teacher is the student's own GRPO checkpoint in the domain;
distillation restarts from the base student with each of ``rollouts_per_prompt`` (1 and 8 in the paper).

Every curve is read smoothed and a target counts as reached within the evaluation's noise
(:mod:`opdgrpo.report.matching`, keys ``smooth_window``, ``tolerance_se``, ``tolerance``): the teacher's accuracy =
the spec's teacher run's smoothed accuracy at its final evaluation point, on the study's domain (the mean of its last
``window`` points); ``F_grpo`` / ``F_opd(n)`` = FLOPs at which the smoothed curve of the GRPO run / of the OPD
run with ``n`` rollouts per prompt first reaches that accuracy less the slack (``tolerance``/100 + ``tolerance_se``
x SE, the standard error of one evaluation on the domain's held-out sets, clustered by prompt), linearly interpolated.
ratio(n) = F_grpo / F_opd(n). The teacher's own GRPO FLOPs are excluded, as in the paper.

* **S3-n1** holds iff ratio(n_min) > 1;
* **S3-n8** holds iff ratio(n_max) > 1 and ratio(n_min) > ratio(n_max).

A run that never reaches it needs more than its whole run, so each ratio is a figure or a range (GRPO never: at
least GRPO's total / F_opd(n); OPD never: at most F_grpo / OPD's total; both: unsettled), and ratio(n_min) >
ratio(n_max) is F_opd(n_min) < F_opd(n_max). Over seeds one monotone interval of the log-ratio margins decides,
whatever each seed gives (:mod:`opdgrpo.report.studies.s3`). A run that reaches the teacher at its step-0 evaluation
(smoothing only looks back, so only where the initial student is within tolerance of the teacher) makes the ratios
undefined: "not measured", naming that step 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from opdgrpo.plan.naming import into, study_student
from opdgrpo.plan.studies.base import ClaimDef, CostSheet, Study, check_smooth_window, matching_keys

if TYPE_CHECKING:
    from opdgrpo.plan.planner import Planner


class S3Entry(TypedDict):
    """Report-spec entry of S3."""

    title: str
    domain: str
    grpo: str                    # the student's GRPO run ...
    teacher: str                 # ... which is also the self-teacher
    opd: dict[str, str]          # rollouts per prompt (as a string) -> OPD run
    tolerance: NotRequired[float]  # accuracy points below the teacher still counted as reaching it
    smooth_window: NotRequired[int]  # evaluation points in the trailing moving average (absent: the default)
    tolerance_se: NotRequired[float]  # standard errors of one evaluation below the teacher still counted
    eval_sizes: NotRequired[dict[str, dict[str, list[float]]]]  # the teacher run's held-out sizes (attached by the report)


class S3(Study[S3Entry]):
    name = "S3"
    keys = frozenset({"domain", "student", "rollouts_per_prompt", "smooth_window", "tolerance_se", "tolerance"})
    claims = (
        ClaimDef(
            "S3-n1", "S3",
            "Self-teacher OPD with 1 rollout/prompt reaches the teacher's accuracy with far fewer FLOPs than GRPO",
            "OPD 0.2 EFLOP vs GRPO 10.1 EFLOP to the teacher's avg@16 (about 50x); teacher's GRPO cost excluded",
        ),
        ClaimDef(
            "S3-n8", "S3",
            "The advantage shrinks but remains at 8 rollouts/prompt",
            "about 6x fewer FLOPs than GRPO at the default 8 rollouts per prompt",
        ),
    )
    direction_tests = (
        "**S3** - ratio(n) = FLOPs for GRPO to first reach the teacher's final accuracy / FLOPs for OPD with n "
        "rollouts/prompt to first reach it (smoothed curves, reached within the evaluation's standard error, linear "
        "interpolation between evaluation points); S3-n1 holds iff "
        "ratio(n_min) > 1, S3-n8 iff ratio(n_max) > 1 and ratio(n_min) > ratio(n_max), with n_min, n_max the spec's "
        "fewest and most rollouts per prompt (1 and 8 in the paper). A run that never reaches the teacher bounds its "
        "ratio (more FLOPs than its whole run), and a bound settles a seed only when it excludes 1."
    )
    direction_tests_rank = 30
    run_keys = frozenset({"grpo", "teacher", "opd"})

    def plan(self, planner: Planner, s: Mapping[str, Any], seed: int) -> S3Entry:
        """The student's GRPO run (the teacher), then OPD from it into the base student at each rollout count."""
        d, st = s["domain"], study_student(s)
        grpo = planner.grpo_expert(self.name, d, seed, st)
        opd = {}
        for n in s["rollouts_per_prompt"]:
            label = f"OPD self n={n}"
            opd[str(n)] = planner.add_run(f"opd-self_n{n}-{into(st)}{d}-s{seed}", self.name, "opd", [d], seed, f"base:{st}",
                                      {d: f"run:{grpo.id}"}, {"rollouts_per_prompt": n}, label=label).id
        return S3Entry(title=s["title"], domain=d, grpo=grpo.id, teacher=grpo.id, opd=opd, **matching_keys(s))

    def validate(self, cfg: dict[str, Any]) -> None:
        """``smooth_window`` must be odd (a trailing mean on an evaluation point); the schema checked the rest."""
        check_smooth_window(cfg, self.name)

    def cost_rows(self, entry: S3Entry, sheet: CostSheet) -> None:
        """The distillation runs without their self-teacher, and the teacher's GRPO against each."""
        sheet.add("GRPO = the self-teacher (not counted in distillation)", [entry["grpo"]])
        for n, run in entry["opd"].items():
            sheet.add(f"distillation, {n} rollout(s)/prompt, teacher excluded", [run])
            sheet.add(f"GRPO / distillation n={n}", [entry["grpo"], run], "x", sheet.cost(entry["grpo"]) / sheet.cost(run))


STUDY = S3()
