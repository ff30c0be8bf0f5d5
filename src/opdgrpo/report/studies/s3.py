"""The report's half of S3 (the study and its rule: :mod:`opdgrpo.plan.studies.s3`): the teacher run's held-out sizes,
GRPO against self-teacher OPD with the teacher's final accuracy as a line, and the FLOP ratios S3-n1 and S3-n8."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opdgrpo.plan.studies.s3 import S3Entry
from opdgrpo.report.curves import domain_curve, format_flops, format_pct
from opdgrpo.report.matching import MatchRule, eval_sizes, mix_se, smooth, start_of
from opdgrpo.report.plots import STEP0_CAPTION, Panel, render
from opdgrpo.report.savings import first_crossing_flops
from opdgrpo.report.uncertainty import FAILS, HOLDS, UNMEASURED

from .base import StudyReport, Verdicts

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from opdgrpo.report.plots import PlotContext


class S3Report(StudyReport[S3Entry]):
    name = "S3"

    def attach(self, entry: S3Entry, runs_dir: Path) -> None:
        """The teacher run's held-out sizes (n prompts, k per set), for the standard error of its accuracy."""
        entry["eval_sizes"] = eval_sizes(Path(runs_dir) / entry["teacher"])

    def figures(self, entry: S3Entry, ctx: PlotContext) -> dict[str, Figure]:
        """GRPO vs self-teacher OPD at each rollout count, with the teacher's final accuracy as a line. The
        distillation curves exclude the teacher's own GRPO FLOPs, as in the paper."""
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
        domain, rule = entry["domain"], MatchRule.of(entry)
        teacher_acc = smooth(domain_curve(curves, entry["teacher"], domain)["accuracy"].tolist(), rule.window)[-1]
        se = mix_se(teacher_acc, entry.get("eval_sizes"), [domain])
        target = teacher_acc - rule.slack(se)
        step0: dict[str, str] = {}

        def reached(run: str, who: str) -> float | None:
            c = domain_curve(curves, run, domain)
            acc = c["accuracy"].tolist()
            flops = first_crossing_flops(c["cumulative_flops"], smooth(acc, rule.window), target)
            start = start_of(acc)
            if flops is not None and flops <= 0 and start >= target:  # step 0 itself within tolerance of the teacher
                step0[who] = (f"the teacher is no better than the initial student: {who}'s step 0, "
                              f"{format_pct(start)}, is within tolerance of the teacher's {format_pct(teacher_acc)} "
                              f"(reached at >= {format_pct(target)})")
            return flops

        f_grpo = reached(entry["grpo"], "GRPO")
        grpo_total = float(domain_curve(curves, entry["grpo"], domain)["cumulative_flops"].iloc[-1])
        se_txt = f", 1 SE = {100 * se:.2f} pts" if se is not None else ""
        head = (f"teacher ({entry['teacher']}) {format_pct(teacher_acc)} (smoothed over {rule.window} points; reached "
                f"at >= {format_pct(target)}{se_txt}); GRPO reached it at ") + (
            _at(f_grpo) if f_grpo is not None else f"never (> {format_flops(grpo_total)})"
        )
        opd_runs = sorted(entry.get("opd", {}).items(), key=lambda kv: int(str(kv[0])))
        if not opd_runs:
            return {}
        f_opd = {int(str(n)): reached(run, f"OPD n={n}") for n, run in opd_runs}
        ratios = _Ratios(f_grpo, grpo_total, f_opd, step0)
        n1 = int(str(opd_runs[0][0]))
        out: Verdicts = {"S3-n1": ratios.n1_verdict(head, n1)}
        if len(opd_runs) > 1:
            out["S3-n8"] = ratios.n8_verdict(head, n1, int(str(opd_runs[-1][0])))
        return out


def _at(flops: float) -> str:
    """Where a curve reached the teacher: its FLOPs, or "step 0" (its first evaluation, before any training)."""
    return "step 0 (0 FLOPs)" if flops <= 0 else format_flops(flops)


class _Ratios:
    """S3's FLOP ratios to the teacher's accuracy: F_grpo (or GRPO's total as a bound) over F_opd(n).

    A run that reaches the teacher at its step-0 evaluation (``step0``: who -> why) leaves the ratios undefined: with
    smoothing that only looks back, that happens only where the initial student already is within tolerance of the
    teacher, so there is nothing to reach and neither method costs anything (no ratio of 0 or infinity, no log(0))."""
    def __init__(self, f_grpo: float | None, grpo_total: float, f_opd: dict[int, float | None],
                 step0: Mapping[str, str] | None = None):
        self.f_grpo, self.grpo_total, self.f_opd = f_grpo, grpo_total, f_opd
        self.step0 = dict(step0 or {})

    def at_start(self, *ns: int) -> str | None:
        """Why the ratios of ``ns`` are undefined: GRPO or OPD(n) reached the teacher at step 0; None otherwise."""
        for who in ("GRPO", *(f"OPD n={n}" for n in ns)):
            if who in self.step0:
                return self.step0[who]
        zero = [n for n in ns if self.f_opd[n] is not None and self.f_opd[n] <= 0]
        if zero or (self.f_grpo is not None and self.f_grpo <= 0):
            return "a run reached the teacher at its first evaluation, before any training"
        return None

    def text(self, n: int) -> tuple[str, float | None, str | None]:
        """(text, ratio or lower bound, reason it is undefined)."""
        fo = self.f_opd[n]
        if fo is None:
            return f"OPD n={n} never reached it", None, f"OPD with {n} rollout(s)/prompt never reached the teacher"
        if fo <= 0 or (self.f_grpo is not None and self.f_grpo <= 0):
            return f"OPD n={n} at {_at(fo)}, no ratio", None, self.at_start(n)
        if self.f_grpo is None:
            r = self.grpo_total / fo
            return f"OPD n={n} at {format_flops(fo)}, ratio > {r:.1f}x", r, None
        r = self.f_grpo / fo
        return f"OPD n={n} at {format_flops(fo)}, ratio {r:.1f}x", r, None

    def n1_verdict(self, head: str, n1: int) -> tuple:
        """S3-n1: ratio(n_min) > 1."""
        text1, r1, why1 = self.text(n1)
        zero = self.at_start(n1)
        if zero is not None:
            return (f"{head}; {text1}", f"{UNMEASURED}: {zero}")
        if why1 is not None:
            return (f"{head}; {text1}", f"{FAILS}: {why1}")
        return (f"{head}; {text1}", HOLDS if r1 > 1 else f"{FAILS}: ratio {r1:.2f} <= 1", math.log(r1), True)

    def n8_verdict(self, head: str, n1: int, n8: int) -> tuple:
        """S3-n8: ratio(n_max) > 1 and ratio(n_min) > ratio(n_max)."""
        f_opd = self.f_opd
        text1, r1, why1 = self.text(n1)
        text8, r8, why8 = self.text(n8)
        ours = f"{head}; {text1}; {text8}"
        zero = self.at_start(n1, n8)
        never = [n for n in (n1, n8) if f_opd[n] is None]
        if zero is not None:
            return (ours, f"{UNMEASURED}: {zero}")
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


REPORT = S3Report()
