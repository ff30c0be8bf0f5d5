"""The machine's matrix-multiply peak, the denominator of a run's MFU (model FLOP utilisation).

Measured, not looked up: a square matrix multiply in the dtype the run's matmuls use (``train.precision``: bf16 under
autocast, else fp32), on the run's device, with the thread count the run set, timed several times after a warm-up;
the best repetition is the peak (the machine is shared and noisy: the best is what it can do), the median is kept
beside it. Measured once per process and remembered (a few tenths of a second on a CPU).
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any

import torch

from . import schema

#: Matrix size per device type: large enough for the library's best kernel, small enough to stay cheap.
SIZES = {"cpu": 1024, "cuda": 8192}
REPEATS, WARMUP, MIN_SECONDS = 10, 2, 0.05


def matmul_dtype(precision: str, param_dtype: torch.dtype = torch.float32) -> torch.dtype:
    """The dtype a run's matrix multiplies run in: bfloat16 under bf16 autocast or with bfloat16 weights."""
    if precision not in schema.allowed("train", "precision"):
        raise ValueError(f"config key `train.precision` must be one of {list(schema.allowed('train', 'precision'))}, "
                         f"got {precision!r}")
    return torch.bfloat16 if precision == "bf16" or param_dtype == torch.bfloat16 else torch.float32


def matmul_peak(dtype: torch.dtype, device: torch.device | str = "cpu") -> dict[str, Any]:
    """``{"flops_per_s", "median_flops_per_s", "dtype", "device", "threads", "shape", "repeats", "statistic", "seconds"}``."""
    device = torch.device(device)
    return dict(_measure(str(dtype).removeprefix("torch."), device.type, device.index, torch.get_num_threads()))


@functools.lru_cache(maxsize=None)
def _measure(dtype_name: str, device_type: str, device_index: int | None, threads: int) -> dict[str, Any]:
    started = time.perf_counter()
    device = torch.device(device_type, device_index) if device_index is not None else torch.device(device_type)
    dtype = getattr(torch, dtype_name)
    n = SIZES.get(device_type, 4096)
    generator = torch.Generator(device="cpu").manual_seed(0)   # the run's own RNG streams stay untouched
    a = torch.randn(n, n, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=generator).to(device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
    for _ in range(WARMUP):
        torch.mm(a, b)
    sync()
    times: list[float] = []
    while len(times) < REPEATS or (sum(times) < MIN_SECONDS and len(times) < 10 * REPEATS):
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        times.append(time.perf_counter() - t0)
    flops = 2.0 * n ** 3
    return {"flops_per_s": flops / min(times), "median_flops_per_s": flops / statistics.median(times),
            "dtype": dtype_name, "device": str(device), "threads": threads, "shape": [n, n, n],
            "repeats": len(times), "statistic": "best of repeats (median also kept)",
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
