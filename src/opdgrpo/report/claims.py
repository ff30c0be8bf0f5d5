"""``claims.md``: each paper claim next to what this run measured, and whether it holds.

At tiny scale the magnitudes cannot match the paper's (tiny models, synthetic tasks), so each claim is reduced to a
*direction* test on our curves. The claims, their tests and their paper numbers belong to the studies
(:mod:`opdgrpo.plan.studies`, one module each: :attr:`~opdgrpo.plan.studies.base.Study.claims`,
:attr:`~opdgrpo.plan.studies.base.Study.direction_tests`), and each study's evaluator to its report half
(:meth:`~opdgrpo.report.studies.base.StudyReport.evaluate`); this module runs every study's evaluator seed by
seed, merges the seeds' verdicts (:func:`_combine`) and writes the table. Accuracy of a domain = mean of its
held-out sets; "first reaches" = linearly interpolated as in :mod:`opdgrpo.report.savings`.

Verdicts are ``holds``, ``does not hold: <why>``, ``inconclusive: <why>`` or ``not measured: <why>`` (study absent,
a run lacks the domain). A verdict from one seed is labelled ``(indicative: one seed)`` and claims.md says so at the
top (:func:`seeds_note`); with 3 or more seeds the 95% interval over seeds decides; with 2 seeds an interval that
spans the threshold leaves an indicative verdict where the seeds agree (:func:`_combine`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from opdgrpo.plan.studies import REGISTRY
from opdgrpo.plan.studies.base import ClaimDef
from opdgrpo.report.conditions import conditions_note, study_conditions
from opdgrpo.report.curves import ReportInputError, instance_seed, study_instances
from opdgrpo.report.studies import REPORTS
from opdgrpo.report.uncertainty import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    UNMEASURED,
    interval_verdict,
    mean_interval,
    monotone_interval,
)

#: Every claim row of claims.md, in order: the registered studies' rows, studies in registry (name) order.
CLAIMS: list[ClaimDef] = [claim for study in REGISTRY.values() for claim in study.claims]

_SEEDS_RULE = (
    "With one seed every verdict is indicative (it says which way this run went, with no interval). With several "
    "seeds each test gives a margin per seed (positive iff it holds): the claim holds when the 95% interval of the "
    "margin over seeds lies above 0, does not hold when it lies at or below 0, and is inconclusive when it spans 0. "
    "Margins that are always figures (S1, S1b-acc, S2) take the t interval; margins a seed may only bound (the "
    "savings, S3's FLOP ratios, where a run never reached its target) or that move in steps (S1b-len, S5b) take one "
    "monotone interval whatever each seed gives, with a least spread, so a bound never says more than a figure and "
    "seeds that agree closely by chance do not decide alone. With 2 seeds an interval that spans 0 leaves an "
    "indicative verdict when both seeds agree. Tests without a margin hold iff they hold for every seed, do not hold "
    "when no seed holds and none is left undecided, and are inconclusive otherwise (a seed whose test is undefined, "
    "e.g. S3's teacher no better than the base, is undecided; a claim undefined on every seed is not measured). "
    "Savings and S3's crossings read curves smoothed over a trailing window and count a target as reached within one "
    "standard error of one evaluation, clustered by prompt (docs/method.md)."
)

#: The label of a verdict from one seed: it shows a direction, no interval decides it.
ONE_SEED = "indicative: one seed"

#: The paragraph under the table: each study's direction tests (by its rank), then the rule for several seeds.
DIRECTION_TESTS = " ".join(
    ["Direction tests:"]
    + [s.direction_tests for s in sorted(REGISTRY.values(), key=lambda s: s.direction_tests_rank) if s.direction_tests]
    + [_SEEDS_RULE]
)


# ------------------------------------------------------------------------------------------------------- table
#: Profiles that check the machinery, not the paper: their verdicts are computed as any profile's but say nothing.
NO_VERDICTS = {"rehearsal": "**A rehearsal, not a result.** Random-init models earn no reward and learn nothing here "
                            "(conf/profile/rehearsal.yaml): every verdict below only shows that the report ran."}


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


def indicative(verdict: str, note: str = ONE_SEED) -> str:
    """``holds (indicative: one seed)``, ``does not hold (indicative: one seed): why``; "not measured" unchanged."""
    for word in (FAILS, HOLDS, INCONCLUSIVE):
        if verdict.startswith(word):
            return f"{word} ({note}){verdict[len(word):]}"
    return verdict


def _why(verdict: str) -> str:
    return verdict.split(":", 1)[1].strip() if ":" in verdict else verdict


def _combine(per_seed: list[tuple]) -> tuple[str, str]:
    """Merge one claim's per-seed results ``(seed, ours, verdict[, margin, strict[, floor]])`` into (ours, verdict).

    One seed: its own verdict, labelled indicative. Several: when every seed gives a margin (a number that is > 0,
    or >= 0 when not strict, exactly when the claim holds for that seed; or a pair (low, high), the range a censored
    margin may lie in), one interval over seeds decides (holds / does not hold / inconclusive,
    :func:`~opdgrpo.report.uncertainty.interval_verdict`): the 95% t interval of figures, or, where a seed gives a
    range or the claim a ``floor`` (a discrete margin's resolution, the savings' least spread), the monotone interval
    (:func:`~opdgrpo.report.uncertainty.monotone_interval`), so a bound never says more than a figure and a
    zero-width interval never decides alone. With two seeds an interval that spans 0 leaves an indicative verdict
    when both seeds agree. Otherwise it holds iff every seed holds, does not hold iff none does, and is inconclusive
    when seeds disagree.
    """
    if len(per_seed) == 1:
        return per_seed[0][1], indicative(per_seed[0][2])
    ours = "; ".join(f"seed {r[0]}: {r[1]}" for r in per_seed)
    unmeasured = [(r[0], r[2]) for r in per_seed if r[2].startswith(UNMEASURED)]
    if len(unmeasured) == len(per_seed):
        return ours, f"{UNMEASURED} for any of {len(per_seed)} seeds (seed {unmeasured[0][0]}: {_why(unmeasured[0][1])})"
    if unmeasured:   # the measured seeds still speak; the unmeasured ones are undecided (no margin: by agreement)
        return ours, _by_agreement(per_seed)
    ranges = [_margin_range(r[3] if len(r) > 3 else None) for r in per_seed]
    if all(rng is not None for rng in ranges):
        floors = [float(r[5]) for r in per_seed if len(r) > 5 and r[5] is not None]
        if floors or any(lo != hi for lo, hi in ranges):
            lo, hi = monotone_interval([r[0] for r in ranges], [r[1] for r in ranges], max(floors, default=0.0))
            summary = (f"monotone 95% interval [{lo:+.3g}, {hi:+.3g}] over {len(per_seed)} seeds"
                       + (f" (spread at least {max(floors):.3g})" if floors else ""))
        else:
            mean, lo, hi = mean_interval([r[0] for r in ranges])
            summary = f"margin {mean:+.3g}, 95% interval [{lo:+.3g}, {hi:+.3g}] over {len(per_seed)} seeds"
        verdict = interval_verdict(lo, hi, 0.0, strict=bool(per_seed[0][4]))
        if verdict == INCONCLUSIVE:
            verdict = _agreeing_pair(per_seed) or f"{INCONCLUSIVE}: the interval spans 0"
        return f"{summary}; {ours}", verdict
    return ours, _by_agreement(per_seed)


def _margin_range(margin: Any) -> tuple[float, float] | None:
    """A seed's margin as the range it may lie in: a figure (low = high), a (low, high) pair; None without one."""
    if margin is None:
        return None
    if isinstance(margin, tuple):
        lo, hi = float(margin[0]), float(margin[1])
        return None if math.isnan(lo) or math.isnan(hi) else (lo, hi)
    value = float(margin)
    return (value, value) if math.isfinite(value) else None


def _agreeing_pair(per_seed: list[tuple]) -> str | None:
    """Two seeds whose interval spans 0 but whose verdicts agree: that verdict, labelled indicative."""
    if len(per_seed) != 2:
        return None
    holding = [r[2] == HOLDS for r in per_seed]
    if all(holding):
        return indicative(HOLDS, "indicative: 2 seeds agree, the interval spans 0")
    if not any(holding):
        return indicative(FAILS, "indicative: 2 seeds agree, the interval spans 0")
    return None


def _by_agreement(per_seed: list[tuple]) -> str:
    """Tests without a margin for every seed: holds iff every seed holds, does not hold iff every seed does not (a
    seed left inconclusive, e.g. a bound that does not settle the sign, leaves the claim inconclusive); indicative
    with 2 seeds."""
    verdicts = [r[2] for r in per_seed]
    holding = sum(v == HOLDS for v in verdicts)
    failing = [r for r in per_seed if r[2].startswith(FAILS)]
    note = "indicative: 2 seeds" if len(per_seed) == 2 else None
    if holding == len(verdicts):
        return indicative(HOLDS, note) if note else HOLDS
    if len(failing) == len(verdicts):
        verdict = f"{FAILS} for any of {len(per_seed)} seeds (seed {failing[0][0]}: {_why(failing[0][2])})"
        return indicative(verdict, note) if note else verdict
    unsure = [r for r in per_seed if r[2] != HOLDS and not r[2].startswith(FAILS)]
    return (f"{INCONCLUSIVE}: holds for {holding}/{len(verdicts)} seeds"
            + (f", {len(unsure)} undecided (seed {unsure[0][0]}: {_why(unsure[0][2])})" if unsure else ""))


def seeds_note(spec: Mapping[str, Any]) -> str:
    """The paragraph at the top of claims.md saying how many seeds the verdicts rest on and what that allows."""
    counts = [len(study_instances(e)) for k, e in (spec.get("studies") or {}).items() if k in REGISTRY]
    n = max(counts, default=1)
    if n == 1:
        return ("**Indicative verdicts: one seed.** Every verdict below rests on one seed (one training run per "
                "method, each evaluation point one avg@k draw), so it says which way this run went, not whether the "
                "direction survives another seed; each says \"indicative: one seed\". Three or more seeds (the `tiny` "
                "profile's default) decide holds / does not hold / inconclusive by 95% intervals.")
    if n == 2:
        return ("**Two seeds.** A verdict is decided where the 95% t interval over the two seeds (1 degree of freedom) "
                "excludes the threshold; where it spans it, two seeds that agree give an indicative verdict. Three "
                "or more seeds are needed for intervals that usually decide.")
    return f"**{n} seeds.** Verdicts are decided by 95% intervals over seeds (holds / does not hold / inconclusive)."


def _per_seed(
    spec: Mapping[str, Any],
    curves: pd.DataFrame,
    savings_rows: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
) -> dict[str, list[tuple]]:
    """Every claim's per-seed results ``(seed, ours, verdict[, margin, strict])``; a seed whose study cannot be
    evaluated gives each of its claims ``("n/a", "not measured: <why>")``."""
    studies = spec.get("studies", {}) or {}
    savings = _savings_rows(savings_rows)
    out: dict[str, list[tuple]] = {}
    for key, study in REPORTS.items():
        if key not in studies:
            continue
        for inst in study_instances(studies[key]):
            seed = instance_seed(dict(spec), inst)
            try:
                found = study.evaluate(inst, curves, _savings_for(savings, key, seed))
            except (ReportInputError, KeyError, ValueError) as exc:
                why = f"the spec's {key} entry lacks key {exc}" if isinstance(exc, KeyError) else str(exc)
                found = {c.id: ("n/a", f"{UNMEASURED}: {why}") for c in study.study.claims}
            for cid, result in found.items():
                out.setdefault(cid, []).append((seed, *result))
    return out


def evaluate_claims(
    spec: Mapping[str, Any],
    curves: pd.DataFrame,
    savings_rows: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
    per_seed: Mapping[str, list[tuple]] | None = None,
) -> list[tuple[ClaimDef, str, str]]:
    """Every claim of :data:`CLAIMS` with (ours, verdict); a missing study or run gives "not measured".
    ``per_seed``: :func:`seed_results`' answer when the caller already has it (each study is evaluated once)."""
    studies = spec.get("studies", {}) or {}
    per_seed = _per_seed(spec, curves, savings_rows) if per_seed is None else per_seed
    results = {cid: _combine(list(v)) for cid, v in per_seed.items()}
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


def seed_results(
    spec: Mapping[str, Any],
    curves: pd.DataFrame,
    savings_rows: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
) -> dict[str, list[tuple]]:
    """Every claim's per-seed results ``(seed, ours, verdict[, margin, strict])``, as :func:`evaluate_claims` reads
    them before merging: claims.md's short cells quote each seed's figure, which the merged text buries. Pass it to
    :func:`evaluate_claims` to evaluate each study once."""
    return _per_seed(spec, curves, savings_rows)


# ------------------------------------------------------------------------------------- short cells of claims.md
def _pts(m: float) -> str:
    return f"{100 * m:+.1f} pts"


def _pct_of(m: float) -> str:
    """A share from a margin over one half (S1b-len, S5b), clipped to what a share can be: an interval's ends may
    lie beyond it."""
    return f"{100 * min(max(m + 0.5, 0.0), 1.0):.0f}%"


#: How a claim's margin reads as a number (label, format), for the claims whose margin has a unit a reader knows.
_MARGINS: dict[str, tuple[str, Callable[[float], str]]] = {
    "S1": ("GRPO minus OPD's peak at OPD's FLOPs, worst pair", _pts),
    "S1b-acc": ("GRPO minus OPD's peak at OPD's FLOPs, worst pair", _pts),
    "S1b-len": ("OPD's final length above GRPO's in", _pct_of),
    "S2-in": ("GRPO final minus OPD peak, worst subset", _pts),
    "S2-heldout": ("gap in the expected direction, worst subset", _pts),
    "S5b": ("domains collapsed", _pct_of),
}


def cost_ratio(savings: float | None, bound: str = "") -> str:
    """Savings read as the cost they stand for: ``6.9x (-589.7%)``, pipeline / joint GRPO FLOPs to one target with
    the savings beside it; an upper bound on the savings is a lower bound on the ratio (``>= 6.9x (<= -589.7%)``)."""
    if savings is None or savings != savings:
        return "n/a"
    if math.isinf(savings):
        return "joint GRPO needs 0 FLOPs (its step 0 reaches the target; savings -inf)"
    mark = {"upper": (">= ", "<= "), "lower": ("<= ", ">= ")}.get(bound, ("", ""))
    return f"{mark[0]}{1 - savings:.1f}x ({mark[1]}{100 * savings:.1f}%)"


def _consolidation_figure(cid: str, row: Mapping[str, Any]) -> str:
    """One seed's figure of S4/S5-share (the share) or -savings (the cost ratio), from its savings row."""
    if cid.endswith("-share"):   # the whole distillation run (what the claim tests), the share at the match beside
        run, match = row.get("distill_share_run"), row.get("distill_share")
        at = "" if match is None else f" (match {'>= ' if row.get('share_bound') else ''}{100 * match:.0f}%)"
        return "n/a" if run is None else f"{100 * run:.0f}%{at}"
    ratio = cost_ratio(row.get("savings"), row.get("savings_bound") or "")
    return ratio.split(" (")[0] if "x (" in ratio else "0 FLOPs for joint GRPO"


def _s3_figure(cid: str, ours: str) -> tuple[str, str]:
    """(n, one seed's S3 ratio F_grpo / F_opd(n)) at the fewest (S3-n1) or most (S3-n8) rollouts, read from the
    text S3's evaluator writes."""
    found = re.findall(r"OPD n=(\d+) ([^;]*)", ours)
    if not found:
        return "?", "n/a"
    n, text = found[0] if cid == "S3-n1" else found[-1]
    ratio = re.search(r"\bratio ([<>]\s*)?(\S+x)\b", text)
    if ratio:
        return n, (ratio.group(1) or "") + ratio.group(2)
    if "no ratio" in text:
        return n, "no ratio (step 0 at the teacher)"
    if "unsettled" in text:
        return n, "unsettled (neither reached it)"
    return n, "never" if "never" in text else "n/a"


def short_ours(cid: str, per_seed: list[tuple], savings_rows: list[Mapping[str, Any]]) -> str:
    """claims.md's "ours" cell: one number per seed and, where every seed has a margin in a known unit, their mean
    with its 95% t interval; the per-seed detail goes to claims_detail.md."""
    study = cid.split("-")[0]
    if study in ("S4", "S5"):
        label = ("whole distillation / experts' FLOPs" if cid.endswith("-share")
                 else "pipeline / joint GRPO FLOPs")
        rows = [_savings_for(savings_rows, study, r[0]).get(study) for r in per_seed]
        figures = [_consolidation_figure(cid, row) if row else "n/a" for row in rows]
    elif study == "S3":
        read = [_s3_figure(cid, r[1]) for r in per_seed]
        label = f"FLOPs to the teacher, GRPO / OPD n={read[0][0]}"
        figures = [figure for _, figure in read]
    else:
        label, fmt = _MARGINS.get(cid, ("margin", lambda m: f"{m:+.3g}"))
        figures = [fmt(r[3]) if len(r) > 3 and r[3] is not None else "n/a" for r in per_seed]
        margins = [r[3] for r in per_seed if len(r) > 3 and r[3] is not None and math.isfinite(r[3])]
        if len(margins) == len(per_seed) > 1:
            mean, lo, hi = mean_interval(margins)
            return f"{label}: {fmt(mean)}, 95% [{fmt(lo)}, {fmt(hi)}]; seeds {', '.join(figures)}"
    return f"{label}: {', '.join(figures)}" + (" (seeds)" if len(per_seed) > 1 else "")


def _verdict_cell(c: ClaimDef, verdict: str, notes: Mapping[str, str]) -> str:
    """The verdict, with the measurability conditions of its study beside it (nothing where none bear on it)."""
    note = notes.get(c.study, "")
    return f"{verdict}; {note}" if note else verdict


def claims_pages(
    spec: Mapping[str, Any],
    curves: pd.DataFrame,
    savings_rows: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
    conditions: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[str, str]:
    """(claims.md, claims_detail.md): one short line per claim (the paper's figure, ours as numbers, the verdict with
    its conditions), read in a minute; then every seed's measurement and the direction tests, in the detail file.

    ``savings_rows`` are the studies' savings rows (:meth:`~opdgrpo.plan.studies.base.Study.savings_row`), each with
    its ``study`` key (or a mapping study -> dict); ``conditions`` the rows of
    :func:`~opdgrpo.report.conditions.condition_rows` (none: no conditions shown).
    """
    profile = spec.get("profile", "unknown")
    rows = _savings_rows(savings_rows)
    per_seed = seed_results(spec, curves, rows)
    evaluated = evaluate_claims(spec, curves, rows, per_seed)
    notes = {k: conditions_note(v) for k, v in study_conditions(spec, conditions or []).items()}
    head = [*([NO_VERDICTS[profile], ""] if profile in NO_VERDICTS else []),
            f"Measured from this run's run directories (profile `{profile}`), not copied from the paper. Small "
            "profiles use tiny models on synthetic tasks: compare directions, not magnitudes. Each seed's "
            "measurement and the direction tests: [claims_detail.md](claims_detail.md); the conditions: "
            "[conditions.md](conditions.md).", "", seeds_note(spec), ""]
    short = [f"# Paper claims vs this reproduction (profile `{profile}`)", "", *head,
             "| claim | paper | ours | verdict |", "|---|---|---|---|"]
    detail = [f"# Paper claims, per seed (profile `{profile}`)", "", *head,
              "| claim | ours, per seed | verdict |", "|---|---|---|"]
    for c, ours, verdict in evaluated:
        figure = short_ours(c.id, per_seed[c.id], rows) if c.id in per_seed else ours
        cell = _verdict_cell(c, verdict, notes)
        short.append(f"| **{c.id}** {_cell(c.claim)} | {_cell(c.paper)} | {_cell(figure)} | {_cell(cell)} |")
        detail.append(f"| **{c.id}** | {_cell(ours)} | {_cell(cell)} |")
    detail += ["", DIRECTION_TESTS, ""]
    short.append("")
    unknown = [k for k in (spec.get("studies") or {}) if k not in REGISTRY or not REGISTRY[k].claims]
    if unknown:
        short += [f"Studies without claim checks (skipped): {', '.join(unknown)}.", ""]
    return "\n".join(short), "\n".join(detail)


def claims_table(
    spec: Mapping[str, Any],
    curves: pd.DataFrame,
    savings_rows: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
    conditions: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """Markdown of claims.md: a header naming the profile, one short row per paper claim (:func:`claims_pages`)."""
    return claims_pages(spec, curves, savings_rows, conditions)[0]
