"""How often S3's verdicts over seeds are wrong when OPD costs what GRPO costs: a simulation under the null.

Run by hand (``python benchmarks/null_s3.py [--trials 1000] [--pool 300] [--seeds 3] [--floor 0 0.02 0.051 0.1 0.12]``);
it prints, per floor (the monotone interval's least spread on the log FLOP ratio; the report's is
:data:`opdgrpo.report.studies.s3.S3_FLOOR` = 0.12, chosen by this simulation), the verdict rates of S3-n1 and S3-n8 over seeds, what
the seeds read, and the same under one alternative (``--alt-n1 2``: OPD n=1 reaches any accuracy at half GRPO's
FLOPs) to show what the floor costs in power.

The null: true ratio 1, so both claims' margins are 0 in truth (S3-n1: ln ratio(1); S3-n8: the smaller of
ln ratio(8) and ln F_opd(8) / F_opd(1), both 0). Every run's true math accuracy after s training steps is
``A0 + (A1 - A0) (1 - exp(-s / TAU))``: 6% rising 4 points to a 10% plateau with a scale of 10 steps, like the tiny
world's math experts (docs/LOG.md: gains of 1.5-5 points from 5-7% over 120 steps), saturated by the OPD runs' last
evaluation so that OPD can reach the teacher in its 60 steps. GRPO and both OPD runs cost the same
FLOPs per step (the unit: 1 / 120, GRPO's whole run is 1), so they reach any accuracy at the same true FLOPs and
their FLOP grids coincide: the trailing window's lag (about one evaluation interval) is the same FLOPs for every
run and the reading itself favours neither method. OPD n=1 and n=8 are equally costly. An alternative with true
ratio R for OPD(n) gives that run per-step FLOPs 1 / R of GRPO's (the same curve in steps, so its FLOPs to any
accuracy, and its lag, are 1 / R of GRPO's).

Shapes are S3's in the tiny profile (conf/profile/tiny.yaml, conf/study/s3.yaml): GRPO (also the teacher) 120 steps
evaluated every 20 (7 points), each OPD run 60 steps every 20 (4 points); math's held-out sets amc and aime, 800
prompts each at k = 1, each evaluation a fresh binomial draw per set around the curve; ``smooth_window`` 3 and
``tolerance_se`` 1 with the sets' sizes in the entry's ``eval_sizes``, so the teacher's target is its final smoothed
accuracy less one standard error (about 0.75 points) as in a report. Each seed is read by
``REPORTS["S3"].evaluate`` and each study's seeds combined by :func:`opdgrpo.report.claims._combine`, so censoring
(a run that never reaches the teacher bounds its ratio) and "not measured" arise as in a report.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from opdgrpo.report.claims import _combine  # noqa: E402
from opdgrpo.report.studies import REPORTS  # noqa: E402
from opdgrpo.report.studies.s3 import S3_FLOOR  # noqa: E402
from opdgrpo.report.uncertainty import FAILS, HOLDS, INCONCLUSIVE, UNMEASURED  # noqa: E402

#: Math's held-out sets in the tiny profile: (set, prompts, samples per prompt).
SETS = [("amc", 800, 1), ("aime", 800, 1)]
GRPO_STEPS, OPD_STEPS, EVAL_EVERY = 120, 60, 20   # methods.grpo.steps, methods.opd.steps, train.eval_every
A0, A1, TAU = 0.06, 0.10, 10.0                     # start, plateau, scale in steps of the true curve
STEP_FLOPS = 1.0 / GRPO_STEPS                      # GRPO's FLOPs per step (its whole run is 1)
CLAIMS = ("S3-n1", "S3-n8")
FLOORS = (0.0, 0.02, -math.log(0.95), 0.1, S3_FLOOR)
VERDICTS = (HOLDS, FAILS, INCONCLUSIVE, UNMEASURED)
ENTRY = {"title": "null", "domain": "math", "grpo": "grpo", "teacher": "grpo", "opd": {"1": "opd1", "8": "opd8"},
         "smooth_window": 3, "tolerance_se": 1.0,
         "eval_sizes": {"math": {name: [n, k] for name, n, k in SETS}}}


def _truth(steps: np.ndarray) -> np.ndarray:
    return A0 + (A1 - A0) * (1.0 - np.exp(-steps / TAU))


def _rows(run: str, steps: int, step_flops: float, rng: np.random.Generator) -> list[dict]:
    rows = []
    for step in range(0, steps + 1, EVAL_EVERY):
        p = float(_truth(np.array(step, dtype=float)))
        for name, n, k in SETS:
            rows.append({"run": run, "study": "S3", "method": "grpo" if run == "grpo" else "opd",
                         "train_domains": "math", "seed": 0, "step": step, "cumulative_flops": step * step_flops,
                         "eval_domain": "math", "eval_set": name, "accuracy": rng.binomial(n * k, p) / (n * k),
                         "mean_response_length": 10.0})
    return rows


def one_seed(rng: np.random.Generator, ratio_n1: float = 1.0, ratio_n8: float = 1.0) -> dict[str, tuple]:
    """One seed's S3 verdicts (claim -> ``(ours, verdict[, margin, strict, floor])``), OPD(n)'s true ratio given."""
    rows = (_rows("grpo", GRPO_STEPS, STEP_FLOPS, rng) + _rows("opd1", OPD_STEPS, STEP_FLOPS / ratio_n1, rng)
            + _rows("opd8", OPD_STEPS, STEP_FLOPS / ratio_n8, rng))
    return REPORTS["S3"].evaluate(dict(ENTRY), pd.DataFrame(rows), {})


def kind(result: tuple) -> str:
    """What one seed read: a figure, a lower or upper bound, a finite range, unsettled, or not measured."""
    if len(result) < 3:
        return "not measured"
    lo, hi = result[2]
    if lo == hi:
        return "figure"
    if math.isinf(lo) and math.isinf(hi):
        return "unsettled"
    return "lower bound" if math.isinf(hi) else "upper bound" if math.isinf(lo) else "range"


def verdict_of(text: str) -> str:
    return next(v for v in VERDICTS if text.startswith(v))


def simulate(trials: int, seeds: int = 3, rng_seed: int = 0, pool: int | None = 300,
             floors: tuple[float, ...] = FLOORS, ratio_n1: float = 1.0, ratio_n8: float = 1.0) -> dict[str, object]:
    """Verdict counts per claim and floor over ``trials`` simulated studies of ``seeds`` seeds each, what the seeds
    read and the sd of their finite margins. With ``pool``, that many seeds are simulated once and each study draws
    its seeds from them without replacement (seeds are independent, so this only reuses draws); without, every
    study draws fresh seeds. Every floor reads the same studies."""
    rng = np.random.default_rng(rng_seed)
    drawn = [one_seed(rng, ratio_n1, ratio_n8) for _ in range(pool)] if pool else []
    counts = {(c, f): Counter() for c in CLAIMS for f in floors}
    kinds = {c: Counter() for c in CLAIMS}
    figures: dict[str, list[float]] = {c: [] for c in CLAIMS}
    for _ in range(trials):
        study = ([drawn[i] for i in rng.choice(len(drawn), seeds, replace=False)] if pool
                 else [one_seed(rng, ratio_n1, ratio_n8) for _ in range(seeds)])
        for c in CLAIMS:
            results = [s[c] for s in study]
            for r in results:
                kinds[c][kind(r)] += 1
                if kind(r) == "figure" and math.isfinite(r[2][0]):
                    figures[c].append(r[2][0])
            for f in floors:
                per_seed = [(i, *r[:4], f) if len(r) > 2 else (i, *r) for i, r in enumerate(results)]
                counts[c, f][verdict_of(_combine(per_seed)[1])] += 1
    return {"counts": counts, "kinds": kinds, "trials": trials,
            "figure_sd": {c: float(np.std(v)) if v else math.nan for c, v in figures.items()},
            "figure_mean": {c: float(np.mean(v)) if v else math.nan for c, v in figures.items()}}


def rate(out: dict, claim: str, floor: float, verdict: str) -> float:
    return out["counts"][claim, floor][verdict] / out["trials"]


def table(out: dict, floors: tuple[float, ...], title: str) -> None:
    print(title)
    for c in CLAIMS:
        k = out["kinds"][c]
        total = sum(k.values())
        read = ", ".join(f"{name} {100 * k[name] / total:.1f}%" for name in
                         ("figure", "lower bound", "upper bound", "range", "unsettled", "not measured") if k[name])
        print(f"{c} per-seed readings: {read}; finite log-ratio margins: mean {out['figure_mean'][c]:+.3f}, "
              f"sd {out['figure_sd'][c]:.3f}")
    print("| claim | floor | holds | does not hold | inconclusive | not measured |")
    print("|---|---|---|---|---|---|")
    for c in CLAIMS:
        for f in floors:
            cells = " | ".join(f"{100 * rate(out, c, f, v):.1f}%" for v in VERDICTS)
            print(f"| {c} | {f:.3g}{' (S3_FLOOR)' if math.isclose(f, S3_FLOOR, abs_tol=5e-4) else ''} | {cells} |")
    print()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=1000)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rng-seed", type=int, default=0)
    p.add_argument("--pool", type=int, default=300, help="simulate this many seeds once and draw studies from them "
                   "(0: fresh seeds for every study)")
    p.add_argument("--floor", type=float, nargs="+", default=list(FLOORS),
                   help="the monotone interval's least spreads to compare (log ratio)")
    p.add_argument("--alt-n1", type=float, default=2.0, help="the alternative's true ratio F_grpo / F_opd(1) "
                   "(1: skip the alternative)")
    p.add_argument("--alt-n8", type=float, default=1.0, help="the alternative's true ratio F_grpo / F_opd(8)")
    a = p.parse_args()
    floors = tuple(a.floor)
    pool = a.pool or None
    src = f"drawn from a pool of {pool} simulated seeds" if pool else "fresh seeds each"
    start = time.perf_counter()
    out = simulate(a.trials, a.seeds, a.rng_seed, pool, floors)
    table(out, floors, f"null: true ratios 1 (both margins 0); {a.trials} studies of {a.seeds} seeds, {src} "
          f"(rng seed {a.rng_seed})")
    if a.alt_n1 != 1.0 or a.alt_n8 != 1.0:
        alt = simulate(a.trials, a.seeds, a.rng_seed, pool, floors, a.alt_n1, a.alt_n8)
        margin8 = min(math.log(a.alt_n8), math.log(a.alt_n1 / a.alt_n8))
        table(alt, floors, f"alternative: true ratio(1) {a.alt_n1:g}, ratio(8) {a.alt_n8:g} (true margins: S3-n1 "
              f"{math.log(a.alt_n1):+.3f}, S3-n8 {margin8:+.3f}); same sizes and rng seed")
    print(f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
