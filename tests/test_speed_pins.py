"""Speed work must not change results: the first steps of smoke runs, bit for bit, as recorded before it.

``tests/fixtures/speed_pins.json`` holds what the code on main wrote before the speed-ups (issue 7): ledger lines
(tokens, FLOPs, loss, reward, gradient norm, metrics; not ``wall_s`` nor keys added since), evaluation results,
pretraining losses and raw sampler outputs. Each test recomputes its part and compares with ``==``, so a faster
sampler, reward path or evaluation that changes a single bit fails here.

Floating-point results depend on the CPU's vector unit and the torch build, so the pins only bind where they were
recorded (same torch version and CPU capability); elsewhere the tests skip and say why. To record them again on a
new machine, from a commit whose results are trusted:
``OPDGRPO_RECORD_PINS=1 python -m pytest -q tests/test_speed_pins.py``.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from opdgrpo.models import autocast
from opdgrpo.runio import read_jsonl
from opdgrpo.sampling import sample
from opdgrpo.train import train

PINS = Path(__file__).parent / "fixtures" / "speed_pins.json"
RECORD = bool(os.environ.get("OPDGRPO_RECORD_PINS"))
#: Ledger keys that may differ between runs of the same config (wall-clock time and rates).
UNPINNED = {"wall_s", "achieved_flops_per_s"}


def _machine() -> dict[str, str]:
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def _check(name: str, observed) -> None:
    """Compare ``observed`` with the pinned value ``name`` (or store it when recording)."""
    observed = json.loads(json.dumps(observed))   # the JSON round trip the pins went through (floats are exact)
    pins = json.loads(PINS.read_text()) if PINS.is_file() else {"machine": _machine(), "pins": {}}
    if RECORD:
        pins["machine"] = _machine()
        pins["pins"][name] = observed
        PINS.write_text(json.dumps(pins, indent=1, sort_keys=True) + "\n")
        return
    if pins["machine"] != _machine():
        pytest.skip(f"pins recorded on {pins['machine']}, this is {_machine()}: bitwise results differ across builds")
    assert name in pins["pins"], f"no pin {name!r} in {PINS}: record it (see the module docstring)"
    expected = pins["pins"][name]
    if isinstance(expected, list) and isinstance(observed, list):
        assert len(observed) == len(expected), name
        for i, (o, e) in enumerate(zip(observed, expected)):
            assert o == e, f"{name}[{i}] differs"
    else:
        assert observed == expected, name


def _ledger(run_dir: Path, name: str | None = None) -> list[dict]:
    """Ledger lines restricted to the pinned keys: added keys (MFU figures) are allowed, changed ones are not."""
    lines = read_jsonl(run_dir / "ledger.jsonl")
    pinned = None if RECORD else json.loads(PINS.read_text())["pins"]
    name = f"{name or run_dir.name}/ledger"
    out = []
    for i, line in enumerate(lines):
        keys = set(line) - UNPINNED
        if pinned is not None and pinned.get(name) and i < len(pinned[name]):
            keys = set(pinned[name][i])
            missing = keys - set(line)
            assert not missing, f"ledger line {i} lost keys {missing}"
        out.append({k: line[k] for k in sorted(keys)})
    return out


def _evals(run_dir: Path) -> list[dict]:
    return [{k: e[k] for k in ("step", "cumulative_flops", "eval_flops", "results")} for e in read_jsonl(run_dir / "evals.jsonl")]


RUNS = [  # (run id in the smoke plan, steps): one and four domains, GRPO and OPD (one teacher routed to 4 domains)
    ("grpo-student-math-s0", 3),
    ("opd-teacher_m-math-s0", 2),
    ("grpo-student-math+code+ifeval+knowledge-s0", 2),
    ("opd-teacher_m-math+code+ifeval+knowledge-s0", 2),
]


@pytest.mark.parametrize("run_id,steps", RUNS, ids=[r for r, _ in RUNS])
def test_training_runs_are_unchanged(smoke_world, tmp_path, run_id, steps):
    _, plan = smoke_world
    cfg = copy.deepcopy(plan.jobs[run_id].config)
    cfg["method"]["steps"] = steps
    cfg["run_id"] = f"{run_id}-pins"
    run_dir = tmp_path / run_id
    summary = train(cfg, run_dir)
    _check(f"{run_id}/ledger", _ledger(run_dir))
    _check(f"{run_id}/evals", _evals(run_dir))
    _check(f"{run_id}/done", {k: summary[k] for k in ("cumulative_flops", "final_eval", "parameters", "steps")})


@pytest.mark.parametrize("model", ["student", "teacher_m"])
def test_pretraining_is_unchanged(smoke_world, model):
    _, plan = smoke_world
    out = Path(plan.jobs[f"base-{model}"].out_dir)
    _check(f"base-{model}/ledger", _ledger(out, f"base-{model}"))
    _check(f"base-{model}/evals", read_jsonl(out / "evals.jsonl"))
    done = json.loads((out / "done.json").read_text())
    _check(f"base-{model}/done", {k: done[k] for k in ("final_loss", "heldout", "pretrain_flops")})


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


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("case", sorted(SAMPLER_CASES))
def test_sampler_outputs_are_unchanged(case, precision):
    torch.set_num_threads(1)
    model = _random_model(eos_bias=1.5)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in [3, 7, 5, 1, 4, 4, 6, 2, 9, 3, 5, 8]]
    generator = torch.Generator().manual_seed(11)
    with autocast(precision):
        r = sample(model, prompts, max_new_tokens=12, eos_token_id=[1, 2], pad_token_id=0, generator=generator,
                   **SAMPLER_CASES[case])
    _check(f"sampler/{case}/{precision}", {
        "sequences": r.sequences.tolist(), "attention_mask": r.attention_mask.tolist(),
        "completion_mask": r.completion_mask.tolist(), "prompt_len": r.prompt_len, "completions": r.completions,
        "finished": r.finished.tolist(), "flops": r.flops, "tokens_computed": r.tokens_computed})
