"""pass@k against brute-force enumeration of k-subsets and exact binomials; avg@n; summarise over prompts."""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import combinations

import pytest

from opdgrpo.train.metrics import avg_at_k, pass_at_k, summarise


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of the k-subsets of n samples (the first c correct) that hold at least one correct sample."""
    subsets = list(combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_edges():
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the solve rate
    assert pass_at_k(10, 3, 8) == 1.0  # fewer than 8 wrong samples: every 8-subset holds a correct one


def test_pass_at_k_large_n_is_stable():
    """C(n, k) overflows a float here; the product form must still match the exact ratio."""
    n, c, k = 2000, 37, 500
    with pytest.raises(OverflowError):
        float(math.comb(n, k))
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-9)
    assert pass_at_k(10_000, 1, 1) == pytest.approx(1e-4)


@pytest.mark.parametrize("n,c,k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_avg_at_k():
    assert avg_at_k([1.0, 0.0, 1.0, 1.0]) == 0.75
    assert avg_at_k([0.5]) == 0.5
    with pytest.raises(ValueError):
        avg_at_k([])


def test_summarise_against_brute_force():
    rewards = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 1, 0]]
    out = summarise(rewards, ks=[1, 2, 4, 8])
    assert out["n"] == 4 and out["prompts"] == 4
    assert out["avg@4"] == pytest.approx(7 / 16)
    assert out["pass@1"] == pytest.approx(out["avg@4"])  # binary rewards: pass@1 is avg@n
    for k in (2, 4):
        expected = sum(brute_pass_at_k(4, sum(r), k) for r in rewards) / 4
        assert out[f"pass@{k}"] == pytest.approx(expected)
    assert out["pass@4"] == pytest.approx(3 / 4)  # the prompts with any correct sample
    assert "pass@8" not in out  # k above n is left out


def test_summarise_partial_credit_counts_as_unsolved():
    out = summarise([[0.5, 1.0], [0.9, 0.0]], ks=[1, 2])
    assert out["avg@2"] == pytest.approx(0.6)
    assert out["pass@1"] == pytest.approx(0.25) and out["pass@2"] == pytest.approx(0.5)
    assert summarise([[0.5, 0.5]], ks=[1], success=0.5)["pass@1"] == 1.0


@pytest.mark.parametrize("rewards,ks,match", [
    ([], [1], "no prompts"), ([[1, 0], [1]], [1], "same, non-zero"), ([[]], [1], "same, non-zero"),
    ([[1, 0]], [0], "k must be"),
])
def test_summarise_rejects_bad_input(rewards, ks, match):
    with pytest.raises(ValueError, match=match):
        summarise(rewards, ks)
