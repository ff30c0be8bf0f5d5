"""Shared base of S4 and S5: one GRPO expert per domain, then multi-teacher OPD of the experts into the base
student, against joint GRPO on the mix of the same domains. The paper's headline: matched-FLOP savings
(:func:`opdgrpo.report.savings.compute_savings`, DESIGN.md's contract).

* **<S>-share**: distill share (distillation FLOPs to the target / experts' final FLOPs) < ``share_threshold``
  (15% by default, :data:`opdgrpo.report.matching.DEFAULT_SHARE_THRESHOLD`: the paper's "small fraction" is 5.2% and
  8.0%; any share below 100% would not test it). Margin: threshold - share.
* **<S>-savings**: savings = 1 - (experts' final FLOPs + distillation FLOPs to the target) / joint GRPO's FLOPs to
  the target > 0, the target being joint GRPO's best *smoothed* mix accuracy and "reaching" it coming within the
  evaluation's standard error (:mod:`opdgrpo.report.matching`, keys ``smooth_window``, ``tolerance_se``,
  ``tolerance``). A distillation that never reaches the target means the pipeline never matches joint GRPO: the
  claim does not hold.

A subclass sets the study's name, its claim rows and the paper's numbers (:class:`PaperSavings`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NotRequired, TypedDict

from .base import CostSheet, Study, Verdicts, check_smooth_window, into, matching_keys, study_student

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from opdgrpo.plan import Planner
    from opdgrpo.report.plots import Panel, PlotContext


class ConsolidationEntry(TypedDict):
    """Report-spec entry of S4 and S5."""

    title: str
    domains: list[str]
    joint: str            # joint GRPO on the mix
    distill: str          # multi-teacher OPD of the experts
    experts: list[str]    # one GRPO run per domain, in ``domains`` order
    tolerance: float      # accuracy points below the joint target still counted as matched
    smooth_window: NotRequired[int]       # evaluation points in the centred moving average (absent: the default)
    tolerance_se: NotRequired[float]      # standard errors of one evaluation below the target still matched
    min_joint_gain_se: NotRequired[float]  # joint GRPO's best is the target only past this gain (standard errors)
    share_threshold: NotRequired[float]   # <S>-share holds below this distillation / experts share
    eval_sizes: NotRequired[dict[str, dict[str, list[int]]]]  # the joint run's held-out sizes (attached by the report)


@dataclass(frozen=True)
class PaperSavings:
    """The paper's figures for a consolidation study (PAPER.md), shown beside ours in savings.csv/.md."""

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
        },
    }

    def validate(self, cfg: dict[str, Any]) -> None:
        """``smooth_window`` must be odd (a centred window); the schema checked the rest."""
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
                              {"steps": s.get("distill_steps")}, label="multi-teacher OPD", train_overrides=train)
        return ConsolidationEntry(title=s["title"], domains=domains, joint=joint.id, distill=distill.id,
                                  experts=[e.id for e in experts], **matching_keys(s))

    def attach(self, entry: ConsolidationEntry, runs_dir: Path) -> None:
        """The joint run's held-out sizes (n prompts, k per set), for the standard error of the target."""
        from opdgrpo.report.matching import eval_sizes

        entry["eval_sizes"] = eval_sizes(Path(runs_dir) / entry["joint"])

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

    def savings_row(self, spec: Mapping[str, Any], entry: ConsolidationEntry, curves: pd.DataFrame,
                    final_flops: Mapping[str, float]) -> dict[str, Any]:
        """The savings row of one per-seed entry: matched-FLOP savings with domains, paper values and status."""
        from opdgrpo.report.curves import instance_seed
        from opdgrpo.report.matching import DEFAULT_SHARE_THRESHOLD

        domains, rule, result = matched_savings(self.name, entry, curves, final_flops)
        return {
            "study": self.name,
            "domains": "+".join(domains),
            **savings_fields(result, rule),
            "paper_savings": self.paper.savings,
            "paper_distill_share": self.paper.distill_share,
            "share_threshold": float(entry.get("share_threshold", DEFAULT_SHARE_THRESHOLD)),
            "seed": instance_seed(dict(spec), dict(entry)),
        }

    def figures(self, entry: ConsolidationEntry, ctx: PlotContext) -> dict[str, Figure]:
        """Joint GRPO vs experts + multi-teacher OPD; one panel per domain, then a mix panel.

        Domain panels show each run on its own FLOPs. The mix panel charges the pipeline its full cost: the
        distillation curve is shifted right by the experts' total FLOPs (marked), and the matched points of the
        savings are starred.
        """
        from opdgrpo.report.curves import run_curve
        from opdgrpo.report.plots import STEP0_CAPTION, Panel, render

        domains = list(entry["domains"])
        joint, distill, experts = entry["joint"], entry["distill"], list(entry["experts"])
        runs = [(joint, "-", ctx.label(joint)), (distill, "--", ctx.label(distill))]
        for e in experts:  # experts often share a label ("GRPO"): name their training domains
            trained = run_curve(ctx.curves, e)["train_domains"].iloc[0]
            runs.append((e, ":", f"{ctx.label(e)} expert ({trained})"))
        panels = []
        for domain in domains:
            panel = Panel(title=domain, ylabel="held-out accuracy (%)")
            for run, ls, label in runs:
                try:
                    panel.lines.append(ctx.line(run, domain, label, linestyle=ls, color_key=run))
                except ValueError:
                    continue  # an expert need not evaluate the other domains
            panels.append(panel)
        panels.append(_mix_panel(self.name, entry, ctx))
        caption = (
            STEP0_CAPTION + " Mix panel: the distillation curve is shifted right by the experts' total training FLOPs "
            "(dash-dot line), so its x is the whole pipeline's cost."
        )
        return {f"{self.name}_accuracy": render(panels, f"{self.name}: {entry.get('title', self.name)}", caption)}

    def evaluate(self, entry: ConsolidationEntry, curves: pd.DataFrame,
                 savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
        """Distillation share and matched-FLOP savings, read from the study's savings row."""
        return _consolidation_verdicts(self.name, savings)


def matched_savings(key: str, entry: Mapping[str, Any], curves: pd.DataFrame,
                    final_flops: Mapping[str, float]) -> tuple[list[str], Any, dict[str, Any]]:
    """(domains, matching rule, :func:`~opdgrpo.report.savings.compute_savings`'s result) of one consolidation
    entry (``joint``, ``distill``, ``experts``, the matching keys): S4/S5's savings row and each cell of S6's map."""
    from opdgrpo.report.curves import ReportInputError, run_curve
    from opdgrpo.report.matching import MatchRule
    from opdgrpo.report.savings import compute_savings

    for field in ("joint", "distill", "experts"):
        if field not in entry:
            raise ReportInputError(f"report spec: study {key} is missing key '{field}'")
    try:
        rule = MatchRule.of(entry)
    except ValueError as exc:
        raise ReportInputError(f"report spec: study {key}: {exc}") from exc
    domains = list(entry.get("domains") or dict.fromkeys(run_curve(curves, entry["joint"])["eval_domain"]))
    result = compute_savings(
        curves, entry["joint"], entry["distill"], list(entry["experts"]), domains, rule.tolerance_points,
        {e: final_flops[e] for e in entry["experts"] if e in final_flops},
        smooth_window=rule.window, tolerance_se=rule.tolerance_se, min_joint_gain_se=rule.min_joint_gain_se,
        eval_sizes=entry.get("eval_sizes"),
    )
    return domains, rule, result


def savings_fields(result: Mapping[str, Any], rule: Any) -> dict[str, Any]:
    """The savings.csv fields of one :func:`~opdgrpo.report.savings.compute_savings` result: the deciding
    reading, its sign and status, the other direction's target and savings, and the matching rule."""
    from opdgrpo.report.savings import SAVINGS_KEYS, savings_sign

    other = result.get("other") or {}
    sign = savings_sign(result.get("savings"), result.get("savings_bound", ""))
    bound = result.get("savings_bound", "")
    return {
        **{k: result.get(k) for k in SAVINGS_KEYS},
        "savings_sign": sign,
        "joint_gain": result.get("joint_gain"),
        "min_joint_gain": result.get("min_joint_gain"),
        "other_direction": other.get("direction"),
        "other_target_accuracy": other.get("target_accuracy"),
        "other_savings": other.get("savings"),
        "other_savings_bound": other.get("savings_bound", ""),
        "status": ("figure" if not bound else f"{bound} bound") if result.get("savings") is not None else "none",
        "reason": result.get("reason", ""),
        "tolerance_points": rule.tolerance_points,
        "smooth_window": rule.window,
        "tolerance_se": rule.tolerance_se,
        "min_joint_gain_se": rule.min_joint_gain_se,
    }


def _mix_panel(key: str, entry: ConsolidationEntry, ctx: PlotContext) -> Panel:
    """The mix panel: joint GRPO, and the distillation shifted right by the experts' FLOPs, with the matched points."""
    from opdgrpo.report.curves import format_flops, run_curve
    from opdgrpo.report.plots import Panel

    domains = list(entry["domains"])
    joint, distill, experts = entry["joint"], entry["distill"], list(entry["experts"])
    sav = ctx.savings.get(key, {})
    expert_flops = sav.get("expert_flops")
    if expert_flops is None:
        expert_flops = float(sum(run_curve(ctx.curves, e)["cumulative_flops"].max() for e in experts))
    mix = Panel(title=f"mix ({' + '.join(domains)}), pipeline cost", ylabel="mix accuracy (%)")
    mix.lines.append(ctx.line(joint, domains, ctx.label(joint), color_key=joint))
    shifted = ctx.line(distill, domains, f"{ctx.label(distill)} (+ experts' FLOPs)", linestyle="--", color_key=distill)
    shifted.flops = shifted.flops + expert_flops
    mix.lines.append(shifted)
    mix.vlines.append((expert_flops, f"experts' total {format_flops(expert_flops)}"))
    if sav.get("target_accuracy") is not None:
        level = sav.get("threshold_accuracy", sav["target_accuracy"])  # the target less the tolerance
        whose = "joint GRPO" if sav.get("direction") == "joint" else "the distillation"
        mix.hlines.append((100.0 * sav["target_accuracy"], f"target: {whose}'s best (smoothed)"))
        reached = [sav.get("joint_flops"), sav.get("pipeline_flops") if sav.get("distill_flops") is not None else None]
        for i, flops in enumerate(f for f in reached if f is not None):   # a side that never reached it: no point
            mix.points.append((flops, 100.0 * level, "reached (target - tolerance)" if i == 0 else "_nolegend_"))
    return mix


def _consolidation_verdicts(key: str, savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
    """``<key>-share`` and ``<key>-savings`` from the study's savings row (none without a row): a figure gives a
    margin, a bound a verdict where it settles the sign and "inconclusive" where it does not."""
    import math

    from opdgrpo.report.curves import format_flops
    from opdgrpo.report.matching import DEFAULT_SHARE_THRESHOLD
    from opdgrpo.report.savings import format_savings, savings_sign
    from opdgrpo.report.uncertainty import FAILS, HOLDS, INCONCLUSIVE, UNMEASURED

    sav = savings.get(key)
    if sav is None:
        return {}
    out: Verdicts = {}
    sv, bound = sav.get("savings"), sav.get("savings_bound") or ""
    read = f"{sav.get('direction')} direction{_tolerance_text(sav)}"
    share, share_bound = sav.get("distill_share"), sav.get("share_bound") or ""
    limit = float(sav.get("share_threshold") or DEFAULT_SHARE_THRESHOLD)
    share_txt = (f"experts {format_flops(sav.get('expert_flops'))}, distillation {format_flops(sav.get('distill_flops'))}"
                 f"{' (never reached the target)' if share_bound else ''}")
    if share is None:
        out[f"{key}-share"] = (share_txt, f"{UNMEASURED}: experts' FLOPs are 0")
    else:
        share_txt += f" ({'>= ' if share_bound else ''}{100 * share:.1f}% of experts; threshold {100 * limit:g}%)"
        if share_bound:
            out[f"{key}-share"] = (share_txt, f"{FAILS}: share >= {100 * limit:g}%" if share >= limit else
                                   f"{INCONCLUSIVE}: the distillation never reached the target, so its share is "
                                   "a lower bound under the threshold")
        elif not sav.get("distill_flops") or (sv is not None and math.isinf(sv)):
            out[f"{key}-share"] = (share_txt, f"{INCONCLUSIVE}: the distillation reached nothing beyond its start or "
                                              "joint GRPO's, so there is no cost of consolidation to share")
        else:
            out[f"{key}-share"] = (share_txt, HOLDS if share < limit else f"{FAILS}: share >= {100 * limit:g}%",
                                   limit - share, True)
    sign = savings_sign(sv, bound)
    txt = f"savings {format_savings(sv, bound)} ({read}): {sav.get('reason', '')}"
    if sv is None:
        out[f"{key}-savings"] = (txt, f"{UNMEASURED}: {sav.get('reason', 'savings undefined')}")
    elif not bound and math.isfinite(sv):
        out[f"{key}-savings"] = (txt, HOLDS if sv > 0 else f"{FAILS}: the pipeline costs more than joint GRPO", sv, True)
    elif sign == "positive":
        out[f"{key}-savings"] = (txt, HOLDS)
    elif sign == "negative":
        out[f"{key}-savings"] = (txt, f"{FAILS}: the pipeline costs more than joint GRPO")
    else:
        out[f"{key}-savings"] = (txt, f"{INCONCLUSIVE}: the bound {format_savings(sv, bound)} does not settle the sign")
    return out


def _tolerance_text(sav: Mapping[str, Any]) -> str:
    """`` (reached at >= 41.2%: smoothed over 3 points, 1 SE = 1.3 pts)``: how the match was read, for claims.md."""
    from opdgrpo.report.curves import format_pct

    threshold, se = sav.get("threshold_accuracy"), sav.get("eval_se")
    if threshold is None:
        return ""
    se_txt = f", 1 SE = {100 * float(se):.2f} pts" if se is not None and se == se else ""
    return f" (reached at >= {format_pct(threshold)}: smoothed over {sav.get('smooth_window')} points{se_txt})"
