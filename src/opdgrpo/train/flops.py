"""Analytic FLOP formulas for decoder-only transformers: dense Qwen3 / Llama style, and Olmo-3's sliding windows.

Convention (the ledger's contract, also stated in docs/method.md, "The FLOP ledger"):

* Only matrix multiplies are counted, each as ``2 * m * n * k`` FLOPs. Norms, activations, softmax, rotary
  embeddings, residual adds and embedding lookups are ignored: they are a negligible, hardware-dependent share.
* Per layer and per token: the q, k, v and o projections (k and v with ``num_key_value_heads``, i.e. GQA is
  cheaper), and the gated MLP (gate, up, down).
* Attention scores (``Q K^T``) and attention-weighted values (``P V``) over the *full* context, not the causally
  halved one: ``4 * L * C * n_heads * head_dim`` per layer for ``L`` query positions against ``C`` key positions.
  That is what an eager (materialised-matrix) attention actually multiplies, GQA keys being repeated per head.
* The LM head (``2 * hidden * vocab`` per position), tied to the embedding or not, on the positions whose logits
  are computed only (``logits_to_keep`` in transformers).
* A backward pass costs exactly twice its forward (gradients w.r.t. activations and weights), so a training
  pass is 3x forward.

This is exactly what ``torch.utils.flop_counter.FlopCounterMode`` counts on a Hugging Face model loaded with
``attn_implementation="eager"`` (HF's Qwen3/Llama rotary embedding uses a broadcast multiply, not a matmul, so it
adds nothing); the tests hold these formulas to that counter. With SDPA the counter uses other formulas (and on CPU
none at all), which is why the ledger is analytic rather than measured.

Sliding-window layers (Olmo-3: ``layer_types`` with ``"sliding_attention"`` in 3 of every 4 layers, window
``sliding_window``; any config with those two keys). The ledger counts what the *eager* kernel with transformers'
``DynamicCache`` computes, measured with ``FlopCounterMode`` (tests/unit/test_flops.py):

* A cache-less forward (training, teacher and reference passes) or a prefill: eager attention multiplies the full
  ``L x L`` score matrix and masks the out-of-window scores, so a sliding layer costs exactly what a full one does,
  at any length (SDPA with a mask does the same arithmetic; only a kernel that skips masked blocks, such as
  FlashAttention with ``sliding_window``, computes less, and the ledger does not model it).
* A cached decode step: the sliding layers' cache (``DynamicSlidingWindowLayer``) keeps the last
  ``sliding_window - 1`` positions, so the new token attends to ``min(context, sliding_window)`` keys there, and
  to the whole context in the full layers. Decoding is therefore cheaper than a Qwen3 of the same shape once
  the context passes the window; for rows no longer than the window every formula equals the dense one.

Olmo-3's other differences (post-norm, RMSNorm of the whole q and k projections, per-layer-type RoPE) add no
matmul. All functions take any ``transformers`` config exposing ``hidden_size``, ``num_hidden_layers``,
``num_attention_heads``, ``num_key_value_heads`` (default: ``num_attention_heads``), ``head_dim`` (default:
``hidden_size // num_attention_heads``), ``intermediate_size`` and ``vocab_size`` (optionally ``layer_types`` and
``sliding_window``), and return float FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class _Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    sliding_layers: int = 0     # layers with a sliding window (the rest attend to the whole context)
    window: int = 0             # ``sliding_window`` (0 when no layer slides)


def _shape(config: Any) -> _Shape:
    heads = int(config.num_attention_heads)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    layers = int(config.num_hidden_layers)
    layer_types = list(getattr(config, "layer_types", None) or [])
    if layer_types and len(layer_types) != layers:
        raise ValueError(f"layer_types has {len(layer_types)} entries for {layers} layers")
    sliding = sum(t == "sliding_attention" for t in layer_types)
    window = int(getattr(config, "sliding_window", None) or 0) if sliding else 0
    if sliding and window < 1:
        raise ValueError("layer_types names sliding_attention layers but sliding_window is not set")
    return _Shape(
        hidden=int(config.hidden_size),
        layers=layers,
        heads=heads,
        kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        ffn=int(config.intermediate_size),
        vocab=int(config.vocab_size),
        sliding_layers=sliding,
        window=window,
    )


def _layer_token_flops(s: _Shape) -> int:
    """Forward matmul FLOPs of one layer for one token, excluding the attention over the context."""
    q_o = 2 * (2 * s.hidden * s.heads * s.head_dim)  # q_proj and o_proj
    k_v = 2 * (2 * s.hidden * s.kv_heads * s.head_dim)  # k_proj and v_proj (GQA: kv heads only)
    mlp = 3 * (2 * s.hidden * s.ffn)  # gate_proj, up_proj, down_proj
    return q_o + k_v + mlp


def _forward(s: _Shape, batch_size: int, new_tokens: int, cached: int, logits_positions: int) -> float:
    """Forward FLOPs of ``new_tokens`` query positions per row after ``cached`` positions in the KV cache.

    Keys per query: ``cached + new_tokens`` in a full layer; in a sliding layer the cache holds at most
    ``window - 1`` of the cached positions (transformers' ``DynamicSlidingWindowLayer``), and all the new ones
    are scored (eager's full matrix, masked), so ``min(cached, window - 1) + new_tokens``.
    """
    full_keys = cached + new_tokens
    sliding_keys = min(cached, s.window - 1) + new_tokens if s.sliding_layers else 0
    attention = 4 * new_tokens * s.heads * s.head_dim * (
        (s.layers - s.sliding_layers) * full_keys + s.sliding_layers * sliding_keys)
    per_row = s.layers * new_tokens * _layer_token_flops(s) + attention
    per_row += 2 * logits_positions * s.hidden * s.vocab
    return float(batch_size * per_row)


def forward_flops(config: Any, batch_size: int, seq_len: int, logits_positions: int | None = None) -> float:
    """FLOPs of one cache-less forward pass over ``batch_size`` rows of ``seq_len`` tokens.

    ``logits_positions``: positions per row whose LM-head logits are computed (None: all ``seq_len``).
    Padding counts: it is computed.
    """
    lp = seq_len if logits_positions is None else logits_positions
    return _forward(_shape(config), batch_size, seq_len, 0, lp)


def train_flops(config: Any, batch_size: int, seq_len: int, logits_positions: int | None = None) -> float:
    """FLOPs of a forward plus backward pass (backward = 2x forward, so 3x :func:`forward_flops`)."""
    return 3.0 * forward_flops(config, batch_size, seq_len, logits_positions)


def prefill_flops(config: Any, batch_size: int, prompt_len: int, logits_positions: int = 1) -> float:
    """FLOPs of the generation prefill: a forward over the (padded) prompts, logits for the last position only."""
    return forward_flops(config, batch_size, prompt_len, logits_positions)


def decode_step_flops(config: Any, batch_size: int, context_len: int) -> float:
    """FLOPs of one cached decode step: one new token per row attending to ``context_len`` positions
    (the cached ones plus itself; a sliding layer to ``min(context_len, sliding_window)``), with its logits computed."""
    return _forward(_shape(config), batch_size, 1, context_len - 1, 1)


def decode_steps_flops(config: Any, batch_size: float, prompt_len: float, steps: float) -> float:
    """FLOPs of ``steps`` consecutive decode steps after a ``prompt_len`` prefill: step ``s`` (1-based) attends to
    ``prompt_len + s`` positions, i.e. ``sum(decode_step_flops(config, batch_size, prompt_len + s))``.

    Closed form, so the cost model can take it at any (mean, fractional) length in O(1): the full layers' cost is
    affine in the context; a sliding layer's grows until the context reaches the window and then stays flat.
    Exact for integer lengths, the same piecewise polynomial between them.
    """
    if steps <= 0 or batch_size == 0:
        return 0.0
    s = _shape(config)
    n, p = float(steps), float(prompt_len)
    fixed = s.layers * _layer_token_flops(s) + 2 * s.hidden * s.vocab
    context_sum = n * p + n * (n + 1) / 2
    if s.sliding_layers:
        k = min(max(s.window - p, 0.0), n)   # steps whose context is still within the window
        window_sum = k * p + k * (k + 1) / 2 + (n - k) * s.window
    else:
        window_sum = 0.0
    attention = 4 * s.heads * s.head_dim * ((s.layers - s.sliding_layers) * context_sum + s.sliding_layers * window_sum)
    return float(batch_size * (n * fixed + attention))


def generate_flops(config: Any, batch_size: int, prompt_len: int, new_tokens: int) -> float:
    """FLOPs of cached generation of exactly ``new_tokens`` tokens per row after ``prompt_len`` prompt tokens.

    Matches ``model.generate(..., max_new_tokens=new_tokens, min_new_tokens=new_tokens)``: the prefill yields the
    first token (logits for the last prompt position only), each further token costs one decode step against the
    growing cache, and the last generated token is never fed back.
    """
    if new_tokens <= 0:
        return 0.0
    total = prefill_flops(config, batch_size, prompt_len)
    for step in range(1, new_tokens):
        total += decode_step_flops(config, batch_size, prompt_len + step)
    return total


def params_count(config: Any) -> int:
    """Parameter count of a Qwen3/Llama/Olmo-3-style model built from ``config`` (embedding counted once if tied).

    Includes RMSNorm weights (Qwen3's per-head q/k norms when ``model_type == "qwen3"``, Olmo-3's norms over the
    whole q and k projections when ``model_type == "olmo3"``) and attention biases when ``attention_bias`` is set;
    it is a size figure, not used for FLOPs.
    """
    s = _shape(config)
    q_out, kv_out = s.heads * s.head_dim, s.kv_heads * s.head_dim
    attn = s.hidden * q_out + 2 * s.hidden * kv_out + q_out * s.hidden
    if getattr(config, "attention_bias", False):
        attn += q_out + 2 * kv_out + s.hidden
    model_type = getattr(config, "model_type", "")
    qk_norms = {"qwen3": 2 * s.head_dim, "olmo3": q_out + kv_out}.get(model_type, 0)
    norms = 2 * s.hidden + qk_norms
    layer = attn + 3 * s.hidden * s.ffn + norms
    embed = s.vocab * s.hidden
    head = 0 if getattr(config, "tie_word_embeddings", False) else s.vocab * s.hidden
    return s.layers * layer + embed + head + s.hidden
