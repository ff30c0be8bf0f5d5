"""What this machine's arithmetic is, and whether our exact fast paths are exact on it.

Why this exists: the same code gives different last bits on different CPUs. oneDNN takes AMX tiles for bfloat16 on
one Intel Xeon, AVX512-BF16 on another, and blocks its loops by the caches it finds; MKL picks code paths by vendor.
``torch.backends.cpu.get_cpu_capability()`` says ``AVX512`` on all of them, so it cannot tell them apart.

* :func:`fingerprint` hashes the bits of a few canonical computations (the bfloat16 and float32 multiplies, the
  reductions, the transcendental functions and one training step of a smoke-sized Qwen3) at one thread, the thread
  count of the pinned runs. Two machines with the same fingerprint took the same kernel paths on all of it; bitwise
  test pins are keyed by it (``tests/pins.py``).
* :func:`folded_attention_exact` and :func:`lean_forward_exact` decide, once per process and shape family, whether
  :mod:`opdgrpo.inference`'s gradient-free fast paths reproduce the reference (``transformers``' eager forward) bit
  for bit *here*. Where they do not, the callers take the reference path, so a run's numbers never depend on whether
  a fast path was taken. The decisions are kept for ``done.json`` (:func:`report`).

``OPDGRPO_FAST_PATHS`` (environment) chooses: ``auto`` (the default: check, then use where exact) or ``off`` (never:
the reference path everywhere, e.g. to compare a run against the fast one). It is not a config key on purpose: it
may change speed, never results.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import random
import types
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

ENV = "OPDGRPO_FAST_PATHS"
MODES = ("auto", "off")

#: Every decision this process took: ``{"folded_attention": {key: {...}}, "lean_forward": {key: {...}}}``.
_decisions: dict[str, dict[str, dict[str, Any]]] = {"folded_attention": {}, "lean_forward": {}}


def mode() -> str:
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"environment variable {ENV} must be one of {list(MODES)}, got {value!r}")
    return value


@contextmanager
def _threads(n: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# --------------------------------------------------------------------------------------------------------------------
# The fingerprint


def _canonical_results() -> Iterator[torch.Tensor]:
    """Canonical computations at the smoke and tiny profiles' shapes; every tensor's bits go into the hash."""
    g = torch.Generator().manual_seed(20261201)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    # bfloat16 multiplies under autocast: projections (small and large row counts), weight gradients (long
    # reductions over batch x tokens, where kernels block by cache size), attention scores for decode and prefill.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for m, k, n in [(1, 64, 64), (7, 128, 384), (128, 128, 384), (1920, 128, 128), (3, 384, 128)]:
            yield torch.nn.functional.linear(randn(m, k), randn(n, k))
        yield randn(1920, 128).t() @ randn(1920, 384)
        yield torch.matmul(randn(8, 4, 1, 32), randn(8, 4, 32, 41))
        yield torch.matmul(randn(8, 2, 34, 32), randn(8, 2, 32, 34))
        yield torch.matmul(randn(8, 2, 34, 34).softmax(-1), randn(8, 2, 34, 32))
    # float32 multiplies: short and long reductions
    yield randn(3, 128) @ randn(128, 384)
    yield randn(64, 1024) @ randn(1024, 64)
    # reductions and vectorised transcendental functions (odd sizes reach the remainder loops)
    x = randn(37, 4099)
    yield x.softmax(-1)
    yield x.logsumexp(-1)
    yield x.sum(-1)
    yield torch.exp(x), torch.log(x.abs() + 1e-3), torch.rsqrt(x.abs() + 1e-3), torch.nn.functional.silu(x)
    yield from _one_training_step()


def _one_training_step() -> Iterator[torch.Tensor]:
    """Initialisation, a bfloat16-autocast forward and backward and an AdamW step of a smoke-sized Qwen3."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(7)
    config = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=32, vocab_size=256, pad_token_id=0, eos_token_id=1)
    config._attn_implementation = "eager"
    model = Qwen3ForCausalLM(config)
    ids = torch.randint(2, 256, (16, 24), generator=torch.Generator().manual_seed(3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, 256), ids[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    yield logits.detach()
    yield from (p.detach() for p in model.parameters())


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """A short hash of this machine's kernel paths (and the torch version), computed at one thread; ~0.3 s once."""
    digest = hashlib.sha256(torch.__version__.encode())
    with _threads(1), torch.random.fork_rng(devices=[]):
        for result in _canonical_results():
            for t in result if isinstance(result, tuple) else (result,):
                digest.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def machine() -> dict[str, str]:
    """What a person needs to recognise the machine a fingerprint came from."""
    import transformers

    cpu, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
        cpu = info.get("model name\t", cpu).strip()
        flags = info.get("flags\t\t", "").split()
    except (OSError, ValueError):
        pass
    vector = [f for f in flags if f.startswith("amx") or f in ("avx512_bf16", "avx512f", "avx2")]
    return {"fingerprint": fingerprint(), "cpu": cpu, "cpu_flags": " ".join(vector) or "unknown",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "capability": torch.backends.cpu.get_cpu_capability()}


# --------------------------------------------------------------------------------------------------------------------
# Fast-path gates


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def _attention_shapes() -> Iterator[tuple[int, int, int]]:
    """(rows, query length, key length): decode steps and prefills, short and long contexts, masked prefixes."""
    for rows in (1, 3, 8, 64):
        for q_len in (1, 2, 7, 33):
            for extra in (0, 5, 31, 96):
                yield rows, q_len, q_len + extra


def folded_attention_exact(heads: int, kv_heads: int, head_dim: int, device: str, fold: Callable,
                           reference: Callable) -> bool:
    """Whether ``fold`` (the folded-GQA attention) equals ``reference`` (eager attention) bit for bit on this machine,
    at this head layout, over the shapes of :func:`_attention_shapes`, under bfloat16 autocast and no gradients.

    Checked once per process, head layout, device type and thread count; off in ``OPDGRPO_FAST_PATHS=off``.
    """
    return _fold_decision(heads, kv_heads, head_dim, device, torch.get_num_threads(), mode(), fold, reference)


@functools.lru_cache(maxsize=None)
def _fold_decision(heads: int, kv_heads: int, head_dim: int, device: str, threads: int, how: str, fold,
                   reference) -> bool:
    key = f"heads={heads} kv_heads={kv_heads} head_dim={head_dim} device={device} threads={threads}"
    if how == "off":
        _decisions["folded_attention"][key] = {"used": False, "reason": f"{ENV}=off"}
        return False
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, training=False)
    rng = random.Random(heads * 1000 + head_dim)
    g = torch.Generator().manual_seed(heads * 7 + kv_heads)
    checked, first_difference = 0, None
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
        for rows, q_len, length in _attention_shapes():
            q = torch.randn(rows, heads, q_len, head_dim, generator=g).to(device)
            k = torch.randn(rows, kv_heads, length, head_dim, generator=g).to(device)
            v = torch.randn(rows, kv_heads, length, head_dim, generator=g).to(device, torch.bfloat16)
            mask = torch.zeros(rows, 1, q_len, length, device=device)
            mask[..., : rng.randint(0, length - 1)] = torch.finfo(torch.float32).min
            a, _ = reference(module, q, k, v, mask, head_dim ** -0.5)
            b, _ = fold(module, q, k, v, mask, head_dim ** -0.5)
            checked += 1
            if not _equal(a, b):
                first_difference = {"rows": rows, "q_len": q_len, "kv_len": length}
                break
    exact = first_difference is None
    _decisions["folded_attention"][key] = {"used": exact, "shapes_checked": checked,
                                           **({"first_difference": first_difference} if not exact else {})}
    return exact


def lean_forward_exact(model: torch.nn.Module, lean_logits: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, int],
                                                                      list[torch.Tensor]],
                       reference_logits: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, int], list[torch.Tensor]]) -> bool:
    """Whether the lean forward's prefill and cached decode logits equal the model's own eager forward bit for bit,
    on this model (left-padded rows, rows dropping out of the cache), once per process, architecture and thread
    count. The callables return the logits of a prefill followed by ``steps`` greedy decode steps."""
    cfg = model.config
    signature = (type(model).__name__, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers,
                 cfg.num_attention_heads, cfg.num_key_value_heads, getattr(cfg, "head_dim", None), cfg.vocab_size,
                 bool(getattr(cfg, "tie_word_embeddings", False)), torch.get_num_threads(), mode())
    cached = _lean_cache.get(signature)
    if cached is None:
        cached = _lean_cache[signature] = _lean_decision(model, signature, lean_logits, reference_logits)
    return cached


_lean_cache: dict[tuple, bool] = {}


def _lean_decision(model, signature: tuple, lean_logits, reference_logits) -> bool:
    key = " ".join(f"{n}={v}" for n, v in zip(("model", "hidden", "ffn", "layers", "heads", "kv_heads", "head_dim",
                                                  "vocab", "tied", "threads"), signature))
    if signature[-1] == "off":
        _decisions["lean_forward"][key] = {"used": False, "reason": f"{ENV}=off"}
        return False
    vocab, device = model.config.vocab_size, next(model.parameters()).device
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(3, vocab, (6, 13), generator=g).to(device)
    mask = torch.ones_like(ids)
    for row, pad in enumerate((0, 4, 1, 9, 0, 2)):   # left padding of different lengths
        mask[row, :pad] = 0
    steps = 6
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
        want = reference_logits(model, ids, mask, steps)
        got = lean_logits(model, ids, mask, steps)
    exact = len(want) == len(got) and all(_equal(a, b) for a, b in zip(want, got))
    _decisions["lean_forward"][key] = {"used": exact, "checked": f"prefill of 6 left-padded rows x 13 tokens + {steps} decode steps"}
    return exact


def report() -> dict[str, Any]:
    """For ``done.json``: the fingerprint and the fast-path decisions this process took."""
    return {"fingerprint": fingerprint(), "fast_paths": {"mode": mode(), **{k: dict(v) for k, v in _decisions.items()}}}


def reset() -> None:
    """Forget every decision (tests that change the environment variable or patch a fast path)."""
    _fold_decision.cache_clear()
    _lean_cache.clear()
    for decisions in _decisions.values():
        decisions.clear()
