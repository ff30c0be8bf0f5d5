"""Kill anywhere, lose nothing; corrupt checkpoints are detected; NaN/inf stops (or skips) a step.

Faults are injected with ``OPDGRPO_FAULT=<point>:<step>`` (``opdgrpo.train.faults``). A killed run is rerun without the
fault and must end with exactly the ledger, evals and FLOP totals of an uninterrupted run: CPU runs are
deterministic (fixed thread count, seeded generators per (seed, step), checkpoints hold exact float32 weights and
the optimiser state), so the comparison is ``==`` on every number, not a tolerance.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opdgrpo.runio import read_jsonl
from opdgrpo.train import faults
from opdgrpo.train.checkpoint import MANIFEST, STATE_FILE, load_state, resume_point, write_manifest
from opdgrpo.train.loop import NonFinite, train
from opdgrpo.train.step_stats import TIMING_KEYS

OPD, GRPO = "opd-teacher_m-math-s0", "grpo-student-math-s0"


def _config(plan, run_id, steps, **train_keys):
    cfg = copy.deepcopy(plan.jobs[run_id].config)
    cfg["method"]["steps"] = steps
    cfg["train"].update(train_keys)
    cfg["run_id"] = f"{run_id}-test"
    return cfg


def _cli(cfg, run_dir: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    cfg_file = run_dir.parent / f"{run_dir.name}.json"
    cfg_file.write_text(json.dumps(cfg))
    env = {k: v for k, v in os.environ.items() if k != faults.ENV}
    if fault:
        env[faults.ENV] = fault
    return subprocess.run([sys.executable, "-m", "opdgrpo.cli", "train", "--out", str(run_dir), "--config-file", str(cfg_file)],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300)


def _outcome(run_dir: Path) -> dict:
    """Everything a run leaves that must not depend on interruptions (wall-clock times and rates aside)."""
    clock = TIMING_KEYS
    ledger = [{k: v for k, v in r.items() if k not in clock} for r in read_jsonl(run_dir / "ledger.jsonl")]
    done = json.loads((run_dir / "done.json").read_text())
    return {"ledger": ledger, "evals": read_jsonl(run_dir / "evals.jsonl"),
            "done": {k: done[k] for k in ("cumulative_flops", "flops_by_component", "final_eval", "steps")}}


# OPD: its loss, weights and rollouts change every step (the smoke student's GRPO rewards are all zero).
# 6 steps, checkpoints after steps 2, 4, 6 (and the final one), evals at steps 0, 3, 6.
KILL_TRAIN = {"checkpoint_every": 2, "eval_every": 3}


@pytest.fixture(scope="module")
def uninterrupted(smoke_world, tmp_path_factory):
    _, plan = smoke_world
    cfg = _config(plan, OPD, 6, **KILL_TRAIN)
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    result = _cli(cfg, run_dir)
    assert result.returncode == 0, result.stderr
    return cfg, _outcome(run_dir)


@pytest.mark.parametrize("fault, resumed_at", [
    ("rollout:3", 2),             # mid-step, after the eval at step 3 was logged: that eval is dropped and redone
    ("update:5", 4),              # after the optimiser step, before the ledger line; a torn ledger line is added too
    ("checkpoint_write:4", 2),    # model files of checkpoint 4 written, no trainer state, no manifest
    ("checkpoint_rename:4", 2),   # checkpoint 2 moved to checkpoint.old, sealed checkpoint 4 not yet renamed
    ("eval:6", 6),                # during the final eval: every step done and checkpointed, no done.json
])
def test_kill_anywhere_and_rerun_equals_the_uninterrupted_run(uninterrupted, tmp_path, fault, resumed_at):
    cfg, want = uninterrupted
    run_dir = tmp_path / "run"
    killed = _cli(cfg, run_dir, fault)
    assert killed.returncode == -9, killed.stderr
    assert not (run_dir / "done.json").exists()
    if fault.startswith("update"):   # a writer killed mid-line leaves a torn last line
        with open(run_dir / "ledger.jsonl", "a") as handle:
            handle.write('{"step": 5, "tok')
    rerun = _cli(cfg, run_dir)
    assert rerun.returncode == 0, rerun.stderr
    assert f"at step {resumed_at} " in rerun.stderr
    got = _outcome(run_dir)
    assert [r["step"] for r in got["ledger"]] == list(range(6))
    assert [e["step"] for e in got["evals"]] == [0, 3, 6]
    assert got == want   # exact: every float of every ledger line, eval and FLOP total


def _corrupt_truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _corrupt_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 8):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def finished_run(smoke_world, tmp_path_factory):
    """A 5-step run: checkpoint/ at step 5 (the final one), checkpoint.old/ at step 4."""
    _, plan = smoke_world
    cfg = _config(plan, OPD, 5, **KILL_TRAIN)
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    train(cfg, run_dir)
    return cfg, run_dir, _outcome(run_dir)


@pytest.mark.parametrize("corrupt, name", [(_corrupt_truncate, "model.safetensors"), (_corrupt_flip, STATE_FILE)])
def test_a_corrupt_checkpoint_falls_back_to_the_previous_one(finished_run, tmp_path, caplog, corrupt, name):
    cfg, source, want = finished_run
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    assert load_state(run_dir / "checkpoint")["step"] == 5 and load_state(run_dir / "checkpoint.old")["step"] == 4
    corrupt(run_dir / "checkpoint" / name)
    caplog.set_level(logging.INFO)
    train(cfg, run_dir)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(run_dir / "checkpoint" / name) in w for w in warnings), warnings
    assert "resuming" in caplog.text and "at step 4 " in caplog.text
    assert _outcome(run_dir) == want   # the ledger line of step 4 and the final eval were dropped and redone
    assert load_state(run_dir / "checkpoint")["step"] == 5 and load_state(run_dir / "checkpoint.old")["step"] == 4


def test_no_valid_checkpoint_starts_over_with_a_warning(finished_run, tmp_path, caplog):
    cfg, source, want = finished_run
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    _corrupt_flip(run_dir / "checkpoint" / STATE_FILE)
    _corrupt_truncate(run_dir / "checkpoint.old" / "model.safetensors")
    caplog.set_level(logging.INFO)
    train(cfg, run_dir)
    assert "no valid checkpoint" in caplog.text and "starts over" in caplog.text and "resuming" not in caplog.text
    assert _outcome(run_dir) == want


def test_a_state_that_does_not_unpickle_is_reported_not_raised(finished_run, tmp_path, caplog):
    """Garbage written *before* sealing (the manifest matches it): the load error becomes a warning, not a crash."""
    _, source, _ = finished_run
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    ckpt = run_dir / "checkpoint"
    (ckpt / STATE_FILE).write_bytes(b"not a pickle")
    write_manifest(ckpt)
    caplog.set_level(logging.WARNING)
    path, state = resume_point(run_dir)
    assert path == run_dir / "checkpoint.old" and state["step"] == 4
    assert f"{ckpt / STATE_FILE}: cannot be loaded" in caplog.text
    assert not ckpt.exists()   # removed, so the next save keeps checkpoint.old as the previous checkpoint


def test_a_checkpoint_from_before_manifests_still_resumes(finished_run, tmp_path, caplog):
    _, source, _ = finished_run
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    (run_dir / "checkpoint" / MANIFEST).unlink()
    caplog.set_level(logging.WARNING)
    path, state = resume_point(run_dir)
    assert path == run_dir / "checkpoint" and state["step"] == 5 and "unverified" in caplog.text


# -- numerical faults ------------------------------------------------------------------------------------------

def _steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(run_dir / "ledger.jsonl")]


@pytest.mark.parametrize("run_id, fault, message", [
    (GRPO, "nan_reward:1", "step 1: rewards contain NaN"),
    (GRPO, "nan_logits:3", "step 3: student logits contain NaN"),
    (GRPO, "nan_loss:3", "step 3: grpo loss is NaN"),
    (OPD, "nan_teacher:3", "step 3: teacher logits (math teacher) contain NaN"),
])
def test_a_nonfinite_step_stops_the_run_and_keeps_the_last_checkpoint(smoke_world, tmp_path, monkeypatch, run_id, fault, message):
    _, plan = smoke_world
    cfg = _config(plan, run_id, 5, checkpoint_every=2, eval_every=100)
    run_dir = tmp_path / "run"
    monkeypatch.setenv(faults.ENV, fault)
    with pytest.raises(NonFinite, match=f"run {cfg['run_id']} {message}".replace("(", r"\(").replace(")", r"\)")):
        train(cfg, run_dir)
    bad = int(fault.split(":")[1])
    assert _steps(run_dir) == list(range(bad))          # no ledger line for the failed step
    assert not (run_dir / "checkpoint.tmp").exists()
    ckpt_step = bad // 2 * 2
    if ckpt_step:
        state = load_state(run_dir / "checkpoint")      # verified against its manifest
        assert state["step"] == ckpt_step
    else:
        assert not (run_dir / "checkpoint").exists()
    # the rerun (fault gone) resumes from that checkpoint and finishes like a clean run
    monkeypatch.delenv(faults.ENV)
    train(cfg, run_dir)
    assert _steps(run_dir) == list(range(5))


def test_the_cli_names_the_step_and_component(smoke_world, tmp_path):
    _, plan = smoke_world
    cfg = _config(plan, OPD, 4, checkpoint_every=2, eval_every=100)
    result = _cli(cfg, tmp_path / "run", "nan_teacher:2")
    assert result.returncode == 3
    assert f"run {cfg['run_id']} step 2: teacher logits (math teacher) contain NaN" in result.stderr
    assert "Traceback" not in result.stderr


def _optimizer_steps(run_dir: Path) -> int:
    state = load_state(run_dir / "checkpoint")["optimizer"]["state"]
    return int(next(iter(state.values()))["step"])


def test_skip_drops_the_update_and_counts_the_flops(smoke_world, tmp_path, monkeypatch, caplog):
    _, plan = smoke_world
    cfg = _config(plan, OPD, 4, checkpoint_every=2, eval_every=100, nonfinite="skip")
    run_dir = tmp_path / "run"
    monkeypatch.setenv(faults.ENV, "nan_teacher:1,nan_loss:3")
    summary = train(cfg, run_dir)
    ledger = read_jsonl(run_dir / "ledger.jsonl")
    assert [r["step"] for r in ledger] == [0, 1, 2, 3]
    assert [r.get("skipped") for r in ledger] == [None, "teacher_logits", None, "loss"]
    assert ["teachers" in r for r in ledger] == [True, False, True, False]   # a skipped line has FLOPs only
    good, skipped_teacher, skipped_loss = ledger[0]["flops"], ledger[1]["flops"], ledger[3]["flops"]
    # what was computed is counted: rollouts, teacher forward, student forward; no backward
    assert skipped_teacher["rollout"] > 0 and skipped_teacher["teacher"] > 0
    # no backward: train FLOPs are one forward (1/3 of a training pass), relative to the teacher's forward
    assert skipped_loss["teacher"] / skipped_loss["train"] == pytest.approx(3 * good["teacher"] / good["train"], rel=0.1)
    assert all(r["cumulative_flops"] == pytest.approx(sum(x["step_flops"] for x in ledger[: i + 1])) for i, r in enumerate(ledger))
    assert summary["cumulative_flops"] == ledger[-1]["cumulative_flops"]
    assert _optimizer_steps(run_dir) == 2          # two of the four steps updated the model
    assert "step 1: teacher logits (math teacher) contain NaN" in caplog.text


def test_skip_stops_after_too_many_in_a_row(smoke_world, tmp_path, monkeypatch):
    _, plan = smoke_world
    cfg = _config(plan, GRPO, 6, checkpoint_every=2, eval_every=100, nonfinite="skip", max_nonfinite_skips=2)
    run_dir = tmp_path / "run"
    monkeypatch.setenv(faults.ENV, "nan_loss:1,nan_loss:2,nan_loss:3")
    with pytest.raises(NonFinite, match="step 3: grpo loss is NaN; run stopped after 2 non-finite steps skipped in a row"):
        train(cfg, run_dir)
    assert [r.get("skipped") for r in read_jsonl(run_dir / "ledger.jsonl")] == [None, "loss", "loss"]
    assert load_state(run_dir / "checkpoint")["nonfinite_streak"] == 1   # saved after step 1, skipped
    # a good step in between resets the count
    monkeypatch.setenv(faults.ENV, "nan_loss:1,nan_loss:2,nan_loss:4,nan_loss:5")
    shutil.rmtree(run_dir)
    train(cfg, run_dir)
    assert [r.get("skipped") for r in read_jsonl(run_dir / "ledger.jsonl")] == [None, "loss", "loss", None, "loss", "loss"]


def test_switching_to_skip_after_a_stop_resumes_the_run(smoke_world, tmp_path, monkeypatch, caplog):
    """`nonfinite` stays out of the config hash: the stopped run's steps are the same under either setting."""
    _, plan = smoke_world
    cfg = _config(plan, GRPO, 4, checkpoint_every=2, eval_every=100)
    run_dir = tmp_path / "run"
    monkeypatch.setenv(faults.ENV, "nan_reward:2")
    with pytest.raises(NonFinite):
        train(cfg, run_dir)
    cfg["train"]["nonfinite"] = "skip"
    caplog.set_level(logging.INFO)
    train(cfg, run_dir)
    assert "resuming" in caplog.text and "at step 2 " in caplog.text and "starting over" not in caplog.text
    assert [r.get("skipped") for r in read_jsonl(run_dir / "ledger.jsonl")] == [None, None, "rewards", None]


def test_faults_cost_nothing_unset(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    assert not faults.armed("rollout", 3)
    faults.kill_point("rollout", 3)   # returns
    monkeypatch.setenv(faults.ENV, "update:5, nan_loss:3")
    assert faults.armed("nan_loss", 3) and faults.armed("update", 5) and not faults.armed("update", 3)
    assert torch.isfinite(torch.zeros(2)).all()
