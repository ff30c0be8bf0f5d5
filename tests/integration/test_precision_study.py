"""Results travel across precisions (docs/speed.md, "Precision per machine"): a small seeded study run in float32
and in bf16 autocast, read by the verdict machinery of claims.md (95% t intervals over seeds,
:mod:`opdgrpo.report.uncertainty`), agrees within its intervals.

The study: GRPO from the smoke student, three seeds, each run once per precision; the claim read is "GRPO raises the
held-out score" (the last evaluation minus the step-0 one, per seed). A claim that is inconclusive in both arithmetics
would agree trivially, so the reward is one GRPO measurably teaches in a CI-sized run: a short answer
(:func:`learning.short_answer_scores`, as in the vLLM engine test), scored by the one scorer both training rewards
and held-out evaluation call. Seeds replicate sampling and data order, so the two precisions are two samples of one
experiment: float32's verdict must hold (else the study measures nothing), bf16's must not contradict it, and their
intervals must overlap. Everything but the reward is real: sampling, the GRPO update in the run's arithmetic, and
held-out evaluation of the knowledge domain's ``knowledge`` set (45 prompts, avg@4 at temperature 1).
"""

from __future__ import annotations

import copy
import json

import pytest
from learning import short_answer_scores

from opdgrpo.report.uncertainty import FAILS, HOLDS, interval_verdict, mean_interval
from opdgrpo.runio import read_jsonl
from opdgrpo.train.loop import train

SEEDS, STEPS = (0, 1, 2), 12


def _score(evaluation: dict) -> float:
    """The run's one held-out set's avg@k at one evaluation point."""
    (result,) = evaluation["results"]
    return result["accuracy"]


@pytest.fixture(scope="module")
def gains(smoke_world, tmp_path_factory) -> dict[str, list[float]]:
    """{precision: [held-out gain of each seed]}."""
    from opdgrpo.train import rollout

    _, plan = smoke_world
    root = tmp_path_factory.mktemp("precision-study")
    out: dict[str, list[float]] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rollout, "score", short_answer_scores)
        for precision in ("fp32", "bf16"):
            out[precision] = []
            for seed in SEEDS:
                cfg = copy.deepcopy(plan.jobs["grpo-student-knowledge-s0"].config)
                cfg["method"].update({"steps": STEPS, "group_size": 8, "lr": 2e-3})
                cfg["train"].update({"precision": precision, "prompts_per_step": 8, "eval_every": STEPS,
                                     "checkpoint_every": 1000, "eval": dict(cfg["train"]["eval"], k=4, temperature=1.0)})
                knowledge = cfg["domains"]["knowledge"]
                knowledge["heldout"] = {"knowledge": dict(knowledge["heldout"]["knowledge"], size=None)}
                cfg["seed"], cfg["run_id"] = seed, f"precision-{precision}-s{seed}"
                run_dir = root / cfg["run_id"]
                train(cfg, run_dir)
                evals = read_jsonl(run_dir / "evals.jsonl")
                assert [e["step"] for e in evals] == [0, STEPS]
                assert json.loads((run_dir / "done.json").read_text())["numerics"]["precision"]["resolved"] == precision
                out[precision].append(_score(evals[-1]) - _score(evals[0]))
    return out


@pytest.mark.slow
def test_the_gain_over_seeds_agrees_across_precisions(gains):
    intervals, verdicts = {}, {}
    for precision, per_seed in gains.items():
        _, lo, hi = mean_interval(per_seed)
        intervals[precision], verdicts[precision] = (lo, hi), interval_verdict(lo, hi)
    print("held-out gain per seed:", gains, "95% intervals:", intervals, "verdicts:", verdicts)
    assert verdicts["fp32"] == HOLDS, f"the study measures nothing: float32's gain is {verdicts['fp32']} {intervals}"
    (lo32, hi32), (lo16, hi16) = intervals["fp32"], intervals["bf16"]
    assert lo32 <= hi16 and lo16 <= hi32, f"the 95% intervals over seeds do not overlap: {intervals}"
    assert {verdicts["fp32"], verdicts["bf16"]} != {HOLDS, FAILS}, f"opposite verdicts: {verdicts}, {intervals}"
