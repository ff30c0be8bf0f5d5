"""Bytes a Qwen3-style model holds on a device: weights, gradients, optimizer state, activations, KV cache, logits.

Our own model (no library predicts the memory of this trainer's phases): what :mod:`opdgrpo.cost.resources` adds up per
job. Each figure counts the tensors the code keeps, not a rule of thumb, and ``tests/unit/test_memory_model.py``
holds the activation and KV figures against peaks measured on CPU (:func:`opdgrpo.cost.memprobe.peak_bytes`).

Activations: what one decoder layer saves for its backward, per token, counted from Hugging Face's Qwen3 layer under
autocast. ``residual`` is the bytes of the residual stream (4 with float32 weights under autocast, 2 with bfloat16
weights, as FSDP2's ``param_dtype`` gives), ``compute`` the bytes of the matmuls' inputs (2 under bf16 autocast):
- each RMSNorm keeps a float32 copy of its input, its output in the residual dtype and a copy in the compute dtype
  (the autocast cast the q/k/v and gate/up projections read, or the norm's own cast back from float32):
  2 norms x (4 + r + c) x hidden;
- q and k: the projection's output, the q/k-norm's float32 copy, output and cast, attention's output (q only, kept
  by ``o_proj``); v: the projection's output;
- the MLP: gate, SiLU(gate), up and their product (kept by ``down_proj``), in the compute dtype;
- eager attention also keeps its float32 probabilities and their cast (6 bytes per head per key); SDPA's fused kernels
  keep only a log-sum-exp per head; during one layer's backward eager attention also holds the probabilities'
  float32 gradient (4 bytes per head per key).
With activation checkpointing each layer keeps only its input, and one layer's activations exist again during its
recomputation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 2**30

#: Adam's two moments in float32.
ADAM_STATE_BYTES = 8


@dataclass(frozen=True)
class Shape:
    """The sizes the memory model reads from a model block (:func:`opdgrpo.cost.model.architecture`)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    window: int | None = None          # sliding-window layers keep at most this many keys in the KV cache
    sliding_layers: int = 0

    @classmethod
    def of(cls, arch: Any) -> Shape:
        types = list(getattr(arch, "layer_types", None) or [])
        heads = int(arch.num_attention_heads)
        head_dim = int(getattr(arch, "head_dim", None) or int(arch.hidden_size) // heads)
        return cls(int(arch.hidden_size), int(arch.intermediate_size), int(arch.num_hidden_layers), heads,
                   int(getattr(arch, "num_key_value_heads", None) or heads), head_dim, int(arch.vocab_size),
                   bool(getattr(arch, "tie_word_embeddings", False)), getattr(arch, "sliding_window", None),
                   sum(t == "sliding_attention" for t in types))

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim


def layer_params(s: Shape) -> int:
    """One decoder layer: attention projections, MLP, its two norms and the q/k norms."""
    return s.hidden * s.q * 2 + s.hidden * s.kv * 2 + 3 * s.hidden * s.intermediate + 2 * s.hidden + 2 * s.head_dim


def root_params(s: Shape) -> int:
    """What FSDP2's root unit holds: the embedding, the LM head unless tied, the final norm."""
    return s.vocab * s.hidden * (1 if s.tied else 2) + s.hidden


def params(s: Shape) -> int:
    return s.layers * layer_params(s) + root_params(s)


def layer_activation_bytes_per_token(s: Shape, residual: int, compute: int, attention: str = "sdpa",
                                     keys: int = 0) -> float:
    """Bytes one decoder layer saves for the backward per token (module docstring); ``keys``: the row's length,
    which eager attention's probabilities grow with."""
    hidden = 2 * (4 + residual + compute) * s.hidden
    q = (compute + 4 + residual + compute + compute) * s.q
    kv = (compute + 4 + residual + compute) * s.kv + compute * s.kv
    mlp = 4 * compute * s.intermediate
    scores = 6 * s.heads * keys if attention == "eager" else 0
    return hidden + q + kv + mlp + scores


def activation_bytes(s: Shape, tokens: int, longest_row: int, residual: int, compute: int, checkpointing: bool,
                     attention: str = "sdpa") -> float:
    """The decoder's saved activations for ``tokens`` tokens (rows of at most ``longest_row``) during a backward."""
    per_layer = tokens * layer_activation_bytes_per_token(s, residual, compute, attention, longest_row)
    backward = tokens * 4 * s.heads * longest_row if attention == "eager" else 0   # one layer's score gradients
    if not checkpointing:
        return s.layers * per_layer + backward
    return s.layers * tokens * residual * s.hidden + per_layer + backward


def kv_cache_bytes(s: Shape, rows: int, tokens: int, dtype_bytes: int = 2) -> float:
    """Keys and values of ``rows`` rows of ``tokens`` positions; sliding-window layers keep at most the window."""
    full = s.layers - s.sliding_layers
    windowed = min(tokens, s.window) if s.window else tokens
    return 2 * rows * s.kv * dtype_bytes * (full * tokens + s.sliding_layers * windowed)


def logit_chunk_bytes(s: Shape, chunk_tokens: int, copies: int = 3) -> float:
    """Full-vocabulary float32 logits of ``copies`` chunks of positions at once (:mod:`opdgrpo.train.logit_chunks`: a
    chunk's logits, its log-softmax, and the gradient of one in the recomputing backward)."""
    return copies * chunk_tokens * s.vocab * 4
