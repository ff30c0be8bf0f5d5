"""Model construction and loading.

Tiny models are ``transformers.Qwen3ForCausalLM`` built from an architecture block in conf
(``conf/model/*.yaml``); paper-scale models load with ``from_pretrained``. Either way a checkpoint on
disk is a Hugging Face directory, so every stage loads its upstream with the same call. A ``source: random`` model's
directory holds no weights, only its config, tokenizer and seed (:data:`RANDOM_INIT`): whoever loads it draws the
weights where it runs, so a rehearsal or a pilot at Qwen3-32B's shape writes nothing to disk.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any, Mapping

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, Qwen3Config, Qwen3ForCausalLM
from transformers.initialization import no_init_weights

from opdgrpo import schema

#: Keys of a model block that are not Qwen3Config's (conf/model/*.yaml; the schema lists them all).
_OWN_KEYS = {"name", "source", "pretrain", "dtype", "seed", "path", "revision", "attn_implementation", "sampling",
             "tokenizer", "prompt_format", "vocab_size"}
#: The file that marks a weightless ``source: random`` checkpoint directory, and holds its seed.
RANDOM_INIT = "random_init.json"


def qwen3_config(arch: Mapping[str, Any], vocab_size: int, pad_token_id: int, eos_token_id: int) -> Qwen3Config:
    """The Qwen3 config of an architecture block (``conf/model/*.yaml``; its own keys left out)."""
    kwargs = {k: v for k, v in arch.items() if k not in _OWN_KEYS}
    return Qwen3Config(vocab_size=vocab_size, pad_token_id=pad_token_id, eos_token_id=eos_token_id,
                       bos_token_id=eos_token_id, **kwargs)


def build_model(arch: Mapping[str, Any], vocab_size: int, pad_token_id: int, eos_token_id: int, seed: int) -> PreTrainedModel:
    """A freshly initialised Qwen3-architecture model; eager attention so FLOP counts are checkable."""
    config = qwen3_config(arch, vocab_size, pad_token_id, eos_token_id)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.pad_token_id = pad_token_id
    model.generation_config.eos_token_id = eos_token_id
    return model


def is_random(path: str | Path) -> bool:
    """Whether ``path`` is a weightless ``source: random`` checkpoint (:data:`RANDOM_INIT`)."""
    return (Path(path) / RANDOM_INIT).is_file()


def draw_weights(model: torch.nn.Module, seed: int, std: float) -> None:
    """A random model's weights, drawn in place where they live: every matrix from N(0, ``std``) in float32 (then
    rounded to the parameter's dtype, so a model loaded in bfloat16 is the float32 one rounded), each from its own
    generator seeded by a 32-bit hash of ``seed`` and the parameter's name (the CPU generator keeps 32 bits);
    RMSNorm gains 1 (Qwen3 has no biases). Drawn on the GPU where there is one, whatever device the parameter lives
    on: a trainer that shards from host memory then holds the same model as the base job that evaluated it on the
    GPU, and 12 billion draws take seconds, not the minutes the CPU generator takes (the GPU pilot). The draw is a
    function of the seed and of whether a GPU is present (CPU and CUDA generators differ)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.fill_(1.0)
                continue
            where = _draw_device(param.device)
            generator = torch.Generator(where).manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
            draw = torch.empty(param.shape, dtype=torch.float32, device=where)
            param.copy_(draw.normal_(0.0, std, generator=generator))


def _draw_device(home: torch.device) -> torch.device:
    """Where a random weight is drawn: the current GPU when there is one, else where it lives."""
    if home.type == "cuda" or not torch.cuda.is_available():
        return home
    return torch.device("cuda", torch.cuda.current_device())


def _load_random(path: Path, dtype: torch.dtype, attn_implementation: str, device: torch.device | str | None) -> PreTrainedModel:
    """A ``source: random`` checkpoint built on ``device`` (default the CPU) from its config and seed. On ``meta``
    nothing is drawn: a model that only gives its config and size (an engine samples in its place)."""
    seed = int(json.loads((path / RANDOM_INIT).read_text())["seed"])
    config = AutoConfig.from_pretrained(str(path))
    target = torch.device(device or "cpu")
    with target, no_init_weights():   # draw_weights sets every parameter; transformers' own draw would be wasted
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    if target.type != "meta":
        draw_weights(model, seed, float(config.initializer_range))
    return model


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, trainable: bool = True,
               attn_implementation: str = "eager", device: torch.device | str | None = None) -> PreTrainedModel:
    """Load a checkpoint directory (ours, or a linked hub snapshot at paper scale), on the CPU unless ``device``
    names another (a ``source: random`` model is then drawn there, not copied there). On ``meta`` no weight is read
    or drawn: the model gives its config and size to a job whose engine samples in its place.

    Eager attention by default: ``FlopCounterMode`` checks the ledger against it exactly. The ledger's FLOPs are
    analytic, so another kernel changes no count; at paper scale ``sdpa`` (or ``flash_attention_2``) is needed
    because eager attention materialises every (query, key) score: 8k-token sequences would need tens of GB each.
    """
    kernels = schema.allowed("train", "attn_implementation")
    if attn_implementation not in kernels:
        raise ValueError(f"attention implementation must be one of {list(kernels)}, got {attn_implementation!r} "
                         f"(config key `train.attn_implementation` or `models.<name>.attn_implementation`)")
    if is_random(path):
        model = _load_random(Path(path), dtype, attn_implementation, device)
    elif device is not None and torch.device(device).type == "meta":   # its config and size only: no weight is read
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(path)), dtype=dtype,
                                                     attn_implementation=attn_implementation)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation=attn_implementation)
        if device is not None:
            model = model.to(device)
    model.train(trainable)
    if not trainable:
        model.requires_grad_(False)
    return model


def autocast(precision: str, device_type: str = "cpu"):
    """Mixed precision for forwards: ``bf16`` runs matmuls in bfloat16 (2-3x faster for the tiny models on a CPU
    with bfloat16 instructions, 7-8x slower on one without: docs/speed.md), ``fp32`` runs everything in float32.
    Losses are computed in float32 either way. ``auto`` is refused: a job resolves it once, at its start
    (:func:`opdgrpo.train.precision.resolve`), and passes the result, so no forward can decide again on its own."""
    if precision not in ("bf16", "fp32"):
        raise ValueError(f"autocast needs a resolved precision (bf16 or fp32), got {precision!r}: resolve "
                         "`precision: auto` once at the job's start (opdgrpo.train.precision.resolve)")
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
