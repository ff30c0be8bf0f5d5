"""Which arithmetic a job runs its forwards and backwards in: ``train.precision`` / ``pretrain.precision``.

``bf16`` (bfloat16 autocast, losses in float32) and ``fp32`` are explicit choices. ``auto``, the CPU profiles'
default, is resolved once per process, at job start, by :func:`resolve`:

* on a GPU: ``bf16`` where the device supports bfloat16 (every GPU the paper profile targets), else ``fp32``;
* on a CPU without bfloat16 instructions (no ``avx512_bf16`` / ``amx_bf16`` on x86, no ``bf16`` on Arm): ``fp32``,
  without measuring. There autocast is emulated: 7-8x slower than float32 for the tiny models' training steps
  (measured on AMD EPYC Zen 1 and Zen 2, docs/speed.md), so the flags alone decide and the choice is the same in
  every job on such a machine;
* on a CPU with them: a forward and backward of one linear layer at the tiny models' widths, timed in both
  arithmetics (interleaved, best of several); ``bf16`` only where it is at least :data:`MARGIN` times faster. The
  measurement is what catches kernels capped below the hardware (``ONEDNN_MAX_CPU_ISA=AVX2``), and the margin keeps
  a machine where both are close from flipping between jobs on timing noise. On such a machine, set ``bf16`` or
  ``fp32`` explicitly to pin it.

**One decision per DAG.** A measured decision can differ between two jobs on a loaded machine (speed-ups of
1.4x-2.9x were seen against the 1.25x margin), and two jobs of one seed would then compute in different arithmetics.
So under the workflow every job reads one record: the rules export :data:`RECORD_ENV` (``<results>/<profile>/
precision.json``); the first job that resolves ``auto`` on a CPU measures and creates the record (exclusively: of two
jobs starting at once, one writes and the other adopts its decision), and every later job, every resume included,
adopts it without measuring. Deleting the file lets the next job decide again; a checkpoint keeps the arithmetic it
was trained in (a resume in another one refuses, :func:`opdgrpo.train.checkpoint.check_precision`). On a GPU the
decision is the device's bfloat16 support, the same in every job, so no record is read. Outside the workflow
(``opdgrpo train`` by hand, tests) each process decides for itself.

The decision (and its measurement, or the record it came from) goes into ``done.json`` beside the numerics
fingerprint (:func:`opdgrpo.train.numerics.report`). A run's config keeps ``auto``, so moving a results folder between
machines reruns nothing; the verdicts are what should travel (docs/speed.md, "Precision per machine").
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any, Mapping

import torch

from opdgrpo import schema
from opdgrpo.job_identity import PRECISION_RECORD_ENV

#: bf16 must beat float32 by this factor to be chosen (a speed-up smaller than this is within job-to-job noise).
MARGIN = 1.25
#: The probe's linear layer: rows x in -> out, the tiny models' MLP shape at a step's row count.
PROBE_SHAPE = (1024, 256, 768)
REPEATS = 5

#: The environment variable naming the DAG's precision record (exported by the workflow's rules).
RECORD_ENV = PRECISION_RECORD_ENV

_decision: dict[str, Any] = {}
_adopted: dict[str, tuple[str, dict[str, Any]]] = {}   # record path -> this process's decision from it
log = logging.getLogger("opdgrpo.train.precision")


def choices() -> list[str]:
    return list(schema.allowed("train", "precision"))


#: The one default of ``train.precision`` and ``pretrain.precision`` (``$defs/precision`` in train.schema.yaml).
DEFAULT = schema.default("train", "precision")


def configured(block: Mapping[str, Any], key: str) -> str:
    """The precision a config block asks for (``pretrain``, a difficulty job's ``rule``), the schema's default where
    it names none; :func:`resolve` turns it into an arithmetic, once per job."""
    return check(str(block.get("precision", DEFAULT)), key)


def check(precision: str, key: str = "train.precision") -> str:
    if precision not in choices():
        raise ValueError(f"config key `{key}` must be one of {choices()}, got {precision!r}")
    return precision


def resolve(precision: str, device: torch.device | str = "cpu", key: str = "train.precision") -> str:
    """``bf16`` or ``fp32``: ``precision`` itself unless it is ``auto``; the decision is recorded for ``done.json``."""
    check(precision, key)
    device_type = torch.device(device).type
    record = os.environ.get(RECORD_ENV)
    if precision == "auto" and device_type == "cpu" and record:
        chosen, why = _dag_decision(Path(record), torch.get_num_threads())
    elif precision == "auto":
        chosen, why = _auto(device_type, torch.get_num_threads())
    else:
        chosen, why = precision, {"reason": "set explicitly"}
    _decision.clear()
    _decision.update({"requested": precision, "resolved": chosen, "key": key, **why})
    return chosen


def _dag_decision(record: Path, threads: int) -> tuple[str, dict[str, Any]]:
    """The DAG's decision from ``record``, made (measured and written exclusively) by the first job to need it; read
    once per process, so a record deleted while a job runs changes nothing in that job."""
    if str(record) not in _adopted:
        _adopted[str(record)] = _read_or_make(record, threads)
    return _adopted[str(record)]


def _read_or_make(record: Path, threads: int) -> tuple[str, dict[str, Any]]:
    if not record.is_file():
        chosen, why = _auto("cpu", threads)
        entry = {"resolved": chosen, **why, "decided_by": {"pid": os.getpid(), "host": platform.node(),
                                                          "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}}
        record.parent.mkdir(parents=True, exist_ok=True)
        # Written whole beside the record, then linked into place: of two processes deciding at once one links, and
        # the other never reads a record half written (it did: its error left a job's other process waiting).
        text = json.dumps(entry, indent=1, sort_keys=True) + "\n"
        draft = record.with_name(f".{record.name}.{os.getpid()}.{platform.node()}")
        draft.write_text(text)
        try:
            os.link(draft, record)   # exclusive: fails where the record exists
            return chosen, {**why, "record": str(record), "record_written": True}
        except FileExistsError:
            pass   # another process decided first: adopt its decision below
        except OSError:   # a filesystem without hard links: an exclusive create, written at once
            try:
                with open(record, "x") as handle:
                    handle.write(text)
                return chosen, {**why, "record": str(record), "record_written": True}
            except FileExistsError:
                time.sleep(1.0)   # its writer has a moment to finish
        finally:
            draft.unlink(missing_ok=True)
    try:
        entry = json.loads(record.read_text())
        chosen = check(str(entry["resolved"]), RECORD_ENV)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{record}: the DAG's precision record is unreadable ({err}); delete it and the next job "
                         "decides again (a checkpoint keeps the arithmetic it was trained in)") from None
    native, flags = native_bf16()
    if chosen == "bf16" and not native:
        log.warning("%s decides bf16, but this CPU has %s: bfloat16 is emulated here, several times slower than "
                    "float32; delete the record to decide again on this machine", record, flags)
    return chosen, {"reason": f"the DAG's decision ({record}): {entry.get('reason', '')}", "record": str(record),
                    "capability": torch.backends.cpu.get_cpu_capability()}


def report() -> dict[str, Any]:
    """What this process resolved (empty until :func:`resolve` ran)."""
    return dict(_decision)


def reset() -> None:
    _decision.clear()
    _adopted.clear()
    _auto.cache_clear()


def native_bf16() -> tuple[bool, str]:
    """Whether this CPU has bfloat16 multiply instructions, and the flags that say so."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i386", "i686"):
        found = [name for name, has in (("avx512_bf16", torch.cpu._is_avx512_bf16_supported()),
                                        ("amx_bf16", torch.cpu._is_amx_tile_supported())) if has]
        return bool(found), " ".join(found) or "no avx512_bf16, no amx_bf16"
    if machine in ("aarch64", "arm64"):
        flags = _cpuinfo_flags()
        return "bf16" in flags, "bf16" if "bf16" in flags else "no bf16"
    return False, f"unknown architecture {machine}"


def _cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("flags", "features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@functools.lru_cache(maxsize=None)
def _auto(device_type: str, threads: int) -> tuple[str, dict[str, Any]]:
    if device_type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ("bf16" if ok else "fp32"), {"reason": f"GPU {'with' if ok else 'without'} bfloat16 support"}
    if device_type != "cpu":
        return "bf16", {"reason": f"{device_type} device: bfloat16 autocast"}
    native, flags = native_bf16()
    if not native:
        return "fp32", {"reason": f"CPU without bfloat16 instructions ({flags}): autocast would be emulated",
                        "capability": torch.backends.cpu.get_cpu_capability()}
    timing = measure(threads)
    chosen = "bf16" if timing["speedup"] >= MARGIN else "fp32"
    return chosen, {"reason": f"CPU with {flags}; bf16 measured {timing['speedup']:.2f}x float32 "
                              f"({'at least' if chosen == 'bf16' else 'under'} {MARGIN}x)",
                    "capability": torch.backends.cpu.get_cpu_capability(), "measured": timing}


def measure(threads: int | None = None) -> dict[str, Any]:
    """Best-of-:data:`REPEATS` seconds of a linear layer's forward and backward in float32 and under bf16 autocast,
    interleaved so both see the same load; ``speedup`` is float32's time over bf16's."""
    rows, width_in, width_out = PROBE_SHAPE
    generator = torch.Generator(device="cpu").manual_seed(0)   # the job's own RNG streams stay untouched
    x = torch.randn(rows, width_in, generator=generator, device="cpu")
    weight = torch.randn(width_out, width_in, generator=generator, device="cpu").requires_grad_(True)
    best = {"fp32": float("inf"), "bf16": float("inf")}
    for repeat in range(REPEATS + 1):   # the first round warms both up and is dropped
        for name in ("fp32", "bf16") if repeat % 2 else ("bf16", "fp32"):
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name == "bf16"):
                y = torch.nn.functional.linear(x, weight)
            y.float().sum().backward()
            weight.grad = None
            if repeat:
                best[name] = min(best[name], time.perf_counter() - t0)
    return {"fp32_s": round(best["fp32"], 6), "bf16_s": round(best["bf16"], 6),
            "speedup": round(best["fp32"] / best["bf16"], 3), "shape": list(PROBE_SHAPE),
            "threads": threads if threads is not None else torch.get_num_threads()}
