"""Uncertainty over seeds: 95% intervals for curves and claims, and the verdict rule.

Our own code (no scipy in the dependencies for one quantile table). Seeds are the unit of replication: each seed
re-runs every post-training job with other sampling and data order (the base models are shared), so the intervals
say how much a finding depends on training randomness, not on the choice of base model.

* Curves and claim statistics: mean over seeds +- Student's t quantile (two-sided 95%) x standard error.
* Verdict: a claim *holds* when its whole interval lies on the claim's side of the threshold, *does not hold* when
  the whole interval lies on the other side, and is *inconclusive* when the interval straddles it. One seed gives no
  interval: the verdict then follows the single value, labelled "indicative: one seed"; two seeds give an interval
  with one degree of freedom, which decides only when it excludes the threshold (else agreeing seeds give an
  indicative verdict; :func:`opdgrpo.report.claims._combine`).
* Readings that are bounds (a savings figure censored where a run never reached the target) and discrete margins go
  through one *monotone* interval (:func:`monotone_interval`): each seed is a range [low, high] of values it may
  have (a figure: low = high; a bound: infinite on its open side), the lower end of the interval is the best t lower
  end of any values no better than the seeds' lows, the upper end the best t upper end of any values no worse than
  their highs, and the interval's spread is never below a stated floor. So worsening a seed, or replacing a figure
  by a bound on it, never moves a verdict towards "holds" or makes it stronger, and a zero-width sample interval
  never decides alone. Why a floor: a rule that is monotone and does not depend on the margin's scale holds whenever
  every seed is positive (any positive sample is at or above a scaled-down copy of another), a 1 in 2^n chance under
  a null, 12.5% with 3 seeds; the floor is the scale that makes 3 seeds able to test at 2.5% (docs/method.md).
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


def _lower_end(values: Sequence[float], floor: float) -> float:
    """sup over y <= ``values`` (componentwise) of mean(y) - t x max(sd(y), floor) / sqrt(n).

    The objective is concave in y (a mean less a multiple of a convex spread), so the supremum lies on the family
    y = min(values, c) (lowering the seeds above c to c: KKT); on each stretch of c between two sorted values the
    clipped set is fixed and the objective concave in c, so a ternary search finds its maximum there."""
    x = sorted(float(v) for v in values)
    n = len(x)
    if x[0] == -math.inf or x[0] == math.inf:   # a seed that may be anything down there / every seed unbounded
        return x[0]
    k = t_quantile_95(n - 1) / math.sqrt(n)

    def at(c: float) -> float:
        y = [min(v, c) for v in x]
        mean = math.fsum(y) / n
        sd = math.sqrt(math.fsum((v - mean) ** 2 for v in y) / (n - 1))
        return mean - k * max(sd, floor)

    finite = [v for v in x if math.isfinite(v)]
    reach = (finite[-1] - finite[0]) + floor + abs(finite[-1]) + 1.0
    best = at(x[0])
    for a, b in zip(x, x[1:]):
        lo, hi = a, (b if math.isfinite(b) else finite[-1] + 1e3 * reach)
        for _ in range(100):
            m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
            if at(m1) < at(m2):
                lo = m1
            else:
                hi = m2
        best = max(best, at(lo), at(b) if math.isfinite(b) else -math.inf)
    return best


def monotone_interval(lows: Sequence[float], highs: Sequence[float], floor: float) -> tuple[float, float]:
    """(lower, upper) of the monotone 95% interval of seeds known only to lie in [low, high] each (module
    docstring): lower = sup over y <= lows of the t lower end with spread at least ``floor``, upper = inf over
    y >= highs of the t upper end. A figure has low = high; an upper bound v is (-inf, v], a lower bound [v, inf),
    an unknown seed (-inf, inf); a figure of -inf is -inf on both sides. Non-decreasing in every low and high."""
    if len(lows) != len(highs) or len(lows) < 2:
        raise ValueError("monotone_interval needs the same number (>= 2) of lows and highs")
    if floor < 0 or not math.isfinite(floor):
        raise ValueError(f"floor must be a finite number >= 0, got {floor}")
    if any(float(lo) > float(hi) for lo, hi in zip(lows, highs)):
        raise ValueError("a seed's low lies above its high")
    upper = -_lower_end([-float(h) for h in highs], floor)
    return _lower_end(lows, floor), upper


def resolution_floor(step: float) -> float:
    """The least spread of a margin that moves in steps of ``step`` (a count over a fixed number of domains or
    pairs): the standard deviation of rounding to that step, step / sqrt(12). Seeds that all give the same count
    then decide only when the count clears the threshold by more than t x that / sqrt(n), never by agreeing alone."""
    return float(step) / math.sqrt(12.0)


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
