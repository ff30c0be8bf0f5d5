"""``train.report_to``: TensorBoard, W&B (offline) and trackio get the ledger's numbers and every evaluation, per step."""

from __future__ import annotations

import copy
import glob
import json
import sqlite3
import struct
from pathlib import Path

import pytest

from opdgrpo.runio import read_jsonl
from opdgrpo.tracking import check_installed, eval_scalars, flatten
from opdgrpo.train.loop import train

RUN = "opd-teacher_m-math-s0"


def _run(smoke_world, tmp_path, report_to, steps: int = 3) -> Path:
    _, plan = smoke_world
    cfg = copy.deepcopy(plan.jobs[RUN].config)
    cfg["method"]["steps"] = steps
    cfg["method"]["score_rollouts"] = True   # the profiles' OPD skips it (reward null, not logged); the reward is tracked here
    cfg["train"].update({"report_to": report_to, "eval_every": 2, "checkpoint_every": 2})
    run_dir = tmp_path / "run"
    train(cfg, run_dir)
    return run_dir


def _expected(run_dir: Path) -> dict[tuple[int, str], float]:
    """Every scalar a backend should hold, from the ledger and the evaluations."""
    want = {}
    for line in read_jsonl(run_dir / "ledger.jsonl"):
        for name, value in flatten({k: v for k, v in line.items() if k != "step"}, "train").items():
            want[line["step"], name] = value
    for record in read_jsonl(run_dir / "evals.jsonl"):
        for name, value in eval_scalars(record["results"]).items():
            want[record["step"], name] = value
    return want


def test_tensorboard_scalars_equal_the_ledger(smoke_world, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = _run(smoke_world, tmp_path, ["tensorboard"])
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    got = {(e.step, tag): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}
    want = _expected(run_dir)
    assert set(want) <= set(got), sorted(set(want) - set(got))[:5]
    for key, value in want.items():   # TensorBoard keeps float32
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-30), key
    assert ("train/reward" in events.Tags()["scalars"]) and ("eval/math/amc/accuracy" in events.Tags()["scalars"])
    assert {"train/teachers/math/reverse_kl", "train/teachers/math/token_share",   # OPD's per-teacher diagnostics
            "train/teachers/math/accuracy"} <= set(events.Tags()["scalars"])


def _wandb_history(path: str) -> list[dict]:
    """History rows of an offline W&B run file (LevelDB log records of ``Record`` protobufs; wandb >= 0.2x has no
    Python reader of its own)."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, records, partial = Path(path).read_bytes(), 32768, 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        partial = chunk if kind in (1, 2) else partial + chunk
        if kind in (1, 4):
            records.append(partial)
    rows = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.HasField("history"):
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_wandb_offline_run_holds_the_ledger(smoke_world, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)   # offline by default: no network, no login
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = _run(smoke_world, tmp_path, ["wandb"])
    (path,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    got = {(row["_step"], k): v for row in _wandb_history(path) for k, v in row.items() if not k.startswith("_")}
    for key, value in _expected(run_dir).items():
        assert got[key] == pytest.approx(value), key


def test_trackio_project_holds_the_ledger(smoke_world, tmp_path, monkeypatch):
    """Through the CLI, as a job runs it: trackio reads ``TRACKIO_DIR`` once per process, at its first import."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("trackio") is None:
        pytest.skip("trackio is not installed (pip install -e '.[tracking]')")
    _, plan = smoke_world
    cfg = copy.deepcopy(plan.jobs[RUN].config)
    cfg["method"]["steps"] = 3
    cfg["train"].update({"report_to": ["trackio"], "eval_every": 2, "checkpoint_every": 2})
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "TRACKIO_DIR"}
    done = subprocess.run([sys.executable, "-m", "opdgrpo.cli", "train", "--out", str(run_dir), "--config-json",
                           json.dumps(cfg)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (db,) = glob.glob(str(run_dir / "trackio" / "*.db"))
    got = {}
    with sqlite3.connect(db) as con:
        for step, metrics in con.execute("select step, metrics from metrics where run_name = ?", (RUN,)):
            got.update({(step, k): v for k, v in json.loads(metrics).items()})
    for key, value in _expected(run_dir).items():
        assert got[key] == pytest.approx(value), key


def test_an_uninstalled_backend_is_an_error_naming_the_extra(monkeypatch):
    import importlib.util

    # wandb missing, everything else as installed except tensorboard, found either way (so the test does not
    # depend on the `tracking` extra being installed)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb"
                        else real(name, *a) or (object() if name == "tensorboard" else None))
    with pytest.raises(ValueError, match=r"train.report_to.*wandb.*\.\[tracking\]"):
        check_installed(["tensorboard", "wandb"])
    check_installed("none")


def test_report_to_outside_the_schema_is_an_error_naming_the_key(smoke_world, tmp_path):
    _, plan = smoke_world
    cfg = copy.deepcopy(plan.jobs[RUN].config)
    cfg["train"]["report_to"] = ["tensorbord"]
    with pytest.raises(ValueError, match="train.report_to"):
        train(cfg, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
