"""``source: random``: a weightless hub-format directory whose loaders draw the same weights from its seed
(opdgrpo.stages.hub_models.build_random, opdgrpo.train.models.load_model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from opdgrpo.config import compose
from opdgrpo.stages.hub_models import build_random
from opdgrpo.train.models import RANDOM_INIT, is_random, load_model, parameter_count
from opdgrpo.train.tokenizer import build_tokenizer, save_tokenizer

ARCH = {"source": "random", "seed": 7, "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "dtype": "bfloat16",
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def random_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("random")
    cfg = compose(["profile=smoke"], Path(__file__).resolve().parents[2] / "conf")
    save_tokenizer(build_tokenizer(cfg["domains"], cfg["tokenizer"]["vocab_size"], 20), root / "tok")
    return build_random(ARCH, "student", root / "tok", root / "base")


def test_directory_holds_config_tokenizer_and_seed_but_no_weights(random_dir):
    names = {p.name for p in random_dir.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", RANDOM_INIT} <= names
    assert not [n for n in names if n.endswith((".safetensors", ".bin"))]
    assert json.loads((random_dir / RANDOM_INIT).read_text())["seed"] == 7
    config = json.loads((random_dir / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["architectures"] == ["Qwen3ForCausalLM"]   # what vLLM reads
    assert is_random(random_dir) and not is_random(random_dir.parent)


def test_every_load_draws_the_same_weights_and_a_bf16_load_is_the_fp32_one_rounded(random_dir):
    a, b = (dict(load_model(random_dir).named_parameters()) for _ in range(2))
    half = dict(load_model(random_dir, dtype=torch.bfloat16).named_parameters())
    assert a.keys() == b.keys() == half.keys()
    for name, w in a.items():
        assert torch.equal(w, b[name]), name
        assert torch.equal(w.to(torch.bfloat16), half[name]), name
    std = a["model.embed_tokens.weight"].std().item()
    assert 0.015 < std < 0.025   # N(0, initializer_range = 0.02)
    assert torch.equal(a["model.norm.weight"], torch.ones(32))
    assert not torch.equal(a["model.layers.0.mlp.up_proj.weight"], a["model.layers.1.mlp.up_proj.weight"])


def test_another_seed_draws_other_weights(random_dir, tmp_path):
    other = build_random({**ARCH, "seed": 8}, "student", random_dir, tmp_path)
    w7, w8 = (load_model(d).get_input_embeddings().weight for d in (random_dir, other))
    assert not torch.equal(w7, w8)


def test_on_meta_it_has_a_shape_and_no_weights(random_dir):
    model = load_model(random_dir, device="meta")
    assert next(model.parameters()).is_meta
    assert parameter_count(model) == parameter_count(load_model(random_dir))


def test_weights_are_drawn_on_the_gpu_where_there_is_one_whatever_device_they_live_on(monkeypatch):
    """The GPU path, checked by what it chooses: a trainer that shards from host memory draws on the GPU, as the base
    job that evaluated the same model there did (the GPU pilot: 12 billion draws on the CPU took minutes)."""
    from opdgrpo.train import models

    cpu = torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert models._draw_device(cpu) == cpu
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert models._draw_device(cpu) == torch.device("cuda", 3)
    assert models._draw_device(torch.device("cuda", 1)) == torch.device("cuda", 1)


def test_transformers_own_initialisation_is_skipped_and_every_parameter_is_drawn(random_dir, monkeypatch):
    """draw_weights sets every parameter, so transformers' draw at construction is skipped: the model is the same
    as when both ran."""
    from transformers import initialization

    skipped = load_model(random_dir, dtype=torch.float32)
    monkeypatch.setattr("opdgrpo.train.models.no_init_weights", initialization.guard_torch_init_functions)
    both = load_model(random_dir, dtype=torch.float32)
    for (name, a), (_, b) in zip(skipped.state_dict().items(), both.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
