"""When does a curve *reach* an accuracy? The matching rule of the savings (S4, S5) and of S3's crossings.

A single evaluation point is one noisy draw: avg@k over n held-out prompts. Taking the best of 41 such points as a
target picks the luckiest draw (biased upward), and taking the first point at or above a target picks the first
lucky draw (biased early). The rule below reads targets and crossings from smoothed curves and counts a curve as
having reached a target when it comes within the evaluation's own noise of it:

* **Smoothing.** Every accuracy curve is replaced by its trailing moving average over ``smooth_window`` (odd,
  default 3) evaluation points: point i becomes the mean of the valid points i-w+1 .. i, the window truncated at the
  start (the first point is the first evaluation itself, the second the mean of the first two). A smoothed point so
  averages only what was measured at or before its own step and FLOPs: nothing placed at 0 FLOPs was measured later
  (a centred window put the mean of steps 0 and 20 at 0 FLOPs, and a run that reached a target by step 20 read as
  reaching it for free). Points whose accuracy is NaN (a domain missing at that point) stay NaN and are skipped as
  neighbours. ``smooth_window`` = 1 is the raw curve.
* **Standard error of one evaluation point.** A held-out set with n prompts and k samples per prompt scores avg@k, a
  mean of n*k rewards that are not independent: the k samples of one prompt share its difficulty. With q_i the
  chance of solving prompt i and p their mean, the variance of avg@k is (Var(q) + E[q (1 - q)] / k) / n, between
  p (1 - p) / (n k) (samples independent: every q_i = p) and p (1 - p) / n (each prompt always or never solved).
  Both terms are read from what every evaluation records: unbiased pass@2 estimates E[1 - (1 - q)^2], so
  E[q (1 - q)] = pass@2 - p and Var(q) = 2p - pass@2 - p^2 (:func:`design_effect`). Their ratio to the binomial
  variance, the design effect, is averaged over a run's evaluations per set (clipped to [1, k]) and turns k into
  k_eff = k / design effect, the independent samples a prompt is worth. This is the error of one evaluation as a
  measure of the model's accuracy on its domain, the held-out set being one draw of the domain's prompts (errors
  clustered by prompt, as Miller 2024, "Adding Error Bars to Evals", recommends); two evaluations of the same set
  share their prompts and differ by less, a paired variance the rule does not use. A domain's accuracy is the mean
  of its S held-out sets, a mix's the mean of its D domains, so at accuracy p

      SE(p) = sqrt( p (1 - p) * sum_d (1 / D^2) * sum_{s in d} 1 / (S_d^2 n_s k_eff_s) ),

  with p (1 - p) taken per set at that set's own accuracy where the caller knows it (the sets of the point that
  sets the target): sets differ (math near 0.1, code near 0.5) and weigh by 1 / (n k), so p (1 - p) at the mix's
  accuracy for every set is no bound, it understated S4's SE by about a tenth (1.26 against 1.41 points). Without
  the sets' accuracies every set takes the mix's. n and k are those the run's ``evals.jsonl`` records per set; a set sampled once per
  prompt (k = 1, greedy) has k_eff = 1; a set without pass@2 in any record keeps k (the smallest the error can be);
  unknown sizes give no SE.
* **Tolerance.** A curve has reached target T when its smoothed accuracy is at least

      T - slack,   slack = tolerance / 100 + tolerance_se * SE(T),

  ``tolerance`` in accuracy points (0 by default) and ``tolerance_se`` in standard errors of one evaluation point
  (1 by default). Both sides of a comparison get the same slack (the joint run's FLOPs to the target are read at
  the same threshold as the distillation's), so the slack does not favour either method.

Why these defaults (chosen before looking at any verdict): a window of 3 averages a target over three draws (its
noise shrinks by about sqrt(3)); a trailing mean of a rising curve lags it by one evaluation interval on average
((w - 1) / 2), the same lag for both sides of a comparison, and the shortest curves (a distillation of 100 steps
evaluated every 10) have 11 points, so a wider window would blur most of their rise. The window stays odd: its mean
then estimates the curve at an evaluation point, (w - 1) / 2 intervals back. One standard error says "a difference
smaller than one evaluation's noise is not a difference", the weakest tolerance that still stops a lucky draw from
deciding a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Defaults of the study keys ``smooth_window``, ``tolerance_se`` and (S4, S5) ``share_threshold``; conf/study/*.yaml
#: states the same values and a unit test holds them together.
DEFAULT_SMOOTH_WINDOW = 3
DEFAULT_TOLERANCE_SE = 1.0
#: A distillation "costs a small fraction" of its experts when its share is below this: the paper measured 5.2% (two
#: domains) and 8.0% (four); 15% is about twice the larger of them, so a reproduction within a factor of two of the
#: paper's shares holds and one where distillation costs a sizeable part of an expert's training does not.
DEFAULT_SHARE_THRESHOLD = 0.15
#: The savings read joint GRPO's own best accuracy (the paper's direction) only when joint GRPO gained at least this
#: many standard errors of one evaluation over its first (smoothed) point; below it the target sits within noise of
#: the start, the joint run's FLOPs to it are near 0 and the savings blow up (a 1.75-point gain gave -308%), so the
#: comparison is read the other way (opdgrpo.report.savings). 3 SE: the measurability condition docs/method.md
#: states for joint GRPO in the default world, fixed before any run.
DEFAULT_MIN_JOINT_GAIN_SE = 3.0

#: Per held-out set of a domain: ``{domain: {set: (n_prompts, k_eff)}}``, k_eff the independent samples a prompt's k
#: are worth (:func:`eval_sizes`).
EvalSizes = Mapping[str, Mapping[str, Sequence[float]]]


@dataclass(frozen=True)
class MatchRule:
    """The matching rule of one study entry (see the module docstring)."""

    window: int = DEFAULT_SMOOTH_WINDOW
    tolerance_points: float = 0.0
    tolerance_se: float = DEFAULT_TOLERANCE_SE
    min_joint_gain_se: float = DEFAULT_MIN_JOINT_GAIN_SE

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window < 1 or self.window % 2 == 0:
            raise ValueError(f"smooth_window must be an odd integer >= 1, got {self.window!r}")
        for name in ("tolerance_points", "tolerance_se", "min_joint_gain_se"):
            value = getattr(self, name)
            if value < 0 or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")

    @classmethod
    def of(cls, entry: Mapping[str, Any]) -> MatchRule:
        """The rule a report-spec entry asks for: keys ``smooth_window``, ``tolerance`` (points), ``tolerance_se``,
        ``min_joint_gain_se``; an entry without them (a spec written before they existed) gets the defaults."""
        return cls(window=int(entry.get("smooth_window", DEFAULT_SMOOTH_WINDOW)),
                   tolerance_points=float(entry.get("tolerance", 0.0)),
                   tolerance_se=float(entry.get("tolerance_se", DEFAULT_TOLERANCE_SE)),
                   min_joint_gain_se=float(entry.get("min_joint_gain_se", DEFAULT_MIN_JOINT_GAIN_SE)))

    def slack(self, se: float | None) -> float:
        """Accuracy (a fraction) a curve may fall short of a target by and still reach it; no SE counts as 0."""
        return self.tolerance_points / 100.0 + (self.tolerance_se * se if se else 0.0)

    def min_gain(self, se: float | None) -> float:
        """The least gain over its start that makes a joint run's best a target (a fraction): ``min_joint_gain_se``
        standard errors, and never less than the slack (without an SE: the slack alone)."""
        return max(self.slack(se), self.min_joint_gain_se * se if se else 0.0)


def smooth(accuracy: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` (odd) valid points, truncated at the start; NaN points stay NaN.

    Trailing, not centred, so a smoothed point never looks ahead: the first point is the first evaluation itself and
    no point averages in an evaluation measured after it (module docstring)."""
    if window < 1 or window % 2 == 0:
        raise ValueError(f"smooth_window must be an odd integer >= 1, got {window}")
    values = [float(a) for a in accuracy]
    valid = [i for i, a in enumerate(values) if not math.isnan(a)]
    out = [math.nan] * len(values)
    for j, i in enumerate(valid):
        behind = [values[valid[m]] for m in range(max(0, j - window + 1), j + 1)]
        out[i] = math.fsum(behind) / len(behind)
    return out


def start_of(accuracy: Sequence[float]) -> float:
    """A run's start, where its gains are measured from: its first complete evaluation, unsmoothed. Every run of a
    seed starts from the same base model, evaluated with the same draws; with the trailing window it is also the
    smoothed curve's first point (docs/method.md, "Matching rule")."""
    return next(float(a) for a in accuracy if not math.isnan(float(a)))


def mix_se(accuracy: float, sizes: EvalSizes | None, domains: Sequence[str],
           set_accuracy: Mapping[str, Mapping[str, float]] | None = None) -> float | None:
    """Standard error of one evaluation point's mix accuracy (module docstring), each set's binomial variance at its
    own accuracy from ``set_accuracy`` (``{domain: {set: accuracy}}``) where given, else at ``accuracy``: the sets
    differ and weigh unequally, so one p for all of them can understate the error. None when a domain's held-out
    sizes are unknown."""
    if not sizes or not domains or math.isnan(accuracy):
        return None
    own = set_accuracy or {}
    var = 0.0
    for d in domains:
        sets = sizes.get(d) or {}
        if not sets:
            return None
        terms = []
        for name, (n, k) in sets.items():
            p = own.get(d, {}).get(name, accuracy)
            p = min(max(float(accuracy if math.isnan(float(p)) else p), 0.0), 1.0)
            terms.append(p * (1.0 - p) / (float(n) * float(k)))
        var += math.fsum(terms) / (len(sets) ** 2 * len(domains) ** 2)
    return math.sqrt(var)


def design_effect(k: int, pass1: float, pass2: float) -> float | None:
    """How many times the variance of a set's avg@k exceeds that of n*k independent rewards (module docstring), from
    its pass@1 and pass@2; clipped to [1, k] (the estimates are noisy); None where pass@1 is 0 or 1 (no variance)."""
    p = float(pass1)
    if k < 2 or not 0.0 < p < 1.0:
        return None
    within = float(pass2) - p            # E[q (1 - q)]
    between = p - p * p - within         # Var(q) = 2p - pass@2 - p^2
    ratio = k * (between + within / k) / (p * (1.0 - p))
    return min(max(ratio, 1.0), float(k))


def eval_sizes(run_dir: Path) -> dict[str, dict[str, list[float]]]:
    """``{domain: {set: [n_prompts, k_eff]}}`` of a run's held-out sets, from its ``evals.jsonl`` (training writes
    ``n_prompts``, ``k`` and, where k > 1, pass@2 per set): k_eff is k over the set's design effect averaged over the
    run's evaluations (:func:`design_effect`). Sets without n and k, and the ``in_domain`` set, left out."""
    from opdgrpo.runio import IN_DOMAIN_SET, iter_jsonl

    sizes: dict[tuple[str, str], tuple[int, int]] = {}
    effects: dict[tuple[str, str], list[float]] = {}
    for _, record in iter_jsonl(Path(run_dir) / "evals.jsonl", missing_ok=True):
        for r in record.get("results", []):
            n, k = r.get("n_prompts"), r.get("k")
            if r.get("eval_set") == IN_DOMAIN_SET or not isinstance(n, int) or not isinstance(k, int) or n < 1 or k < 1:
                continue
            key = (str(r["eval_domain"]), str(r["eval_set"]))
            sizes.setdefault(key, (n, k))
            passes = r.get("pass_at_k") or {}
            if "pass@1" in passes and "pass@2" in passes:
                effect = design_effect(k, passes["pass@1"], passes["pass@2"])
                if effect is not None:
                    effects.setdefault(key, []).append(effect)
    out: dict[str, dict[str, list[float]]] = {}
    for (domain, name), (n, k) in sizes.items():
        seen = effects.get((domain, name))
        out.setdefault(domain, {})[name] = [n, k / (math.fsum(seen) / len(seen)) if seen else k]
    return out
