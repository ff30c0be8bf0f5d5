"""Model construction and loading.

Tiny models are ``transformers.Qwen3ForCausalLM`` built from an architecture block in conf
(``conf/model/*.yaml``); paper-scale models load with ``from_pretrained``. Either way a checkpoint on
disk is a Hugging Face directory, so every stage loads its upstream with the same call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen3Config, Qwen3ForCausalLM

from . import schema
from .precision import check as check_precision
from .precision import resolve as resolve_precision

#: Keys of a model block that are not Qwen3Config's (conf/model/*.yaml; the schema lists them all).
_OWN_KEYS = {"name", "source", "pretrain", "dtype", "seed", "path", "revision", "attn_implementation", "sampling",
             "tokenizer", "prompt_format", "vocab_size"}


def build_model(arch: Mapping[str, Any], vocab_size: int, pad_token_id: int, eos_token_id: int, seed: int) -> PreTrainedModel:
    """A freshly initialised Qwen3-architecture model; eager attention so FLOP counts are checkable."""
    kwargs = {k: v for k, v in arch.items() if k not in _OWN_KEYS}
    config = Qwen3Config(
        vocab_size=vocab_size, pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=eos_token_id, **kwargs
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.pad_token_id = pad_token_id
    model.generation_config.eos_token_id = eos_token_id
    return model


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, trainable: bool = True,
               attn_implementation: str = "eager") -> PreTrainedModel:
    """Load a checkpoint directory (ours, or a linked hub snapshot at paper scale).

    Eager attention by default: ``FlopCounterMode`` checks the ledger against it exactly. The ledger's FLOPs are
    analytic, so another kernel changes no count; at paper scale ``sdpa`` (or ``flash_attention_2``) is needed
    because eager attention materialises every (query, key) score: 8k-token sequences would need tens of GB each.
    """
    kernels = schema.allowed("train", "attn_implementation")
    if attn_implementation not in kernels:
        raise ValueError(f"attention implementation must be one of {list(kernels)}, got {attn_implementation!r} "
                         f"(config key `train.attn_implementation` or `models.<name>.attn_implementation`)")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation=attn_implementation)
    model.train(trainable)
    if not trainable:
        model.requires_grad_(False)
    return model


def autocast(precision: str, device_type: str = "cpu"):
    """Mixed precision for forwards: ``bf16`` runs matmuls in bfloat16 (2-3x faster for the tiny models on a CPU
    with bfloat16 instructions, 7-8x slower on one without: docs/speed.md), ``fp32`` runs everything in float32,
    ``auto`` whichever :func:`opdgrpo.precision.resolve` chooses here. Losses are computed in float32 either way."""
    if precision == "auto":
        precision = resolve_precision(precision, device_type)
    check_precision(precision)
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bf16")


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """``train.activation_checkpointing``: keep only each decoder layer's input in the training forward and recompute
    the layer in the backward (non-reentrant ``torch.utils.checkpoint``, through transformers' switch; training mode
    only, so sampling in eval mode is unchanged). The recompute repeats the forward's arithmetic, so results do not
    change; it costs one more forward per training step, which the FLOP ledger does not count (it counts the method's
    FLOPs, and MFU excludes recomputation by definition)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):   # transformers >= 5.2x; the older name is deprecated
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
