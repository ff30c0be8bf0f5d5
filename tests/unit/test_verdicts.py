"""The verdict machinery (docs/method.md, "Matching rule" and "Seeds and intervals"): the matching rule (smoothed
targets and crossings within one standard error), the share threshold, one-seed verdicts labelled indicative, and
verdicts with intervals that stay the same when the seeds change or the curves take another draw of the evaluation's
own noise.

The seed test builds run directories through the project's run-file writers (:mod:`opdgrpo.runio`) from a known
world: S4's four runs per seed, accuracies drawn as avg@4 over 150 prompts per held-out set (the tiny profile's
math sets), with a per-seed shift of each run's plateau standing in for training randomness. In process, a few seconds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from opdgrpo.report.build import attach_run_info, consolidation_rows
from opdgrpo.report.claims import claims_table, evaluate_claims
from opdgrpo.report.curves import load_curves, load_final_flops
from opdgrpo.report.matching import (
    DEFAULT_SHARE_THRESHOLD,
    DEFAULT_SMOOTH_WINDOW,
    DEFAULT_TOLERANCE_SE,
    MatchRule,
    design_effect,
    eval_sizes,
    mix_se,
    smooth,
)
from opdgrpo.report.savings import first_crossing_flops
from opdgrpo.report.studies import REPORTS
from opdgrpo.runio import append_jsonl, write_json

REPO = Path(__file__).resolve().parents[2]
SETS = {"math": {"amc": 150, "aime": 150}, "code": {"lcb": 150}}   # n prompts per held-out set
K = 4                                                              # avg@4: the tiny profile's k when this was written


# ------------------------------------------------------------------------------------------------- the rule itself
def test_trailing_moving_average_by_hand_truncated_at_the_start_and_skipping_nan():
    assert smooth([0.0, 0.3, 0.6, 0.3], 3) == pytest.approx([0.0, 0.15, 0.3, 0.4])
    assert smooth([0.1, 0.2], 1) == [0.1, 0.2]
    out = smooth([0.0, math.nan, 0.6, 0.3], 3)  # the NaN point stays NaN and is no neighbour
    assert math.isnan(out[1]) and out[0] == 0.0 and out[2] == pytest.approx(0.3) and out[3] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="odd"):
        smooth([0.1], 2)


@pytest.mark.parametrize("window", [1, 3, 5])
def test_smoothing_never_looks_ahead(window):
    """A point is unchanged by anything measured after it: a high step-20 evaluation does not move the 0-FLOP point,
    and no later point moves an earlier one."""
    low, high = [0.05, 0.06, 0.07, 0.08], [0.05, 0.60, 0.07, 0.08]
    assert smooth(high, window)[0] == smooth(low, window)[0] == 0.05
    ramp = [0.05, 0.10, 0.15, 0.20, 0.25]
    for cut in range(1, len(ramp)):
        assert smooth(ramp[:cut], window) == pytest.approx(smooth(ramp, window)[:cut])


def test_a_run_that_rises_by_step_20_does_not_reach_its_target_at_0_flops():
    # step 0 at 5%, 30% from step 20 on: the first smoothed point is step 0's, so the crossing of 25% is past 0 FLOPs
    flops, acc = [0.0, 10.0, 20.0, 30.0], [0.05, 0.30, 0.30, 0.30]
    crossing = first_crossing_flops(flops, smooth(acc, 3), 0.25)
    assert crossing is not None and crossing > 20.0   # a centred window crossed it near 14


def test_standard_error_formula_of_a_mix():
    # SE(p)^2 = p(1-p) sum_d 1/D^2 sum_s 1/(S_d^2 n_s k_s): math two sets of 150x4, code one set of 150x4
    sizes = {d: {s: [n, K] for s, n in sets.items()} for d, sets in SETS.items()}
    expected = math.sqrt(0.25 * (0.25 * (1 / 600 + 1 / 600) / 4 + (1 / 600) / 4))
    assert mix_se(0.5, sizes, ["math", "code"]) == pytest.approx(expected)
    assert mix_se(0.5, sizes, ["code"]) == pytest.approx(math.sqrt(0.25 / 600))  # one set: sqrt(p(1-p)/(n k))
    assert mix_se(0.5, sizes, ["ifeval"]) is None and mix_se(0.5, None, ["code"]) is None  # sizes unknown


def test_design_effect_spans_independent_to_fully_correlated_samples():
    # every prompt solved with the same chance p: unbiased pass@2 = 1 - (1 - p)^2, the k samples are independent
    assert design_effect(4, 0.3, 1 - 0.7 ** 2) == pytest.approx(1.0)
    # each prompt always or never solved: pass@2 = pass@1, the k samples are one draw
    assert design_effect(4, 0.3, 0.3) == pytest.approx(4.0)
    assert design_effect(1, 0.3, 0.3) is None and design_effect(4, 0.0, 0.0) is None and design_effect(4, 1.0, 1.0) is None


def test_k_eff_from_recorded_pass_at_2_predicts_the_spread_of_avg_at_k(tmp_path):
    """Held-out sets of n prompts drawn from a domain whose prompts vary in difficulty (q ~ Beta(0.5, 2)): k_eff read
    from each evaluation's pass@1 and pass@2, as the report reads them, gives an SE within 15% of the spread of avg@k
    over 400 such evaluations; the binomial sqrt(p (1 - p) / (n k)) it replaces is far too small."""
    from opdgrpo.train.metrics import summarise

    rng, n, k = np.random.default_rng(0), 200, 4
    accuracies = []
    for step in range(400):
        q = rng.beta(0.5, 2.0, size=n)
        rewards = (rng.random((n, k)) < q[:, None]).astype(float)
        passes = summarise(rewards.tolist(), [1, 2, 4])
        accuracies.append(passes["avg@4"])
        if step < 10:
            append_jsonl(tmp_path / "evals.jsonl", {"step": step, "results": [
                {"eval_domain": "code", "eval_set": "lcb", "accuracy": passes["avg@4"], "k": k, "n_prompts": n,
                 "pass_at_k": {key: v for key, v in passes.items() if key.startswith("pass@")}}]})
    sizes = eval_sizes(tmp_path)
    n_read, k_eff = sizes["code"]["lcb"]
    assert n_read == n and 1.8 < k_eff < 2.5   # Beta(0.5, 2): design effect 1.86, k_eff 2.15
    p = float(np.mean(accuracies))
    spread = float(np.std(accuracies))
    assert mix_se(p, sizes, ["code"]) == pytest.approx(spread, rel=0.15)
    assert math.sqrt(p * (1 - p) / (n * k)) < 0.8 * spread


def test_rule_keys_and_defaults_agree_with_conf():
    assert MatchRule.of({}) == MatchRule(DEFAULT_SMOOTH_WINDOW, 0.0, DEFAULT_TOLERANCE_SE)
    assert MatchRule.of({"smooth_window": 1, "tolerance": 2.0, "tolerance_se": 0}).slack(0.01) == pytest.approx(0.02)
    assert MatchRule().slack(0.01) == pytest.approx(0.01) and MatchRule().slack(None) == 0.0
    with pytest.raises(ValueError, match="odd"):
        MatchRule(window=4)
    for name in ("s1", "s1b", "s3", "s4", "s5"):
        block = yaml.safe_load((REPO / "conf" / "study" / f"{name}.yaml").read_text())
        assert block["smooth_window"] == DEFAULT_SMOOTH_WINDOW
        if name.startswith("s1"):
            continue
        assert block["tolerance_se"] == DEFAULT_TOLERANCE_SE
        if name != "s3":
            assert block["share_threshold"] == DEFAULT_SHARE_THRESHOLD and block["tolerance"] == 0


def test_s1_peaks_are_read_smoothed_so_one_lucky_point_does_not_decide():
    from opdgrpo.report.curves import CURVE_COLUMNS
    from opdgrpo.report.studies import REPORTS

    def rows(run: str, accs: list[float], per_step: float) -> list[dict]:
        return [{"run": run, "study": "S1", "method": "x", "train_domains": "math", "seed": 0, "step": i,
                 "cumulative_flops": i * per_step, "eval_domain": "math", "eval_set": "amc", "accuracy": a,
                 "mean_response_length": 5.0} for i, a in enumerate(accs)]

    grpo = rows("g", [0.20, 0.30, 0.36, 0.38, 0.40, 0.40], 1.0)
    opd = rows("o", [0.20, 0.30, 0.34, 0.43, 0.34, 0.35], 1.0)  # one lucky draw at step 3
    curves = pd.DataFrame(grpo + opd, columns=CURVE_COLUMNS)
    entry = {"comparisons": [{"domain": "math", "grpo": "g", "opd": {"OPD": "o"}}]}
    raw = REPORTS["S1"].evaluate(dict(entry, smooth_window=1), curves, {})["S1"]
    smoothed = REPORTS["S1"].evaluate(entry, curves, {})["S1"]  # the default window: 3 points
    assert raw[1].startswith("does not hold") and smoothed[1] == "holds"
    assert "smoothed over 3 points" in smoothed[0]


# -------------------------------------------------------------------------------------------- a world with seeds
def _accuracy(t: np.ndarray, start: float, plateau: float, tau: float) -> np.ndarray:
    return start + (plateau - start) * (1 - np.exp(-t / tau))


#: run kind -> (steps, eval every, training FLOPs per step, start, plateau, time constant in steps)
WORLD = {
    "joint": (400, 10, 1.0e12, 0.20, 0.56, 120.0),
    "distill": (100, 10, 5.0e10, 0.20, 0.60, 25.0),
    "expert-math": (200, 10, 0.5e12, 0.20, 0.45, 60.0),
    "expert-code": (200, 10, 0.5e12, 0.20, 0.45, 60.0),
}


def _write_run(runs: Path, run: str, kind: str, rng: np.random.Generator, extra_noise: float,
               expert_cost: float) -> None:
    """evals.jsonl and done.json as training writes them: per held-out set avg@k over n prompts x k samples."""
    steps, every, per_step, start, plateau, tau = WORLD[kind]
    per_step *= expert_cost if kind.startswith("expert") else 1.0
    plateau += rng.normal(0.0, 0.01)  # training randomness: each seed's run settles a little higher or lower
    run_dir = runs / run
    run_dir.mkdir(parents=True)
    for step in range(0, steps + 1, every):
        p = float(_accuracy(np.array(step, dtype=float), start, plateau, tau))
        results = []
        for domain, sets in SETS.items():
            for name, n in sets.items():
                acc = rng.binomial(n * K, p) / (n * K)
                if extra_noise:  # another draw of the evaluation's own noise on top
                    acc = min(max(acc + rng.normal(0.0, extra_noise * math.sqrt(p * (1 - p) / (n * K))), 0.0), 1.0)
                results.append({"eval_domain": domain, "eval_set": name, "accuracy": acc,
                                "mean_response_length": 12.0, "k": K, "n_prompts": n})
        append_jsonl(run_dir / "evals.jsonl", {"step": step, "cumulative_flops": step * per_step,
                                               "eval_flops": 1e9, "results": results})
    write_json(run_dir / "done.json", {"run": run, "steps": steps, "cumulative_flops": steps * per_step})


def world(tmp: Path, seeds: list[int], extra_noise: float = 0.0, expert_cost: float = 1.0, **entry_keys) -> dict:
    """Run directories of S4 for ``seeds`` (experts' FLOPs scaled by ``expert_cost``), and the report spec the
    planner would write for them."""
    runs, entries, spec_runs = tmp / "runs", [], []
    for seed in seeds:
        rng = np.random.default_rng(1000 + seed)
        ids = {kind: f"{kind}-s{seed}" for kind in WORLD}
        for kind, run in ids.items():
            _write_run(runs, run, kind, rng, extra_noise, expert_cost)
            spec_runs.append({"run": run, "studies": ["S4"], "method": "opd" if kind == "distill" else "grpo",
                              "label": kind, "train_domains": ["math", "code"], "seed": seed})
        entries.append({"title": "S4", "domains": ["math", "code"], "joint": ids["joint"], "distill": ids["distill"],
                        "experts": [ids["expert-math"], ids["expert-code"]], "tolerance": 0.0, **entry_keys})
    studies = {"S4": entries[0] if len(entries) == 1 else {"title": "S4", "seeds": entries}}
    return {"spec": {"profile": "synthetic", "runs": spec_runs, "studies": studies}, "runs": runs}


def verdicts(w: dict) -> tuple[dict[str, tuple[str, str]], list[dict]]:
    spec, runs = w["spec"], w["runs"]
    attach_run_info(spec, runs)
    curves = load_curves(spec, runs)
    rows = consolidation_rows(spec, curves, load_final_flops(runs, [r["run"] for r in spec["runs"]]))
    found = {c.id: (ours, verdict) for c, ours, verdict in evaluate_claims(spec, curves, rows) if c.study == "S4"}
    return found, rows


def test_verdicts_have_intervals_and_survive_other_seeds_and_another_draw_of_noise(tmp_path):
    first, rows = verdicts(world(tmp_path / "a", [0, 1, 2]))
    other, _ = verdicts(world(tmp_path / "b", [3, 4, 5]))
    noisier, _ = verdicts(world(tmp_path / "c", [0, 1, 2], extra_noise=1.0))
    for claim in ("S4-share", "S4-savings"):
        assert first[claim][1] == other[claim][1] == noisier[claim][1] == "holds", (claim, first, other, noisier)
        assert "95% interval" in first[claim][0] and "over 3 seeds" in first[claim][0]
    summary = next(r for r in rows if r["seed"] == "all")
    assert summary["savings_min"] is not None and 0 < summary["savings_min"] <= summary["savings"]
    assert summary["savings"] <= summary["savings_max"] < 1 and summary["savings_sign"] == "positive"
    assert summary["status"] == "mean and range over seeds" and summary["direction"] == "joint"
    per_seed = [r for r in rows if r["seed"] != "all"]
    assert all(r["smooth_window"] == 3 and 0.005 < r["eval_se"] < 0.02 for r in per_seed)  # about 1.2 points
    # the target is read from the smoothed curve: never above the joint run's best single point
    curves = load_curves(world(tmp_path / "d", [0])["spec"], tmp_path / "d" / "runs")
    best_single = curves[curves["run"] == "joint-s0"].groupby("step")["accuracy"].agg(
        lambda a: (a.iloc[0] + a.iloc[1]) / 4 + a.iloc[2] / 2).max()  # mix = mean(math sets)/2 + code/2
    assert per_seed[0]["target_accuracy"] < best_single


def test_a_pipeline_that_costs_more_does_not_hold_for_either_set_of_seeds(tmp_path):
    # experts 4x dearer (8e14 FLOPs together) against a joint run that reaches the target at about 3e14
    for i, seeds in enumerate(([0, 1, 2], [3, 4, 5])):
        found, _ = verdicts(world(tmp_path / str(i), seeds, expert_cost=4.0))
        assert found["S4-savings"][1] == "does not hold", found["S4-savings"]
        assert found["S4-share"][1] == "holds"


def test_share_threshold_decides_and_one_seed_is_indicative(tmp_path):
    one, _ = verdicts(world(tmp_path / "a", [0]))
    assert one["S4-share"][1] == one["S4-savings"][1] == "holds (indicative: one seed)"
    assert "threshold 15%" in one["S4-share"][0]
    # a threshold below the measured share (about 1-2% here): the share test fails, decided by its interval
    strict, _ = verdicts(world(tmp_path / "b", [0, 1, 2], share_threshold=0.001))
    assert strict["S4-share"][1] == "does not hold"
    w = world(tmp_path / "c", [0])
    md = claims_table(w["spec"], load_curves(w["spec"], w["runs"]), [])
    assert "Indicative verdicts: one seed" in md.split("| claim |")[0]


def test_a_world_where_nothing_learns_answers_minus_infinity_not_a_blank(tmp_path):
    # every run scores 0% throughout: joint GRPO gains nothing, so the savings are read at the distillation's best
    # (0%), which joint GRPO's start already has: the pipeline pays its FLOPs for nothing, savings minus infinity
    w = world(tmp_path, [0])
    for run_dir in w["runs"].iterdir():
        records = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
        (run_dir / "evals.jsonl").unlink()
        for record in records:
            append_jsonl(run_dir / "evals.jsonl", dict(record, results=[dict(r, accuracy=0.0) for r in record["results"]]))
    found, rows = verdicts(w)
    assert rows[0]["target_accuracy"] == 0.0 and rows[0]["savings"] == -math.inf and rows[0]["direction"] == "pipeline"
    assert found["S4-savings"][1].startswith("does not hold") and "-inf" in found["S4-savings"][0]
    assert found["S4-share"][1].startswith("inconclusive")   # nothing was consolidated, so no share to test


def test_measurability_conditions_are_met_where_every_method_learns_and_named_where_one_does_not(tmp_path, monkeypatch):
    from opdgrpo.report.conditions import condition_rows, conditions_markdown

    w = world(tmp_path / "a", [0, 1])
    attach_run_info(w["spec"], w["runs"])
    rows = condition_rows(w["spec"], load_curves(w["spec"], w["runs"]), w["runs"])
    assert [r["condition"] for r in rows[:5]] == ["expert math learns", "expert code learns", "joint GRPO learns its mix",
                                                  "distillation reaches the math expert",
                                                  "distillation reaches the code expert"]
    assert len(rows) == 10 and all(r["met"] for r in rows), rows
    assert all(r["in_se"] > 4 for r in rows if r["condition"].startswith("expert"))   # 20 -> 45%: about 20 SE
    # a distillation that plateaus at 30%, below its experts' 45%: that condition fails, by about -10 SE
    monkeypatch.setitem(WORLD, "distill", (100, 10, 5.0e10, 0.20, 0.30, 25.0))
    w = world(tmp_path / "b", [0])
    attach_run_info(w["spec"], w["runs"])
    curves = load_curves(w["spec"], w["runs"])
    failed = [r for r in condition_rows(w["spec"], curves, w["runs"]) if not r["met"]]
    assert {r["condition"] for r in failed} == {"distillation reaches the math expert", "distillation reaches the code expert"}
    assert all(r["in_se"] < -5 for r in failed)
    md = conditions_markdown(w["spec"], curves, w["runs"])
    assert "**Met: 3 of 5.**" in md and md.count("| **no** |") == 2


def test_a_conditions_gain_is_measured_from_the_runs_unsmoothed_start(tmp_path):
    # an expert that rises at once (20% -> 30% by step 20, then flat): the 3-point smoothed curve's first point is 25%,
    # which would halve its gain; the condition measures from the base model's step-0 evaluation, 20%
    from opdgrpo.report.conditions import _gain
    from opdgrpo.report.curves import CURVE_COLUMNS

    rows = [{"run": "e", "study": "S4", "method": "grpo", "train_domains": "code", "seed": 0, "step": step,
             "cumulative_flops": 10.0 * step, "eval_domain": "code", "eval_set": "lcb", "accuracy": acc,
             "mean_response_length": 8.0} for step, acc in [(0, 0.2), (20, 0.3), (40, 0.3), (60, 0.3)]]
    start, best, se = _gain(pd.DataFrame(rows, columns=CURVE_COLUMNS), "e", ["code"], 3, tmp_path)
    assert (start, best) == (pytest.approx(0.2), pytest.approx(0.3)) and se is None   # no evals.jsonl: sizes unknown


# ------------------------------------------------------------------------------------------ S3 at 0 FLOPs and beyond
def _s3_curves(grpo: list[float], n1: list[float], n8: list[float]) -> pd.DataFrame:
    """Math curves evaluated every 10 steps: GRPO (also the teacher) 10 FLOPs a step, OPD n=1 1, OPD n=8 4."""
    rows = []
    for run, accs, per_step in (("grpo", grpo, 10.0), ("opd1", n1, 1.0), ("opd8", n8, 4.0)):
        for i, acc in enumerate(accs):
            rows.append({"run": run, "study": "S3", "method": "grpo" if run == "grpo" else "opd",
                         "train_domains": "math", "seed": 0, "step": 10 * i, "cumulative_flops": 10 * i * per_step,
                         "eval_domain": "math", "eval_set": "amc", "accuracy": acc, "mean_response_length": 5.0})
    return pd.DataFrame(rows)


S3_ENTRY = {"domain": "math", "grpo": "grpo", "teacher": "grpo", "opd": {"1": "opd1", "8": "opd8"},
            "tolerance_se": 0.0, "smooth_window": 3}


def test_s3_a_rise_by_step_10_is_not_a_crossing_at_0_flops():
    """Step 0 far below the teacher (30%), a lucky 60% at step 10: a centred window put the mean of steps 0 and 10
    (32.5%) at 0 FLOPs, so GRPO 'reached' the teacher for free and the ratio's log(0) crashed the claim. Now the
    0-FLOP point is step 0 alone and every crossing lies between steps 0 and 10, interpolated on the trailing mean."""
    curves = _s3_curves([0.05, 0.60, 0.30, 0.30, 0.30], [0.05, 0.90, 0.90, 0.90], [0.05, 0.90, 0.90, 0.90])
    found = REPORTS["S3"].evaluate(dict(S3_ENTRY), curves, {})
    ours, verdict, margin, *_ = found["S3-n1"]
    f_grpo, f_opd = 100 * 0.25 / 0.275, 10 * 0.25 / 0.425      # GRPO 5% -> 32.5%, OPD 5% -> 47.5% over 10 steps
    assert verdict == "holds" and margin == pytest.approx((math.log(f_grpo / f_opd),) * 2)
    assert "no better" not in ours + verdict and "step 0" not in ours and found["S3-n8"][1] == "holds"


def test_s3_grpo_at_the_teacher_from_step_0_gives_a_verdict_not_a_crash():
    """Step 0 within tolerance of the teacher: GRPO reaches it at 0 FLOPs. No log(0): both claims are undefined for
    this seed, and the reason names the step-0 accuracy against the teacher's."""
    flat = [0.30, 0.30, 0.31, 0.30, 0.30]   # the teacher: 30.3% smoothed, reached within 1 point: at >= 29.3%
    found = REPORTS["S3"].evaluate(dict(S3_ENTRY, tolerance=1.0), _s3_curves(flat, [0.2, 0.3, 0.3, 0.3], [0.2, 0.25, 0.3, 0.3]), {})
    for cid in ("S3-n1", "S3-n8"):
        ours, verdict = found[cid][:2]
        assert verdict.startswith("not measured: the teacher is no better than the initial student: GRPO's step 0")
        assert "30.0%" in verdict and "step 0 (0 FLOPs)" in ours


def test_s3_teacher_far_above_step_0_is_never_called_no_better_than_the_start():
    """OPD's step 0 is far below the teacher while its step 10 is above: the 0-FLOP point is step 0 alone, so the
    teacher is not 'no better than the initial student'; OPD's crossing lies between steps 0 and 10."""
    curves = _s3_curves([0.05, 0.10, 0.20, 0.30, 0.30], [0.05, 0.90, 0.90, 0.90], [0.05, 0.90, 0.90, 0.90])
    found = REPORTS["S3"].evaluate(dict(S3_ENTRY), curves, {})
    assert all("no better" not in found[cid][1] for cid in ("S3-n1", "S3-n8"))
    assert found["S3-n1"][1] == "holds" and found["S3-n1"][2][0] > 0


def test_s3_a_run_that_never_reaches_the_teacher_gives_a_range_not_a_verdict_by_fiat():
    """A run that never reaches the teacher needs more than its whole run: GRPO never -> the ratio is at least
    GRPO's total over OPD's crossing; OPD n=8 never -> at most F_grpo over its whole run (not 'ratio 0'); both never
    -> unsettled. The margins are those ranges, tested with S3's floor over seeds."""
    from opdgrpo.report.studies.s3 import S3_FLOOR

    never = [0.05, 0.10, 0.10, 0.10, 0.10]
    # GRPO (the teacher) rises to 30%, reached at 300 FLOPs (trailing window of 3); OPD n=1 reaches it, OPD n=8
    # never does in its 160 FLOPs: ratio(8) < 300 / 160, which does not settle the sign
    grpo = [0.05, 0.30, 0.30, 0.30, 0.30]
    found = REPORTS["S3"].evaluate(dict(S3_ENTRY), _s3_curves(grpo, [0.05, 0.9, 0.9, 0.9], never), {})
    ours, verdict, margin, strict, floor = found["S3-n8"]
    assert floor == S3_FLOOR and strict and margin[0] == -math.inf and margin[1] == pytest.approx(math.log(300 / 160))
    assert "n=8 never reached it (> 160 FLOP), ratio < 1.9x" in ours and verdict.startswith("inconclusive")
    # unsmoothed, GRPO reaches it at 100 FLOPs, below OPD n=8's whole run: ratio(8) < 0.625 <= 1 for sure
    found = REPORTS["S3"].evaluate(dict(S3_ENTRY, smooth_window=1), _s3_curves(grpo, [0.05, 0.9, 0.9, 0.9], never), {})
    ours, verdict, margin, *_ = found["S3-n8"]
    assert verdict.startswith("does not hold: ratio(n=8) <= 1") and margin[1] == pytest.approx(math.log(100 / 160))
    # GRPO never reaches a teacher it defines only when the teacher is another run: use OPD n=1 as the teacher
    found = REPORTS["S3"].evaluate(dict(S3_ENTRY, teacher="opd1"), _s3_curves(never, [0.05, 0.9, 0.9, 0.9], never), {})
    ours, verdict, margin, *_ = found["S3-n1"]
    assert "GRPO reached it at never (> 400 FLOP)" in ours and "ratio > " in ours
    assert verdict == "holds" and margin[0] > 0 and math.isinf(margin[1])
    ours, verdict, margin, *_ = found["S3-n8"]
    assert "ratio unsettled" in ours and verdict.startswith("inconclusive") and margin == (-math.inf, math.inf)


def test_s3_over_seeds_one_monotone_test_whatever_each_seed_gives():
    """Over seeds S3 takes one monotone interval with its floor: three ratios of 2x, 2.1x, 2.2x hold; replacing the
    best by a lower bound on it still holds, by an upper bound does not hold any more, and a seed that never settles
    leaves it inconclusive; three nearly equal ratios just above 1 do not decide alone."""
    from opdgrpo.report.claims import _combine
    from opdgrpo.report.studies.s3 import S3_FLOOR

    def seeds(*margins):
        return [(i, "ours", "x", m, True, S3_FLOOR) for i, m in enumerate(margins)]

    r = [(math.log(v),) * 2 for v in (2.0, 2.1, 2.2)]
    assert _combine(seeds(*r))[1] == "holds"
    assert _combine(seeds(r[0], r[1], (r[2][0], math.inf)))[1] == "holds"
    assert _combine(seeds(r[0], r[1], (-math.inf, r[2][1])))[1].startswith("inconclusive")
    assert _combine(seeds(r[0], r[1], (-math.inf, math.inf)))[1].startswith("inconclusive")
    near = [(math.log(v),) * 2 for v in (1.01, 1.011, 1.012)]
    assert _combine(seeds(*near))[1].startswith("inconclusive")


# ----------------------------------------------------------------------- conditions beside verdicts, short cells
def _cond(study: str, seed: int, condition: str, run: str, met: bool | None, threshold: float) -> dict:
    return {"study": study, "seed": seed, "condition": condition, "run": run, "met": met, "threshold_se": threshold}


def _consolidation_spec() -> dict:
    s4 = {"domains": ["math", "code"], "joint": "j", "distill": "d", "experts": ["em", "ec"]}
    s5 = {"domains": ["math", "code", "ifeval"], "joint": "j5", "distill": "d5", "experts": ["em", "ec", "ei"]}
    return {"profile": "tiny", "runs": [], "studies": {"S4": s4, "S5": s5}}


def test_conditions_note_counts_each_kind_and_s5_inherits_the_shared_experts():
    from opdgrpo.report.conditions import conditions_note, study_conditions

    rows = [_cond("S4", 0, "expert math learns", "em", True, 4.0), _cond("S4", 0, "expert code learns", "ec", True, 4.0),
            _cond("S4", 0, "joint GRPO learns its mix", "j", True, 3.0),
            _cond("S4", 0, "distillation reaches the math expert", "d", True, -1.0),
            _cond("S4", 0, "distillation reaches the code expert", "d", False, -1.0),
            _cond("S5", 0, "expert ifeval learns", "ei", False, 4.0),
            _cond("S5", 0, "joint GRPO learns its mix", "j5", True, 3.0)]
    by = study_conditions(_consolidation_spec(), rows)
    assert len(by["S4"]) == 5 and len(by["S5"]) == 4          # S5: its own two rows and S4's math and code experts
    assert conditions_note(by["S4"]) == "conditions unmet: distillation within 1 SE of its experts in 1/2"
    assert conditions_note(by["S5"]) == "conditions unmet: experts gain 4 SE in 2/3"
    assert conditions_note(by["S4"][:4]) == "conditions met (4/4)" and conditions_note([]) == ""
    assert conditions_note([dict(rows[0], met=None)]).endswith("(1 unmeasured: held-out sizes unknown)")


def test_unmet_conditions_sit_in_the_verdict_cell_of_claims_md_and_beside_savings():
    """S4's verdict says its distillation fails the condition; S5 lists none of its own failures when all are met;
    savings.md reads the savings as a cost ratio, the percentage beside it, with the same conditions."""
    from opdgrpo.report.build import savings_markdown
    from opdgrpo.report.claims import claims_table, cost_ratio
    from opdgrpo.report.conditions import study_conditions

    spec = {"profile": "tiny", "runs": [], "studies": {"S4": {"domains": ["math", "code"], "joint": "j",
                                                              "distill": "d", "experts": ["em", "ec"]}}}
    savings = {"study": "S4", "seed": 0, "domains": "math+code", "direction": "joint", "target_accuracy": 0.157,
               "joint_flops": 5.71e11, "expert_flops": 2.17e12, "distill_flops": None, "pipeline_flops": 3.94e12,
               "savings": -5.897, "savings_bound": "upper", "savings_sign": "negative", "distill_share": 0.813,
               "distill_share_run": 0.9, "share_bound": "lower", "share_threshold": 0.15, "paper_savings": 0.42, "paper_distill_share": 0.052,
               "tolerance_points": 0.0, "smooth_window": 3, "tolerance_se": 1.0, "min_joint_gain_se": 3.0,
               "reason": "the distillation never reached 15.7%"}
    conditions = [_cond("S4", 0, "distillation reaches the math expert", "d", False, -1.0),
                  _cond("S4", 0, "expert math learns", "em", True, 4.0)]
    md = claims_table(spec, pd.DataFrame(columns=["run"]), [savings], conditions)
    rows = {ln.split("**")[1]: ln for ln in md.splitlines() if ln.startswith("| **")}
    verdict = rows["S4-savings"].rstrip(" |").rsplit(" | ", 1)[1]
    assert verdict == ("does not hold (indicative: one seed): the pipeline costs more than joint GRPO; conditions "
                       "unmet: distillation within 1 SE of its experts in 0/1")
    assert "| pipeline / joint GRPO FLOPs: >= 6.9x |" in rows["S4-savings"]
    assert "| whole distillation / experts' FLOPs: 90% (match >= 81%) |" in rows["S4-share"]
    assert "conditions" not in rows["S1"] and "not measured" in rows["S1"]
    assert cost_ratio(-5.897, "upper") == ">= 6.9x (<= -589.7%)" and cost_ratio(0.25) == "0.8x (25.0%)"
    text = savings_markdown([savings], "tiny", study_conditions(spec, conditions))
    assert ("- **S4**: pipeline / joint GRPO FLOPs to reach 15.7%: >= 6.9x (<= -589.7%) (paper 0.58x, 42.0%); "
            "conditions unmet: distillation within 1 SE of its experts in 0/1") in text
    assert "| >= 6.9x (<= -589.7%) | conditions unmet: distillation within 1 SE of its experts in 0/1 |" in text


@pytest.mark.parametrize("text,n1,n8", [
    ("GRPO at 1 TFLOP; OPD n=1 at 2 GFLOP, ratio 13.6x; OPD n=8 at 9 GFLOP, ratio > 1.6x", ("1", "13.6x"), ("8", "> 1.6x")),
    ("GRPO at 1 TFLOP; OPD n=1 at step 0, no ratio; OPD n=8 never reaches the teacher",
     ("1", "no ratio (step 0 at the teacher)"), ("8", "never")),
    ("GRPO at 1 TFLOP; OPD n=1 never reached it (> 3 GFLOP), ratio < 0.3x; OPD n=8 never reached it (> 3 GFLOP), "
     "ratio unsettled (neither run reached it)", ("1", "< 0.3x"), ("8", "unsettled (neither reached it)")),
])
def test_claims_short_s3_cell_reads_every_form_s3_writes(text, n1, n8):
    """The short S3 cell quotes S3's own text: a ratio, a bound, a crossing at step 0 (no ratio), never."""
    from opdgrpo.report.claims import _s3_figure

    assert _s3_figure("S3-n1", text) == n1 and _s3_figure("S3-n8", text) == n8


def test_s1_compares_a_peak_at_opds_start_at_its_first_budget_not_at_zero_flops():
    """OPD never rises above its start while GRPO does: comparing at 0 FLOPs sets one base model's step 0 against
    itself (margin exactly 0); at OPD's first budget GRPO is ahead."""
    from opdgrpo.report.studies.comparison import compared_budget, loses_per_flop

    assert compared_budget(0.0, [0.0, 5e9, 1e10]) == 5e9 and compared_budget(7e9, [0.0, 5e9, 7e9]) == 7e9
    rows = []
    for run, points in {"g": [(0, 0.0, 0.05), (20, 2e9, 0.09), (40, 4e9, 0.11)],
                        "o": [(0, 0.0, 0.05), (20, 5e9, 0.04), (40, 1e10, 0.03)]}.items():
        for step, flops, acc in points:
            rows.append({"run": run, "study": "S1", "method": "x", "train_domains": "math", "seed": 0, "step": step,
                         "cumulative_flops": flops, "eval_domain": "math", "eval_set": "amc", "accuracy": acc,
                         "mean_response_length": 3.0})
    entry = {"comparisons": [{"domain": "math", "grpo": "g", "opd": {"teacher_m": "o"}}], "smooth_window": 3}
    ours, verdict, margin, strict = loses_per_flop(entry, pd.DataFrame(rows))
    assert verdict == "holds" and margin == pytest.approx((0.05 + 0.09 + 0.11) / 3 - 0.05)
    assert "at its start, compared at its first budget, 5 GFLOP" in ours
