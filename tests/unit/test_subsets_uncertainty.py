"""S2's binning rule and the uncertainty helpers, on constructed data."""

from __future__ import annotations

import json
import math

import pytest

from opdgrpo.report.uncertainty import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    interval_verdict,
    mean_interval,
    t_quantile_95,
)
from opdgrpo.subsets import bin_by_rates, load_subset, subset_names


def test_bins_cut_by_student_rank_then_teacher_rank():
    # 16 prompts: student rate = i/16, teacher rate decreasing, so the teacher's order is reversed within groups
    prompts = [f"p{i}" for i in range(16)]
    student = [i / 16 for i in range(16)]
    teacher = [1 - i / 16 for i in range(16)]
    bins = bin_by_rates(prompts, student, teacher, 2, 4)
    assert list(bins) == subset_names(2, 4) == ["s0t0", "s0t1", "s0t2", "s0t3", "s1t0", "s1t1", "s1t2", "s1t3"]
    assert all(len(idx) == 2 for idx in bins.values())
    assert bins["s0t0"] == [6, 7]     # low student half (0..7), lowest teacher rates there: 6, 7
    assert bins["s0t3"] == [0, 1]
    assert bins["s1t0"] == [14, 15] and bins["s1t3"] == [8, 9]
    assert sorted(i for idx in bins.values() for i in idx) == list(range(16))  # a partition


def test_bins_are_equal_sized_with_ties_and_deterministic():
    prompts = [f"calc {i}" for i in range(50)]
    student, teacher = [0.0] * 50, [0.5] * 50  # every rate tied: the prompt hash decides
    a = bin_by_rates(prompts, student, teacher, 2, 4)
    b = bin_by_rates(list(prompts), list(student), list(teacher), 2, 4)
    assert a == b
    sizes = sorted(len(v) for v in a.values())
    assert sizes[-1] - sizes[0] <= 1 and sum(sizes) == 50


@pytest.mark.parametrize("n,bins", [(7, (2, 4)), (8, (0, 4))])
def test_bins_reject_impossible_cuts(n, bins):
    with pytest.raises(ValueError):
        bin_by_rates([f"p{i}" for i in range(n)], [0.0] * n, [0.0] * n, *bins)


def test_bins_reject_mismatched_lengths():
    with pytest.raises(ValueError, match="same length"):
        bin_by_rates(["a", "b"], [0.0], [0.0, 1.0], 1, 1)


def test_load_subset_names_the_file_and_the_subsets(tmp_path):
    path = tmp_path / "subsets.json"
    with pytest.raises(FileNotFoundError, match="subsets.json"):
        load_subset(path, "s0t0")
    path.write_text(json.dumps({"subsets": {"s0t0": {"prompts": ["x"]}}}))
    assert load_subset(path, "s0t0")["prompts"] == ["x"]
    with pytest.raises(KeyError, match="s0t0"):
        load_subset(path, "s9t9")


def test_t_quantiles():
    assert t_quantile_95(2) == pytest.approx(4.303)
    assert t_quantile_95(1000) == pytest.approx(1.962, abs=1e-3)
    assert t_quantile_95(31) == pytest.approx(2.040, abs=2e-3)  # the expansion joins the table smoothly
    with pytest.raises(ValueError):
        t_quantile_95(0)


def test_mean_interval_on_known_data():
    mean, lo, hi = mean_interval([1.0, 2.0, 3.0])
    half = 4.303 * 1.0 / math.sqrt(3)  # sd 1, n 3
    assert (mean, lo, hi) == pytest.approx((2.0, 2.0 - half, 2.0 + half))
    assert mean_interval([0.4]) == (0.4, 0.4, 0.4)
    assert all(math.isnan(x) for x in mean_interval([]))
    assert all(math.isnan(x) for x in mean_interval([1.0, float("nan")]))


def test_interval_verdicts():
    assert interval_verdict(0.1, 0.5) == HOLDS
    assert interval_verdict(-0.5, -0.1) == FAILS
    assert interval_verdict(-0.1, 0.5) == INCONCLUSIVE
    assert interval_verdict(0.0, 0.0) == FAILS                  # strict: 0 is not above 0
    assert interval_verdict(0.0, 0.2, strict=False) == HOLDS    # >= 0 claims
    assert interval_verdict(-0.2, 0.0, strict=False) == INCONCLUSIVE
