"""The training loop: contracted run files, exact FLOP accounting per step, and resume after a kill."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from opdgrpo.runio import read_jsonl
from opdgrpo.train import flops as F
from opdgrpo.train.batching import batch_tasks, domain_counts
from opdgrpo.train.loop import train


def _config(plan, run_id, out_root: Path, **method):
    cfg = copy.deepcopy(plan.jobs[run_id].config)
    cfg["method"].update(method)
    cfg["run_id"] = f"{run_id}-test"
    return cfg


def test_grpo_run_writes_the_contracted_files(smoke_world, tmp_path):
    _, plan = smoke_world
    cfg = _config(plan, "grpo-student-math-s0", tmp_path, steps=3)
    run_dir = tmp_path / "grpo"
    summary = train(cfg, run_dir)
    for name in ("config.yaml", "ledger.jsonl", "evals.jsonl", "done.json"):
        assert (run_dir / name).is_file(), name
    AutoModelForCausalLM.from_pretrained(run_dir / "checkpoint")
    ledger = read_jsonl(run_dir / "ledger.jsonl")
    assert [r["step"] for r in ledger] == [0, 1, 2]
    running = 0.0
    for record in ledger:
        assert set(record["flops"]) == {"rollout", "train", "old_policy", "teacher"}
        assert record["flops"]["teacher"] == 0 and record["flops"]["rollout"] > 0
        assert "teachers" not in record   # OPD's per-teacher diagnostics only
        running += record["step_flops"]
        assert record["cumulative_flops"] == pytest.approx(running)
    evals = read_jsonl(run_dir / "evals.jsonl")
    assert [e["step"] for e in evals] == [0, 2, 3]   # step 0, every eval_every=2, and the last
    assert evals[0]["cumulative_flops"] == 0 and evals[-1]["cumulative_flops"] == pytest.approx(running)
    assert {r["eval_set"] for r in evals[0]["results"]} == {"amc", "aime"}
    assert summary["cumulative_flops"] == pytest.approx(running)


def test_opd_counts_teacher_forward_exactly(smoke_world, tmp_path):
    _, plan = smoke_world
    cfg = _config(plan, "opd-teacher_m-math-s0", tmp_path, steps=1)
    run_dir = tmp_path / "opd"
    train(cfg, run_dir)
    record = read_jsonl(run_dir / "ledger.jsonl")[0]
    teacher = AutoModelForCausalLM.from_pretrained(cfg["teachers"]["math"]["path"])
    student = AutoModelForCausalLM.from_pretrained(cfg["student"]["path"])
    batch, length = record["tokens"]["train"], None
    # train tokens = B*L; both passes see the same (B, L) and keep logits for the completion (+1)
    ratio = record["flops"]["teacher"] / record["flops"]["train"]
    b = cfg["train"]["prompts_per_step"] * cfg["method"]["rollouts_per_prompt"]
    length = batch // b
    for new in range(1, length):
        t = F.forward_flops(teacher.config, b, length, logits_positions=new + 1)
        s = F.train_flops(student.config, b, length, logits_positions=new + 1)
        if t / s == pytest.approx(ratio, rel=1e-12):
            break
    else:
        pytest.fail("teacher/train FLOPs do not correspond to one (B, L) shape")
    assert record["loss"] >= 0 and record["metrics"]["kl"] >= 0
    # one teacher: the per-teacher diagnostics' one entry holds every trained token and the step's token-mean KL
    (only,) = record["teachers"].values()
    assert list(record["teachers"]) == ["math"] and only["token_share"] == 1.0
    assert only["tokens"] == record["tokens"]["completion"] and only["rollouts"] == b
    assert only["reverse_kl"] == pytest.approx(record["loss"], rel=1e-5)   # token-mean, one micro-batch, one update


def test_opd_without_scoring_its_rollouts_trains_the_same_and_leaves_reward_null(smoke_world, tmp_path):
    """`score_rollouts: false` skips the verifiers on training rollouts: the same losses, tokens, FLOPs and held-out
    evaluations as a scoring run, and `reward` null in the ledger (OPD's loss never reads it)."""
    _, plan = smoke_world
    runs = {}
    for score in (True, False):
        cfg = _config(plan, "opd-teacher_m-code-s0", tmp_path, steps=2, score_rollouts=score)
        train(cfg, tmp_path / f"score-{score}")
        runs[score] = (read_jsonl(tmp_path / f"score-{score}" / "ledger.jsonl"),
                       read_jsonl(tmp_path / f"score-{score}" / "evals.jsonl"))
    (scored, scored_evals), (unscored, unscored_evals) = runs[True], runs[False]
    assert all(isinstance(r["reward"], float) for r in scored) and all(r["reward"] is None for r in unscored)
    for a, b in zip(scored, unscored, strict=True):
        assert (a["loss"], a["tokens"], a["flops"], a["mean_response_length"]) == \
            (b["loss"], b["tokens"], b["flops"], b["mean_response_length"])
        # the teacher's accuracy is the step's reward where scored, null (never 0) where not
        assert a["teachers"]["code"]["accuracy"] == pytest.approx(a["reward"], rel=1e-6)
        assert b["teachers"]["code"]["accuracy"] is None
        assert {**a["teachers"]["code"], "accuracy": None} == b["teachers"]["code"]
    assert [e["results"] for e in scored_evals] == [e["results"] for e in unscored_evals]


def test_domain_counts_and_batches_are_reproducible():
    pools = {"math": list(range(30)), "code": list(range(10))}
    assert domain_counts(pools, 8, "balanced") == {"code": 4, "math": 4}
    assert domain_counts(pools, 8, "instance") == {"code": 2, "math": 6}
    with pytest.raises(ValueError, match="train.mix"):
        domain_counts(pools, 8, "weird")
    assert batch_tasks(pools, {"math": 3, "code": 1}, 5, 0) == batch_tasks(pools, {"math": 3, "code": 1}, 5, 0)
    seen = [t for s in range(10) for t in batch_tasks({"math": list(range(30))}, {"math": 3}, s, 0)]
    assert sorted(seen) == list(range(30))   # one epoch visits every prompt once


def _train_subprocess(cfg, run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "opdgrpo.cli", "train", "--out", str(run_dir), "--config-json", json.dumps(cfg)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_kill_and_resume_continues_the_ledger_exactly(smoke_world, tmp_path):
    """Kill -9 mid-run, rerun: every step appears once and the ledger equals an uninterrupted run's."""
    _, plan = smoke_world
    cfg = _config(plan, "grpo-student-math-s0", tmp_path, steps=7)   # 10 until CI's 40 minutes got tight
    cfg["train"] = dict(cfg["train"], checkpoint_every=3, eval_every=4)
    reference = tmp_path / "reference"
    assert _train_subprocess(cfg, reference).wait() == 0

    run_dir = tmp_path / "killed"
    proc = _train_subprocess(cfg, run_dir)
    deadline = time.time() + 120
    while time.time() < deadline:
        if len(read_jsonl(run_dir / "ledger.jsonl")) >= 5 and (run_dir / "checkpoint").exists():
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "done.json").exists()
    assert _train_subprocess(cfg, run_dir).wait() == 0

    got, want = read_jsonl(run_dir / "ledger.jsonl"), read_jsonl(reference / "ledger.jsonl")
    assert [r["step"] for r in got] == list(range(7))
    for a, b in zip(got, want):
        assert a["cumulative_flops"] == b["cumulative_flops"]
        assert a["reward"] == b["reward"] and a["loss"] == b["loss"]   # CPU runs are deterministic: exact
    assert [e["step"] for e in read_jsonl(run_dir / "evals.jsonl")] == [0, 4, 7]
    assert json.loads((run_dir / "done.json").read_text())["cumulative_flops"] == json.loads((reference / "done.json").read_text())["cumulative_flops"]


def test_sigterm_checkpoints_and_a_rerun_resumes(smoke_world, tmp_path):
    _, plan = smoke_world
    cfg = _config(plan, "grpo-student-math-s0", tmp_path, steps=40)
    cfg["train"] = dict(cfg["train"], checkpoint_every=1000, eval_every=1000)
    run_dir = tmp_path / "term"
    proc = _train_subprocess(cfg, run_dir)
    deadline = time.time() + 120
    while time.time() < deadline and len(read_jsonl(run_dir / "ledger.jsonl")) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    stopped_at = len(read_jsonl(run_dir / "ledger.jsonl"))
    assert (run_dir / "checkpoint" / "trainer_state.pt").is_file()
    assert _train_subprocess(cfg, run_dir).wait() == 0
    steps = [r["step"] for r in read_jsonl(run_dir / "ledger.jsonl")]
    assert steps == list(range(40)) and stopped_at < 40


def test_a_signal_during_an_evaluation_stops_before_the_next_step(smoke_world, tmp_path, monkeypatch):
    """SLURM's warning during the evaluation at step 2 (fault ``term_eval:2``): the run checkpoints the state after
    2 updates (no periodic checkpoint holds it) and stops without training step 2, so the warning's lead needs to
    cover an evaluation or a step, not both; the rerun redoes that evaluation and ends as an uninterrupted run."""
    from opdgrpo.train.loop import Interrupted

    _, plan = smoke_world
    cfg = _config(plan, "grpo-student-math-s0", tmp_path, steps=5)
    cfg["train"] = dict(cfg["train"], checkpoint_every=3, eval_every=2)
    train(copy.deepcopy(cfg), tmp_path / "whole")
    run_dir = tmp_path / "warned"
    monkeypatch.setenv("OPDGRPO_FAULT", "term_eval:2")
    with pytest.raises(Interrupted, match="during the evaluation at step 2"):
        train(copy.deepcopy(cfg), run_dir)
    assert [r["step"] for r in read_jsonl(run_dir / "ledger.jsonl")] == [0, 1]
    assert torch.load(run_dir / "checkpoint" / "trainer_state.pt", weights_only=False)["step"] == 2
    monkeypatch.delenv("OPDGRPO_FAULT")
    train(copy.deepcopy(cfg), run_dir)
    got, want = (read_jsonl(d / "ledger.jsonl") for d in (run_dir, tmp_path / "whole"))
    assert [(r["step"], r["reward"], r["loss"], r["cumulative_flops"]) for r in got] == \
        [(r["step"], r["reward"], r["loss"], r["cumulative_flops"]) for r in want]
    assert [e["step"] for e in read_jsonl(run_dir / "evals.jsonl")] == [0, 2, 4, 5]
    # the count the cost model and the scheduler read is the trainer's (5 steps, every 2: 0, 2, 4 and the final 5)
    from opdgrpo.run_shape import evaluation_count

    assert evaluation_count(cfg) == len({e["step"] for e in read_jsonl(run_dir / "evals.jsonl")}) == 4


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGURG])
def test_a_signal_while_the_models_load_stops_after_one_checkpointed_step(smoke_world, tmp_path, monkeypatch, signum):
    """A stop signal can arrive before the first step (a paper-scale model loads for minutes): a SIGTERM, or SLURM's
    warning to a training job (SIGURG, which the rules ask for); it is noted, not fatal; the run trains one step,
    checkpoints and stops, so its next attempt resumes past it."""
    import torch

    from opdgrpo.train import loop as train_mod
    from opdgrpo.train.loop import Interrupted

    _, plan = smoke_world
    cfg = _config(plan, "grpo-student-math-s0", tmp_path, steps=5)
    cfg["train"] = dict(cfg["train"], checkpoint_every=1000, eval_every=1000)
    real_setup = train_mod._setup

    def setup_with_a_signal(*args):
        os.kill(os.getpid(), signum)   # arrives while the run is being set up
        return real_setup(*args)

    monkeypatch.setattr(train_mod, "_setup", setup_with_a_signal)
    run_dir = tmp_path / "early"
    with pytest.raises(Interrupted, match="after step 0"):
        train(cfg, run_dir)
    assert [r["step"] for r in read_jsonl(run_dir / "ledger.jsonl")] == [0]
    assert torch.load(run_dir / "checkpoint" / "trainer_state.pt", weights_only=False)["step"] == 1


def test_under_slurm_a_run_stops_itself_before_its_allocation_ends(smoke_world, tmp_path, monkeypatch):
    """SLURM's warning may never reach the trainer (under proctrack/cgroup it goes to the job step's task, the inner
    Snakemake, only): the run reads its job's end time (from `squeue`, a stand-in here) and stops, checkpointed,
    once the next step and a save no longer fit before it with the margin; the rerun outside SLURM then ends as an
    uninterrupted run does."""
    from opdgrpo.train.loop import Interrupted
    from opdgrpo.train.time_limit import EXIT_MARGIN_S

    _, plan = smoke_world
    cfg = _config(plan, "grpo-student-math-s0", tmp_path, steps=20)
    cfg["train"] = dict(cfg["train"], checkpoint_every=1000, eval_every=1000)
    train(copy.deepcopy(cfg), tmp_path / "whole")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + EXIT_MARGIN_S + 5))
    (bin_dir / "squeue").write_text(f"#!/bin/sh\necho {end}\n")
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("OPDGRPO_FAULT", "pace:1")   # steps of at least a second: the end comes after a few
    run_dir = tmp_path / "limited"
    with pytest.raises(Interrupted, match="SLURM job 77 ends in") as stopped:
        train(copy.deepcopy(cfg), run_dir)
    assert stopped.value.why.startswith("SLURM job 77 ends in")
    done = len(read_jsonl(run_dir / "ledger.jsonl"))
    assert 1 <= done < 20
    assert torch.load(run_dir / "checkpoint" / "trainer_state.pt", weights_only=False)["step"] == done
    for name in ("SLURM_JOB_ID", "OPDGRPO_FAULT"):
        monkeypatch.delenv(name)
    train(copy.deepcopy(cfg), run_dir)
    got, want = (read_jsonl(d / "ledger.jsonl") for d in (run_dir, tmp_path / "whole"))
    assert [(r["step"], r["reward"], r["loss"], r["cumulative_flops"]) for r in got] == \
        [(r["step"], r["reward"], r["loss"], r["cumulative_flops"]) for r in want]


def test_changed_config_starts_over(smoke_world, tmp_path):
    _, plan = smoke_world
    cfg = _config(plan, "grpo-student-math-s0", tmp_path, steps=2)
    run_dir = tmp_path / "changed"
    train(cfg, run_dir)
    cfg["method"]["lr"] = 5e-5
    cfg["method"]["steps"] = 3
    train(cfg, run_dir)
    assert [r["step"] for r in read_jsonl(run_dir / "ledger.jsonl")] == [0, 1, 2]
    assert all(r["lr"] == 5e-5 for r in read_jsonl(run_dir / "ledger.jsonl"))


def _distillation_with_own_teacher(plan, tmp_path):
    import shutil

    cfg = _config(plan, "opd-teacher_m-math-s0", tmp_path, steps=2)
    teacher_dir = tmp_path / "teacher"
    shutil.copytree(Path(cfg["teachers"]["math"]["path"]).parent, teacher_dir)
    cfg["teachers"]["math"]["path"] = str(teacher_dir / "checkpoint")
    return cfg, teacher_dir


def test_a_retrained_teacher_restarts_the_distillation_and_a_rewritten_record_does_not(smoke_world, tmp_path, caplog):
    """Same run config; the identity folds in the teacher's weights (the digest its done.json records), not the text
    of that file: new weights start the run over, a done.json rewritten around the same weights resumes it."""
    import logging

    from safetensors.torch import load_file, save_file

    from opdgrpo.train.finished import checkpoint_record

    _, plan = smoke_world
    cfg, teacher_dir = _distillation_with_own_teacher(plan, tmp_path)
    run_dir = tmp_path / "distil"
    train(cfg, run_dir)
    caplog.set_level(logging.INFO, logger="opdgrpo.train.loop")
    done = teacher_dir / "done.json"
    done.write_text(done.read_text().replace('"wall_s"', '"rewritten": true, "wall_s"'))
    caplog.clear()
    train(cfg, run_dir)   # same weights: resumes at its last step
    assert "resuming" in caplog.text and "starting over" not in caplog.text
    weights = teacher_dir / "checkpoint" / "model.safetensors"
    state = load_file(weights)
    save_file({k: v + 1e-3 if v.is_floating_point() else v for k, v in state.items()}, weights, metadata={"format": "pt"})
    record = json.loads(done.read_text())
    done.write_text(json.dumps({**record, "checkpoint": checkpoint_record(teacher_dir / "checkpoint", hash_contents=True)}))
    caplog.clear()
    train(cfg, run_dir)   # retrained teacher: starts over
    assert "starting over" in caplog.text and "resuming" not in caplog.text
    assert [r["step"] for r in read_jsonl(run_dir / "ledger.jsonl")] == [0, 1]


@pytest.mark.parametrize("damage,message", [
    ("done_cut", r"teacher/done\.json: not valid JSON .*cut short or overwritten; redo that job with `snakemake --forcerun .*teacher/done\.json`"),
    ("weights_cut", r"teacher/checkpoint/model\.safetensors: \d+ bytes, .*done\.json records \d+ \(truncated or replaced\)"),
    ("weights_gone", r"teacher/checkpoint/model\.safetensors: missing, though .*done\.json records it"),
])
def test_a_broken_upstream_is_named_and_the_finished_run_below_it_is_kept(smoke_world, tmp_path, damage, message):
    """A teacher whose done.json or weights were damaged after it finished: the distillation refuses at its start,
    naming the file and how to redo it, and its own finished checkpoint, ledger, evaluations and done.json stay."""
    from opdgrpo.train.finished import BrokenUpstream

    _, plan = smoke_world
    cfg, teacher_dir = _distillation_with_own_teacher(plan, tmp_path)
    run_dir = tmp_path / "distil"
    train(cfg, run_dir)
    before = {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    done, weights = teacher_dir / "done.json", teacher_dir / "checkpoint" / "model.safetensors"
    if damage == "done_cut":
        done.write_text(done.read_text()[:40])
    elif damage == "weights_cut":
        weights.write_bytes(weights.read_bytes()[:1000])
    else:
        weights.unlink()
    with pytest.raises(BrokenUpstream, match=message):
        train(cfg, run_dir)
    after = {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert after == before and "done.json" in after and "checkpoint/model.safetensors" in after


def test_a_checkpoint_whose_history_was_lost_is_not_resumed(smoke_world, tmp_path, caplog):
    """A finished run whose evals.jsonl was deleted (and its done.json, so the job reruns): resuming at the final
    checkpoint would leave a one-point curve with no step-0 evaluation; the run is redone instead, whole."""
    import logging

    _, plan = smoke_world
    cfg = _config(plan, "grpo-student-math-s0", tmp_path, steps=2)
    cfg["train"]["eval_every"] = 1
    run_dir = tmp_path / "lost"
    train(cfg, run_dir)
    whole = [r["step"] for r in read_jsonl(run_dir / "evals.jsonl")]
    (run_dir / "evals.jsonl").unlink()
    (run_dir / "done.json").unlink()
    caplog.set_level(logging.INFO, logger="opdgrpo.train.loop")
    train(cfg, run_dir)
    assert "history is incomplete (evals.jsonl lacks the evaluation(s) at step(s) 0, 1); starting over" in caplog.text
    assert [r["step"] for r in read_jsonl(run_dir / "evals.jsonl")] == whole == [0, 1, 2]
    assert [r["step"] for r in read_jsonl(run_dir / "ledger.jsonl")] == [0, 1]


def test_a_resume_keeps_the_arithmetic_it_started_in(smoke_world, tmp_path, monkeypatch):
    """The resolved precision is in the checkpoint: a resume that would compute in another one refuses, naming the key
    and the value that resumes it; that value then resumes (the setting itself is not the run's identity). The
    resume starts its sampling engine before Adam's state is loaded (what vLLM's start-up memory check sees is a
    fresh start's), with the attempt's first step for the engine's seed."""
    from opdgrpo.train import loop
    from opdgrpo.train.checkpoint import ResumeRefused

    starts, build = [], loop._engine

    def engine_recorded(run, start):
        starts.append((start, len(run.optimizer.state)))   # Adam's state on the device when the engine starts
        return build(run, start)

    monkeypatch.setattr(loop, "_engine", engine_recorded)

    _, plan = smoke_world
    cfg = _config(plan, "grpo-student-math-s0", tmp_path, steps=2)
    cfg["train"]["precision"] = "fp32"
    run_dir = tmp_path / "arith"
    train(cfg, run_dir)
    (run_dir / "done.json").unlink()
    before = (run_dir / "ledger.jsonl").read_text()
    cfg["train"]["precision"] = "bf16"
    with pytest.raises(ResumeRefused, match=r"trained in fp32, and `train.precision: bf16` resolves to bf16 in this "
                                            r"process; pass `train.precision=fp32` to resume it"):
        train(cfg, run_dir)
    assert (run_dir / "ledger.jsonl").read_text() == before and (run_dir / "checkpoint").is_dir()
    cfg["train"]["precision"] = "fp32"
    train(cfg, run_dir)
    assert (run_dir / "ledger.jsonl").read_text() == before and (run_dir / "done.json").is_file()
    assert starts[0] == (0, 0) and starts[-1] == (2, 0)   # the resume: at step 2, before the optimizer state


def test_difficulty_selection_then_training_on_one_subset(smoke_world, tmp_path):
    """S2 end to end at smoke size: the selection job writes rate-ranked subsets; a run on one subset trains only on
    its prompts, scores them as the `in_domain` set and keeps the subset's rates in done.json."""
    from opdgrpo.stages.difficulty import select

    _, plan = smoke_world
    selection = copy.deepcopy(plan.jobs["difficulty-math-teacher_m"].config)
    summary = select(selection, tmp_path / "sel")
    subsets = json.loads((tmp_path / "sel" / "subsets.json").read_text())["subsets"]
    assert list(subsets) == ["s0t0", "s0t1"] and summary["counted"] is False
    assert subsets["s0t0"]["teacher_rate"] <= subsets["s0t1"]["teacher_rate"]
    assert sum(len(s["prompts"]) for s in subsets.values()) == selection["rule"]["pool_size"]

    cfg = _config(plan, "grpo-student-math_s0t1-s0", tmp_path, steps=2)
    cfg["train_subset"]["file"] = str(tmp_path / "sel" / "subsets.json")
    done = train(cfg, tmp_path / "run")
    assert done["train_subset"]["subset"] == "s0t1" and done["train_subset"]["size"] == len(subsets["s0t1"]["prompts"])
    evals = read_jsonl(tmp_path / "run" / "evals.jsonl")
    in_domain = [r for r in evals[-1]["results"] if r["eval_set"] == "in_domain"]
    assert len(in_domain) == 1 and in_domain[0]["n_prompts"] == len(subsets["s0t1"]["prompts"])

    cfg["train_subset"]["subset"] = "s7t7"
    with pytest.raises(KeyError, match="s7t7"):
        train(cfg, tmp_path / "run2")


@pytest.mark.parametrize("run_id", ["grpo-student-math-s0", "opd-teacher_m-math-s0"])
def test_a_training_step_draws_every_random_tensor_on_its_generators_device(smoke_world, tmp_path, run_id):
    """The trainer's rollouts and evaluations under the device check (tests/device_checks.py): on a GPU the
    rollout and evaluation generators are CUDA generators, and any draw that does not land on its generator's device
    fails there (the step-0 evaluation under vLLM did); here every such draw fails the run."""
    from device_checks import RandomDrawsNameTheirDevice

    _, plan = smoke_world
    cfg = _config(plan, run_id, tmp_path, steps=1)
    with RandomDrawsNameTheirDevice() as mode:
        train(cfg, tmp_path / "run")
    assert mode.seen > 0 and [r["step"] for r in read_jsonl(tmp_path / "run" / "ledger.jsonl")] == [0]
