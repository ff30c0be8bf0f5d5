"""The machine's matrix-multiply peak, the denominator of a run's MFU (model FLOP utilisation).

Measured, not looked up, in the arithmetic the run's matmuls use: float32, plain bfloat16 (bfloat16 weights), or
bfloat16 autocast over float32 weights (``train.precision: bf16``), on the run's device, with the thread count the
run set. A square multiply in both layouts a training step uses (``x @ W`` and ``F.linear``'s ``x @ W.T``: without
bfloat16 instructions their speeds differ 2-3x, and a peak from the slower one put MFU above 1 on an AVX2 CPU), timed
several times after a warm-up; the best repetition of either layout is the peak (the machine is shared and noisy:
the best is what it can do), the median is kept beside it. Measured once per process and remembered (a few tenths
of a second on a CPU).
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any

import torch

from opdgrpo.train.precision import check as check_precision

#: Matrix size per device type: large enough for the library's best kernel, small enough to stay cheap.
SIZES = {"cpu": 512, "cuda": 8192}
#: At least MIN_REPEATS and MIN_SECONDS of repeats per layout, at most REPEATS or MAX_SECONDS (an emulated bfloat16
#: multiply takes 0.3 s at 512 on an AVX2 CPU).
REPEATS, MIN_REPEATS, WARMUP, MIN_SECONDS, MAX_SECONDS = 10, 3, 1, 0.05, 1.0


def matmul_dtype(precision: str, param_dtype: torch.dtype = torch.float32) -> torch.dtype:
    """The dtype a run's matrix multiplies run in: bfloat16 under bf16 autocast or with bfloat16 weights
    (``precision`` resolved: ``bf16`` or ``fp32``)."""
    if check_precision(precision) == "auto":
        raise ValueError("resolve `train.precision: auto` first (opdgrpo.train.precision.resolve)")
    return torch.bfloat16 if precision == "bf16" or param_dtype == torch.bfloat16 else torch.float32


def run_peak(precision: str, param_dtype: torch.dtype = torch.float32,
             device: torch.device | str = "cpu") -> dict[str, Any]:
    """The peak in a run's own arithmetic: bf16 autocast over float32 weights is measured under autocast."""
    dtype = matmul_dtype(precision, param_dtype)
    return matmul_peak(dtype, device, autocast=precision == "bf16" and param_dtype != torch.bfloat16)


def matmul_peak(dtype: torch.dtype, device: torch.device | str = "cpu", autocast: bool = False) -> dict[str, Any]:
    """``{"flops_per_s", "median_flops_per_s", "dtype", "autocast", "device", "threads", "shape", "layouts",
    "repeats", "statistic", "seconds"}``; ``autocast``: float32 operands multiplied under ``dtype`` autocast."""
    device = torch.device(device)
    return dict(_measure(str(dtype).removeprefix("torch."), device.type, device.index, torch.get_num_threads(),
                         bool(autocast) and dtype != torch.float32))


def _more(times: list[float]) -> bool:
    spent = sum(times)
    if len(times) < MIN_REPEATS or (spent < MIN_SECONDS and len(times) < 10 * REPEATS):
        return True
    return len(times) < REPEATS and spent < MAX_SECONDS


#: The layouts a training step multiplies in: forward ``x @ W.T`` (``F.linear``), backward ``g @ W`` and ``g.T @ x``.
LAYOUTS = {"linear": torch.nn.functional.linear, "mm": torch.mm}


@functools.lru_cache(maxsize=None)
def _measure(dtype_name: str, device_type: str, device_index: int | None, threads: int,
             autocast: bool) -> dict[str, Any]:
    started = time.perf_counter()
    device = torch.device(device_type, device_index) if device_index is not None else torch.device(device_type)
    dtype = getattr(torch, dtype_name)
    n = SIZES.get(device_type, 4096)
    generator = torch.Generator(device="cpu").manual_seed(0)   # the run's own RNG streams stay untouched
    operand = torch.float32 if autocast else dtype
    a = torch.randn(n, n, generator=generator, device="cpu").to(device=device, dtype=operand)
    b = torch.randn(n, n, generator=generator, device="cpu").to(device=device, dtype=operand)
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {}
    with torch.autocast(device_type, dtype=dtype, enabled=autocast):
        for layout, multiply in LAYOUTS.items():
            for _ in range(WARMUP):
                multiply(a, b)
            sync()
            times[layout] = []
            while _more(times[layout]):
                t0 = time.perf_counter()
                multiply(a, b)
                sync()
                times[layout].append(time.perf_counter() - t0)
    flops = 2.0 * n ** 3
    best = min(times, key=lambda layout: min(times[layout]))
    return {"flops_per_s": flops / min(times[best]), "median_flops_per_s": flops / statistics.median(times[best]),
            "dtype": dtype_name, "autocast": autocast, "device": str(device), "threads": threads, "shape": [n, n, n],
            "layouts": {layout: flops / min(t) for layout, t in times.items()}, "best_layout": best,
            "repeats": sum(len(t) for t in times.values()), "statistic": "best of repeats and layouts (median also kept)",
            "seconds": round(time.perf_counter() - started, 3)}


def mfu_summary(ledger: list[dict[str, Any]], peak: dict[str, Any], processes: int = 1) -> dict[str, Any]:
    """A run's mean achieved training FLOP/s (all its steps' FLOPs over their summed wall time, evaluation excluded)
    and its MFU against ``peak`` times the number of processes that shared the steps."""
    flops = sum(float(r.get("step_flops", 0.0)) for r in ledger)
    wall = sum(float(r.get("wall_s", 0.0)) for r in ledger)
    achieved = flops / wall if wall > 0 else None
    return {"train_wall_s": round(wall, 3), "achieved_flops_per_s": achieved,
            "mfu": None if achieved is None else achieved / (peak["flops_per_s"] * processes),
            "peak": {**peak, "processes": processes}}
