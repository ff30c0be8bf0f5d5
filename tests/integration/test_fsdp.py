"""FSDP2 (``train.distributed: fsdp``) on 2 CPU processes with gloo, against one process (``-k fsdp`` runs them).

What is pinned, and why these tolerances:
- the sharded update equals the unsharded one (``test_fsdp_two_processes_equal_one_process``: OPD, 2 steps, 4 shards,
  so each process accumulates 2). Float32 gathered weights (``train.fsdp.param_dtype: float32``) make the forward the
  same arithmetic, and the rollouts are sampled from identical weights. Each process's loss is scaled by 2 and
  reduce-scattered as a sum divided by 2 (powers of two: exact); what differs is the order of additions: FSDP adds
  the shards' gradients as (g0 + g1) + (g2 + g3) where one process adds ((g0 + g1) + g2) + g3, and the global norm sums
  squares per parameter shard, then across processes. That is a relative error of a few float32 ulps (1.2e-7 each)
  in the gradients and the norm; Adam's update ``lr * m / (sqrt(v) + eps)`` is scale-free, so the weights move by
  ``lr`` = 2e-4 times a ratio that carries the same relative error. Allowed: ``rtol=1e-5, atol=1e-6`` on weights
  (the DDP test's; 1e-6 is 1/200 of one step's update), ``rel=1e-5`` on losses and gradient norms (the norm is what
  would show a wrongly scaled gradient, which Adam's update hides); tokens, FLOPs and rewards exactly. Measured on
  this machine (2 CPU cores, torch 2.13): largest weight difference 6.0e-8 (1 float32 ulp of the weight; the update
  itself up to 4.0e-4), losses within 3.3e-8 relative, gradient norms within 4.4e-7 relative (0.9441607 against
  0.9441611): 20x inside the tolerances.
- clipping uses the global norm: ``fsdp_worker.py`` clips at a ``max_norm`` between every shard's partial norm and
  the full gradient's norm, so clipping by a partial norm (FSDP1's local ``clip_grad_norm_``) would not clip at all.
  Measured: the two processes' partial norms 1.094 and 1.141, the full gradient's 1.581, ``max_norm`` 1.361;
  ``clip_grad_norm`` returns 1.581 on both processes, and the clipped gradients and updated weights equal the
  unsharded ones clipped at the global norm (difference 0). The same update also shows activation checkpointing
  acting under FSDP2: each layer's MLP runs twice (forward and recompute), the unsharded copy's once.
- the paper profile's mixed precision (``train.fsdp``: bfloat16 gathered weights, float32 reduction) under bf16
  autocast: the forward sees bfloat16 weights, the master shards and gradients are float32, and the gradients differ
  from one process's (float32 weights, the same autocast) by bfloat16 rounding where autocast keeps float32 (norm
  and embedding weights, a tied weight's two gradient terms added before the reduction): measured relative error
  7.0e-3 (norm of the difference over the norm), allowed 2e-2.
- SIGTERM checkpoints the gathered model and optimizer state, and the rerun repeats the uninterrupted run exactly
  (bfloat16 gathered weights, the profile's default: the resumed run reads the same float32 master weights).
- one process is the plain run under ``distributed: none``, ``ddp`` and ``fsdp``, and with activation checkpointing:
  bit for bit (tests/integration/test_speed_pins.py pins the default's numbers).
"""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from learning import one_process_run_that_learns
from safetensors.torch import load_file

from opdgrpo.runio import read_jsonl
from opdgrpo.train.distributed import Workers
from opdgrpo.train.loop import train
from opdgrpo.train.step_stats import TIMING_KEYS

pytestmark = pytest.mark.timeout(600)

HERE = Path(__file__).resolve().parent
#: Ledger keys that differ between two runs of the same steps (wall-clock time).
TIMES = TIMING_KEYS


def _torchrun(args: list[str], processes: int = 2) -> list[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(processes),
            "--master_addr", "127.0.0.1", "--master_port", str(port), *args]


def _train_args(cfg: dict, run_dir: Path) -> list[str]:
    return ["-m", "opdgrpo.cli", "train", "--out", str(run_dir), "--config-json", json.dumps(cfg)]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(_torchrun(args), capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _config(plan, run_id: str, steps: int = 2, **train_overrides) -> dict:
    cfg = copy.deepcopy(plan.jobs[run_id].config)
    cfg["method"]["steps"] = steps
    cfg["train"].update({"eval_every": 100, "checkpoint_every": 100, **train_overrides})
    cfg["run_id"] = f"{run_id}-fsdp"
    return cfg


def _ledger(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in line.items() if k not in TIMES} for line in read_jsonl(run_dir / "ledger.jsonl")]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoint" / "model.safetensors"))


def _optimizer(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoint" / "trainer_state.pt", weights_only=False)["optimizer"]


def _assert_identical(a: Path, b: Path) -> None:
    """Ledger (less wall times), evaluations and final weights bit for bit."""
    assert _ledger(a) == _ledger(b)
    assert read_jsonl(a / "evals.jsonl") == read_jsonl(b / "evals.jsonl")
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[n], wb[n]) for n in wa)


def test_fsdp_clips_by_the_global_norm_and_updates_as_one_process(tmp_path):
    """One update of a tiny tied Qwen3, sharded over 2 processes, against the unsharded update (fsdp_worker.py)."""
    _run([str(HERE / "fsdp_worker.py"), str(tmp_path)])
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    main = ranks[0]
    partials, full = main["partial_norms"], main["full_norm"]
    # The case FSDP1's local clipping gets wrong: every shard's own norm is below max_norm, the whole gradient's above.
    assert max(partials) < main["max_norm"] < full
    assert sum(p * p for p in partials) ** 0.5 == pytest.approx(full, rel=1e-6)
    for rank in ranks:
        assert rank["norm_type"] == "Tensor" and rank["clip_norm"] == pytest.approx(full, rel=1e-6)
        assert rank["clip_norm"] == main["clip_norm"]
        assert rank["tied"] and rank["replica_tied"]
        assert rank["layer_calls"] == [2, 2]   # activation checkpointing acts: each layer recomputed in the backward
        # the profile's policy: the forward sees bfloat16 weights, the shards and their gradients stay float32, and the
        # gradients are the one-process bf16-autocast gradients to bfloat16's precision (unit roundoff 3.9e-3)
        assert (rank["gathered_dtype"], rank["master_dtype"], rank["grad_dtype"]) == (
            "torch.bfloat16", "torch.float32", "torch.float32")
        assert rank["bf16_grad_relative_error"] < 2e-2
        # clipped gradients (about 1) and updated weights (a step of about lr = 1e-2) as the unsharded update
        assert rank["grad_diff"] <= 1e-6 and rank["weight_diff"] <= 1e-7 < main["update_size"]
    assert main["checkpoint_left_out"] == ["lm_head.weight"] and main["checkpoint_diff"] <= 1e-7
    assert main["optimizer_keys_match"] and main["optimizer_diff"] <= 1e-7
    assert main["optimizer_round_trip_diff"] == 0.0


def _assert_same_steps(one: Path, two: Path) -> tuple[list, list, dict, dict]:
    """Steps 0 and 1 of the two runs agree: FLOPs and tokens exactly, loss and gradient norm to 1e-5 relative, every
    weight to rtol 1e-5 / atol 1e-6 (the module docstring says why). Returns both ledgers and both weight sets."""
    a, b = _ledger(one), _ledger(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1]
    for ra, rb in zip(a, b):
        assert (ra["flops"], ra["tokens"], ra["cumulative_flops"]) == (rb["flops"], rb["tokens"], rb["cumulative_flops"])
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-5, abs=1e-7)
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-5)
    wa, wb = _weights(one), _weights(two)
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    return a, b, wa, wb


@pytest.mark.parametrize("method", ["opd", "grpo-knobs"])
def test_fsdp_two_processes_equal_one_process(smoke_world, knowing_student, tmp_path, method):
    """OPD (a gradient at every step), and GRPO with two updates per batch in two mini-batches and a reference KL
    (from a student that finds rewards, at a seed whose first step has a gradient); 4 shards (2 accumulated per
    process), float32 gathered weights, activation checkpointing on: the same steps as one process with the plain
    model (tolerances: the module docstring)."""
    _, plan = smoke_world
    if method == "opd":
        cfg = _config(plan, "opd-teacher_m-math-s0", micro_batches=4, precision="fp32", prompts_per_step=8)
        one = tmp_path / "one"
        train(copy.deepcopy(cfg), one)
    else:
        cfg = _config(plan, "grpo-student-knowledge-s0", micro_batches=4, precision="fp32", prompts_per_step=8)
        cfg["method"].update(updates_per_batch=2, minibatches=2, beta=0.1)
        cfg["student"]["path"] = knowing_student
        cfg, one = one_process_run_that_learns(cfg, tmp_path)
    two = tmp_path / "two"
    fsdp_cfg = copy.deepcopy(cfg)
    fsdp_cfg["train"].update({"distributed": "fsdp", "fsdp": {"param_dtype": "float32"}, "activation_checkpointing": True})
    _run(_train_args(fsdp_cfg, two))
    assert json.loads((two / "done.json").read_text())["processes"] == 2
    a, b, wa, wb = _assert_same_steps(one, two)
    for ra, rb in zip(a, b):
        assert (ra["reward"], ra["mean_response_length"]) == (rb["reward"], rb["mean_response_length"])
    base = load_file(str(Path(cfg["student"]["path"]) / "model.safetensors"))
    print("fsdp vs one process: largest weight difference", max(float((wa[n] - wb[n]).abs().max()) for n in wa),
          "largest update", max(float((wa[n] - base[n]).abs().max()) for n in wa),
          "losses", [(ra["loss"], rb["loss"]) for ra, rb in zip(a, b)],
          "gradient norms", [(ra["grad_norm"], rb["grad_norm"]) for ra, rb in zip(a, b)])
    assert any(not torch.equal(base[n], wb[n]) for n in base), "the sharded run did not update the weights"
    saved = json.loads((two / "checkpoint" / "config.json").read_text())
    assert saved["architectures"] == ["Qwen3ForCausalLM"] and saved["tie_word_embeddings"]
    oa, ob = _optimizer(one), _optimizer(two)
    assert oa["state"].keys() == ob["state"].keys()
    assert [g["params"] for g in oa["param_groups"]] == [g["params"] for g in ob["param_groups"]]


#: The one-domain run unchunked was a third case until the vLLM torchrun test needed its 17 s of CI: the four-domain
#: run takes the unchunked path with a sharded teacher, the one-domain run the chunked one.
@pytest.mark.parametrize(("run", "chunk"), [("opd-teacher_m-math-s0", 16), ("opd-teacher_m-math+code+ifeval+knowledge-s0", None)])
def test_fsdp_sharded_teachers_and_logit_chunks_equal_one_process(smoke_world, tmp_path, run, chunk):
    """OPD under FSDP with the teacher sharded as the student is (per decoder layer, frozen, no optimizer state;
    each process holds half of its weights and gathers them a layer at a time in ``train.fsdp.param_dtype``), its
    logits gathered only at the student's top-k ids: the same steps as one process with a replica teacher, within
    the tolerances of ``test_fsdp_two_processes_equal_one_process`` (the module docstring). With
    ``train.logit_chunk_tokens: 16`` (8 rows of up to 16 response tokens: up to 8 chunks per shard) both runs take
    the chunked path: the student's LM head runs inside the sharded root unit's forward and is recomputed per chunk
    in its backward. Four domains (one teacher serving them, two prompts per shard): a process whose shard has no
    row of a domain still forwards that domain's teacher on a stand-in row, so the processes' gathers stay paired."""
    _, plan = smoke_world
    overrides = {"micro_batches": 4, "precision": "fp32", "prompts_per_step": 8}
    if chunk:
        overrides["logit_chunk_tokens"] = chunk
    cfg = _config(plan, run, **overrides)
    one = tmp_path / "one"
    train(copy.deepcopy(cfg), one)
    two = tmp_path / "two"
    fsdp_cfg = copy.deepcopy(cfg)
    fsdp_cfg["train"].update({"distributed": "fsdp", "fsdp": {"param_dtype": "float32"}})
    done = _run(_train_args(fsdp_cfg, two))
    sharded = [line for line in done.stderr.splitlines() if "FSDP2-sharded over 2 processes" in line]
    assert len(sharded) == 2, done.stderr[-3000:]   # one line per process
    for line in sharded:
        held, total = (int(w) for w in line.split(", ")[1].split()[:4:3])
        assert held < 0.6 * total   # about half (a row count not divisible by 2 leaves one more row on one)
    a, b, wa, wb = _assert_same_steps(one, two)
    for ra, rb in zip(a, b):   # per-teacher diagnostics: sums over each process's shards, added over the processes
        assert list(ra["teachers"]) == list(rb["teachers"]) == cfg["train_domains"]
        assert sum(t["token_share"] for t in rb["teachers"].values()) == pytest.approx(1.0, rel=1e-12)
        for domain, t in ra["teachers"].items():
            assert (t["tokens"], t["rollouts"]) == (rb["teachers"][domain]["tokens"], rb["teachers"][domain]["rollouts"])
            assert rb["teachers"][domain]["reverse_kl"] == pytest.approx(t["reverse_kl"], rel=1e-5, abs=1e-7)
        assert sum(t["tokens"] for t in rb["teachers"].values()) == rb["tokens"]["completion"]
    print("sharded teachers,", run, "chunk", chunk, ": largest weight difference",
          max(float((wa[n] - wb[n]).abs().max()) for n in wa),
          "losses", [(ra["loss"], rb["loss"]) for ra, rb in zip(a, b)],
          "gradient norms", [(ra["grad_norm"], rb["grad_norm"]) for ra, rb in zip(a, b)])


def test_fsdp_sigterm_checkpoints_and_a_rerun_resumes_exactly(smoke_world, tmp_path):
    """SLURM's warning signal under FSDP (the profile's bfloat16 gathered weights): every process stops after the
    step, the main one writes the gathered checkpoint, and the rerun ends where an uninterrupted run ends, bit for
    bit (ledger, evaluations, weights, optimizer state)."""
    _, plan = smoke_world
    cfg = _config(plan, "opd-teacher_m-math-s0", steps=10, distributed="fsdp", micro_batches=2)
    whole = tmp_path / "whole"
    _run(_train_args(cfg, whole))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_torchrun(_train_args(cfg, run_dir)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    ledger, deadline = run_dir / "ledger.jsonl", time.time() + 300
    while (not ledger.exists() or len(read_jsonl(ledger)) < 2) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    stopped_at = len(read_jsonl(ledger))
    assert 2 <= stopped_at < 10 and (run_dir / "checkpoint" / "manifest.json").exists()
    assert torch.load(run_dir / "checkpoint" / "trainer_state.pt", weights_only=False)["step"] == stopped_at
    _run(_train_args(cfg, run_dir))
    assert [r["step"] for r in read_jsonl(ledger)] == list(range(10))
    _assert_identical(whole, run_dir)
    oa, ob = _optimizer(whole), _optimizer(run_dir)
    assert oa["param_groups"] == ob["param_groups"] and oa["state"].keys() == ob["state"].keys()
    for i in oa["state"]:
        assert all(torch.equal(oa["state"][i][k], ob["state"][i][k]) for k in oa["state"][i])


def test_fsdp_none_and_activation_checkpointing_leave_one_process_unchanged(smoke_world, tmp_path):
    """One process trains the plain model whatever ``train.distributed`` says; recomputing activations in the
    backward repeats the forward's arithmetic: the same ledger, evaluations and weights, bit for bit."""
    _, plan = smoke_world
    cfg = _config(plan, "opd-teacher_m-math-s0")
    runs = {"default": {}, "none": {"distributed": "none"},
            "fsdp+ac": {"distributed": "fsdp", "activation_checkpointing": True}}
    for name, overrides in runs.items():
        variant = copy.deepcopy(cfg)
        variant["train"].update(overrides)
        train(variant, tmp_path / name)
    for name in ("none", "fsdp+ac"):
        _assert_identical(tmp_path / "default", tmp_path / name)


def test_fsdp_distributed_none_refuses_several_processes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="train.distributed: none"):
        Workers("none")


#: A checkpoint save slowed to CHECKPOINT_S (OPDGRPO_FAULT=checkpoint_s: a large model's write and hash on a shared
#: filesystem), and a stop signal sent to the whole process group, torchrun and its workers, as SLURM's warning is.
CHECKPOINT_S = 8


@pytest.mark.parametrize("shutdown_timeout, saved", [(2, False), (40, True)])
def test_torchrun_waits_for_the_checkpoint_only_as_long_as_its_shutdown_timeout(smoke_world, tmp_path, shutdown_timeout,
                                                                                saved):
    """torchrun forwards SIGTERM to its workers and SIGKILLs them after ``--shutdown-timeout`` (30 s by default, less
    than a large model's checkpoint): with a timeout shorter than the save the workers die in it and the step is
    lost; with the lead the rules pass (workflow/rules/common.smk) the save completes and they exit 130."""
    from opdgrpo.attempts import records

    _, plan = smoke_world
    cfg = _config(plan, "grpo-student-math-s0", steps=50)
    run_dir = tmp_path / "run"
    cmd = _torchrun(["--shutdown-timeout", str(shutdown_timeout), *_train_args(cfg, run_dir)])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "OPDGRPO_FAULT": f"checkpoint_s:{CHECKPOINT_S}"})
    ledger, deadline = run_dir / "ledger.jsonl", time.time() + 300
    while (not ledger.exists() or len(read_jsonl(ledger)) < 1) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    state = run_dir / "checkpoint" / "trainer_state.pt"
    assert state.exists() == saved, err[-3000:]
    ends = [r["end"] for r in records(run_dir) if "end" in r]   # the trainer's own word on how the attempt ended
    if saved:   # the step after the signal finished, checkpointed, and the trainer exited 130 (`interrupted`)
        assert torch.load(state, weights_only=False, map_location="cpu")["step"] == len(read_jsonl(ledger))
        assert ends == ["interrupted"], err[-3000:]
    else:       # SIGKILLed inside the save: no word at all
        assert ends == [], err[-3000:]
