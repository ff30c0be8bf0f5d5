"""Analytic FLOP formulas for dense decoder-only transformers (Qwen3 / Llama style).

Convention (the ledger's contract, see DESIGN.md "The FLOP ledger"):

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

All functions take any ``transformers`` config exposing ``hidden_size``, ``num_hidden_layers``,
``num_attention_heads``, ``num_key_value_heads`` (default: ``num_attention_heads``), ``head_dim`` (default:
``hidden_size // num_attention_heads``), ``intermediate_size`` and ``vocab_size``, and return float FLOPs.
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


def _shape(config: Any) -> _Shape:
    heads = int(config.num_attention_heads)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return _Shape(
        hidden=int(config.hidden_size),
        layers=int(config.num_hidden_layers),
        heads=heads,
        kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        ffn=int(config.intermediate_size),
        vocab=int(config.vocab_size),
    )


def _layer_token_flops(s: _Shape) -> int:
    """Forward matmul FLOPs of one layer for one token, excluding the attention over the context."""
    q_o = 2 * (2 * s.hidden * s.heads * s.head_dim)  # q_proj and o_proj
    k_v = 2 * (2 * s.hidden * s.kv_heads * s.head_dim)  # k_proj and v_proj (GQA: kv heads only)
    mlp = 3 * (2 * s.hidden * s.ffn)  # gate_proj, up_proj, down_proj
    return q_o + k_v + mlp


def _forward(s: _Shape, batch_size: int, new_tokens: int, context_len: int, logits_positions: int) -> float:
    """Forward FLOPs of ``new_tokens`` query positions per row attending to ``context_len`` key positions."""
    per_row = s.layers * (
        new_tokens * _layer_token_flops(s) + 4 * new_tokens * context_len * s.heads * s.head_dim
    )
    per_row += 2 * logits_positions * s.hidden * s.vocab
    return float(batch_size * per_row)


def forward_flops(config: Any, batch_size: int, seq_len: int, logits_positions: int | None = None) -> float:
    """FLOPs of one cache-less forward pass over ``batch_size`` rows of ``seq_len`` tokens.

    ``logits_positions``: positions per row whose LM-head logits are computed (None: all ``seq_len``).
    Padding counts: it is computed.
    """
    lp = seq_len if logits_positions is None else logits_positions
    return _forward(_shape(config), batch_size, seq_len, seq_len, lp)


def train_flops(config: Any, batch_size: int, seq_len: int, logits_positions: int | None = None) -> float:
    """FLOPs of a forward plus backward pass (backward = 2x forward, so 3x :func:`forward_flops`)."""
    return 3.0 * forward_flops(config, batch_size, seq_len, logits_positions)


def prefill_flops(config: Any, batch_size: int, prompt_len: int, logits_positions: int = 1) -> float:
    """FLOPs of the generation prefill: a forward over the (padded) prompts, logits for the last position only."""
    return forward_flops(config, batch_size, prompt_len, logits_positions)


def decode_step_flops(config: Any, batch_size: int, context_len: int) -> float:
    """FLOPs of one cached decode step: one new token per row attending to ``context_len`` positions
    (the cached ones plus itself), with its logits computed."""
    return _forward(_shape(config), batch_size, 1, context_len, 1)


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
    """Parameter count of a Qwen3/Llama-style model built from ``config`` (embedding counted once if tied).

    Includes RMSNorm weights (and Qwen3's per-head q/k norms when ``model_type == "qwen3"``) and attention
    biases when ``attention_bias`` is set; it is a size figure, not used for FLOPs.
    """
    s = _shape(config)
    q_out, kv_out = s.heads * s.head_dim, s.kv_heads * s.head_dim
    attn = s.hidden * q_out + 2 * s.hidden * kv_out + q_out * s.hidden
    if getattr(config, "attention_bias", False):
        attn += q_out + 2 * kv_out + s.hidden
    norms = 2 * s.hidden + (2 * s.head_dim if getattr(config, "model_type", "") == "qwen3" else 0)
    layer = attn + 3 * s.hidden * s.ffn + norms
    embed = s.vocab * s.hidden
    head = 0 if getattr(config, "tie_word_embeddings", False) else s.vocab * s.hidden
    return s.layers * layer + embed + head + s.hidden
