"""One run shape read by the trainer, the cost model and the planner (opdgrpo.run_shape): its defaults, its refusal
of shards that cannot be dealt, and the planner's rows and strategy taken from it (an unset ``train.distributed``
is DDP everywhere)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from opdgrpo.config import compose
from opdgrpo.plan.build import build_plan
from opdgrpo.run_shape import DEFAULT_CHUNK_TOKENS, RunShape

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runs() -> dict:
    return {j.id: j.config for j in build_plan(compose(["profile=paper"], REPO / "conf")).jobs.values() if j.kind == "train"}


def test_the_paper_grpo_run_shape(runs):
    shape = RunShape.of(runs["grpo-student-code-s0"], world=8)
    assert (shape.prompts_per_step, shape.rows_per_prompt, shape.shards, shape.rows_per_shard) == (64, 8, 8, 64)
    assert shape.mine(3) == [3] and shape.sharded and shape.distributed == "fsdp"
    assert not shape.old_policy and not shape.reference and shape.updates_per_batch == 1
    assert shape.logit_chunk_tokens == DEFAULT_CHUNK_TOKENS and shape.microbatch_tokens == 49152


def test_defaults_live_in_the_shape(runs):
    cfg = copy.deepcopy(runs["grpo-student-code-s0"])
    for key in ("distributed", "micro_batches", "logit_chunk_tokens", "max_tokens_per_microbatch", "mix", "nonfinite"):
        cfg["train"].pop(key, None)
    cfg["method"].update(updates_per_batch=2, beta=0.01)
    shape = RunShape.of(cfg, world=2)
    assert (shape.distributed, shape.sharded, shape.shards, shape.mix, shape.nonfinite) == ("ddp", False, 2, "balanced", "stop")
    assert shape.microbatch_tokens is None and shape.old_policy and shape.reference
    assert not shape.one_pass_per_shard and RunShape.of(cfg, world=1).one_pass_per_shard   # 2 shards vs 1


def test_shards_that_cannot_be_dealt_are_refused_naming_the_key(runs):
    cfg = copy.deepcopy(runs["grpo-student-code-s0"])
    with pytest.raises(ValueError, match=r"`train\.micro_batches` \(8\) must be a multiple of the number of processes \(3\)"):
        RunShape.of(cfg, world=3)
    cfg["train"]["max_tokens_per_microbatch"] = 0
    with pytest.raises(ValueError, match=r"`train\.max_tokens_per_microbatch` must be a positive integer"):
        RunShape.of(cfg, world=8)


def test_the_planner_reads_the_strategy_from_the_shape(runs):
    """An unset ``train.distributed`` is DDP for the planner as for the trainer: its gradient buckets are counted."""
    from opdgrpo.cost.memory_model import Shape
    from opdgrpo.cost.resources import _train_static

    cfg = copy.deepcopy(runs["grpo-student-code-s0"])
    cfg["train"].pop("distributed")
    cfg["train"].pop("fsdp", None)
    student = Shape(hidden=2560, intermediate=9728, layers=36, heads=32, kv_heads=8, head_dim=128, vocab=151936, tied=True)
    unset, _ = _train_static({}, cfg, student, [], RunShape.of(cfg, world=8))
    cfg["train"]["distributed"] = "ddp"
    ddp, _ = _train_static({}, cfg, student, [], RunShape.of(cfg, world=8))
    assert unset == ddp and unset["gradients"] == 2 * unset["weights"]
