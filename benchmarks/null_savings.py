"""How often the savings verdict over seeds is wrong when the pipeline saves nothing: a simulation under the null.

Run by hand (``python benchmarks/null_savings.py [--trials 2000] [--seeds 3]``); it prints the verdict rates of the
rule claims.md uses (:func:`opdgrpo.report.savings.sign_over_seeds`) and of the rule before it (the t interval when
every seed has a finite figure, the agreement of the seeds' signs as soon as one is a bound or -inf).

The null: true savings 0 at every accuracy. The distillation's true mix accuracy rises as
``a0 + (a1 - a0) (1 - exp(-F / tau))`` over its FLOPs F; joint GRPO's is the same curve shifted right by the
experts' FLOPs E (flat at a0 before E), so at any accuracy joint GRPO's FLOPs equal experts + distillation. Shapes
are S4's in the tiny profile: the distillation evaluated 7 times over a run of 0.8 E (120 steps, every 20; its
whole run about 80% of the experts' cost), joint GRPO 13 times over 2 E (240 steps). Each evaluation is a fresh
binomial draw on held-out sets of the tiny profile's sizes (math: amc and aime, 800 prompts, k = 1; code: 142
prompts, k_eff 2), each set's accuracy drawn around the curve's. Each seed is read by
:func:`opdgrpo.report.savings.compute_savings` with the default matching rule, so the direction, censoring and
-inf readings arise as in a report.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from opdgrpo.report.savings import SAVINGS_FLOOR, compute_savings, finite_figures, savings_sign, sign_over_seeds  # noqa: E402
from opdgrpo.report.uncertainty import FAILS, HOLDS, interval_verdict, mean_interval  # noqa: E402

#: Held-out sets of the tiny profile: (domain, set, prompts, independent samples per prompt).
SETS = [("math", "amc", 800, 1.0), ("math", "aime", 800, 1.0), ("code", "lcb", 142, 2.0)]
EXPERTS = 1.0                      # the experts' final FLOPs (the unit)
DISTILL_RUN, JOINT_RUN = 0.8, 2.0  # whole runs, in units of the experts' FLOPs
A0, A1, TAU = 0.20, 0.40, 0.25     # start, plateau and FLOP scale of the true curve


def _truth(flops: np.ndarray) -> np.ndarray:
    return A0 + (A1 - A0) * (1.0 - np.exp(-np.clip(flops, 0.0, None) / TAU))


def _rows(run: str, flops: np.ndarray, truth: np.ndarray, rng: np.random.Generator) -> list[dict]:
    rows = []
    for step, (f, p) in enumerate(zip(flops, truth)):
        for domain, name, n, k in SETS:
            trials = int(round(n * k))
            rows.append({"run": run, "study": "S4", "step": 20 * step, "cumulative_flops": float(f),
                         "eval_domain": domain, "eval_set": name, "accuracy": rng.binomial(trials, p) / trials,
                         "method": "x", "train_domains": "math+code", "seed": 0, "mean_response_length": 1.0})
    return rows


def one_seed(rng: np.random.Generator) -> tuple[float | None, str]:
    """One seed's (savings, savings_bound) under the null."""
    d_flops = np.linspace(0.0, DISTILL_RUN, 7)
    j_flops = np.linspace(0.0, JOINT_RUN, 13)
    rows = (_rows("distill", d_flops, _truth(d_flops), rng) + _rows("joint", j_flops, _truth(j_flops - EXPERTS), rng)
            + _rows("expert", np.array([0.0, EXPERTS]), np.array([A0, A1]), rng))
    sizes = {}
    for domain, name, n, k in SETS:
        sizes.setdefault(domain, {})[name] = [n, k]
    r = compute_savings(pd.DataFrame(rows), "joint", "distill", ["expert"], ["math", "code"],
                        expert_final_flops={"expert": EXPERTS}, eval_sizes=sizes)
    return r["savings"], r["savings_bound"] or ""


def previous_rule(readings: list[tuple[float | None, str]]) -> str:
    """The rule before: the t interval of the figures when every seed has a finite one, else agreement of signs."""
    figures = finite_figures(readings)
    if len(figures) == len(readings):
        _, lo, hi = mean_interval(figures)
        return {HOLDS: "positive", FAILS: "negative"}.get(interval_verdict(lo, hi), "inconclusive")
    signs = {savings_sign(v, b) for v, b in readings}
    return signs.pop() if len(signs) == 1 and signs != {"unknown"} else "inconclusive"


def simulate(trials: int, seeds: int = 3, rng_seed: int = 0, pool: int | None = None,
             floor: float = SAVINGS_FLOOR) -> dict[str, object]:
    """Verdict counts of both rules over ``trials`` simulated studies of ``seeds`` seeds each, and what the seeds
    read (figures, bounds, -inf) and the spread of the finite figures. With ``pool``, that many seeds are simulated
    once and each study draws its seeds from them without replacement (seeds are independent under the null, so
    this only reuses draws: fast enough for a unit test)."""
    rng = np.random.default_rng(rng_seed)
    drawn = [one_seed(rng) for _ in range(pool)] if pool else []
    new, old, kinds, figures = Counter(), Counter(), Counter(), []
    for _ in range(trials):
        readings = ([drawn[i] for i in rng.choice(len(drawn), seeds, replace=False)] if pool
                    else [one_seed(rng) for _ in range(seeds)])
        new[sign_over_seeds(readings, floor)] += 1
        old[previous_rule(readings)] += 1
        for v, b in readings:
            kinds["-inf" if v is not None and math.isinf(v) else (b or "figure") if v is not None else "none"] += 1
        figures += finite_figures(readings)
    return {"new": new, "old": old, "kinds": kinds, "figure_sd": float(np.std(figures)) if figures else math.nan,
            "trials": trials}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rng-seed", type=int, default=0)
    p.add_argument("--pool", type=int, default=None, help="simulate this many seeds once and draw studies from them")
    p.add_argument("--floor", type=float, default=SAVINGS_FLOOR, help="the interval's least spread (savings, fraction)")
    a = p.parse_args()
    out = simulate(a.trials, a.seeds, a.rng_seed, a.pool, a.floor)
    n = out["trials"]
    print(f"null: true savings 0; {n} simulated studies of {a.seeds} seeds (rng seed {a.rng_seed}"
          f"{f', drawn from a pool of {a.pool}' if a.pool else ''}); floor {a.floor:g}")
    print(f"per-seed readings: {dict(out['kinds'])}; sd of the finite figures {100 * out['figure_sd']:.1f} pts")
    print("| rule | holds (positive) | does not hold (negative) | inconclusive |")
    print("|---|---|---|---|")
    for name in ("old", "new"):
        c = out[name]
        print(f"| {name} | {100 * c['positive'] / n:.1f}% | {100 * c['negative'] / n:.1f}% "
              f"| {100 * c['inconclusive'] / n:.1f}% |")


if __name__ == "__main__":
    main()
