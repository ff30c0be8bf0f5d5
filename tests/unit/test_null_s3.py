"""S3's verdicts over seeds under a simulated null (true ratio 1, both margins 0): a small seeded run of
benchmarks/null_s3.py (300 studies of 3 seeds drawn from 150 simulated seeds, rng seed 0), which prints the rates at
full size per floor.

Measured (benchmarks/null_s3.py, 1000 studies): at S3_FLOOR = ln(1/0.95) S3-n1 says "holds" in 1.9-3.4% and "does
not hold" in 2.4-4.4% of null studies, and S3-n8 "does not hold" in 14-20% (its margin is the smaller of two noisy
log ratios, biased below 0); a floor of 0.12 keeps every rate at or under 0.7% at full size and 2.0% here. So the
2.5% bound holds at 0.12, not at S3_FLOOR: the floor is the maintainers' decision, and the S3_FLOOR test is expected
to fail (strict: it says so once the floor is raised far enough)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from opdgrpo.report.studies.s3 import S3_FLOOR

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import null_s3  # noqa: E402

#: Every null rate <= 2.5% in every run tried at this floor: 1000 studies (a pool of 300, rng seed 0; fresh seeds) and
#: this size (rng seeds 0-4, at most 2.0%); at 0.1 this size gave 3.7% (S3-n8 "does not hold", rng seed 0).
BOUNDED_FLOOR = 0.12
BOUND = 0.025


@pytest.fixture(scope="module")
def null():
    return null_s3.simulate(trials=300, seeds=3, rng_seed=0, pool=150, floors=(S3_FLOOR, BOUNDED_FLOOR))


def _false_rates(out, floor):
    return {(c, v): null_s3.rate(out, c, floor, v) for c in null_s3.CLAIMS for v in (null_s3.HOLDS, null_s3.FAILS)}


def test_null_s3_false_rates_are_within_the_bound_at_a_floor_of_0_12_and_fall_with_the_floor(null):
    """Both claims, both directions: at most 2.5% of null studies decide at a floor of 0.12, and no rate is higher
    than at the smaller S3_FLOOR (a wider least spread only widens the monotone interval). Every seed is measured."""
    wide, narrow = _false_rates(null, BOUNDED_FLOOR), _false_rates(null, S3_FLOOR)
    assert all(r <= BOUND for r in wide.values()), wide
    assert all(wide[k] <= narrow[k] for k in wide), (wide, narrow)
    assert all(null_s3.rate(null, c, S3_FLOOR, null_s3.UNMEASURED) == 0 for c in null_s3.CLAIMS)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="measured: at S3_FLOOR = ln(1/0.95) S3-n8 says 'does not hold' in 14-20% of "
                   "null studies and S3-n1 decides in 2-4% each way (benchmarks/null_s3.py); raising the floor is the "
                   "maintainers' decision")
def test_null_s3_false_rates_are_within_the_bound_at_s3_floor(null):
    rates = _false_rates(null, S3_FLOOR)
    assert all(r <= BOUND for r in rates.values()), rates
