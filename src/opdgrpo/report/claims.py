"""``claims.md``: each paper claim of S1, S1b, S3 and S4 next to what this run measured, and whether it holds.

At tiny scale the magnitudes cannot match the paper's (tiny models, synthetic tasks), so each claim is reduced to a
*direction* test on our curves. The tests, exactly (accuracy of a domain = mean of its held-out sets; "first
reaches" = linearly interpolated as in :mod:`opdgrpo.report.savings`):

* **S1** (and **S1b-acc**, with the GRPO-trained teacher): for every compared domain and every OPD teacher, let OPD
  peak at accuracy ``a_opd`` (its best evaluation point, the first if tied) at FLOPs ``F_opd``; GRPO's best accuracy
  over its evaluation points with cumulative FLOPs <= ``F_opd`` must be >= ``a_opd``. Holds iff true for all pairs.
* **S1b-len**: OPD's mean response length at its final evaluation point > GRPO's at its final point (domain mean
  over held-out sets). The paper says "often", so it holds iff true for more than half of the domain x teacher
  pairs of S1b.
* **S3**: the teacher's accuracy = the spec's teacher run's accuracy at its final evaluation point, on the study's
  domain. ``F_grpo`` / ``F_opd(n)`` = FLOPs at which the GRPO run / the OPD run with ``n`` rollouts per prompt first
  reaches it (an optional study ``tolerance`` in points lowers the bar, default 0). ratio(n) = F_grpo / F_opd(n).
  **S3-n1** holds iff ratio(n_min) > 1; **S3-n8** holds iff ratio(n_max) > 1 and ratio(n_min) > ratio(n_max).
  The teacher's own GRPO FLOPs are excluded, as in the paper. If GRPO never reaches it, F_grpo > its final FLOPs
  is used as a bound; ratio(n_min) > ratio(n_max) is then still decided, as it is equivalent to F_opd(n_min) <
  F_opd(n_max). An OPD run that never reaches it fails its test (ratio 0); a teacher no better than the initial
  student (reached at 0 FLOPs) makes the ratio undefined: "not measured".
* **S4-share**: distill share (distillation FLOPs to the target / experts' final FLOPs) < 1.
  **S4-savings**: savings > 0, per DESIGN.md's matched-FLOP contract. A distillation that never reaches the target
  means the pipeline never matches joint GRPO: the claim does not hold.

Verdicts are ``holds``, ``does not hold: <why>`` or ``not measured: <why>`` (study absent, a run lacks the domain).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from opdgrpo.report.curves import (
    ReportInputError,
    domain_accuracy,
    format_flops,
    format_pct,
    instance_seed,
    run_curve,
    study_instances,
)
from opdgrpo.report.savings import best_point, first_crossing_flops
from opdgrpo.report.uncertainty import INCONCLUSIVE, interval_verdict, mean_interval
from opdgrpo.runio import IN_DOMAIN_SET

HOLDS = "holds"
FAILS = "does not hold"
UNMEASURED = "not measured"


@dataclass(frozen=True)
class ClaimDef:
    """A paper claim: its id, what it says, and the paper's numbers."""

    id: str
    study: str
    claim: str
    paper: str


#: Every claim row of claims.md, in order. Later studies (S2, S5, S5b) add rows here and an evaluator below.
CLAIMS: list[ClaimDef] = [
    ClaimDef(
        "S1", "S1",
        "External-teacher OPD loses to GRPO per training FLOP (every domain, every teacher)",
        "code, Qwen3-4B-Base: GRPO 46.4% at 0.6 EFLOP; OPD with 8B teacher peaks at 36.7% at 45.7 EFLOP, "
        "with 32B teacher at 28.7% at 68.7 EFLOP (114x the compute, 17.7 points lower)",
    ),
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
    ClaimDef(
        "S2-in", "S2",
        "On every difficulty subset, GRPO's final in-domain accuracy beats OPD's peak",
        "all 8 math subsets (Qwen3-1.7B student, Qwen3-4B thinking teacher)",
    ),
    ClaimDef(
        "S2-heldout", "S2",
        "On held-out math, OPD finishes higher on the subsets the teacher solves least, GRPO on the rest",
        "OPD higher on the 3 subsets where the teacher solved the fewest prompts, GRPO on the other 5",
    ),
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
    ClaimDef(
        "S5b", "S5b",
        "OPD from a single external teacher on all four domains collapses on most of them",
        "collapses on most domains, 0% on math and code (external 8B teacher)",
    ),
]

DIRECTION_TESTS = (
    "Direction tests: **S1/S1b-acc** - for each domain and OPD teacher, GRPO's best accuracy at cumulative FLOPs <= "
    "those of OPD's peak is >= OPD's peak accuracy (holds iff for all pairs). **S1b-len** - OPD's final mean response "
    "length > GRPO's final, in more than half of S1b's pairs (the paper says 'often'). **S3** - ratio(n) = FLOPs "
    "for GRPO to first reach the teacher's final accuracy / FLOPs for OPD with n rollouts/prompt to first reach it (linear interpolation between "
    "evaluation points); S3-n1 holds iff ratio(n_min) > 1, S3-n8 iff ratio(n_max) > 1 and ratio(n_min) > ratio(n_max), "
    "with n_min, n_max the spec's fewest and most rollouts per prompt (1 and 8 in the paper). **S4** - "
    "savings = 1 - (experts' final FLOPs + distillation FLOPs to joint GRPO's best mix accuracy) / joint GRPO's FLOPs "
    "to that accuracy > 0 (S4-savings); distillation FLOPs / experts' FLOPs < 1 (S4-share). Accuracy of a domain = "
    "mean of its held-out sets. **S2-in** - on every subset GRPO's final accuracy on the subset's own prompts > OPD's "
    "peak there. **S2-heldout** - subsets ranked by the teacher's solve rate; OPD's final held-out accuracy > GRPO's on "
    "the lowest-ranked ones (3 in the paper), GRPO's >= OPD's on the rest. **S5** - as S4 on four domains. **S5b** - "
    "a domain collapses when the final held-out accuracy is below half of step 0's; holds iff more than half "
    "collapse. With several seeds each test gives a margin per seed (positive iff it holds): the claim holds when the "
    "95% t interval of the margin over seeds lies above 0, does not hold when it lies at or below 0, and is "
    "inconclusive when it spans 0; tests without a margin hold iff they hold for every seed, and are inconclusive when "
    "seeds disagree."
)

Verdicts = dict[str, tuple]  # claim id -> (ours, verdict) or (ours, verdict, margin, strict); see _combine


# ------------------------------------------------------------------------------------------------------- helpers
def _domain_curve(curves: pd.DataFrame, run: str, domain: str) -> pd.DataFrame:
    dom = domain_accuracy(run_curve(curves, run))
    dom = dom[dom["eval_domain"] == domain].sort_values("step", kind="stable")
    if dom.empty:
        raise ReportInputError(f"run '{run}' has no evaluation on domain '{domain}'")
    return dom


def _loses_per_flop(study: Mapping[str, Any], curves: pd.DataFrame) -> tuple:
    """The S1 test over a comparison study; returns (ours, verdict, margin = worst GRPO - OPD gap, strict=False)."""
    parts, failures, margins = [], [], []
    for comp in study.get("comparisons", []):
        domain = comp["domain"]
        grpo = _domain_curve(curves, comp["grpo"], domain)
        g_best = best_point(grpo["cumulative_flops"], grpo["accuracy"])
        for label, run in comp.get("opd", {}).items():
            opd = _domain_curve(curves, run, domain)
            a_opd, f_opd = best_point(opd["cumulative_flops"], opd["accuracy"])
            within = grpo[grpo["cumulative_flops"] <= f_opd]
            g_within = float(within["accuracy"].max())
            ok = g_within >= a_opd - 1e-9
            margins.append(g_within - a_opd)
            parts.append(
                f"{domain}, {label}: OPD peak {format_pct(a_opd)} at {format_flops(f_opd)} vs GRPO "
                f"{format_pct(g_within)} within that budget (GRPO best {format_pct(g_best[0])} at "
                f"{format_flops(g_best[1])})"
            )
            if not ok:
                failures.append(f"{domain}/{label}")
    if not parts:
        return "no comparisons in the spec", f"{UNMEASURED}: the study lists no comparisons"
    verdict = HOLDS if not failures else f"{FAILS}: OPD's peak beats GRPO at equal FLOPs on {', '.join(failures)}"
    return "; ".join(parts), verdict, min(margins), False


# ---------------------------------------------------------------------------------------------------- evaluators
def eval_s1(study: Mapping[str, Any], curves: pd.DataFrame, savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
    """S1: external-teacher OPD vs GRPO per FLOP."""
    return {"S1": _loses_per_flop(study, curves)}


def eval_s1b(study: Mapping[str, Any], curves: pd.DataFrame, savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
    """S1b: the S1 test with the GRPO-trained teacher, and response-length inflation."""
    out: Verdicts = {"S1b-acc": _loses_per_flop(study, curves)}
    parts, inflated, pairs = [], 0, 0
    for comp in study.get("comparisons", []):
        domain = comp["domain"]
        g_len = float(_domain_curve(curves, comp["grpo"], domain)["mean_response_length"].iloc[-1])
        for label, run in comp.get("opd", {}).items():
            o_len = float(_domain_curve(curves, run, domain)["mean_response_length"].iloc[-1])
            pairs += 1
            inflated += o_len > g_len
            parts.append(f"{domain}, {label}: final length OPD {o_len:.1f} vs GRPO {g_len:.1f} tokens")
    if pairs == 0:
        out["S1b-len"] = ("no comparisons in the spec", f"{UNMEASURED}: the study lists no comparisons")
    else:
        summary = f"OPD longer in {inflated}/{pairs} pairs"
        verdict = HOLDS if inflated > pairs / 2 else f"{FAILS}: {summary}"
        out["S1b-len"] = ("; ".join(parts) + f" ({summary})", verdict, inflated / pairs - 0.5, True)
    return out


def eval_s3(study: Mapping[str, Any], curves: pd.DataFrame, savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
    """S3: FLOPs to the self-teacher's accuracy, OPD (n rollouts) vs GRPO."""
    domain = study["domain"]
    teacher_acc = float(_domain_curve(curves, study["teacher"], domain)["accuracy"].iloc[-1])
    target = teacher_acc - float(study.get("tolerance", 0.0)) / 100.0
    grpo = _domain_curve(curves, study["grpo"], domain)
    f_grpo = first_crossing_flops(grpo["cumulative_flops"], grpo["accuracy"], target)
    grpo_total = float(grpo["cumulative_flops"].iloc[-1])
    head = f"teacher ({study['teacher']}) {format_pct(teacher_acc)}; GRPO reached it at " + (
        format_flops(f_grpo) if f_grpo is not None else f"never (> {format_flops(grpo_total)})"
    )
    opd_runs = sorted(study.get("opd", {}).items(), key=lambda kv: int(str(kv[0])))
    if not opd_runs:
        return {}
    f_opd: dict[int, float | None] = {}
    for n, run in opd_runs:
        c = _domain_curve(curves, run, domain)
        f_opd[int(str(n))] = first_crossing_flops(c["cumulative_flops"], c["accuracy"], target)

    def ratio_text(n: int) -> tuple[str, float | None, str | None]:
        """(text, ratio or lower bound, reason it is undefined)."""
        fo = f_opd[n]
        if fo is None:
            return f"OPD n={n} never reached it", None, f"OPD with {n} rollout(s)/prompt never reached the teacher"
        if fo <= 0:
            return (f"OPD n={n} at 0 FLOPs", None,
                    "the teacher is no better than the initial student (reached at 0 FLOPs)")
        if f_grpo is None:
            r = grpo_total / fo
            return f"OPD n={n} at {format_flops(fo)}, ratio > {r:.1f}x", r, None
        r = f_grpo / fo
        return f"OPD n={n} at {format_flops(fo)}, ratio {r:.1f}x", r, None

    out: Verdicts = {}
    n_min, n_max = opd_runs[0], opd_runs[-1]
    n1 = int(str(n_min[0]))
    text1, r1, why1 = ratio_text(n1)
    if why1 is not None and f_opd[n1] is None:
        out["S3-n1"] = (f"{head}; {text1}", f"{FAILS}: {why1}")
    elif why1 is not None:
        out["S3-n1"] = (f"{head}; {text1}", f"{UNMEASURED}: {why1}")
    else:
        out["S3-n1"] = (f"{head}; {text1}", HOLDS if r1 > 1 else f"{FAILS}: ratio {r1:.2f} <= 1", math.log(r1), True)
    if len(opd_runs) > 1:
        n8 = int(str(n_max[0]))
        text8, r8, why8 = ratio_text(n8)
        ours = f"{head}; {text1}; {text8}"
        zero = [n for n in (n1, n8) if f_opd[n] is not None and f_opd[n] <= 0]
        never = [n for n in (n1, n8) if f_opd[n] is None]
        if zero:
            out["S3-n8"] = (ours, f"{UNMEASURED}: {why1 if n1 in zero else why8}")
        elif never:  # a run that never reaches the teacher has ratio 0: the n_max test cannot pass
            out["S3-n8"] = (ours, f"{FAILS}: {why1 if n1 in never else why8}")
        else:
            # Both ratios share the numerator F_grpo, so ratio(n_min) > ratio(n_max) <=> F_opd(n_min) < F_opd(n_max).
            above_one = r8 > 1 if f_grpo is not None else grpo_total >= f_opd[n8]
            smaller = f_opd[n1] < f_opd[n8]
            margin = min(math.log(r8), math.log(r1 / r8)) if f_grpo is not None else None
            if above_one and smaller:
                out["S3-n8"] = (ours, HOLDS, margin, True)
            else:
                why = [] if above_one else [f"ratio(n={n8}) <= 1"]
                why += [] if smaller else [f"ratio(n={n1}) <= ratio(n={n8})"]
                out["S3-n8"] = (ours, f"{FAILS}: {' and '.join(why)}", margin, True)
    return out


def _consolidation(key: str, savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
    """S4/S5: distillation share and matched-FLOP savings, read from the study's savings row."""
    sav = savings.get(key)
    if sav is None:
        return {}
    expert, distill = sav.get("expert_flops"), sav.get("distill_flops")
    if distill is None:
        why = sav.get("reason", "the distillation never reached the target")
        share = (f"experts {format_flops(expert)}; distillation never reached the target", f"{UNMEASURED}: {why}")
        saving = (f"target {format_pct(sav.get('target_accuracy'))}, joint {format_flops(sav.get('joint_flops'))}; "
                  "pipeline never matched", f"{FAILS}: {why}")
        return {f"{key}-share": share, f"{key}-savings": saving}
    out: Verdicts = {}
    s = sav.get("distill_share")
    share_txt = f"experts {format_flops(expert)}, distillation {format_flops(distill)}"
    if s is None:
        out[f"{key}-share"] = (share_txt, f"{UNMEASURED}: experts' FLOPs are 0")
    else:
        out[f"{key}-share"] = (f"{share_txt} ({100 * s:.1f}% of experts)", HOLDS if s < 1 else f"{FAILS}: share >= 1", 1 - s, True)
    sv = sav.get("savings")
    txt = (f"pipeline {format_flops(sav.get('pipeline_flops'))} vs joint {format_flops(sav.get('joint_flops'))} "
           f"at target mix accuracy {format_pct(sav.get('target_accuracy'))}")
    if sv is None:
        out[f"{key}-savings"] = (txt, f"{UNMEASURED}: {sav.get('reason', 'savings undefined')}")
    else:
        more_or_less = "fewer" if sv >= 0 else "more"
        out[f"{key}-savings"] = (f"{100 * abs(sv):.1f}% {more_or_less} total FLOPs: {txt}",
                             HOLDS if sv > 0 else f"{FAILS}: the pipeline costs more than joint GRPO", sv, True)
    return out


def eval_s4(study: Mapping[str, Any], curves: pd.DataFrame, savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
    """S4: two-domain consolidation."""
    return _consolidation("S4", savings)


def eval_s5(study: Mapping[str, Any], curves: pd.DataFrame, savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
    """S5: four-domain consolidation."""
    return _consolidation("S5", savings)


def _in_domain_curve(curves: pd.DataFrame, run: str) -> pd.DataFrame:
    rows = run_curve(curves, run)
    rows = rows[rows["eval_set"] == IN_DOMAIN_SET].sort_values("step", kind="stable")
    if rows.empty:
        raise ReportInputError(f"run '{run}' has no in-domain evaluation (eval set '{IN_DOMAIN_SET}')")
    return rows


def eval_s2(study: Mapping[str, Any], curves: pd.DataFrame, savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
    """S2: per subset, GRPO's final in-domain accuracy vs OPD's in-domain peak; then who finishes higher on held-out.

    Subsets are ranked by the teacher's solve rate (``teacher_rate``, from the runs' ``done.json``); the
    ``low_teacher_subsets`` lowest are where the paper has OPD finishing higher on held-out math.
    """
    domain, subsets = study["domain"], list(study.get("subsets", []))
    if not subsets:
        return {}
    if any("teacher_rate" not in sub for sub in subsets):
        raise ReportInputError("S2: subsets lack the teacher's solve rate (the runs' done.json has no train_subset)")
    in_parts, in_fail, in_margins = [], [], []
    for sub in subsets:
        g_final = float(_in_domain_curve(curves, sub["grpo"])["accuracy"].iloc[-1])
        o_peak = float(_in_domain_curve(curves, sub["opd"])["accuracy"].max())
        in_margins.append(g_final - o_peak)
        in_parts.append(f"{sub['name']} {format_pct(g_final)} vs {format_pct(o_peak)}")
        if not g_final > o_peak:
            in_fail.append(sub["name"])
    n = len(subsets)
    out: Verdicts = {"S2-in": (
        f"GRPO final vs OPD peak, in-domain: {'; '.join(in_parts)} (GRPO higher on {n - len(in_fail)}/{n})",
        HOLDS if not in_fail else f"{FAILS}: OPD's peak is at least GRPO's final on {', '.join(in_fail)}",
        min(in_margins), True)}
    n_low = int(study.get("low_teacher_subsets", 3))
    ranked = sorted(subsets, key=lambda sub: (float(sub["teacher_rate"]), sub["name"]))
    low = {sub["name"] for sub in ranked[:n_low]}
    parts, mismatched, margins = [], [], []
    for sub in ranked:
        g = float(_domain_curve(curves, sub["grpo"], domain)["accuracy"].iloc[-1])
        o = float(_domain_curve(curves, sub["opd"], domain)["accuracy"].iloc[-1])
        winner = "OPD" if o > g else "GRPO"
        expected = "OPD" if sub["name"] in low else "GRPO"
        margins.append(o - g if expected == "OPD" else g - o)
        parts.append(f"{sub['name']} (teacher {100 * float(sub['teacher_rate']):.0f}%): {winner} "
                     f"{format_pct(max(o, g))} vs {format_pct(min(o, g))}")
        if winner != expected:
            mismatched.append(sub["name"])
    ours = (f"ranked by teacher solve rate: {'; '.join(parts)}; pattern (OPD on the {n_low} lowest, GRPO on the rest) "
            f"matched on {n - len(mismatched)}/{n}")
    out["S2-heldout"] = (ours, HOLDS if not mismatched else f"{FAILS}: not matched on {', '.join(mismatched)}",
                         min(margins), True)
    return out


def eval_s5b(study: Mapping[str, Any], curves: pd.DataFrame, savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
    """S5b: a domain *collapses* when the OPD run's final held-out accuracy is below half its step-0 accuracy
    (the paper's 0% on math and code is the extreme case). The claim holds when more than half of the domains
    collapse."""
    run, domains = study["opd"], list(study["domains"])
    parts, collapsed = [], 0
    for d in domains:
        c = _domain_curve(curves, run, d)
        first, last = float(c["accuracy"].iloc[0]), float(c["accuracy"].iloc[-1])
        down = last < 0.5 * first  # a domain at 0% from the start has nothing to collapse
        collapsed += down
        parts.append(f"{d} {format_pct(first)} -> {format_pct(last)}{' (collapsed)' if down else ''}")
    share = collapsed / len(domains)
    ours = f"step 0 -> final: {'; '.join(parts)} ({collapsed}/{len(domains)} collapsed)"
    return {"S5b": (ours, HOLDS if share > 0.5 else f"{FAILS}: {collapsed}/{len(domains)} domains collapsed",
                    share - 0.5, True)}


#: Study key -> evaluator filling that study's claim rows. Add S2/S5/S5b here (and their rows in :data:`CLAIMS`).
EVALUATORS: dict[str, Callable[[Mapping[str, Any], pd.DataFrame, Mapping[str, Mapping[str, Any]]], Verdicts]] = {
    "S1": eval_s1,
    "S1b": eval_s1b,
    "S3": eval_s3,
    "S2": eval_s2,
    "S4": eval_s4,
    "S5": eval_s5,
    "S5b": eval_s5b,
}


# ------------------------------------------------------------------------------------------------------- table
def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _savings_rows(savings_rows: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]]) -> list[Mapping]:
    if isinstance(savings_rows, Mapping):
        return [dict(row, study=key) for key, row in savings_rows.items()]
    return list(savings_rows)


def _savings_for(rows: list[Mapping[str, Any]], key: str, seed: Any) -> dict[str, Mapping[str, Any]]:
    """The savings row of study ``key`` for one seed (the only row when there is one)."""
    mine = [r for r in rows if r.get("study") == key]
    if len(mine) > 1:
        mine = [r for r in mine if r.get("seed") == seed] or mine[:1]
    return {key: mine[0]} if mine else {}


def _combine(per_seed: list[tuple]) -> tuple[str, str]:
    """Merge one claim's per-seed results ``(seed, ours, verdict[, margin, strict])`` into (ours, verdict).

    One seed: its own verdict. Several: when every seed gives a margin (a number that is > 0, or >= 0 when not
    strict, exactly when the claim holds for that seed), the verdict is the 95% t interval's over seeds (holds /
    does not hold / inconclusive, :func:`~opdgrpo.report.uncertainty.interval_verdict`). Otherwise it holds iff every
    seed holds, does not hold iff none does, and is inconclusive when seeds disagree.
    """
    if len(per_seed) == 1:
        return per_seed[0][1], per_seed[0][2]
    ours = "; ".join(f"seed {r[0]}: {r[1]}" for r in per_seed)
    verdicts = [r[2] for r in per_seed]
    unmeasured = [(r[0], r[2]) for r in per_seed if r[2].startswith(UNMEASURED)]

    def why(verdict: str) -> str:
        return verdict.split(":", 1)[1].strip() if ":" in verdict else verdict

    if unmeasured:
        return ours, f"{UNMEASURED} for seed {unmeasured[0][0]}: {why(unmeasured[0][1])}"
    margins = [r[3] if len(r) > 3 else None for r in per_seed]
    if all(m is not None and math.isfinite(m) for m in margins):
        mean, lo, hi = mean_interval(margins)
        strict = bool(per_seed[0][4])
        verdict = interval_verdict(lo, hi, 0.0, strict=strict)
        summary = f"margin {mean:+.3g}, 95% interval [{lo:+.3g}, {hi:+.3g}] over {len(per_seed)} seeds"
        return f"{summary}; {ours}", verdict if verdict != INCONCLUSIVE else f"{INCONCLUSIVE}: the interval spans 0"
    holding = sum(v == HOLDS for v in verdicts)
    if holding == len(verdicts):
        return ours, HOLDS
    if holding == 0:
        failing = next(r for r in per_seed if r[2] != HOLDS)
        return ours, f"{FAILS} for any of {len(per_seed)} seeds (seed {failing[0]}: {why(failing[2])})"
    return ours, f"{INCONCLUSIVE}: holds for {holding}/{len(verdicts)} seeds"


def evaluate_claims(
    spec: Mapping[str, Any],
    curves: pd.DataFrame,
    savings_rows: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
) -> list[tuple[ClaimDef, str, str]]:
    """Every claim of :data:`CLAIMS` with (ours, verdict); a missing study or run gives "not measured"."""
    studies = spec.get("studies", {}) or {}
    savings = _savings_rows(savings_rows)
    results: dict[str, tuple[str, str]] = {}
    for key, evaluator in EVALUATORS.items():
        if key not in studies:
            continue
        per_claim: dict[str, list[tuple[Any, str, str]]] = {}
        for inst in study_instances(studies[key]):
            seed = instance_seed(dict(spec), inst)
            try:
                found = evaluator(inst, curves, _savings_for(savings, key, seed))
            except (ReportInputError, KeyError, ValueError) as exc:
                why = f"the spec's {key} entry lacks key {exc}" if isinstance(exc, KeyError) else str(exc)
                found = {c.id: ("n/a", f"{UNMEASURED}: {why}") for c in CLAIMS if c.study == key}
            for cid, result in found.items():
                per_claim.setdefault(cid, []).append((seed, *result))
        results.update({cid: _combine(v) for cid, v in per_claim.items()})
    rows = []
    for c in CLAIMS:
        if c.id in results:
            ours, verdict = results[c.id]
        elif c.study not in studies:
            ours, verdict = "n/a", f"{UNMEASURED}: study {c.study} is not in the report spec"
        else:
            ours, verdict = "n/a", f"{UNMEASURED}: the spec's {c.study} entry lacks the runs this claim needs"
        rows.append((c, ours, verdict))
    return rows


def claims_table(
    spec: Mapping[str, Any],
    curves: pd.DataFrame,
    savings_rows: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
) -> str:
    """Markdown of claims.md: a header naming the profile, one row per paper claim, then the direction tests.

    ``savings_rows`` are the consolidation studies' :func:`~opdgrpo.report.savings.compute_savings` dicts, each
    with its ``study`` key (or a mapping study -> dict).
    """
    profile = spec.get("profile", "unknown")
    lines = [
        f"# Paper claims vs this reproduction (profile `{profile}`)",
        "",
        f"The *ours* column is measured from the run directories of this run (profile `{profile}`), not copied from "
        "the paper. Small profiles use tiny models on synthetic tasks, so compare directions, not magnitudes.",
        "",
        "| claim | paper | ours | holds? |",
        "|---|---|---|---|",
    ]
    for c, ours, verdict in evaluate_claims(spec, curves, savings_rows):
        lines.append(f"| **{c.id}** {_cell(c.claim)} | {_cell(c.paper)} | {_cell(ours)} | {_cell(verdict)} |")
    lines += ["", DIRECTION_TESTS, ""]
    unknown = [k for k in (spec.get("studies") or {}) if k not in EVALUATORS]
    if unknown:
        lines += [f"Studies without claim checks (skipped): {', '.join(unknown)}.", ""]
    return "\n".join(lines)
