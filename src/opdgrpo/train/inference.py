"""Faster gradient-free forwards that compute exactly what Hugging Face's eager attention computes.

Rollouts, evaluation and teacher forwards run without gradients; on these tiny models their time went into
copying, not arithmetic (``torch.profiler`` before this module, docs/speed.md "Where the time went": copies were
half of a decode step at batch 1024: the per-step cast of the whole float32 key cache, ``repeat_kv``'s per-head copies
and the cache's concatenation). Two changes remove that without changing a single bit of the output:

* :func:`eager_attention_no_grad`: the same matrix multiplies as ``transformers``' ``eager_attention_forward``
  on the same rounded operands, with the GQA head groups folded into the rows of one multiply instead of repeating
  the keys and values per head. Under autocast, casting the operands first is what autocast does to a ``matmul``'s
  inputs anyway. Only under bfloat16 autocast, the precision every profile runs: there the folded multiply gave the
  same bits on every shape tried (``tests/integration/test_inference.py``), while in float32 the one-row multiply of a decode
  step takes another kernel than the folded one and the last bits differ. With gradients enabled, or in float32, it
  *is* the eager function (the backward of a folded multiply would also sum the head groups' key gradients in
  another order), so training is untouched.
* :func:`sampling_cache`: the KV cache keeps keys in the autocast dtype (bfloat16) rather than float32: the eager
  multiply cast the whole key cache on every read, and the per-step concatenation copies half the bytes.

A preallocated (static) buffer was measured too and lost: CPU ``bmm`` copies a strided view of a buffer to a
contiguous tensor on every read, which costs more than the concatenation it saves.

Both keep the FLOPs the ledger counts: the same multiplies, over the same rows and positions. The tests hold them
bit for bit to the eager path (``tests/integration/test_inference.py``, ``tests/integration/test_speed_pins.py``).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import types
from typing import Iterator, Sequence

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import _disable_current_modes
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb, eager_attention_forward

from opdgrpo.train import numerics
from opdgrpo.train.logit_chunks import Reduce, reduce_response, reducing_head
from opdgrpo.train.packed_rows import PackedRows, segment_mask

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


def eager_attention_no_grad(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """``transformers``' eager attention, without the per-head copies of keys and values when no gradient flows
    and the folded multiply is exact on this machine (:func:`fold_allowed`)."""
    cast = _autocast_dtype(query.device.type)
    if (torch.is_grad_enabled() or (dropout and module.training) or cast != torch.bfloat16
            or not fold_allowed(query.shape[1], key.shape[1], query.shape[-1], query.device.type)):
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
    (``tests/integration/test_inference.py``). Weights are cast to bfloat16 once per instance (autocast casts the weights of a
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
        """Whether it implements ``model`` under the current settings: Qwen3, full attention, default RoPE, SiLU,
        eager attention, bfloat16 autocast, eval mode, no gradients. Whether its bits equal the model's own on this
        machine is :func:`choose_path`'s question."""
        config = getattr(model, "config", None)
        if type(model).__name__ != "Qwen3ForCausalLM" or config is None or torch.is_grad_enabled():
            return False
        device = next(model.parameters()).device.type
        rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
        return (config._attn_implementation in ("eager", NAME) and _autocast_dtype(device) == torch.bfloat16
                and all(t == "full_attention" for t in getattr(config, "layer_types", None) or ["full_attention"])
                and rope == "default" and config.hidden_act == "silu" and not model.training)

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
        return self.head(self.hidden_states(input_ids, position_ids, mask, cache=cache)[:, -logits_to_keep:, :])

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on final hidden states (the model's bfloat16 ``F.linear``)."""
        return torch.nn.functional.linear(hidden, *self.lm_head)

    def hidden_states(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor, *,
                      cache: bool = True) -> torch.Tensor:
        """The final norm's output at every position (what :meth:`head` turns into logits)."""
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
        return _rms_norm(hidden, self.norm)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` of the batch in the cache (finished rows leave it)."""
        self.keys = [k[rows, ...] for k in self.keys]
        self.values = [v[rows, ...] for v in self.values]


class FrozenForward:
    """Gradient-free forwards of a model that never changes during a run (OPD's teachers).

    The path :func:`choose_path` picks, decided at the first call under the run's autocast: :class:`LeanQwen3` with
    the bfloat16 weights cast once for the run rather than by autocast on every call (a frozen model's weights need
    no gradient, so autocast does not cache their casts), the model under :func:`fast_attention`, or the model itself.
    The logits are the reference's bits whichever it is.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.path: str | None = None
        self.lean: LeanQwen3 | None = None
        # FSDP2-sharded (Workers.prepare_frozen): only the model's own forward gathers its shards, and the gathered
        # weights are bfloat16 under the paper's policy, not the weights the exactness check would compare against.
        self.sharded = any(isinstance(p, DTensor) for p in model.parameters())
        if self.sharded:
            self.path = REFERENCE

    def reduced(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                logits_to_keep: int, reduce: Reduce, extras: Sequence[torch.Tensor], chunk: int) -> tuple[torch.Tensor, ...]:
        """:func:`~opdgrpo.train.logit_chunks.reduce_response` over the logits this forward would return: the decoder on
        the whole batch, the LM head ``chunk`` positions at a time, each chunk reduced by ``reduce`` (same bits as
        reducing :meth:`__call__`'s logits; a sharded model's root weights are resharded afterwards)."""
        def run(hidden: torch.Tensor, head) -> tuple[torch.Tensor, ...]:
            return reduce_response(hidden, head, reduce, extras, chunk)

        if self.path is None:
            self.path = choose_path(self.model)
            self.lean = LeanQwen3(self.model) if self.path == LEAN else None
        if self.lean is not None:
            mask = LeanQwen3.mask_bias(attention_mask, input_ids.shape[1])
            hidden = self.lean.hidden_states(input_ids, position_ids, mask, cache=False)
            return run(hidden[:, -logits_to_keep:, :], self.lean.head)
        with fast_attention(self.model) if self.path == FAST else contextlib.nullcontext(), reducing_head(self.model, run):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             logits_to_keep=logits_to_keep).logits
        if self.sharded:
            self.model.reshard()   # FSDP2 keeps the root unit (embedding, LM head) gathered after a forward
        return out

    def reduced_packed(self, packed: PackedRows, reduce: Reduce, extras: Sequence[torch.Tensor],
                       chunk: int) -> tuple[torch.Tensor, ...]:
        """:meth:`reduced` over rows laid end to end (:mod:`opdgrpo.train.packed_rows`): the decoder on the packed
        rows, the LM head on each row's response positions gathered back into its ``(rows, response)`` layout (plus
        one position per row that the reduction drops, as :meth:`reduced` keeps ``response + 1``)."""
        index = torch.cat([packed.logit_index, packed.logit_index[:, :1]], dim=1)

        def run(hidden: torch.Tensor, head) -> tuple[torch.Tensor, ...]:
            picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, index.reshape(-1))
            return reduce_response(picked.reshape(*index.shape, -1), head, reduce, extras, chunk)

        if self.path is None:
            self.path = choose_path(self.model)
            self.lean = LeanQwen3(self.model) if self.path == LEAN else None
        if self.lean is not None:
            allowed = segment_mask(packed.position_ids)
            mask = torch.where(allowed, torch.zeros((), device=allowed.device, dtype=torch.float32),
                               torch.finfo(torch.float32).min)
            return run(self.lean.hidden_states(packed.input_ids, packed.position_ids, mask, cache=False), self.lean.head)
        with fast_attention(self.model) if self.path == FAST else contextlib.nullcontext(), reducing_head(self.model, run):
            out = self.model(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None,
                             use_cache=False, logits_to_keep=0).logits
        if self.sharded:
            self.model.reshard()
        return out

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                 logits_to_keep: int) -> torch.Tensor:
        if self.path is None:
            self.path = choose_path(self.model)
            self.lean = LeanQwen3(self.model) if self.path == LEAN else None
        if self.lean is not None:
            mask = LeanQwen3.mask_bias(attention_mask, input_ids.shape[1])
            return self.lean.forward(input_ids, position_ids, mask, logits_to_keep=logits_to_keep, cache=False)
        with fast_attention(self.model) if self.path == FAST else contextlib.nullcontext():
            return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              logits_to_keep=logits_to_keep).logits


def cache_kwarg(model: torch.nn.Module) -> str:
    """transformers 5.24 names the forward's cache argument ``cache`` (``past_key_values`` is a deprecated alias
    until 5.40); older 5.x releases only know ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


# --------------------------------------------------------------------------------------------------------------------
# Which path is exact on this machine: checked once per process, never assumed (the folded multiply that was exact
# on an AMD EPYC differed in the last bits on an Intel Xeon with AMX; docs/speed.md, "Exact on which CPUs").
# Decisions go to done.json through opdgrpo.train.numerics.

LEAN, FAST, REFERENCE = "lean", "fast", "reference"
#: Per head layout (heads, kv_heads, head_dim, device, threads) and mode: whether the fold passed the sweep.
_fold_verdicts: dict[tuple, bool] = {}
#: Head layouts whose fold a model-level check found inexact although the sweep passed.
_fold_vetoed: set[tuple] = set()
_paths: dict[tuple, str] = {}


def _forget() -> None:
    _fold_verdicts.clear()
    _fold_vetoed.clear()
    _paths.clear()


numerics.on_reset(_forget)


def _layout(heads: int, kv_heads: int, head_dim: int, device: str) -> tuple:
    return heads, kv_heads, head_dim, device, torch.get_num_threads()


def fold_allowed(heads: int, kv_heads: int, head_dim: int, device: str) -> bool:
    """Whether the folded GQA multiply may replace eager attention for this head layout here: not vetoed by a model's
    check (:func:`choose_path`) and exact over :func:`_fold_sweep`'s shapes, under ``OPDGRPO_FAST_PATHS=auto``."""
    layout, mode = _layout(heads, kv_heads, head_dim, device), numerics.mode()
    if (layout, mode) not in _fold_verdicts:
        _fold_verdicts[layout, mode] = _fold_sweep(layout, mode)
    return layout not in _fold_vetoed and _fold_verdicts[layout, mode]


def _model_like(rows: int, length: int, heads: int, head_dim: int, generator, device: str) -> torch.Tensor:
    """A (rows, heads, length, head_dim) tensor laid out as the model makes it: (rows, length, heads, head_dim)
    transposed (the multiply's kernel can depend on the strides, not only the shape)."""
    return torch.randn(rows, length, heads, head_dim, generator=generator, device=generator.device).to(device).transpose(1, 2)


def _fold_sweep(layout: tuple, mode: str) -> bool:
    """The fold against eager attention on decode steps and prefills, short and long contexts, masked prefixes, with
    the model's layouts: queries transposed, keys as a prefill leaves them (transposed) or as the cache's
    concatenation leaves them (contiguous), values in bfloat16."""
    heads, kv_heads, head_dim, device, threads = layout
    key = f"heads={heads} kv_heads={kv_heads} head_dim={head_dim} device={device} threads={threads}"
    if mode == "off":
        numerics.record("folded_attention", key, {"used": False, "reason": f"{numerics.ENV}=off"})
        return False
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, training=False)
    g = torch.Generator(device="cpu").manual_seed(heads * 1000 + kv_heads * 100 + head_dim)
    checked, first_difference = 0, None
    with torch.no_grad(), _disable_current_modes(), torch.autocast(device, dtype=torch.bfloat16):
        for rows, q_len, extra in itertools.product((1, 3, 8, 64), (1, 2, 7, 33), (0, 5, 31, 96)):
            length = q_len + extra
            q = _model_like(rows, q_len, heads, head_dim, g, device)
            k = _model_like(rows, length, kv_heads, head_dim, g, device)
            v = _model_like(rows, length, kv_heads, head_dim, g, device).to(torch.bfloat16)
            if q_len == 1:   # a decode step reads the concatenated cache
                k, v = k.contiguous(), v.contiguous()
            mask = torch.zeros(rows, 1, q_len, length, device=device)
            mask[..., : (rows * 7 + length) % length] = torch.finfo(torch.float32).min
            a, _ = eager_attention_forward(module, q, k, v, mask, head_dim ** -0.5)
            b, _ = _folded_attention(module, q, k, v, mask, head_dim ** -0.5)
            checked += 1
            if not torch.equal(a, b):
                first_difference = {"rows": rows, "q_len": q_len, "kv_len": length}
                break
    exact = first_difference is None
    numerics.record("folded_attention", key, {"used": exact, "shapes_checked": checked,
                                              **({} if exact else {"first_difference": first_difference})})
    return exact


def _signature(model: torch.nn.Module) -> tuple:
    cfg, param = model.config, next(model.parameters())
    return (type(model).__name__, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers,
            cfg.num_attention_heads, cfg.num_key_value_heads, getattr(cfg, "head_dim", None), cfg.vocab_size,
            bool(getattr(cfg, "tie_word_embeddings", False)), bool(getattr(cfg, "attention_bias", False)),
            getattr(getattr(model, "lm_head", None), "bias", None) is not None, str(param.dtype).removeprefix("torch."),
            param.device.type, str(_autocast_dtype(param.device.type)).removeprefix("torch."),
            cfg._attn_implementation if cfg._attn_implementation != NAME else "eager", torch.get_num_threads(),
            numerics.mode())


def choose_path(model: torch.nn.Module) -> str:
    """The fastest gradient-free path that gives ``model``'s own eager-forward bits on this machine, under the current
    autocast: :data:`LEAN` (:class:`LeanQwen3`), :data:`FAST` (the model under :func:`fast_attention` with a
    :func:`sampling_cache`) or :data:`REFERENCE` (the model, eager attention, a plain ``DynamicCache``).

    Checked once per process and model architecture on a probe batch (left-padded prefill, cached decode steps, a
    row leaving the cache); where the fast path differs only through the folded multiply, the fold is vetoed for
    that head layout and the rest kept.
    """
    if model.training:   # dropout may apply: only the model's own forward computes that
        return REFERENCE
    signature = _signature(model)
    if signature not in _paths:
        _paths[signature] = _check_paths(model, signature)
    return _paths[signature]


def _check_paths(model: torch.nn.Module, signature: tuple) -> str:
    names = ("model", "hidden", "ffn", "layers", "heads", "kv_heads", "head_dim", "vocab", "tied", "attention_bias",
             "head_bias", "dtype", "device", "autocast", "attention", "threads")
    key = " ".join(f"{n}={v}" for n, v in zip(names, signature))
    if numerics.mode() == "off":
        numerics.record("paths", key, {"path": REFERENCE, "reason": f"{numerics.ENV}=off"})
        return REFERENCE
    cfg, device = model.config, next(model.parameters()).device.type
    layout = _layout(cfg.num_attention_heads, cfg.num_key_value_heads,
                     int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads), device)
    candidates = ([LEAN] if LeanQwen3.supports(model) else []) + [FAST]
    refused: list[str] = []
    # Invisible to dispatch modes around the caller (a FlopCounterMode counting a sampler call must not count the
    # check's forwards); torch has no public switch for this.
    with torch.no_grad(), _disable_current_modes():
        ids, mask = _probe_batch(cfg.vocab_size, next(model.parameters()).device)
        want = _reference_decode(model, ids, mask)
        for veto in (False, True):
            if veto:
                if not fold_allowed(*layout[:4]):
                    break   # the fold was not in play: vetoing it changes nothing
                _fold_vetoed.add(layout)
            for path in candidates:
                got = (_lean_decode if path == LEAN else _fast_decode)(model, ids, mask)
                if len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(want, got)):
                    numerics.record("paths", key, {"path": path, "fold": fold_allowed(*layout[:4]),
                                                   **({"refused": refused} if refused else {})})
                    return path
                refused.append(path + (" (fold vetoed)" if veto else ""))
    numerics.record("paths", key, {"path": REFERENCE, "fold": False, "refused": refused})
    return REFERENCE


def _probe_batch(vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """6 rows x 13 tokens, left-padded by different amounts."""
    ids = torch.randint(3, vocab, (6, 13), generator=torch.Generator(device="cpu").manual_seed(11), device="cpu").to(device)
    mask = torch.ones_like(ids)
    for row, pad in enumerate((0, 4, 1, 9, 0, 2)):
        mask[row, :pad] = 0
    return ids, mask


@contextlib.contextmanager
def _plain_eager(model: torch.nn.Module) -> Iterator[None]:
    """``transformers``' own eager attention inside the block, even within :func:`fast_attention`."""
    previous = model.config._attn_implementation
    if previous == NAME:
        model.config._attn_implementation = "eager"
    try:
        yield
    finally:
        model.config._attn_implementation = previous


def _greedy_decode(step, select, ids: torch.Tensor, mask: torch.Tensor, steps: int = 6) -> list[torch.Tensor]:
    """Prefill logits of every position, then ``steps`` greedy decode steps; one row leaves after the second."""
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


def _model_decode(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache) -> list[torch.Tensor]:
    kw = cache_kwarg(model)

    def step(x, m, p, keep):
        return model(input_ids=x, attention_mask=m, position_ids=p, use_cache=True, logits_to_keep=keep, **{kw: cache}).logits

    return _greedy_decode(step, cache.batch_select_indices, ids, mask)


def _reference_decode(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """The model's own forward with eager attention (or its own kernel) and a plain ``DynamicCache``."""
    with _plain_eager(model):
        return _model_decode(model, ids, mask, DynamicCache(config=model.config))


def _fast_decode(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    with fast_attention(model):
        return _model_decode(model, ids, mask, sampling_cache(model.config))


def _lean_decode(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    lean = LeanQwen3(model)

    def step(x, m, p, keep):
        return lean.forward(x, p, LeanQwen3.mask_bias(m, x.shape[1]), logits_to_keep=keep)

    return _greedy_decode(step, lean.select, ids, mask)
