"""S3: self-teacher OPD (conf/study/s3.yaml). The teacher is the student's own GRPO checkpoint in the domain;
distillation restarts from the base student with each of ``rollouts_per_prompt`` (1 and 8 in the paper).

Every curve is read smoothed and a target counts as reached within the evaluation's noise
(:mod:`opdgrpo.report.matching`, keys ``smooth_window``, ``tolerance_se``, ``tolerance``): the teacher's accuracy =
the spec's teacher run's smoothed accuracy at its final evaluation point, on the study's domain (the mean of its last
(window + 1) / 2 points); ``F_grpo`` / ``F_opd(n)`` = FLOPs at which the smoothed curve of the GRPO run / of the OPD
run with ``n`` rollouts per prompt first reaches that accuracy less the slack (``tolerance``/100 + ``tolerance_se``
x SE, the binomial standard error of one evaluation on the domain's held-out sets), linearly interpolated.
ratio(n) = F_grpo / F_opd(n). The teacher's own GRPO FLOPs are excluded, as in the paper.

* **S3-n1** holds iff ratio(n_min) > 1;
* **S3-n8** holds iff ratio(n_max) > 1 and ratio(n_min) > ratio(n_max).

If GRPO never reaches it, F_grpo > its final FLOPs is used as a bound; ratio(n_min) > ratio(n_max) is then still
decided, as it is equivalent to F_opd(n_min) < F_opd(n_max). An OPD run that never reaches it fails its test
(ratio 0); a teacher no better than the initial student (reached at 0 FLOPs) makes the ratio undefined: "not
measured".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from .base import ClaimDef, CostSheet, Study, Verdicts, check_smooth_window, into, matching_keys, study_student

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from opdgrpo.plan import Planner
    from opdgrpo.report.plots import PlotContext


class S3Entry(TypedDict):
    """Report-spec entry of S3."""

    title: str
    domain: str
    grpo: str                    # the student's GRPO run ...
    teacher: str                 # ... which is also the self-teacher
    opd: dict[str, str]          # rollouts per prompt (as a string) -> OPD run
    tolerance: NotRequired[float]  # accuracy points below the teacher still counted as reaching it
    smooth_window: NotRequired[int]  # evaluation points in the centred moving average (absent: the default)
    tolerance_se: NotRequired[float]  # standard errors of one evaluation below the teacher still counted
    eval_sizes: NotRequired[dict[str, dict[str, list[int]]]]  # the teacher run's held-out sizes (attached by the report)


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
        "fewest and most rollouts per prompt (1 and 8 in the paper)."
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
        """``smooth_window`` must be odd (a centred window); the schema checked the rest."""
        check_smooth_window(cfg, self.name)

    def attach(self, entry: S3Entry, runs_dir: Path) -> None:
        """The teacher run's held-out sizes (n prompts, k per set), for the standard error of its accuracy."""
        from opdgrpo.report.matching import eval_sizes

        entry["eval_sizes"] = eval_sizes(Path(runs_dir) / entry["teacher"])

    def cost_rows(self, entry: S3Entry, sheet: CostSheet) -> None:
        """The distillation runs without their self-teacher, and the teacher's GRPO against each."""
        sheet.add("GRPO = the self-teacher (not counted in distillation)", [entry["grpo"]])
        for n, run in entry["opd"].items():
            sheet.add(f"distillation, {n} rollout(s)/prompt, teacher excluded", [run])
            sheet.add(f"GRPO / distillation n={n}", [entry["grpo"], run], "x", sheet.cost(entry["grpo"]) / sheet.cost(run))

    def figures(self, entry: S3Entry, ctx: PlotContext) -> dict[str, Figure]:
        """GRPO vs self-teacher OPD at each rollout count, with the teacher's final accuracy as a line. The
        distillation curves exclude the teacher's own GRPO FLOPs, as in the paper."""
        from opdgrpo.report.matching import MatchRule, smooth
        from opdgrpo.report.plots import STEP0_CAPTION, Panel, render

        key, domain = self.name, entry["domain"]
        panel = Panel(title=domain, ylabel="held-out accuracy (%)")
        panel.lines.append(ctx.line(entry["grpo"], domain, ctx.label(entry["grpo"])))
        for n, run in sorted(entry.get("opd", {}).items(), key=lambda kv: _as_int(kv[0])):
            suffix = "rollout" if str(n) == "1" else "rollouts"
            panel.lines.append(ctx.line(run, domain, f"self-teacher OPD, {n} {suffix}/prompt", linestyle="--"))
        teacher, window = entry["teacher"], MatchRule.of(entry).window
        final = smooth(list(ctx.series(teacher, domain).y), window)[-1]  # as the claim reads it
        panel.hlines.append((float(final), f"teacher ({teacher}) final accuracy, smoothed over {window} points"))
        caption = STEP0_CAPTION + " OPD FLOPs exclude the teacher's own GRPO training, as in the paper."
        return {f"{key}_accuracy": render([panel], f"{key}: {entry.get('title', key)}", caption)}

    def evaluate(self, entry: S3Entry, curves: pd.DataFrame,
                 savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
        """FLOPs to the self-teacher's accuracy, OPD (n rollouts) vs GRPO (see the module docstring)."""
        from opdgrpo.report.curves import domain_curve, format_flops, format_pct
        from opdgrpo.report.matching import MatchRule, mix_se, smooth
        from opdgrpo.report.savings import first_crossing_flops

        domain, rule = entry["domain"], MatchRule.of(entry)

        def reached(run: str) -> float | None:
            c = domain_curve(curves, run, domain)
            return first_crossing_flops(c["cumulative_flops"], smooth(c["accuracy"].tolist(), rule.window), target)

        teacher_acc = smooth(domain_curve(curves, entry["teacher"], domain)["accuracy"].tolist(), rule.window)[-1]
        se = mix_se(teacher_acc, entry.get("eval_sizes"), [domain])
        target = teacher_acc - rule.slack(se)
        f_grpo = reached(entry["grpo"])
        grpo_total = float(domain_curve(curves, entry["grpo"], domain)["cumulative_flops"].iloc[-1])
        se_txt = f", 1 SE = {100 * se:.2f} pts" if se is not None else ""
        head = (f"teacher ({entry['teacher']}) {format_pct(teacher_acc)} (smoothed over {rule.window} points; reached "
                f"at >= {format_pct(target)}{se_txt}); GRPO reached it at ") + (
            format_flops(f_grpo) if f_grpo is not None else f"never (> {format_flops(grpo_total)})"
        )
        opd_runs = sorted(entry.get("opd", {}).items(), key=lambda kv: int(str(kv[0])))
        if not opd_runs:
            return {}
        f_opd = {int(str(n)): reached(run) for n, run in opd_runs}
        ratios = _Ratios(f_grpo, grpo_total, f_opd)
        n1 = int(str(opd_runs[0][0]))
        out: Verdicts = {"S3-n1": ratios.n1_verdict(head, n1)}
        if len(opd_runs) > 1:
            out["S3-n8"] = ratios.n8_verdict(head, n1, int(str(opd_runs[-1][0])))
        return out


class _Ratios:
    """S3's FLOP ratios to the teacher's accuracy: F_grpo (or GRPO's total as a bound) over F_opd(n)."""

    def __init__(self, f_grpo: float | None, grpo_total: float, f_opd: dict[int, float | None]):
        self.f_grpo, self.grpo_total, self.f_opd = f_grpo, grpo_total, f_opd

    def text(self, n: int) -> tuple[str, float | None, str | None]:
        """(text, ratio or lower bound, reason it is undefined)."""
        from opdgrpo.report.curves import format_flops

        fo = self.f_opd[n]
        if fo is None:
            return f"OPD n={n} never reached it", None, f"OPD with {n} rollout(s)/prompt never reached the teacher"
        if fo <= 0:
            return (f"OPD n={n} at 0 FLOPs", None,
                    "the teacher is no better than the initial student (reached at 0 FLOPs)")
        if self.f_grpo is None:
            r = self.grpo_total / fo
            return f"OPD n={n} at {format_flops(fo)}, ratio > {r:.1f}x", r, None
        r = self.f_grpo / fo
        return f"OPD n={n} at {format_flops(fo)}, ratio {r:.1f}x", r, None

    def n1_verdict(self, head: str, n1: int) -> tuple:
        """S3-n1: ratio(n_min) > 1."""
        from opdgrpo.report.uncertainty import FAILS, HOLDS, UNMEASURED

        text1, r1, why1 = self.text(n1)
        if why1 is not None and self.f_opd[n1] is None:
            return (f"{head}; {text1}", f"{FAILS}: {why1}")
        if why1 is not None:
            return (f"{head}; {text1}", f"{UNMEASURED}: {why1}")
        return (f"{head}; {text1}", HOLDS if r1 > 1 else f"{FAILS}: ratio {r1:.2f} <= 1", math.log(r1), True)

    def n8_verdict(self, head: str, n1: int, n8: int) -> tuple:
        """S3-n8: ratio(n_max) > 1 and ratio(n_min) > ratio(n_max)."""
        from opdgrpo.report.uncertainty import FAILS, HOLDS, UNMEASURED

        f_opd = self.f_opd
        text1, r1, why1 = self.text(n1)
        text8, r8, why8 = self.text(n8)
        ours = f"{head}; {text1}; {text8}"
        zero = [n for n in (n1, n8) if f_opd[n] is not None and f_opd[n] <= 0]
        never = [n for n in (n1, n8) if f_opd[n] is None]
        if zero:
            return (ours, f"{UNMEASURED}: {why1 if n1 in zero else why8}")
        if never:  # a run that never reaches the teacher has ratio 0: the n_max test cannot pass
            return (ours, f"{FAILS}: {why1 if n1 in never else why8}")
        # Both ratios share the numerator F_grpo, so ratio(n_min) > ratio(n_max) <=> F_opd(n_min) < F_opd(n_max).
        above_one = r8 > 1 if self.f_grpo is not None else self.grpo_total >= f_opd[n8]
        smaller = f_opd[n1] < f_opd[n8]
        margin = min(math.log(r8), math.log(r1 / r8)) if self.f_grpo is not None else None
        if above_one and smaller:
            return (ours, HOLDS, margin, True)
        why = [] if above_one else [f"ratio(n={n8}) <= 1"]
        why += [] if smaller else [f"ratio(n={n1}) <= ratio(n={n8})"]
        return (ours, f"{FAILS}: {' and '.join(why)}", margin, True)


def _as_int(value: Any) -> float:
    """Sort key of a rollout count written as a string; non-numbers last."""
    try:
        return float(int(str(value)))
    except ValueError:
        return math.inf


STUDY = S3()
