"""Speed work must not change results: the first steps of smoke runs, as recorded before it.

``tests/fixtures/speed_pins.json`` holds what the code wrote (ledger lines: tokens, FLOPs, loss, reward, gradient
norm, metrics, not ``wall_s`` nor keys added since; evaluation results; pretraining losses; raw sampler outputs), one
set per machine, keyed by its numerics fingerprint (``tests/pins.py``, which also says what the tolerance
comparison looks at). Each case runs once and is checked twice:
bit for bit against this machine's own pins (skipped, saying how to record them, on a machine without pins), and
within tolerances against every machine's pins (runs everywhere, so a real regression fails on any CPU).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from pins import RECORD, PinStore, tolerance_view
from transformers import Qwen3Config, Qwen3ForCausalLM

from opdgrpo.runio import read_jsonl
from opdgrpo.train.loop import train
from opdgrpo.train.models import autocast
from opdgrpo.train.sampling import sample
from opdgrpo.train.step_stats import TIMING_KEYS

#: Ledger keys that may differ between runs of the same config (wall-clock time and rates).
UNPINNED = TIMING_KEYS


@pytest.fixture(scope="module")
def store() -> PinStore:
    return PinStore()


def _ledger(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in sorted(line.items()) if k not in UNPINNED} for line in read_jsonl(run_dir / "ledger.jsonl")]


def _as_pinned(observed: list[dict], pinned: list[dict]) -> list[dict]:
    """Ledger lines restricted to the keys the pins have: keys added since (MFU figures) are allowed, lost ones not."""
    out = []
    for i, line in enumerate(observed):
        if i < len(pinned):
            missing = set(pinned[i]) - set(line)
            assert not missing, f"ledger line {i} lost keys {missing}"
            line = {k: line[k] for k in pinned[i]}
        out.append(line)
    return out


def _evals(run_dir: Path) -> list[dict]:
    return [{k: e[k] for k in ("step", "cumulative_flops", "eval_flops", "results")} for e in read_jsonl(run_dir / "evals.jsonl")]


def _check_bitwise(store: PinStore, observed: dict) -> None:
    for name, value in observed.items():
        if name.endswith("/ledger") and not RECORD:
            value = _as_pinned(value, store.own(name))
        store.bitwise(name, value)


def _check_tolerance(store: PinStore, observed: dict) -> None:
    if RECORD:
        pytest.skip("recording pins")
    for name, value in observed.items():
        store.within_tolerance(name, value, lambda pin: tolerance_view(name, pin))


RUNS = [  # (run id in the smoke plan, steps): one and four domains, GRPO and OPD (one teacher routed to 4 domains)
    ("grpo-student-math-s0", 3),
    ("opd-teacher_m-math-s0", 2),
    ("grpo-student-math+code+ifeval+knowledge-s0", 2),
    ("opd-teacher_m-math+code+ifeval+knowledge-s0", 2),
]


@pytest.fixture(scope="module", params=RUNS, ids=[r for r, _ in RUNS])
def training_run(request, smoke_world, tmp_path_factory) -> dict:
    run_id, steps = request.param
    _, plan = smoke_world
    cfg = copy.deepcopy(plan.jobs[run_id].config)
    cfg["method"]["steps"] = steps
    if cfg["method"]["name"] == "opd":   # the pins were recorded with OPD scoring its rollouts (the ledger's reward);
        cfg["method"]["score_rollouts"] = True   # scoring changes nothing else (tests/integration/test_train.py)
    cfg["run_id"] = f"{run_id}-pins"
    run_dir = tmp_path_factory.mktemp("pins") / run_id
    summary = train(cfg, run_dir)
    return {f"{run_id}/ledger": _ledger(run_dir), f"{run_id}/evals": _evals(run_dir),
            f"{run_id}/done": {k: summary[k] for k in ("cumulative_flops", "final_eval", "parameters", "steps")}}


def test_training_runs_are_unchanged_bit_for_bit(store, training_run):
    _check_bitwise(store, training_run)


def test_training_runs_are_unchanged_within_tolerance(store, training_run):
    _check_tolerance(store, training_run)


@pytest.fixture(scope="module", params=["student", "teacher_m"])
def pretraining(request, smoke_world) -> dict:
    model = request.param
    _, plan = smoke_world
    out = Path(plan.jobs[f"base-{model}"].out_dir)
    done = json.loads((out / "done.json").read_text())
    return {f"base-{model}/ledger": _ledger(out),
            f"base-{model}/evals": read_jsonl(out / "evals.jsonl"),
            f"base-{model}/done": {k: done[k] for k in ("final_loss", "heldout", "pretrain_flops")}}


def test_pretraining_is_unchanged_bit_for_bit(store, pretraining):
    _check_bitwise(store, pretraining)


def test_pretraining_is_unchanged_within_tolerance(store, pretraining):
    _check_tolerance(store, pretraining)


def _random_model(eos_bias: float) -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
                         intermediate_size=96, vocab_size=200, tie_word_embeddings=False, pad_token_id=0, eos_token_id=1,
                         bos_token_id=1, initializer_range=0.1, attn_implementation="eager")
    model = Qwen3ForCausalLM(config).eval()
    bias = torch.zeros(config.vocab_size)
    bias[1], bias[2] = eos_bias, eos_bias / 2   # rows end at different steps, on either stop token
    model.lm_head.bias = torch.nn.Parameter(bias)
    return model


SAMPLER_CASES = {
    "full": dict(temperature=1.0),
    "greedy": dict(temperature=0.0),
    "top_p": dict(temperature=0.8, top_p=0.9),
    "top_k": dict(temperature=1.2, top_k=5),
}


@pytest.fixture(scope="module", params=[(c, p) for c in sorted(SAMPLER_CASES) for p in ("fp32", "bf16")],
                ids=[f"{c}-{p}" for c in sorted(SAMPLER_CASES) for p in ("fp32", "bf16")])
def sampled(request) -> dict:
    case, precision = request.param
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = _random_model(eos_bias=1.5)
        g = torch.Generator().manual_seed(5)
        prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in [3, 7, 5, 1, 4, 4, 6, 2, 9, 3, 5, 8]]
        generator = torch.Generator().manual_seed(11)
        with autocast(precision):
            r = sample(model, prompts, max_new_tokens=12, eos_token_id=[1, 2], pad_token_id=0, generator=generator,
                       **SAMPLER_CASES[case])
    finally:
        torch.set_num_threads(threads)
    return {f"sampler/{case}/{precision}": {
        "sequences": r.sequences.tolist(), "attention_mask": r.attention_mask.tolist(),
        "completion_mask": r.completion_mask.tolist(), "prompt_len": r.prompt_len, "completions": r.completions,
        "finished": r.finished.tolist(), "flops": r.flops, "tokens_computed": r.tokens_computed}}


def test_sampler_outputs_are_unchanged_bit_for_bit(store, sampled):
    _check_bitwise(store, sampled)


def test_sampler_outputs_are_unchanged_within_tolerance(store, sampled):
    _check_tolerance(store, sampled)
