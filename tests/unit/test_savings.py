"""Matched-FLOP savings (the contract in docs/method.md, "Matched-FLOP savings"): hand-computed cases, never-matched,
tolerance, and the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from opdgrpo.report.curves import CURVE_COLUMNS, ReportInputError
from opdgrpo.report.matching import mix_se
from opdgrpo.report.savings import (
    SAVINGS_KEYS,
    compute_savings,
    first_crossing_flops,
    format_savings,
    main,
    savings_sign,
    sign_over_seeds,
)

# ------------------------------------------------------------------------------------------------------ helpers
SETS = {"math": ["amc", "aime"], "code": ["lcb"]}


def curve_rows(run: str, points: list[tuple[int, float, dict[str, float]]], study: str = "S4") -> list[dict]:
    """Long-form rows for one run; a math accuracy a is split into sets a+0.1 and a-0.1 (mean a)."""
    rows = []
    for step, flops, accs in points:
        for domain, acc in accs.items():
            sets = SETS[domain]
            offsets = [0.1, -0.1] if len(sets) == 2 else [0.0]
            for s, off in zip(sets, offsets):
                rows.append(
                    {"run": run, "study": study, "method": "x", "train_domains": "math+code", "seed": 0,
                     "step": step, "cumulative_flops": float(flops), "eval_domain": domain, "eval_set": s,
                     "accuracy": acc + off, "mean_response_length": 10.0}
                )
    return rows


def both(x: float, y: float | None = None) -> dict[str, float]:
    """Equal-weight mix helper: math=x, code=y (default x), so the mix accuracy is (x+y)/2."""
    return {"math": x, "code": x if y is None else y}


JOINT = [(0, 0, both(0.2)), (10, 100, both(0.4, 0.5)), (20, 200, both(0.6, 0.5)), (30, 300, both(0.5))]
EXPERTS = {
    "e-math": [(0, 0, both(0.2)), (5, 40, both(0.6, 0.2))],
    "e-code": [(0, 0, both(0.2)), (5, 60, both(0.2, 0.6))],
}


def make_curves(distill: list[tuple[int, float, dict[str, float]]], joint=JOINT) -> pd.DataFrame:
    rows = curve_rows("joint", joint) + curve_rows("distill", distill)
    for run, pts in EXPERTS.items():
        rows += curve_rows(run, pts)
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def savings(distill, joint=JOINT, **kw):
    """The raw-point rule (no smoothing) the hand computations below use; the smoothed rule: test_verdicts.py."""
    kw.setdefault("smooth_window", 1)
    return compute_savings(make_curves(distill, joint), "joint", "distill", ["e-math", "e-code"], **kw)


#: Held-out sizes for the SE: 100 prompts x 4 samples per set (math's two sets, code's one).
SIZES = {"math": {"amc": [100, 4], "aime": [100, 4]}, "code": {"lcb": [100, 4]}}


def se_at(x: float) -> float:
    """SE of a point where math and code are both at ``x``: each set's variance at its own accuracy (curve_rows
    splits math into x + 0.1 and x - 0.1), as compute_savings reads it."""
    return mix_se(x, SIZES, ["math", "code"], {"math": {"amc": x + 0.1, "aime": x - 0.1}, "code": {"lcb": x}})


# --------------------------------------------------------------------------------------------------------- tests
def test_interpolated_between_eval_points_by_hand() -> None:
    # joint mix: 0.2, 0.45, 0.55, 0.5 -> target 0.55 first reached at 200 FLOPs; experts 40 + 60 = 100.
    # distill mix 0.2 @0, 0.4 @10, 0.6 @20: crosses 0.55 at 10 + (0.55-0.4)/(0.6-0.4)*10 = 17.5.
    r = savings([(0, 0, both(0.2)), (1, 10, both(0.4)), (2, 20, both(0.6))])
    assert set(SAVINGS_KEYS) <= set(r) and r["direction"] == "joint" and r["savings_bound"] == ""
    assert r["other"]["direction"] == "pipeline" and set(SAVINGS_KEYS) <= set(r["other"])
    assert r["target_accuracy"] == pytest.approx(0.55)
    assert r["joint_flops"] == 200.0
    assert r["expert_flops"] == 100.0
    assert r["distill_flops"] == pytest.approx(17.5)
    assert r["pipeline_flops"] == pytest.approx(117.5)
    assert r["savings"] == pytest.approx(1 - 117.5 / 200)  # 0.4125
    assert r["distill_share"] == pytest.approx(0.175)


def test_exactly_matched_at_an_eval_point() -> None:
    r = savings([(0, 0, both(0.2)), (1, 10, both(0.4)), (2, 20, both(0.55)), (3, 30, both(0.7))])
    assert r["distill_flops"] == pytest.approx(20.0)
    assert r["savings"] == pytest.approx(1 - 120 / 200)


def test_reached_at_first_point_takes_its_flops() -> None:
    r = savings([(5, 8, both(0.6)), (10, 16, both(0.7))])
    assert r["distill_flops"] == 8.0


def test_a_distillation_that_never_reaches_the_target_gives_an_upper_bound() -> None:
    # the pipeline needs more than experts 100 + the whole distillation 20: savings <= 1 - 120 / 200, share >= 20 %
    r = savings([(0, 0, both(0.2)), (1, 10, both(0.4)), (2, 20, both(0.5))])
    assert r["direction"] == "joint" and r["distill_flops"] is None
    assert r["savings"] == pytest.approx(0.4) and r["savings_bound"] == "upper"
    assert r["pipeline_flops"] == pytest.approx(120.0)
    assert r["distill_share"] == pytest.approx(0.2) and r["share_bound"] == "lower"
    assert "never reached" in r["reason"] and "at most" in r["reason"]
    assert r["target_accuracy"] == pytest.approx(0.55) and r["joint_flops"] == 200.0 and r["expert_flops"] == 100.0
    assert savings_sign(r["savings"], r["savings_bound"]) == "unknown"   # <= 40 %: either sign
    assert savings_sign(-0.1, "upper") == "negative" and savings_sign(0.1, "lower") == "positive"


def test_a_joint_run_that_does_not_learn_is_read_the_other_way() -> None:
    # joint mix 0.2, 0.21, 0.2, 0.21: a 1-point gain, under 3 SE (SE at 0.21 with these sizes: 1.7 pts). The pipeline
    # direction: target = the distillation's best 0.5, threshold 0.5 - SE(0.5); joint never gets there, so joint
    # would need more than its whole 300 FLOPs: savings >= 1 - (100 + distill's FLOPs to it) / 300.
    flat = [(0, 0, both(0.2)), (10, 100, both(0.21)), (20, 200, both(0.2)), (30, 300, both(0.21))]
    r = savings([(0, 0, both(0.2)), (1, 10, both(0.3)), (2, 20, both(0.5))], joint=flat, eval_sizes=SIZES)
    se = se_at(0.5)
    assert r["direction"] == "pipeline" and r["other"]["direction"] == "joint"
    assert r["joint_gain"] == pytest.approx(0.01) and r["min_joint_gain"] == pytest.approx(3 * se_at(0.21))
    assert r["target_accuracy"] == pytest.approx(0.5) and r["threshold_accuracy"] == pytest.approx(0.5 - se)
    distill = 10 + (0.5 - se - 0.3) / 0.2 * 10
    assert r["distill_flops"] == pytest.approx(distill) and r["joint_flops"] is None
    assert r["savings"] == pytest.approx(1 - (100 + distill) / 300) and r["savings_bound"] == "lower"
    assert savings_sign(r["savings"], r["savings_bound"]) == "positive"
    assert "joint GRPO never reached" in r["reason"] and "less than" in r["reason"]


def test_a_pipeline_that_gains_nothing_over_joint_grpos_start_costs_minus_infinity() -> None:
    flat = [(0, 0, both(0.2)), (10, 100, both(0.21)), (20, 200, both(0.2)), (30, 300, both(0.21))]
    r = savings([(0, 0, both(0.2)), (1, 10, both(0.2)), (2, 20, both(0.19))], joint=flat, eval_sizes=SIZES)
    assert r["direction"] == "pipeline" and r["joint_flops"] == 0.0
    assert r["savings"] == -math.inf and r["savings_bound"] == ""
    assert savings_sign(r["savings"]) == "negative" and format_savings(r["savings"]) == "-inf"


@pytest.mark.parametrize("gain_se, direction", [(2.0, "pipeline"), (4.0, "joint")])
def test_the_papers_direction_needs_a_joint_gain_of_min_joint_gain_se(gain_se, direction) -> None:
    se = mix_se(0.3, SIZES, ["math", "code"])
    best = 0.3 + gain_se * se   # the SE is read at the target; near 0.3 it barely moves
    joint = [(0, 0, both(0.3)), (10, 100, both(best)), (20, 200, both(best)), (30, 300, both(best))]
    r = savings([(0, 0, both(0.3)), (1, 10, both(0.6))], joint=joint, eval_sizes=SIZES)
    assert r["direction"] == direction
    assert savings([(0, 0, both(0.3)), (1, 10, both(0.6))], joint=joint, eval_sizes=SIZES,
                   min_joint_gain_se=1.5)["direction"] == "joint"


def test_joint_grpos_gain_is_measured_from_its_unsmoothed_start() -> None:
    # a joint run that rises at once: 20% -> 26% by its second point, then flat. Smoothed over 3 points its first point
    # is (20 + 26) / 2 = 23%, which would halve the gain; its start is the base model's step-0 evaluation, 20%.
    rising = [(0, 0, both(0.2)), (10, 100, both(0.26)), (20, 200, both(0.26)), (30, 300, both(0.26))]
    r = savings([(0, 0, both(0.2)), (1, 10, both(0.6))], joint=rising, eval_sizes=SIZES, smooth_window=3)
    assert r["joint_gain"] == pytest.approx(0.06)
    assert r["min_joint_gain"] == pytest.approx(3 * se_at(0.26))
    assert r["direction"] == "joint"   # 6 points is past 3 SE (4.0 points); from the smoothed 23% (3 points) it would not be


def test_sign_over_seeds_is_one_monotone_interval_over_figures_and_bounds() -> None:
    assert sign_over_seeds([(0.3, ""), (0.32, ""), (0.31, "")]) == "positive"
    assert sign_over_seeds([(0.3, ""), (-0.5, ""), (0.31, "")]) == "inconclusive"
    assert sign_over_seeds([(0.3, ""), (0.2, "lower"), (0.31, "")]) == "positive"     # at least 0.2: as the figure
    assert sign_over_seeds([(0.3, ""), (0.2, "upper"), (0.31, "")]) == "inconclusive"  # at most 0.2: any value
    assert sign_over_seeds([(-0.3, ""), (-math.inf, ""), (-0.25, "upper")]) == "negative"
    # the bound says no more than the figure it bounds, and a far worse seed no less than a near one
    assert sign_over_seeds([(-0.3, ""), (-0.35, ""), (-5.0, "")]) == sign_over_seeds([(-0.3, ""), (-0.35, ""), (-5.0, "upper")])
    assert sign_over_seeds([(-0.3, ""), (-0.35, ""), (-5.0, "")]) == "negative"
    # seeds that agree within the floor (5 points) do not decide on their zero-width interval alone
    assert sign_over_seeds([(0.05, ""), (0.05, ""), (0.05, "")]) == "inconclusive"
    assert sign_over_seeds([(-0.2, "")]) == "negative" and sign_over_seeds([(0.1, "upper")]) == "inconclusive"


def test_tolerance_moves_both_sides_to_the_same_threshold() -> None:
    # threshold 0.55 - 0.05 = 0.50: joint mix 0.45 @100 -> 0.55 @200 crosses it at 150, the distillation at 20
    r = savings([(0, 0, both(0.2)), (1, 10, both(0.4)), (2, 20, both(0.5))], tolerance=5.0)
    assert r["threshold_accuracy"] == pytest.approx(0.50)
    assert r["joint_flops"] == pytest.approx(150.0) and r["distill_flops"] == pytest.approx(20.0)
    assert r["savings"] == pytest.approx(1 - 120.0 / 150.0)


def test_tolerance_in_accuracy_points() -> None:
    pts = [(0, 0, both(0.2)), (1, 10, both(0.4)), (2, 20, both(0.5))]
    assert savings(pts, tolerance=5.0)["distill_flops"] == pytest.approx(20.0)  # threshold 0.50
    assert savings(pts, tolerance=10.0)["distill_flops"] == pytest.approx(15.0)  # threshold 0.45
    assert savings(pts, tolerance=4.9)["savings_bound"] == "upper"
    with pytest.raises(ReportInputError):
        savings(pts, tolerance=-1.0)


def test_expert_final_flops_override_and_domain_mean_over_sets() -> None:
    pts = [(0, 0, both(0.2)), (1, 10, both(0.4)), (2, 20, both(0.6))]
    r = savings(pts, expert_final_flops={"e-math": 50.0})
    assert r["expert_flops"] == 110.0
    # math's two sets are 0.5 and 0.7 at joint step 20: the domain mean (0.6), not a set mean, enters the mix
    assert r["target_accuracy"] == pytest.approx((0.6 + 0.5) / 2)


def test_single_domain_mix_and_first_of_tied_best() -> None:
    r = savings([(0, 0, both(0.2)), (1, 10, both(0.7))], domains=["code"])
    # joint code: 0.2, 0.5, 0.5, 0.5 -> target 0.5, first reached at 100
    assert r["target_accuracy"] == pytest.approx(0.5)
    assert r["joint_flops"] == 100.0
    assert r["distill_flops"] == pytest.approx(0 + (0.5 - 0.2) / (0.7 - 0.2) * 10)


def test_errors_name_run_and_domain() -> None:
    curves = make_curves([(0, 0, both(0.2))])
    with pytest.raises(ReportInputError, match="nosuchrun"):
        compute_savings(curves, "joint", "nosuchrun", ["e-math"])
    with pytest.raises(ReportInputError, match="chem"):
        compute_savings(curves, "joint", "distill", ["e-math"], domains=["math", "chem"])
    with pytest.raises(ReportInputError, match="accuracy"):
        compute_savings(curves.drop(columns="accuracy"), "joint", "distill", ["e-math"])


def test_first_crossing_skips_nan_points() -> None:
    assert first_crossing_flops([0, 10, 20], [0.2, np.nan, 0.6], 0.4) == pytest.approx(10.0)
    assert first_crossing_flops([0, 10], [0.2, 0.3], 0.4) is None


# ----------------------------------------------------------------------------------------------------------- CLI
@pytest.fixture()
def curves_csv(tmp_path):
    path = tmp_path / "curves.csv"
    make_curves([(0, 0, both(0.2)), (1, 10, both(0.4)), (2, 20, both(0.6))]).to_csv(path, index=False)
    return path


def test_cli_prints_one_json_object(curves_csv, capsys) -> None:
    argv = ["--curves", str(curves_csv), "--joint", "joint", "--distill", "distill", "--experts", "e-math", "e-code",
            "--smooth-window", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1
    obj = json.loads(out)
    assert obj["savings"] == pytest.approx(0.4125)
    assert main([*argv, "--tolerance", "10"]) == 0
    # threshold 0.55 - 0.10 = 0.45, between 0.4 @10 and 0.6 @20: 10 + 0.05/0.2*10
    assert json.loads(capsys.readouterr().out)["distill_flops"] == pytest.approx(12.5)


def test_cli_reads_held_out_sizes_from_runs_for_the_se_tolerance(curves_csv, tmp_path, capsys) -> None:
    from opdgrpo.runio import append_jsonl

    runs = tmp_path / "runs"
    (runs / "joint").mkdir(parents=True)
    results = [{"eval_domain": d, "eval_set": s, "accuracy": 0.5, "mean_response_length": 1.0, "k": 4, "n_prompts": 25}
               for d, sets in SETS.items() for s in sets]
    append_jsonl(runs / "joint" / "evals.jsonl", {"step": 0, "cumulative_flops": 0.0, "results": results})
    argv = ["--curves", str(curves_csv), "--joint", "joint", "--distill", "distill", "--experts", "e-math", "e-code",
            "--smooth-window", "1", "--runs", str(runs)]
    assert main(argv) == 0
    obj = json.loads(capsys.readouterr().out)
    # SE at joint GRPO's best (math 0.6, split into sets 0.7 and 0.5; code 0.5; mix 0.55) with math 2 x (25 x 4) and
    # code 1 x (25 x 4), each set at its own accuracy: sqrt((0.25 (0.7 x 0.3 + 0.5 x 0.5) / 100 + 0.5 x 0.5 / 100) / 4)
    se = ((0.25 * (0.7 * 0.3 + 0.5 * 0.5) / 100 + 0.5 * 0.5 / 100) / 4) ** 0.5
    assert obj["eval_se"] == pytest.approx(se) and obj["threshold_accuracy"] == pytest.approx(0.55 - se)
    assert main([*argv, "--tolerance-se", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["threshold_accuracy"] == pytest.approx(0.55)


def test_cli_errors_exit_nonzero(curves_csv, tmp_path, capsys) -> None:
    assert main(["--curves", str(curves_csv), "--joint", "joint", "--distill", "ghost", "--experts", "e-math"]) != 0
    err = capsys.readouterr()
    assert "ghost" in err.err and err.out == ""
    bad = tmp_path / "bad.csv"
    pd.read_csv(curves_csv).drop(columns="cumulative_flops").to_csv(bad, index=False)
    assert main(["--curves", str(bad), "--joint", "joint", "--distill", "distill", "--experts", "e-math"]) != 0
    assert "cumulative_flops" in capsys.readouterr().err


def test_python_dash_m_entry(curves_csv) -> None:
    cmd = [sys.executable, "-m", "opdgrpo.report.savings", "--curves", str(curves_csv), "--joint", "joint",
           "--distill", "distill", "--experts", "e-math", "e-code", "--smooth-window", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["pipeline_flops"] == pytest.approx(117.5)
    assert proc.stderr == ""


def test_cli_prints_minus_infinity_as_a_string_so_any_json_parser_reads_it(tmp_path, capsys) -> None:
    flat = [(0, 0, both(0.2)), (10, 100, both(0.2)), (20, 200, both(0.2))]
    path = tmp_path / "curves.csv"
    make_curves([(0, 0, both(0.2)), (1, 10, both(0.2))], flat).to_csv(path, index=False)
    assert main(["--curves", str(path), "--joint", "joint", "--distill", "distill", "--experts", "e-math", "e-code"]) == 0
    obj = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
    assert obj["savings"] == "-inf" and obj["direction"] == "pipeline"
