"""``mfu.md``: how much of the machine each run used, read from the runs' ``done.json``.

A run's achieved FLOP/s is its training FLOPs (rollouts, training passes, teacher forwards: the ledger's
``step_flops``) over the wall time of its steps (evaluation and checkpoints excluded); MFU divides that by the
matrix-multiply peak the job measured on its own device before its first step (:mod:`opdgrpo.train.peak`), times the
number of processes that shared the run. A run finished before ``done.json`` had these fields gets its achieved
FLOP/s from its ledger (``step_flops`` and ``wall_s``) and ``n/a`` for the peak and MFU.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opdgrpo.report.curves import ReportInputError, format_flops
from opdgrpo.runio import read_jsonl

COLUMNS = ["run", "method", "training FLOPs", "wall s", "achieved GFLOP/s", "peak GFLOP/s", "MFU"]


def _done(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ReportInputError(f"{path}: malformed JSON ({exc})") from exc


def _from_ledger(path: Path) -> dict[str, Any]:
    """Achieved FLOP/s of an older run from its ledger lines (no peak was measured then)."""
    try:
        records = read_jsonl(path)
    except ValueError as exc:
        raise ReportInputError(str(exc)) from exc
    flops = sum(float(r.get("step_flops", 0.0)) for r in records)
    wall = sum(float(r.get("wall_s", 0.0)) for r in records)
    return {"train_wall_s": wall, "achieved_flops_per_s": flops / wall} if wall > 0 else {}


def _giga(value: Any) -> str:
    return "n/a" if value is None else f"{float(value) / 1e9:.1f}"


def _row(name: str, method: str, flops: Any, done: Mapping[str, Any]) -> list[str]:
    peak = (done.get("peak") or {}).get("flops_per_s")
    processes = int((done.get("peak") or {}).get("processes", 1))
    mfu = done.get("mfu")
    wall = done.get("train_wall_s")
    return [name, method, format_flops(None if flops is None else float(flops)),
            "n/a" if wall is None else f"{float(wall):.1f}", _giga(done.get("achieved_flops_per_s")),
            "n/a" if peak is None else f"{_giga(peak)}" + (f" x {processes}" if processes > 1 else ""),
            "n/a" if mfu is None else f"{100 * float(mfu):.1f}%"]


def _table(rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS), *("| " + " | ".join(r) + " |" for r in rows)]


def _peak_note(dones: list[Mapping[str, Any]]) -> str:
    peaks = [d["peak"] for d in dones if isinstance(d.get("peak"), Mapping) and d["peak"].get("flops_per_s")]
    if not peaks:
        return ""
    first = peaks[0]
    values = sorted(p["flops_per_s"] / 1e9 for p in peaks)
    n = "x".join(str(x) for x in first.get("shape", []))
    return (f"Peak: a {n} `{first.get('dtype')}` matrix multiply on `{first.get('device')}` with {first.get('threads')} "
            f"thread(s), {first.get('statistic', 'best of repeats')}, measured once by each job before its first step "
            f"(range over jobs {values[0]:.1f}-{values[-1]:.1f} GFLOP/s; jobs running side by side share the cores).")


def mfu_markdown(spec: Mapping[str, Any], runs_dir: Path, profile: str) -> str:
    """The MFU table of every run in the spec (and of the base models' pretraining, not counted as training)."""
    lines = [f"# Achieved FLOP/s and MFU (profile `{profile}`)", "",
             "Achieved = a run's training FLOPs (rollouts + training passes + teacher forwards) over the wall time of "
             "its training steps (evaluation and checkpoints excluded); MFU = achieved / measured matrix-multiply peak.",
             ""]
    rows, dones = [], []
    for entry in spec["runs"]:
        done = _done(Path(runs_dir) / entry["run"] / "done.json")
        if done is None:
            rows.append([entry["run"], str(entry.get("method", "")), "n/a", "n/a", "n/a", "n/a", "not finished"])
            continue
        if done.get("achieved_flops_per_s") is None:
            done = {**done, **_from_ledger(Path(runs_dir) / entry["run"] / "ledger.jsonl")}
        dones.append(done)
        rows.append(_row(entry["run"], str(done.get("method", entry.get("method", ""))), done.get("cumulative_flops"), done))
    lines += _table(rows) if rows else ["No runs in the report spec."]
    base = []
    for label, out_dir in (spec.get("base_models") or {}).items():
        done = _done(Path(out_dir) / "done.json")
        if done is not None and "pretrain_flops" in done:
            dones.append(done)
            base.append(_row(label, "pretraining", done.get("pretrain_flops"), done))
    if base:
        lines += ["", "Base-model pretraining (not post-training compute, shown for scale):", "", *_table(base)]
    note = _peak_note(dones)
    return "\n".join(lines + ([""] + [note] if note else []) + [""])
