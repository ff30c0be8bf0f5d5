"""Faster gradient-free forwards that compute exactly what Hugging Face's eager attention computes.

Rollouts, evaluation and teacher forwards run without gradients; on these tiny models their time went into
copying, not arithmetic (issue 7's profile: copies were half of a decode step at batch 1024: the
per-step cast of the whole float32 key cache, ``repeat_kv``'s per-head copies and the cache's concatenation). Two changes remove that
without changing a single bit of the output:

* :func:`eager_attention_no_grad`: the same matrix multiplies as ``transformers``' ``eager_attention_forward``
  on the same rounded operands, with the GQA head groups folded into the rows of one multiply instead of repeating
  the keys and values per head. Under autocast, casting the operands first is what autocast does to a ``matmul``'s
  inputs anyway. Only under bfloat16 autocast, the precision every profile runs: there the folded multiply gave the
  same bits on every shape tried (``tests/test_inference.py``), while in float32 the one-row multiply of a decode
  step takes another kernel than the folded one and the last bits differ. With gradients enabled, or in float32, it
  *is* the eager function (the backward of a folded multiply would also sum the head groups' key gradients in
  another order), so training is untouched.
* :func:`sampling_cache`: the KV cache keeps keys in the autocast dtype (bfloat16) rather than float32: the eager
  multiply cast the whole key cache on every read, and the per-step concatenation copies half the bytes.

A preallocated (static) buffer was measured too and lost: CPU ``bmm`` copies a strided view of a buffer to a
contiguous tensor on every read, which costs more than the concatenation it saves.

Both keep the FLOPs the ledger counts: the same multiplies, over the same rows and positions. The tests hold them
bit for bit to the eager path (``tests/test_inference.py``, ``tests/test_speed_pins.py``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

#: The attention implementation name :func:`fast_attention` switches a model to while it runs without gradients.
NAME = "opdgrpo_eager"


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def eager_attention_no_grad(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """``transformers``' eager attention, without the per-head copies of keys and values when no gradient flows."""
    cast = _autocast_dtype(query.device.type)
    if torch.is_grad_enabled() or (dropout and module.training) or cast != torch.bfloat16:
        return eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    query_dtype = query.dtype
    query, key, value = query.to(cast), key.to(cast), value.to(cast)  # what autocast does to a matmul's inputs
    batch, heads, q_len, head_dim = query.shape
    kv_heads, groups = key.shape[1], heads // key.shape[1]
    # Query heads h = g * groups + r share key head g (repeat_kv's order), so (B, H, Q, D) -> (B, G, r*Q, D).
    scores = torch.matmul(query.reshape(batch, kv_heads, groups * q_len, head_dim), key.transpose(2, 3))
    scores = scores.view(batch, heads, q_len, -1) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query_dtype)
    out = torch.matmul(weights.to(cast).reshape(batch, kv_heads, groups * q_len, -1), value)
    return out.view(batch, heads, q_len, head_dim).transpose(1, 2).contiguous(), weights


AttentionInterface.register(NAME, eager_attention_no_grad)
AttentionMaskInterface.register(NAME, eager_mask)   # the eager mask: a float 0 / -inf bias (B, 1, Q, K)


@contextlib.contextmanager
def fast_attention(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` with :func:`eager_attention_no_grad` inside the block, if it uses eager attention."""
    config = getattr(model, "config", None)
    previous = getattr(config, "_attn_implementation", None)
    if previous != "eager":
        yield
        return
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = previous


class _CastLayer(DynamicLayer):
    """``DynamicLayer`` storing keys and values in the autocast dtype, as the eager multiply reads them."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        cast = _autocast_dtype(key_states.device.type)
        if cast is not None:
            key_states, value_states = key_states.to(cast), value_states.to(cast)
        return super().update(key_states, value_states, *args, **kwargs)


def sampling_cache(config) -> DynamicCache:
    """A ``DynamicCache`` whose full-attention layers keep keys and values in the autocast dtype (under autocast).

    Models with other layer kinds (sliding windows, linear attention) keep ``transformers``' own layers.
    """
    cache = DynamicCache(config=config)
    if cache.layers and all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [_CastLayer() for _ in cache.layers]
    return cache
