"""What this machine's arithmetic is, and whether our exact fast paths are exact on it.

Why this exists: the same code gives different last bits on different CPUs. oneDNN takes AMX tiles for bfloat16 on
one Intel Xeon, AVX512-BF16 on another, and blocks its loops by the caches it finds; MKL picks code paths by vendor.
``torch.backends.cpu.get_cpu_capability()`` says ``AVX512`` on all of them, so it cannot tell them apart.

* :func:`fingerprint` hashes the bits of a few canonical computations (the bfloat16 and float32 multiplies, the
  reductions, the transcendental functions and one training step of a smoke-sized Qwen3) at one thread, the thread
  count of the pinned runs. Two machines with the same fingerprint took the same kernel paths on all of it; bitwise
  test pins are keyed by it (``tests/pins.py``).
* :mod:`opdgrpo.train.inference` checks, once per process and model, whether its gradient-free fast paths reproduce the
  reference (``transformers``' eager forward) bit for bit *here*, and takes the reference path where they do not, so
  a run's numbers never depend on whether a fast path was taken. The decisions are recorded here for ``done.json``
  (:func:`report`).

``OPDGRPO_FAST_PATHS`` (environment) chooses: ``auto`` (the default: check, then use where exact) or ``off`` (never:
the reference path everywhere, e.g. to compare a run against the fast one). It is not a config key on purpose: it
may change speed, never results.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from opdgrpo.train import precision

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
    g = torch.Generator(device="cpu").manual_seed(20261201)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device="cpu")

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
    ids = torch.randint(2, 256, (16, 24), generator=torch.Generator(device="cpu").manual_seed(3), device="cpu")
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
# The fast-path decisions a process took (made in :mod:`opdgrpo.train.inference`, which owns the paths and their checks)

#: ``{kind: {key: decision}}``, e.g. ``{"folded_attention": {"heads=4 kv_heads=2 ...": {"used": True, ...}}}``.
_decisions: dict[str, dict[str, dict[str, Any]]] = {}
_reset_hooks: list[Callable[[], None]] = []


def record(kind: str, key: str, decision: dict[str, Any]) -> None:
    _decisions.setdefault(kind, {})[key] = decision


def on_reset(hook: Callable[[], None]) -> None:
    """Register a cache of decisions that :func:`reset` clears."""
    _reset_hooks.append(hook)


def report() -> dict[str, Any]:
    """For ``done.json``: the fingerprint, the fast-path decisions this process took and the precision it chose
    (``train.precision: auto`` resolved here: :mod:`opdgrpo.train.precision`)."""
    return {"fingerprint": fingerprint(),
            "fast_paths": {"mode": mode(), **{kind: dict(d) for kind, d in sorted(_decisions.items())}},
            "precision": precision.report()}


def reset() -> None:
    """Forget every decision (tests that change ``OPDGRPO_FAST_PATHS`` or make a fast path inexact on purpose)."""
    for hook in _reset_hooks:
        hook()
    _decisions.clear()
