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
import inspect
from typing import Iterator

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb, eager_attention_forward

from opdgrpo import numerics

#: The attention implementation name :func:`fast_attention` switches a model to while it runs without gradients.
NAME = "opdgrpo_eager"


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def _folded_attention(module, query, key, value, attention_mask, scaling):
    """Eager attention's arithmetic with the GQA head groups folded into the rows of one bfloat16 multiply."""
    cast = _autocast_dtype(query.device.type)
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


def _reference_attention(module, query, key, value, attention_mask, scaling):
    return eager_attention_forward(module, query, key, value, attention_mask, scaling)


def eager_attention_no_grad(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """``transformers``' eager attention, without the per-head copies of keys and values when no gradient flows
    and the folded multiply is exact on this machine (:func:`opdgrpo.numerics.folded_attention_exact`)."""
    cast = _autocast_dtype(query.device.type)
    if (torch.is_grad_enabled() or (dropout and module.training) or cast != torch.bfloat16
            or not numerics.folded_attention_exact(query.shape[1], key.shape[1], query.shape[-1], query.device.type,
                                                   _folded_attention, _reference_attention)):
        return eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    return _folded_attention(module, query, key, value, attention_mask, scaling)


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


# --------------------------------------------------------------------------------------------------------------------
# A lean Qwen3 forward for rollouts: the model's own functions, none of the module machinery


def _rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """``Qwen3RMSNorm``'s own forward, called without the module call machinery (hooks, ``__call__``)."""
    return type(norm).forward(norm, x)


class LeanQwen3:
    """Prefill and cached decode steps of a ``Qwen3ForCausalLM`` under bfloat16 autocast, without gradients.

    Our own code because it is where rollouts spend their time: late decode steps have few rows, and a decode step
    of the tiny student over 8 rows costs 3.0 ms through ``transformers`` (module calls, config lookups, building
    the 4D mask and the cache objects) and 2.4 ms here; what is left is mostly the fixed cost of each small bfloat16
    matrix multiply. It calls the model's own RMSNorm, rotary embedding and ``apply_rotary_pos_emb`` (without the
    module call machinery), :func:`eager_attention_no_grad`, and ``F.linear`` on the same weights, in the model's
    order; keys and values are cached in bfloat16 as :func:`sampling_cache` keeps them, and the additive float32
    mask is the one ``eager_mask`` builds. The logits are bit for bit those of the model's own forward
    (``tests/test_inference.py``). Weights are cast to bfloat16 once per instance (autocast casts the weights of a
    model that needs no gradient, such as a teacher, on every call).

    Only for what it reproduces (:meth:`supports`): Qwen3 with full attention, default RoPE, SiLU, eager
    attention, bfloat16 autocast. Anything else runs through the model's own forward.
    """

    def __init__(self, model: torch.nn.Module):
        cfg, body = model.config, model.model
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.scaling = body.layers[0].self_attn.scaling
        self.rotary = body.rotary_emb
        self.embed = body.embed_tokens.weight
        self.cast = torch.get_autocast_dtype(self.embed.device.type)

        def w(linear: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
            # (weight, bias) as autocast casts them for F.linear
            bias = None if linear.bias is None else linear.bias.detach().to(self.cast)
            return linear.weight.detach().to(self.cast), bias

        self.layers = []
        for layer in body.layers:
            att, mlp = layer.self_attn, layer.mlp
            self.layers.append({
                "ln1": layer.input_layernorm, "ln2": layer.post_attention_layernorm,
                "q": w(att.q_proj), "k": w(att.k_proj), "v": w(att.v_proj), "o": w(att.o_proj),
                "qn": att.q_norm, "kn": att.k_norm, "module": att,
                "gate": w(mlp.gate_proj), "up": w(mlp.up_proj), "down": w(mlp.down_proj),
            })
        self.norm = body.norm
        self.lm_head = w(model.lm_head)
        self.keys: list[torch.Tensor | None] = [None] * len(self.layers)
        self.values: list[torch.Tensor | None] = [None] * len(self.layers)

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        """Whether it reproduces ``model``'s own forward: the architecture and settings it implements, and the
        bits checked once per process on this machine (:func:`opdgrpo.numerics.lean_forward_exact`)."""
        config = getattr(model, "config", None)
        if type(model).__name__ != "Qwen3ForCausalLM" or config is None or torch.is_grad_enabled():
            return False
        device = next(model.parameters()).device.type
        rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
        return (config._attn_implementation in ("eager", NAME) and _autocast_dtype(device) == torch.bfloat16
                and all(t == "full_attention" for t in getattr(config, "layer_types", None) or ["full_attention"])
                and rope == "default" and config.hidden_act == "silu" and not model.training
                and numerics.lean_forward_exact(model, _lean_decode, _reference_decode))

    @staticmethod
    def mask_bias(attention_mask: torch.Tensor, q_len: int) -> torch.Tensor:
        """``eager_mask`` for a 2D padding mask whose last ``q_len`` positions are the queries: 0 where a query may
        attend (causal and not padding), the float32 minimum elsewhere; shape (B, 1, q_len, K)."""
        kv_len = attention_mask.shape[1]
        q_idx = torch.arange(kv_len - q_len, kv_len, device=attention_mask.device)
        kv_idx = torch.arange(kv_len, device=attention_mask.device)
        allowed = (kv_idx[None, :] <= q_idx[:, None])[None, None] & attention_mask.bool()[:, None, None, :]
        return torch.where(allowed, torch.zeros((), device=allowed.device, dtype=torch.float32), torch.finfo(torch.float32).min)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor, *,
                logits_to_keep: int = 1, cache: bool = True) -> torch.Tensor:
        """Logits of the last ``logits_to_keep`` positions; ``mask`` from :meth:`mask_bias`. With ``cache`` the keys
        and values are appended to this object's cache and attention reads all of it."""
        batch, q_len = input_ids.shape
        hidden = torch.nn.functional.embedding(input_ids, self.embed)
        cos, sin = type(self.rotary).forward(self.rotary, hidden, position_ids)   # Qwen3RotaryEmbedding's own

        def linear(x: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
            return torch.nn.functional.linear(x, *weights)

        for i, p in enumerate(self.layers):
            residual = hidden
            x = _rms_norm(hidden, p["ln1"])
            q = _rms_norm(linear(x, p["q"]).view(batch, q_len, -1, self.head_dim), p["qn"]).transpose(1, 2)
            k = _rms_norm(linear(x, p["k"]).view(batch, q_len, -1, self.head_dim), p["kn"]).transpose(1, 2)
            v = linear(x, p["v"]).view(batch, q_len, -1, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k, v = k.to(self.cast), v.to(self.cast)   # what _CastLayer stores
            if cache:
                if self.keys[i] is not None:
                    k, v = torch.cat([self.keys[i], k], dim=-2), torch.cat([self.values[i], v], dim=-2)
                self.keys[i], self.values[i] = k, v
            out, _ = eager_attention_no_grad(p["module"], q, k, v, mask, self.scaling)
            hidden = residual + linear(out.reshape(batch, q_len, -1).contiguous(), p["o"])
            residual = hidden
            x = _rms_norm(hidden, p["ln2"])
            hidden = residual + linear(torch.nn.functional.silu(linear(x, p["gate"])) * linear(x, p["up"]), p["down"])
        hidden = _rms_norm(hidden, self.norm)
        return linear(hidden[:, -logits_to_keep:, :], self.lm_head)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` of the batch in the cache (finished rows leave it)."""
        self.keys = [k[rows, ...] for k in self.keys]
        self.values = [v[rows, ...] for v in self.values]


class FrozenForward:
    """Gradient-free forwards of a model that never changes during a run (OPD's teachers).

    :class:`LeanQwen3` where it reproduces the model's own forward, its bfloat16 weights cast once for the run rather
    than by autocast on every call (a frozen model's weights need no gradient, so autocast does not cache their
    casts); otherwise the model itself under :func:`fast_attention`. The logits are the same bits either way.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.lean: LeanQwen3 | None = None
        self.checked = False

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                 logits_to_keep: int) -> torch.Tensor:
        if not self.checked:   # decided at the first call, under the run's autocast
            self.lean = LeanQwen3(self.model) if LeanQwen3.supports(self.model) else None
            self.checked = True
        if self.lean is not None:
            mask = LeanQwen3.mask_bias(attention_mask, input_ids.shape[1])
            return self.lean.forward(input_ids, position_ids, mask, logits_to_keep=logits_to_keep, cache=False)
        with fast_attention(self.model):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              logits_to_keep=logits_to_keep).logits


# --------------------------------------------------------------------------------------------------------------------
# The two paths :func:`opdgrpo.numerics.lean_forward_exact` compares: a prefill, then greedy decode steps against the
# cache, with one row leaving the batch after the second step (as finished rows leave the sampler's batch).


def cache_kwarg(model: torch.nn.Module) -> str:
    """transformers 5.24 names the forward's cache argument ``cache`` (``past_key_values`` is a deprecated alias
    until 5.40); older 5.x releases only know ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@contextlib.contextmanager
def _plain_eager(model: torch.nn.Module) -> Iterator[None]:
    """``transformers``' own eager attention inside the block, even within :func:`fast_attention`."""
    previous = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        yield
    finally:
        model.config._attn_implementation = previous


def _greedy_decode(step, select, ids: torch.Tensor, mask: torch.Tensor, steps: int) -> list[torch.Tensor]:
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = step(ids, mask, positions, ids.shape[1])
    outs, pos = [out], positions[:, -1:]
    for i in range(steps):
        token = out[:, -1].argmax(-1, keepdim=True)
        if i == 2:
            keep = torch.arange(1, token.shape[0], device=token.device)
            select(keep)
            token, mask, pos = token[keep], mask[keep], pos[keep]
        mask, pos = torch.cat([mask, torch.ones_like(token)], -1), pos + 1
        out = step(token, mask, pos, 1)
        outs.append(out)
    return outs


def _reference_decode(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The model's own forward with eager attention and a plain ``DynamicCache``."""
    cache, kw = DynamicCache(config=model.config), cache_kwarg(model)

    def step(x, m, p, keep):
        return model(input_ids=x, attention_mask=m, position_ids=p, use_cache=True, logits_to_keep=keep, **{kw: cache}).logits

    with _plain_eager(model):
        return _greedy_decode(step, cache.batch_select_indices, ids, mask, steps)


def _lean_decode(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, steps: int) -> list[torch.Tensor]:
    lean = LeanQwen3(model)

    def step(x, m, p, keep):
        return lean.forward(x, p, LeanQwen3.mask_bias(m, x.shape[1]), logits_to_keep=keep)

    return _greedy_decode(step, lean.select, ids, mask, steps)
