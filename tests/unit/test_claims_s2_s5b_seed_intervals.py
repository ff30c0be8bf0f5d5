"""Claims of S2, S5b and the seed-interval verdict, on constructed curves (no training)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from opdgrpo.report.claims import _combine
from opdgrpo.report.curves import CURVE_COLUMNS, domain_accuracy
from opdgrpo.report.studies import REPORTS
from opdgrpo.runio import IN_DOMAIN_SET

eval_s2, eval_s5b = REPORTS["S2"].evaluate, REPORTS["S5b"].evaluate  # each study's claim evaluator


def rows(run: str, points: list[tuple[int, float, dict[tuple[str, str], float]]], method: str = "grpo") -> list[dict]:
    out = []
    for step, flops, accs in points:
        for (domain, eval_set), acc in accs.items():
            out.append({"run": run, "study": "S2", "method": method, "train_domains": "math", "seed": 0, "step": step,
                        "cumulative_flops": flops, "eval_domain": domain, "eval_set": eval_set, "accuracy": acc,
                        "mean_response_length": 5.0})
    return out


def subset_runs(name: str, grpo_in: list[float], opd_in: list[float], grpo_held: float, opd_held: float) -> list[dict]:
    """Three evaluation points; held-out accuracy given at the last point (0.1 before)."""
    def pts(in_dom, held):
        return [(s, s * 1e9, {("math", "amc"): held if s == 20 else 0.1, ("math", IN_DOMAIN_SET): a})
                for s, a in zip((0, 10, 20), in_dom)]
    return rows(f"grpo-{name}", pts(grpo_in, grpo_held)) + rows(f"opd-{name}", pts(opd_in, opd_held), "opd")


def s2_study(names_rates: list[tuple[str, float]], low: int) -> dict:
    return {"domain": "math", "low_teacher_subsets": low,
            "subsets": [{"name": n, "grpo": f"grpo-{n}", "opd": f"opd-{n}", "teacher_rate": r, "student_rate": 0.2}
                        for n, r in names_rates]}


def test_in_domain_set_is_not_held_out_accuracy():
    df = pd.DataFrame(subset_runs("a", [0.1, 0.5, 0.9], [0.1, 0.2, 0.3], 0.4, 0.3), columns=CURVE_COLUMNS)
    dom = domain_accuracy(df[df["run"] == "grpo-a"])
    assert dom["accuracy"].tolist() == pytest.approx([0.1, 0.1, 0.4])  # the 0.9 in-domain score is left out


def test_s2_holds_when_grpo_wins_in_domain_and_opd_wins_held_out_where_the_teacher_is_weak():
    data = (subset_runs("hard", [0.1, 0.4, 0.6], [0.1, 0.5, 0.4], grpo_held=0.2, opd_held=0.3)   # teacher 10%
            + subset_runs("easy", [0.3, 0.6, 0.8], [0.3, 0.7, 0.6], grpo_held=0.5, opd_held=0.4))  # teacher 90%
    curves = pd.DataFrame(data, columns=CURVE_COLUMNS)
    out = eval_s2(s2_study([("easy", 0.9), ("hard", 0.1)], low=1), curves, {})
    assert out["S2-in"][1] == "holds" and out["S2-in"][2] == pytest.approx(0.1)  # min(0.6 - 0.5, 0.8 - 0.7)
    assert out["S2-heldout"][1] == "holds"
    assert "matched on 2/2" in out["S2-heldout"][0]


def test_s2_fails_naming_the_subsets():
    data = (subset_runs("hard", [0.1, 0.4, 0.5], [0.1, 0.6, 0.4], grpo_held=0.4, opd_held=0.3)
            + subset_runs("easy", [0.3, 0.6, 0.8], [0.3, 0.7, 0.6], grpo_held=0.5, opd_held=0.4))
    curves = pd.DataFrame(data, columns=CURVE_COLUMNS)
    out = eval_s2(s2_study([("easy", 0.9), ("hard", 0.1)], low=1), curves, {})
    assert out["S2-in"][1].startswith("does not hold") and "hard" in out["S2-in"][1]
    assert out["S2-heldout"][1] == "does not hold: not matched on hard"


def test_s5b_counts_collapsed_domains():
    pts = [(0, 0.0, {("math", "amc"): 0.4, ("code", "lcb"): 0.8, ("ifeval", "ifeval"): 0.5}),
           (10, 1e9, {("math", "amc"): 0.0, ("code", "lcb"): 0.3, ("ifeval", "ifeval"): 0.45})]
    curves = pd.DataFrame(rows("opd-all", pts, "opd"), columns=CURVE_COLUMNS)
    ours, verdict, margin, strict, floor = eval_s5b({"opd": "opd-all", "domains": ["math", "code", "ifeval"]}, curves,
                                                    {})["S5b"]
    assert floor == pytest.approx(1 / 3 / math.sqrt(12))   # a count of 3 domains: its rounding error
    assert verdict == "holds" and "2/3 collapsed" in ours and margin == pytest.approx(2 / 3 - 0.5)


def test_seed_interval_decides_holds_fails_and_inconclusive():
    agree = [(s, f"m{s}", "holds", m, True) for s, m in ((0, 0.10), (1, 0.12), (2, 0.11))]
    ours, verdict = _combine(agree)
    assert verdict == "holds" and "95% interval" in ours
    spread = [(0, "a", "holds", 0.3, True), (1, "b", "does not hold", -0.2, True), (2, "c", "holds", 0.05, True)]
    assert _combine(spread)[1].startswith("inconclusive")
    below = [(s, "x", "does not hold", m, True) for s, m in ((0, -0.3), (1, -0.25), (2, -0.31))]
    assert _combine(below)[1] == "does not hold"
    no_margin = [(0, "a", "holds"), (1, "b", "does not hold: never reached")]
    assert _combine(no_margin)[1] == "inconclusive: holds for 1/2 seeds"
    one = _combine([(0, "a", "holds", 0.1, True)])  # one seed: its own verdict, labelled indicative
    assert one == ("a", "holds (indicative: one seed)")
    assert _combine([(0, "a", "does not hold: why")])[1] == "does not hold (indicative: one seed): why"
    assert _combine([(0, "a", "not measured: why")])[1] == "not measured: why"


def test_one_unmeasured_seed_leaves_the_others_speaking():
    """A seed whose test is undefined (S3's teacher no better than the base) makes the claim inconclusive, naming
    that seed and why; it no longer blanks what the other seeds measured. Only every seed unmeasured is "not
    measured"."""
    teacher = "not measured: the teacher is no better than the initial student"
    mixed = [(0, "a", "holds", 0.4, True), (1, "b", "holds", 0.5, True), (2, "c", teacher)]
    assert _combine(mixed)[1] == ("inconclusive: holds for 2/3 seeds, 1 undecided (seed 2: the teacher is no "
                                  "better than the initial student)")
    failing = [(0, "a", "does not hold: x", -0.1, True), (1, "b", "does not hold: y", -0.2, True), (2, "c", teacher)]
    assert _combine(failing)[1].startswith("inconclusive: holds for 0/3 seeds, 1 undecided (seed 2")
    none = [(s, "x", teacher) for s in range(3)]
    assert _combine(none)[1] == ("not measured for any of 3 seeds (seed 0: the teacher is no better than the "
                                 "initial student)")


def test_two_seeds_decide_by_interval_else_indicative_when_they_agree():
    # margins 0.10 and 0.12: t(1 df) = 12.7, half-width 12.7 * 0.01 = 0.127 > 0.11: the interval spans 0
    assert _combine([(0, "a", "holds", 0.10, True), (1, "b", "holds", 0.12, True)])[1] == (
        "holds (indicative: 2 seeds agree, the interval spans 0)")
    # margins 0.100 and 0.101: half-width 0.006, the interval lies above 0: decided
    assert _combine([(0, "a", "holds", 0.100, True), (1, "b", "holds", 0.101, True)])[1] == "holds"
    assert _combine([(0, "a", "holds", 0.1, True), (1, "b", "does not hold", -0.1, True)])[1].startswith(
        "inconclusive")
    assert _combine([(0, "a", "holds"), (1, "b", "holds")])[1] == "holds (indicative: 2 seeds)"
    assert _combine([(0, "a", "does not hold: x"), (1, "b", "does not hold: y")])[1] == (
        "does not hold (indicative: 2 seeds) for any of 2 seeds (seed 0: x)")


def test_constraints_table_shows_first_and_last_rates_per_kind(tmp_path):
    import json

    from opdgrpo.report.constraints import constraints_markdown

    def record(step, rates):
        res = {"eval_domain": "ifeval", "eval_set": "ifeval", "accuracy": 0.5, "mean_response_length": 3.0}
        return json.dumps({"step": step, "cumulative_flops": step * 1e9, "results": [dict(res, constraint_rates=rates) if rates else res]})

    for run, lines in {"a": [record(0, {"upper": 0.5, "words": 0.25}), record(10, {"upper": 0.75, "words": 1.0})],
                       "b": [record(0, None), record(10, {"upper": 1.0})]}.items():  # b: rates only at the end
        (tmp_path / run).mkdir()
        (tmp_path / run / "evals.jsonl").write_text("\n".join(lines) + "\n")
    spec = {"profile": "tiny", "runs": [{"run": "a", "label": "GRPO"}, {"run": "b"}, {"run": "missing"}]}
    table = constraints_markdown(spec, tmp_path)
    assert "| GRPO (a) | ifeval | 50 -> 75% | 25 -> 100% |" in table
    assert "(b)" not in table  # no rates at its first evaluation: no row rather than a misleading one
    assert "No run" in constraints_markdown({"runs": [{"run": "b"}]}, tmp_path)


def test_s2_heldout_expects_opd_on_the_teachers_lowest_subsets_of_the_whole_study_not_of_one_seed():
    """A seed that trained only 'mid' (teacher 50%): among all subsets 'hard' (10%) is the lowest, so with one low
    subset GRPO is expected to win on 'mid'; ranked within the seed alone, 'mid' would be the lowest."""
    data = subset_runs("mid", [0.1, 0.4, 0.6], [0.1, 0.5, 0.4], grpo_held=0.5, opd_held=0.3)
    curves = pd.DataFrame(data, columns=CURVE_COLUMNS)
    study = s2_study([("mid", 0.5)], low=1)
    study["ranking"] = [{"name": "hard", "run": "grpo-hard", "teacher_rate": 0.1},
                        {"name": "mid", "run": "grpo-mid", "teacher_rate": 0.5},
                        {"name": "easy", "run": "grpo-easy", "teacher_rate": 0.9}]
    out = eval_s2(study, curves, {})
    assert out["S2-heldout"][1] == "holds" and out["S2-heldout"][2] == pytest.approx(0.2)
    assert "lowest of 3" in out["S2-heldout"][0] and "expected GRPO" in out["S2-heldout"][0]
    del study["ranking"]   # the seed's own subsets alone: 'mid' is the lowest, OPD expected, GRPO won
    assert eval_s2(study, curves, {})["S2-heldout"][1] == "does not hold: not matched on mid"


def test_s2_spread_over_seeds_draws_every_subset_once_and_decides_by_the_interval_over_groups():
    """Three seeds training 2, 1 and 1 of four subsets: the figure has a panel per subset (naming its seed), and the
    claims table gives S2-in an interval over the three seeds' groups."""
    from opdgrpo.report.build import draw_figures
    from opdgrpo.report.claims import evaluate_claims

    groups = {0: [("a", 0.1), ("c", 0.6)], 1: [("b", 0.3)], 2: [("d", 0.9)]}
    data, seeds, runs = [], [], []
    for seed, subsets in groups.items():
        entry = s2_study(subsets, low=1)
        for sub in entry["subsets"]:
            for key in ("grpo", "opd"):
                sub[key] = f"{sub[key]}-s{seed}"
                runs.append({"run": sub[key], "seed": seed, "method": key, "label": sub[key]})
            data += [dict(r, run=f"{r['run']}-s{seed}", seed=seed)
                     for r in subset_runs(sub["name"], [0.1, 0.4, 0.6 + seed / 100], [0.1, 0.5, 0.4], 0.3, 0.2)]
        entry["ranking"] = [{"name": n, "run": f"grpo-{n}", "teacher_rate": r}
                            for n, r in (("a", 0.1), ("b", 0.3), ("c", 0.6), ("d", 0.9))]
        seeds.append(entry)
    spec = {"profile": "test", "runs": runs, "studies": {"S2": {"title": "S2", "seeds": seeds}}}
    curves = pd.DataFrame(data, columns=CURVE_COLUMNS)
    figures = draw_figures(spec, ["S2"], curves, [], [])
    titles = [ax.get_title() for ax in figures["S2_accuracy"].axes if ax.get_title()]
    assert len(titles) == 4 and titles[0].startswith("a (") and titles[0].endswith("seed 0")
    assert "each training its own subsets" in figures["S2_accuracy"].get_suptitle().replace("\n", " ")
    verdicts = {c.id: (ours, verdict) for c, ours, verdict in evaluate_claims(spec, curves, [])}
    ours, verdict = verdicts["S2-in"]
    assert verdict == "holds" and "over 3 seeds" in ours and "seed 2:" in ours   # margins 0.10, 0.11, 0.12
    # GRPO wins held-out everywhere: seed 0 misses on a (OPD expected: -0.1), seeds 1 and 2 match (+0.1 each)
    assert verdicts["S2-heldout"][1].startswith("inconclusive")


def test_seeds_without_margins_decide_by_agreement_and_an_undecided_seed_leaves_the_claim_open():
    """A savings bound gives no margin: the seeds then agree or not, and one whose bound does not settle its sign
    (inconclusive on its own) keeps the claim from "does not hold" even when no seed holds."""
    fails = "does not hold: the pipeline costs more than joint GRPO"
    assert _combine([(0, "a", fails), (1, "b", fails), (2, "c", fails)])[1].startswith("does not hold for any of 3")
    assert _combine([(0, "a", "holds"), (1, "b", "holds"), (2, "c", "holds")])[1] == "holds"
    verdict = _combine([(0, "a", fails), (1, "b", "inconclusive: the bound <= 12.0% does not settle the sign"),
                        (2, "c", fails)])[1]
    assert verdict == ("inconclusive: holds for 0/3 seeds, 1 undecided (seed 1: the bound <= 12.0% does not settle "
                       "the sign)")
