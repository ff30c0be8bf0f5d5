"""The numerics fingerprint in another process, and the fast paths' gates on whole models and training runs: a
run's numbers never depend on whether a fast path ran (``OPDGRPO_FAST_PATHS=off`` against ``auto``), and a fast path
made inexact on purpose inside a model is refused. (The gates on single attention calls: tests/unit/test_numerics.py.)"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from opdgrpo.runio import read_jsonl
from opdgrpo.train import inference, numerics
from opdgrpo.train.models import autocast
from opdgrpo.train.sampling import sample
from opdgrpo.train.step_stats import TIMING_KEYS

pytestmark = pytest.mark.usefixtures("fresh_numerics")


def test_fingerprint_is_the_same_in_another_process_and_sees_one_changed_bit(monkeypatch):
    here = numerics.fingerprint()
    assert len(here) == 16 and int(here, 16) >= 0
    other = subprocess.run([sys.executable, "-c", "from opdgrpo.train import numerics; print(numerics.fingerprint())"],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert other.stdout.strip() == here, other.stderr[-2000:]
    real_linear = torch.nn.functional.linear

    def last_bits_off(x, w, b=None):   # what another kernel's rounding would do to one element
        out = real_linear(x, w, b)
        out.view(-1)[0] *= 1 + 2 ** -6   # a few units in the last place of a bfloat16
        return out

    monkeypatch.setattr(torch.nn.functional, "linear", last_bits_off)
    assert numerics.fingerprint.__wrapped__() != here



def _off_by_some_ulps(real):
    def fold(*args):
        out, weights = real(*args)
        return out * (1 + 2 ** -6), weights
    return fold



def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
                         intermediate_size=96, vocab_size=200, pad_token_id=0, eos_token_id=1, initializer_range=0.1,
                         attn_implementation="eager")
    return Qwen3ForCausalLM(config).eval()



def _sample(model) -> dict:
    prompts = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]] * 3
    with autocast("bf16"):
        r = sample(model, prompts, max_new_tokens=10, eos_token_id=1, pad_token_id=0,
                   generator=torch.Generator().manual_seed(4))
    return {"sequences": r.sequences.tolist(), "flops": r.flops, "completions": r.completions}



def _paths() -> list[dict]:
    return list(numerics.report()["fast_paths"]["paths"].values())



def test_an_inexact_lean_forward_is_refused_and_the_models_forward_used(monkeypatch):
    model = _model()
    monkeypatch.setenv(numerics.ENV, "off")
    reference = _sample(model)
    assert [d["path"] for d in _paths()] == ["reference"]
    numerics.reset()
    monkeypatch.setenv(numerics.ENV, "auto")
    real = inference.LeanQwen3.forward

    def drifting(self, *args, **kwargs):
        return real(self, *args, **kwargs) * (1 + 2 ** -6)

    monkeypatch.setattr(inference.LeanQwen3, "forward", drifting)
    assert _sample(model) == reference
    (decision,) = _paths()
    assert decision["path"] != "lean" and decision["refused"][0] == "lean"



def test_a_fold_inexact_only_inside_the_model_is_vetoed_and_the_rest_kept(monkeypatch):
    """The sweep passes (forced) but the fold changes the model's bits: the model-level check vetoes the fold for
    that head layout and keeps the lean forward with eager arithmetic."""
    model = _model()
    monkeypatch.setenv(numerics.ENV, "off")
    reference = _sample(model)
    numerics.reset()
    monkeypatch.setenv(numerics.ENV, "auto")
    monkeypatch.setattr(inference, "_folded_attention", _off_by_some_ulps(inference._folded_attention))
    monkeypatch.setattr(inference, "_fold_sweep", lambda layout, mode: True)
    assert _sample(model) == reference
    (decision,) = _paths()
    assert decision == {"path": "lean", "fold": False, "refused": ["lean", "fast"]}



def test_off_and_auto_sample_the_same_tokens(monkeypatch):
    model = _model()
    auto = _sample(model)
    assert _paths(), "auto mode decided nothing"
    numerics.reset()
    monkeypatch.setenv(numerics.ENV, "off")
    assert _sample(model) == auto



RUNS = ["grpo-student-math+code+ifeval+knowledge-s0", "opd-teacher_m-math+code+ifeval+knowledge-s0"]


@pytest.mark.parametrize("run_id", RUNS)
def test_a_training_run_gives_the_same_numbers_with_fast_paths_off(smoke_world, tmp_path, run_id):
    """Rollouts, teacher forwards and evaluations with the fast paths (where exact here) and without any."""
    from opdgrpo.train.loop import train

    _, plan = smoke_world
    cfg = copy.deepcopy(plan.jobs[run_id].config)
    cfg["method"]["steps"] = 2
    out = {}
    for mode in ("auto", "off"):
        numerics.reset()
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(numerics.ENV, mode)
            out[mode] = train(copy.deepcopy(cfg), tmp_path / mode)
    def strip(rows):
        return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]

    for name in ("ledger.jsonl", "evals.jsonl"):
        a, b = (read_jsonl(tmp_path / mode / name) for mode in ("auto", "off"))
        assert strip(a) == strip(b), name
    assert out["auto"]["final_eval"] == out["off"]["final_eval"]
    auto = json.loads((Path(tmp_path) / "auto" / "done.json").read_text())["numerics"]
    assert auto["fingerprint"] == numerics.fingerprint() and auto["fast_paths"]["mode"] == "auto"
    models = 2 if run_id.startswith("opd") else 1   # the student, and the teacher of an OPD run
    assert len(auto["fast_paths"]["paths"]) == models, "done.json records one path decision per model"
    off = json.loads((Path(tmp_path) / "off" / "done.json").read_text())["numerics"]["fast_paths"]
    assert {d["path"] for d in off["paths"].values()} == {"reference"} and not off.get("folded_attention")
