"""S3's verdicts over seeds under a simulated null (true ratio 1, both margins 0): a small seeded run of
benchmarks/null_s3.py (300 studies of 3 seeds drawn from 150 simulated seeds, rng seed 0), which prints the rates at
full size per floor. S3_FLOOR (0.12) is the smallest floor tried whose false rates stay at or under 2.5% for both
claims, in both directions, at full size and at this size (rng seeds 0-4); at ln(1/0.95) = 0.051, the savings' floor
as a ratio, S3-n8 said "does not hold" in 14-20% of null studies."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from opdgrpo.report.studies.s3 import S3_FLOOR

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import null_s3  # noqa: E402

#: A smaller floor, where the null rates exceed the bound (S3-n8 'does not hold' 7.7-20% at this size).
NARROW_FLOOR = -math.log(0.95)
BOUND = 0.025


@pytest.fixture(scope="module")
def null():
    return null_s3.simulate(trials=300, seeds=3, rng_seed=0, pool=150, floors=(S3_FLOOR, NARROW_FLOOR))


def _false_rates(out, floor):
    return {(c, v): null_s3.rate(out, c, floor, v) for c in null_s3.CLAIMS for v in (null_s3.HOLDS, null_s3.FAILS)}


def test_null_s3_false_rates_are_within_the_bound_at_s3_floor(null):
    """Both claims, both directions: at most 2.5% of null studies decide at S3_FLOOR; every seed is measured."""
    rates = _false_rates(null, S3_FLOOR)
    assert all(r <= BOUND for r in rates.values()), rates
    assert all(null_s3.rate(null, c, S3_FLOOR, null_s3.UNMEASURED) == 0 for c in null_s3.CLAIMS)


def test_a_narrower_floor_would_not_hold_the_bound(null):
    """What the floor is for: at the savings' 5-point floor as a ratio, S3-n8 says "does not hold" by chance more
    often than the bound allows, and no rate is lower than at S3_FLOOR (a wider least spread only widens the
    interval)."""
    narrow, wide = _false_rates(null, NARROW_FLOOR), _false_rates(null, S3_FLOOR)
    assert max(narrow.values()) > BOUND
    assert all(wide[k] <= narrow[k] for k in wide), (wide, narrow)
