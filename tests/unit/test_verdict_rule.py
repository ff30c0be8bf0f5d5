"""The verdict over seeds: monotone in every seed, a bound never saying more than its figure, no zero-width interval
deciding alone, and its error rates under a simulated null (a small seeded run of benchmarks/null_savings.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from opdgrpo.report.claims import _combine
from opdgrpo.report.matching import mix_se
from opdgrpo.report.savings import sign_over_seeds
from opdgrpo.report.studies.consolidation import _share_verdict
from opdgrpo.report.uncertainty import monotone_interval, resolution_floor

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import null_savings  # noqa: E402

RANK = {"negative": 0, "inconclusive": 1, "positive": 2}


def _reading(rng: np.random.Generator) -> tuple[float, str]:
    kind = rng.choice(["", "", "upper", "lower", "-inf"])
    return (-math.inf, "") if kind == "-inf" else (float(rng.normal(0.1, 0.3)), str(kind))


def test_worsening_a_seed_or_bounding_a_figure_never_moves_the_verdict_towards_holds():
    rng = np.random.default_rng(0)
    for _ in range(300):
        readings = [_reading(rng) for _ in range(3)]
        before = RANK[sign_over_seeds(readings)]
        i = int(rng.integers(3))
        value, bound = readings[i]
        worse = list(readings)
        worse[i] = (value - float(rng.exponential(0.3)) if math.isfinite(value) else value, bound)
        assert RANK[sign_over_seeds(worse)] <= before, (readings, worse)
        if bound == "" and math.isfinite(value):   # the figure replaced by a bound on it: never a stronger verdict
            for side in ("upper", "lower"):
                bounded = list(readings)
                bounded[i] = (value, side)
                after = RANK[sign_over_seeds(bounded)]
                assert after == before or after == RANK["inconclusive"], (readings, side)


def test_the_reviewers_example_reads_the_same_with_a_figure_a_bound_or_minus_infinity():
    close = [(-0.30, ""), (-0.32, "")]
    verdicts = {sign_over_seeds(close + [last]) for last in [(-5.0, ""), (-5.0, "upper"), (-math.inf, ""), (-0.34, "")]}
    assert verdicts == {"negative"}


def test_monotone_interval_contains_the_t_interval_of_clipped_values_and_never_shrinks_below_its_floor():
    lo, hi = monotone_interval([0.2, 0.2, 0.2], [0.2, 0.2, 0.2], 0.05)
    half = 4.303 * 0.05 / math.sqrt(3)
    assert (lo, hi) == pytest.approx((0.2 - half, 0.2 + half))
    lo, hi = monotone_interval([0.1, 0.11, 5.0], [0.1, 0.11, 5.0], 0.0)   # a far better seed: no wider than a near one
    assert lo >= monotone_interval([0.1, 0.11, 0.12], [0.1, 0.11, 0.12], 0.0)[0]
    assert monotone_interval([0.1, -math.inf], [0.1, 0.2], 0.0)[0] == -math.inf
    assert monotone_interval([0.1, 0.2], [0.1, math.inf], 0.0)[1] == math.inf
    with pytest.raises(ValueError):
        monotone_interval([0.3], [0.2], 0.0)


def test_discrete_margins_need_more_than_a_zero_width_interval():
    floor = resolution_floor(0.25)   # S5b over 4 domains
    same = [(s, "x", "holds", 0.25, True, floor) for s in range(3)]
    one_more = same[:2] + [(2, "x", "holds", 0.5, True, floor)]
    assert _combine(same)[1] == "holds" and _combine(one_more)[1] == "holds"   # one more collapse: no weaker
    thin = [(s, "x", "holds", 0.05, True, floor) for s in range(3)]            # agreeing, but within the resolution
    assert _combine(thin)[1].startswith("inconclusive")
    assert _combine([(s, "x", "holds", 0.05, True) for s in range(3)])[1] == "holds"   # no floor: the plain t interval


def test_mix_se_takes_each_sets_own_accuracy():
    sizes = {"math": {"amc": [800, 1], "aime": [800, 1]}, "code": {"lcb": [142, 2]}}
    own = {"math": {"amc": 0.05, "aime": 0.05}, "code": {"lcb": 0.5}}
    mix = 0.25 * (0.05 + 0.05) + 0.5 * 0.5   # the mix accuracy these sets give: 0.275
    expected = math.sqrt((0.25 * 2 * 0.05 * 0.95 / 800 + 0.25 / 284) / 4)
    assert mix_se(mix, sizes, ["math", "code"], own) == pytest.approx(expected)
    assert mix_se(mix, sizes, ["math", "code"]) < expected   # one p for all sets understates it here


def test_share_is_the_whole_distillation_run_with_the_share_at_the_match_beside_it():
    row = {"distill_share_run": 0.82, "distill_share": 0.12, "share_bound": "", "distill_flops": 1.0, "savings": -0.2,
           "expert_flops": 10.0, "share_threshold": 0.15}
    ours, verdict, margin, strict = _share_verdict("S4", row)["S4-share"]
    assert verdict.startswith("does not hold") and margin == pytest.approx(0.15 - 0.82) and strict
    assert "whole distillation 82.0%" in ours and "up to the match 12.0%" in ours
    assert _share_verdict("S4", dict(row, distill_share_run=0.05))["S4-share"][1] == "holds"


def test_null_error_rates_of_the_rule_are_within_bounds():
    """True savings 0: the rule says "holds" or "does not hold" in at most 2.5% of studies each (the stated bound;
    benchmarks/null_savings.py prints the rates at full size, beside the previous rule's)."""
    out = null_savings.simulate(trials=300, seeds=3, rng_seed=0, pool=30)
    new, n = out["new"], out["trials"]
    assert new["negative"] / n <= 0.025 and new["positive"] / n <= 0.025
