"""Device mixing that only a GPU would show, caught on the CPU.

A CUDA generator given to a random factory with no ``device`` fails on a GPU ("Expected a 'cpu' device type for
generator but found 'cuda'") and runs on a CPU, where both are the CPU. Two tests that fail on that bug class here:

- a lint over ``src/``: every ``torch.Generator(...)`` names its device, every random factory given a
  ``generator=`` names its ``device=`` (so the draw happens where the generator lives, whatever the default device),
  and every ``torch.load`` names its ``map_location`` (a state saved on a GPU otherwise loads onto the device it
  was saved from: every rank's copy on cuda:0);
- the sampling and evaluation paths run under :class:`device_checks.RandomDrawsNameTheirDevice`, which holds every
  random draw they make to the same rule at run time: the vLLM engine's per-call seed (with vLLM's ``LLM`` replaced
  by a stand-in that returns rows), and held-out evaluation through it and through the project's own sampler.
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest
import torch
from device_checks import DeviceRuleBroken, RandomDrawsNameTheirDevice
from transformers import Qwen3Config, Qwen3ForCausalLM

from opdgrpo.domains import Task
from opdgrpo.train.engines.vllm_engine import VLLMEngine
from opdgrpo.train.evaluation import evaluate

SRC = Path(__file__).resolve().parents[2] / "src" / "opdgrpo"
#: torch's random factories: a new tensor from a size, on the ``device`` keyword's device (else the default one).
FACTORY_NAMES = {"rand", "randn", "randint", "randperm", "normal"}


def _is_torch_attr(node: ast.AST, names: set[str]) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.value, ast.Name)
            and node.value.id == "torch")


def _device_rule_breaches(tree: ast.AST, where: str) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        keywords = {k.arg for k in node.keywords}
        if _is_torch_attr(node.func, {"Generator"}) and not node.args and "device" not in keywords:
            out.append(f"{where}:{node.lineno} torch.Generator() names no device")
        if _is_torch_attr(node.func, {"load"}) and "map_location" not in keywords:
            out.append(f"{where}:{node.lineno} torch.load() names no map_location (it loads onto the saving device)")
        if (_is_torch_attr(node.func, FACTORY_NAMES) and "generator" in keywords and "device" not in keywords
                and not (node.func.attr == "normal" and node.args and not isinstance(node.args[0], ast.Constant))):
            out.append(f"{where}:{node.lineno} torch.{node.func.attr}(..., generator=...) names no device")
    return out


def test_every_generator_random_factory_and_load_in_src_names_its_device():
    breaches = [b for path in sorted(SRC.rglob("*.py"))
                for b in _device_rule_breaches(ast.parse(path.read_text(encoding="utf-8")), str(path.relative_to(SRC)))]
    assert not breaches, ("on a GPU these draw on another device than their generator's; pass device= "
                          "(device=generator.device for a caller's generator):\n" + "\n".join(breaches))


def test_the_lint_finds_the_engine_seed_draw_as_it_was():
    """The lint flags the exact line the trainer's step-0 evaluation crashed on under vLLM on a GPU."""
    old = "base = int(torch.randint(0, 2**31 - len(prompts), (1,), generator=generator))"
    assert _device_rule_breaches(ast.parse(old), "vllm_engine.py") == [
        "vllm_engine.py:1 torch.randint(..., generator=...) names no device"]
    assert not _device_rule_breaches(ast.parse(old.replace("generator)", "generator, device=generator.device)")), "x")
    assert _device_rule_breaches(ast.parse("g = torch.Generator()"), "x")
    assert not _device_rule_breaches(ast.parse("g = torch.Generator(where)"), "x")
    assert _device_rule_breaches(ast.parse("torch.load(p, weights_only=False)"), "x")


def test_the_run_time_check_refuses_a_draw_with_no_device():
    with RandomDrawsNameTheirDevice() as mode, pytest.raises(DeviceRuleBroken, match="names no device"):
        torch.randint(0, 9, (1,), generator=torch.Generator(device="cpu"))
    with RandomDrawsNameTheirDevice() as mode:
        torch.randint(0, 9, (1,), generator=torch.Generator(device="cpu"), device="cpu")
        torch.multinomial(torch.ones(2, 3), 1, generator=torch.Generator(device="cpu"))
    assert mode.seen == 2


# --------------------------------------------------------------------------------------------------------------------
# The paths themselves, under the run-time check


class _Tokenizer:
    """Characters as token ids (2 + ord % 40), enough for encode_prompts, stop ids and batch_decode."""

    pad_token_id, eos_token_id, unk_token_id = 0, 1, None

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[2 + ord(c) % 40 for c in text] for text in texts]}

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(97 + t % 26) for t in row) for row in rows]


class _Domain:
    name, cfg = "math", {}

    def score(self, tasks, texts):
        return [float(len(t) % 2) for t in texts]


class _FakeLLM:
    """vLLM's ``LLM.generate`` as the engine calls it: one output per prompt, each with token ids and log-probs."""

    def __init__(self):
        self.seeds: list[int | None] = []

    def generate(self, prompts, params, use_tqdm=False):
        self.seeds += [p["seed"] for p in params]
        out = []
        for p in params:
            ids = [3 + (p["seed"] or 0) % 5, 4, 1]
            lps = [{t: types.SimpleNamespace(logprob=-0.5)} for t in ids]
            out.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=ids, logprobs=lps)]))
        return out


def _engine(llm: _FakeLLM) -> VLLMEngine:
    """A VLLMEngine around the stand-in, without starting vLLM (the attributes ``__init__`` sets)."""
    engine = VLLMEngine.__new__(VLLMEngine)
    engine.config = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    engine.device, engine.llm, engine.version = torch.device("cpu"), llm, None
    engine.sleeps, engine.sleep_level, engine._held, engine._sleeping, engine._unsynced = False, 2, False, set(), None
    engine.seeded, engine.logprobs_mode = True, None   # a CPU engine: each request seeded from the caller's generator
    engine._params, engine._prompt = (lambda **kw: kw), (lambda prompt_token_ids: prompt_token_ids)
    return engine


TASKS = [Task(domain="math", prompt=p, answer="1") for p in ("1+2=", "3*4-5=", "9-9=")]


def _evaluate(model, engine=None, k=2):
    return evaluate(model, _Tokenizer(), {"math": _Domain()}, {"math": {"held": TASKS}}, k=k, temperature=1.0,
                    max_new_tokens=4, batch_size=2, seed=7, engine=engine)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=8, pad_token_id=0,
                                        eos_token_id=1, attn_implementation="eager"))


def test_vllm_engine_sampling_draws_its_seed_on_the_generators_device():
    """The engine draws one base seed per call from the caller's generator (a CUDA one in a GPU trainer): on its
    device, and the same base for the same generator state."""
    llm = _FakeLLM()
    engine = _engine(llm)
    with RandomDrawsNameTheirDevice() as mode:
        a = engine.sample([[5, 6], [7]], max_new_tokens=4, eos_token_id=1, pad_token_id=0,
                          generator=torch.Generator(device="cpu").manual_seed(3))
        engine.sample([[5, 6], [7]], max_new_tokens=4, eos_token_id=1, pad_token_id=0,
                      generator=torch.Generator(device="cpu").manual_seed(3))
    assert mode.seen == 2 and a.sequences.shape[0] == 2
    assert llm.seeds[:2] == llm.seeds[2:] and llm.seeds[1] == llm.seeds[0] + 1   # one base per call, + row


def test_heldout_evaluation_through_the_vllm_engine_under_the_device_check():
    """The trainer's step-0 evaluation under ``train.engine: vllm``: the path that crashed first on a GPU."""
    with RandomDrawsNameTheirDevice() as mode:
        results, _ = _evaluate(_model(), engine=_engine(_FakeLLM()))
    assert mode.seen >= 1 and results[0]["n_prompts"] == 3 and results[0]["k"] == 2


def test_heldout_evaluation_with_the_projects_sampler_under_the_device_check():
    with RandomDrawsNameTheirDevice() as mode:
        results, flops = _evaluate(_model())
    assert mode.seen > 0 and flops > 0 and results[0]["accuracy"] >= 0


def test_a_level_two_sleep_leaves_no_weights_to_sample():
    """Sleep level 2 discards the weights (the next sync rewrites them): sampling before that sync is refused."""
    engine = _engine(_FakeLLM())
    engine.sleeps, engine.llm.sleep = True, lambda level: None
    engine._sleep()
    assert engine.version is None and engine._unsynced
    with pytest.raises(RuntimeError, match="sleep_level"):
        engine.sample([[5]], max_new_tokens=2, eos_token_id=1, pad_token_id=0)
