"""What the vLLM engine is started with and what each kind of call asks of it, on a CUDA placement and on a CPU one,
without vLLM: ``vllm.LLM`` is replaced by a stand-in that records its arguments and every request, and the engine
is built by the jobs' own code (the trainer's ``_engine``, ``checkpoint_engine``) and called through the callers'
own functions (``sample_and_score`` as the trainer's rollouts call it, ``evaluate``, S2's ``solve_rates``).

The policy (docs/design-notes.md, "The vLLM engine"): a seed per request on CPUs only (CUDA: the engine's own
stream, seeded by the run's seed and the attempt's first step); the sampled token's log-prob only in training
rollouts, and only where the engine's ``logprobs_mode`` gives the sampling distribution (``raw_logprobs`` at
temperature 1, ``processed_logprobs`` at another temperature with ``methods.grpo.engine_is_cap``, none otherwise).
What a CPU cannot show: that vLLM's CUDA sampler then takes FlashInfer (the GPU pilot's S2 and base jobs sample
with top-k/top-p through it); that raw equals processed log-probs inside vLLM is checked on its own sampler in
tests/integration/test_vllm_engine.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import types
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from opdgrpo.config import compose
from opdgrpo.domains import Task
from opdgrpo.plan.build import build_plan
from opdgrpo.run_shape import RunShape, Sampling
from opdgrpo.train.batching import engine_seed
from opdgrpo.train.engines import vllm_engine
from opdgrpo.train.engines.vllm_engine import PROCESSED_LOGPROBS, RAW_LOGPROBS, engine_args, rollout_logprobs_mode
from opdgrpo.train.rollout import PromptFormat

TASKS = [Task(domain="math", prompt=p, answer="1") for p in ("1+2=", "3*4-5=", "9-9=")]


class _Tokenizer:
    """Characters as token ids; saves nothing (the stand-in engine reads no directory)."""

    pad_token_id, eos_token_id, unk_token_id = 0, 1, None

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[2 + ord(c) % 40 for c in text] for text in texts]}

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(97 + t % 26) for t in row) for row in rows]

    def save_pretrained(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)


class _Domain:
    name, cfg = "math", {}

    def score(self, tasks, texts):
        return [float(len(t) % 2) for t in texts]


class _LLM:
    """``vllm.LLM`` as the engine calls it: its arguments, its weight reloads and every request recorded; rows of
    three tokens, with the sampled tokens' log-probs only where a request asked for them."""

    def __init__(self, model: str, **args):
        self.model, self.args, self.requests, self.reloads = model, args, [], 0
        self.llm_engine = types.SimpleNamespace(engine_core=types.SimpleNamespace(shutdown=lambda: None))

    def generate(self, prompts, params, use_tqdm=False):
        self.requests.append(list(params))
        out = []
        for p in params:
            ids = [3, 4, 1]
            lps = None if p["logprobs"] is None else [{t: types.SimpleNamespace(logprob=-0.5)} for t in ids]
            out.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=ids, logprobs=lps)]))
        return out

    def collective_rpc(self, method, kwargs):
        self.reloads += 1
        list(kwargs["weights_iterator"])

    def reset_prefix_cache(self):
        pass

    def sleep(self, level):
        pass

    def wake_up(self, tags=None):
        pass


@pytest.fixture(params=["cuda", "cpu"])
def placement(request, monkeypatch) -> str:
    """The engine on a CUDA device (``torch.cuda.is_available`` says so) or on the CPU, with the stand-in vLLM."""
    stand_in = types.SimpleNamespace(LLM=_LLM, SamplingParams=lambda **kw: kw,
                                     inputs=types.SimpleNamespace(TokensPrompt=lambda prompt_token_ids: prompt_token_ids))
    monkeypatch.setattr(vllm_engine, "import_vllm", lambda: stand_in)
    monkeypatch.setattr(vllm_engine, "_placement", lambda rank, world, args: {"rank": rank, "backend": "uni"})
    monkeypatch.setattr(vllm_engine, "check_cpu_head_dim", lambda config, model_dir: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: request.param == "cuda")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    return request.param


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=8, pad_token_id=0,
                                        eos_token_id=1, attn_implementation="eager"))


@functools.lru_cache(maxsize=1)
def _paper_grpo_config() -> str:
    plan = build_plan(compose(["profile=paper"]))
    return json.dumps(next(j.config for j in plan.jobs.values()
                           if j.kind == "train" and j.config["method"]["name"] == "grpo"))


def _paper_run_config() -> dict:
    """A paper GRPO run's config (temperature 1, ``engine_is_cap`` 3, ``engine: vllm``), planned once per session."""
    return json.loads(_paper_grpo_config())


def _training_engine(tmp_path: Path, start: int = 0, temperature: float | None = None, cap: float | None | str = "paper"):
    """The engine a paper GRPO run's trainer builds (``opdgrpo.train.loop._engine``) at ``start``, optionally at another
    rollout temperature or ``engine_is_cap``."""
    from opdgrpo.train.loop import _engine

    cfg = _paper_run_config()
    shape = RunShape.of(cfg, 1)
    if temperature is not None:
        shape = dataclasses.replace(shape, rollout=Sampling(temperature, shape.rollout.max_new_tokens))
    if cap != "paper":
        shape = dataclasses.replace(shape, method={**shape.method, "engine_is_cap": cap})
    model = _model()
    workers = types.SimpleNamespace(rank=0, full_params=lambda m: contextlib.nullcontext(m))
    run = types.SimpleNamespace(shape=shape, cfg=cfg, pools={"math": TASKS}, heldout={"math": {"held": TASKS}},
                                tokenizer=_Tokenizer(), fmt=PromptFormat(), workers=workers, model=model,
                                run_dir=tmp_path)
    return _engine(run, start), model


def _rollout(engine, model):
    """A training rollout as the trainer's ``_sample`` asks for it."""
    from opdgrpo.train.rollout import sample_and_score

    return sample_and_score(model, _Tokenizer(), {"math": _Domain()}, TASKS, max_new_tokens=4, temperature=1.0,
                            generator=torch.Generator(device="cpu").manual_seed(5), engine=engine,
                            engine_logprobs=True)


def _evaluation(engine, model):
    from opdgrpo.train.evaluation import evaluate

    return evaluate(model, _Tokenizer(), {"math": _Domain()}, {"math": {"held": TASKS}}, k=2, temperature=0.6,
                    top_p=0.95, top_k=20, max_new_tokens=4, batch_size=2, seed=7, engine=engine)


def test_a_training_engine_starts_on_placeholder_weights_and_refuses_to_sample_before_a_sync(placement, tmp_path):
    """``for_model`` syncs nothing (the trainer syncs before every sampling): no weight reload at the start, and a
    sampling before the first sync is refused; after it, the engine samples."""
    engine, model = _training_engine(tmp_path)
    assert engine.llm.reloads == 0 and engine.version is None
    with pytest.raises(RuntimeError, match="placeholder weights.*sync the policy"):
        _rollout(engine, model)
    with engine.awake():
        engine.sync(model, version=0)
        assert _rollout(engine, model).rollouts.logprobs is not None
    assert engine.llm.reloads == 1


def test_training_engine_arguments_and_each_calls_requests(placement, tmp_path):
    """A paper GRPO run (temperature 1, cap 3): ``raw_logprobs``, the seed from the run's seed and the attempt's
    first step; its rollouts ask for the sampled token's log-prob, its held-out evaluation for none; a seed per
    request on the CPU only."""
    cuda = placement == "cuda"
    engine, model = _training_engine(tmp_path, start=0)
    seed = int(_paper_run_config()["seed"])
    args = engine.llm.args
    assert args["logprobs_mode"] == RAW_LOGPROBS and engine.logprobs_mode == RAW_LOGPROBS
    assert args["seed"] == engine_seed(seed, 0) and args["enable_sleep_mode"] is cuda and args["enforce_eager"] is not cuda
    # the run's config carries no share: the plan's reaches the job through the rules (job_identity.ENGINE_ENV)
    assert args["load_format"] == "dummy" and "gpu_memory_utilization" not in args
    with engine.awake():
        engine.sync(model, version=0)
        rollout = _rollout(engine, model)
        _evaluation(engine, model)
    assert (engine.placement["requests_seeded"], engine.placement["rollout_logprobs"]) == (not cuda, RAW_LOGPROBS)
    rollout_requests, *evaluation_requests = engine.llm.requests
    assert [r["logprobs"] for r in rollout_requests] == [0, 0, 0] and rollout.rollouts.logprobs is not None
    assert all(r["logprobs"] is None for call in evaluation_requests for r in call)
    assert all((r["top_k"], r["top_p"], r["temperature"]) == (20, 0.95, 0.6) for call in evaluation_requests for r in call)
    seeds = [r["seed"] for call in engine.llm.requests for r in call]
    if cuda:
        assert seeds == [None] * len(seeds)
    else:
        assert None not in seeds and seeds[1] == seeds[0] + 1   # base + row
    resumed, _ = _training_engine(tmp_path / "resumed", start=5)   # a resumed attempt: another engine stream
    assert resumed.llm.args["seed"] == engine_seed(seed, 5) != args["seed"]


def test_each_rank_s_engine_draws_from_its_own_stream(placement, tmp_path, monkeypatch):
    """Under torchrun vLLM seeds every rank's engine alike; the engine gives each rank its own seed (rank 0 keeps the
    job's), so unseeded rows on two GPUs do not draw the same noise."""
    monkeypatch.setattr(vllm_engine, "_world", lambda: (1, 2))
    engine, _ = _training_engine(tmp_path)
    seed = engine_seed(int(_paper_run_config()["seed"]), 0)
    assert engine.llm.args["seed"] == vllm_engine.rank_seed(seed, 1) != seed
    assert engine.llm.args["distributed_executor_backend"] == "external_launcher"
    assert vllm_engine.rank_seed(seed, 0) == seed and 0 <= vllm_engine.rank_seed(2**31 - 1, 7) < 2**31


@pytest.mark.parametrize("temperature, cap, mode, asks", [(0.7, 3.0, PROCESSED_LOGPROBS, True), (0.7, None, None, False),
                                                          (1.0, None, RAW_LOGPROBS, True)])
def test_rollout_logprobs_by_temperature_and_cap(placement, tmp_path, temperature, cap, mode, asks):
    """Another rollout temperature: ``processed_logprobs`` with a cap (GRPO's weights need the tempered
    distribution); without one no log-probs at all (vLLM keeps its default mode, the mismatch metric is absent)."""
    engine, model = _training_engine(tmp_path, temperature=temperature, cap=cap)
    assert engine.logprobs_mode == mode and engine.llm.args["logprobs_mode"] == (mode or RAW_LOGPROBS)
    with engine.awake():
        engine.sync(model, version=0)
        scored = _rollout(engine, model)
    assert [r["logprobs"] for r in engine.llm.requests[0]] == ([0] * 3 if asks else [None] * 3)
    assert (scored.rollouts.logprobs is not None) is asks


def test_checkpoint_engines_of_s2_and_base_evaluation_ask_for_no_logprobs(placement, tmp_path):
    """S2's solve rates and a base model's evaluation: an engine on the checkpoint, awake, vLLM's default
    ``raw_logprobs`` (nothing asks), the job's seed; no request asks for log-probs; seeds per request on CPUs only."""
    from opdgrpo.stages.difficulty import solve_rates
    from opdgrpo.train.engines import checkpoint_engine

    cuda = placement == "cuda"
    cfg = {"engine": "vllm", "vllm": {"gpu_memory_utilization": 0.9}, "seed": 3}
    model = _model()
    with checkpoint_engine(cfg, tmp_path, model, tokenizer=_Tokenizer(), tasks=TASKS, fmt=PromptFormat(),
                           max_new_tokens=4) as engine:
        args = engine.llm.args
        assert args["logprobs_mode"] == RAW_LOGPROBS and engine.logprobs_mode is None
        assert args["seed"] == 3 and args["enable_sleep_mode"] is False and "load_format" not in args
        assert (engine.placement["requests_seeded"], engine.placement["rollout_logprobs"]) == (not cuda, None)
        rates, flops = solve_rates(model, _Tokenizer(), _Domain(), TASKS, k=2, temperature=0.6, top_p=0.95, top_k=20,
                                   max_new_tokens=4, batch_size=2, seed=0, engine=engine)
        _evaluation(engine, model)
        requests = [r for call in engine.llm.requests for r in call]
    assert len(rates) == 3 and flops > 0 and len(requests) == 3 * 2 + 3 * 2   # S2 and evaluation, k = 2 each
    assert all(r["logprobs"] is None for r in requests)
    assert all((r["seed"] is None) is cuda for r in requests)


def test_rollout_logprobs_mode_and_engine_set_keys():
    assert rollout_logprobs_mode(1.0, None) == rollout_logprobs_mode(1.0, 3.0) == RAW_LOGPROBS
    assert rollout_logprobs_mode(0.7, 3.0) == PROCESSED_LOGPROBS and rollout_logprobs_mode(0.7, None) is None
    config = types.SimpleNamespace(dtype="bfloat16", max_position_embeddings=4096)
    for key in ("logprobs_mode", "seed"):
        with pytest.raises(ValueError, match=rf"`train.vllm.{key}`: the engine sets it"):
            engine_args(config, max_len=100, settings={key: 1}, seed=0, cuda=True, world=1, shares_gpu=True)
    with pytest.raises(ValueError, match="logprobs_mode must be"):
        engine_args(config, max_len=100, settings={}, seed=0, cuda=True, world=1, shares_gpu=True,
                    logprobs_mode="raw_logits")
