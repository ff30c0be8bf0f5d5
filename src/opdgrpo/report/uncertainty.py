"""Uncertainty over seeds: 95% intervals for curves and claims, and the verdict rule.

Our own code (no scipy in the dependencies for one quantile table). Seeds are the unit of replication: each seed
re-runs every post-training job with other sampling and data order (the base models are shared), so the intervals
say how much a finding depends on training randomness, not on the choice of base model.

* Curves and claim statistics: mean over seeds +- Student's t quantile (two-sided 95%) x standard error.
* Savings: a figure or a bound per seed (:mod:`opdgrpo.report.savings`); savings.csv gives their range over seeds
  (with 3 seeds a bootstrap would have 10 distinct resamples and only restate the range), the verdict the t interval
  of the figures, or the seeds' agreement where a bound stands in for a figure.
* Verdict: a claim *holds* when its whole interval lies on the claim's side of the threshold, *does not hold* when
  the whole interval lies on the other side, and is *inconclusive* when the interval straddles it. One seed gives no
  interval: the verdict then follows the single value, labelled "indicative: one seed"; two seeds give an interval
  with one degree of freedom, which decides only when it excludes the threshold (else agreeing seeds give an
  indicative verdict; :func:`opdgrpo.report.claims._combine`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: Two-sided 95% quantiles of Student's t by degrees of freedom (standard tables).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
        29: 2.045, 30: 2.042}


def t_quantile_95(df: int) -> float:
    """Two-sided 95% quantile of Student's t with ``df`` degrees of freedom (Cornish-Fisher beyond 30)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df in _T95:
        return _T95[df]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, lower, upper) of a 95% t interval; one value gives a zero-width interval (no replication)."""
    x = np.asarray([float(v) for v in values], dtype=float)
    if x.size == 0 or not np.all(np.isfinite(x)):
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if x.size == 1:
        return mean, mean, mean
    half = t_quantile_95(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half


#: The verdict words of claims.md; ``not measured`` when a claim has no data (study absent, a run lacks the domain).
HOLDS, FAILS, INCONCLUSIVE, UNMEASURED = "holds", "does not hold", "inconclusive", "not measured"


def interval_verdict(lo: float, hi: float, threshold: float = 0.0, strict: bool = True) -> str:
    """``holds`` if the interval lies above ``threshold`` (at or above when not ``strict``), ``does not hold`` if it
    lies on the other side, ``inconclusive`` if it straddles it."""
    above = lo > threshold if strict else lo >= threshold
    below = hi <= threshold if strict else hi < threshold
    if above:
        return HOLDS
    if below:
        return FAILS
    return INCONCLUSIVE
