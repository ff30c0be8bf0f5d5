"""``train.distributed``, ``train.fsdp`` and ``train.activation_checkpointing`` as configuration (the FSDP2 runs
themselves: tests/integration/test_fsdp.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from transformers import Qwen3Config, Qwen3ForCausalLM

from opdgrpo import schema
from opdgrpo.config import ConfigError, compose
from opdgrpo.train.fsdp import Policy, decoder_layers
from opdgrpo.train.models import enable_activation_checkpointing

ROOT = Path(__file__).resolve().parents[2]


def test_fsdp_policy_follows_the_resolved_precision_unless_set():
    assert Policy.from_config({}, "bf16") == Policy(torch.bfloat16, torch.float32)
    assert Policy.from_config({}, "fp32") == Policy(torch.float32, torch.float32)
    assert Policy.from_config({"param_dtype": "float32", "reduce_dtype": "bfloat16"}, "bf16") \
        == Policy(torch.float32, torch.bfloat16)
    assert Policy.from_config({"param_dtype": None}, "bf16") == Policy(torch.bfloat16, torch.float32)
    with pytest.raises(ValueError, match="resolved precision"):   # the job resolves `auto` once, before the policy
        Policy.from_config({}, "auto")


def test_fsdp_schema_keys():
    train = yaml.safe_load((ROOT / "conf" / "profile" / "paper.yaml").read_text())["train"]
    schema.validate(train, "train")
    assert train["distributed"] == "fsdp" and train["activation_checkpointing"] is True
    schema.validate({**train, "distributed": "none", "fsdp": {"param_dtype": None}}, "train")
    with pytest.raises(schema.SchemaError):
        schema.validate({**train, "fsdp": {"reshard_after_forward": True}}, "train")   # no key that would do nothing
    with pytest.raises(schema.SchemaError):
        schema.validate({**train, "distributed": "fsdp1"}, "train")


def test_fsdp_block_under_another_strategy_is_an_error():
    """A key that would do nothing: the paper profile with `train.distributed=ddp` must drop its fsdp block."""
    with pytest.raises(ConfigError, match=r"train.fsdp.*~train.fsdp"):
        compose(["profile=paper", "train.distributed=ddp"])
    cfg = compose(["profile=paper", "train.distributed=ddp", "~train.fsdp"])
    assert cfg["train"]["distributed"] == "ddp" and "fsdp" not in cfg["train"]


def test_fsdp_activation_checkpointing_recomputes_each_layer():
    """The key acts: in training mode each decoder layer's body runs again in the backward; the gradients are the
    same (eval-mode sampling is not checkpointed)."""
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16)
    plain = Qwen3ForCausalLM(config)
    checkpointed = Qwen3ForCausalLM(config)
    checkpointed.load_state_dict(plain.state_dict())
    enable_activation_checkpointing(checkpointed)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    counts = {}
    for name, model in (("plain", plain), ("checkpointed", checkpointed)):
        calls = [0]
        for layer in decoder_layers(model):
            layer.mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        counts[name] = calls[0]
    assert counts == {"plain": 2, "checkpointed": 4}
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters()):
        assert torch.equal(a.grad, b.grad), name
