"""Two writers on one results directory: Snakemake's lock refuses a second workflow, and the training job's
own lock refuses a second process on one run directory (e.g. `opdgrpo train` by hand next to a workflow)."""

from __future__ import annotations

import copy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opdgrpo.config import compose
from opdgrpo.plan.build import build_plan
from opdgrpo.runio import DirectoryInUse, job_lock

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]
#: Waits are generous bounds against a hang, not speed checks: a slow CPU (emulated arithmetic, a busy machine) makes
#: this test slower, never red. Snakemake stops on SIGINT only after the job it runs has been cancelled and cleaned up.
WAIT_S = 900


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow
def test_second_snakemake_on_one_directory_is_refused(tmp_path):
    """The first invocation holds `.snakemake/locks`; an identical second one exits non-zero with Snakemake's
    LockException before running anything; SIGINT (Snakemake's clean stop) then ends the first early."""
    cmd = [*SNAKEMAKE, "--directory", str(tmp_path), "--cores", "1", "--config", "profile=smoke"]
    # SIGINT handled by default in the first invocation even when this test runs as a background job of a
    # non-interactive shell (`pytest ... &`): such jobs start with SIGINT ignored, and a child inherits that, so
    # Snakemake never stopped, was killed after 120 s and left its lock behind. Its output goes to a file, not a pipe
    # nobody reads until the end.
    log_path = tmp_path.parent / f"{tmp_path.name}-first.log"
    with open(log_path, "w") as log:
        first = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        locks = tmp_path / ".snakemake" / "locks"
        _wait_for(lambda: locks.is_dir() and any(locks.iterdir()) or first.poll() is not None, WAIT_S, ".snakemake/locks")
        assert first.poll() is None, "the first invocation ended before the second could start"
        started = time.time()
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT_S)
        second_s = time.time() - started
        output = second.stdout + second.stderr
        assert second.returncode != 0
        assert "LockException" in output or "Directory cannot be locked" in output, output[-2000:]
    finally:
        first.send_signal(signal.SIGINT)
        try:
            first.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()
    first_out = log_path.read_text()
    assert first.returncode != 0, first_out[-2000:]  # stopped early, not finished
    assert not locks.exists() or not any(locks.iterdir()), \
        f"the stopped invocation left its lock behind (the second took {second_s:.1f} s):\n{first_out[-3000:]}"
    assert not (tmp_path / "results" / "smoke" / "report").exists()


def _hold_lock(run_dir: Path) -> subprocess.Popen:
    code = ("import sys, time; from pathlib import Path; from opdgrpo.runio import job_lock\n"
            "with job_lock(Path(sys.argv[1])):\n    print('locked', flush=True); time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_job_lock_refuses_a_second_process_and_frees_on_exit(tmp_path):
    run_dir = tmp_path / "runs" / "r"
    holder = _hold_lock(run_dir)
    try:
        with pytest.raises(DirectoryInUse, match=rf"{run_dir} is in use by another process \(pid {holder.pid} on "):
            with job_lock(run_dir):
                pass
    finally:
        holder.kill()
        holder.wait()
    with job_lock(run_dir):  # a killed holder leaves no stale lock
        pass


def test_train_on_a_locked_run_dir_fails_fast_and_leaves_it_untouched(tmp_path):
    """Two `train` processes on one run directory: the second fails at once, naming the directory, and touches
    none of the first's files (here a finished run's, to show nothing is deleted)."""
    from opdgrpo.train.loop import train
    from opdgrpo.train.tokenizer import build_tokenizer, save_tokenizer

    cfg = compose(["profile=smoke", f"results_dir={tmp_path}/results"], REPO / "conf")
    plan = build_plan(cfg)
    tok_dir = Path(plan.jobs["tokenizer"].out_dir)
    tok = build_tokenizer(cfg["domains"], cfg["tokenizer"]["vocab_size"], 50)
    save_tokenizer(tok, tok_dir)
    student = Path(plan.jobs["base-student"].out_dir) / "checkpoint"
    student.mkdir(parents=True)
    for f in tok_dir.iterdir():
        (student / f.name).write_bytes(f.read_bytes())
    (student / "config.json").write_text(f'{{"model_type": "qwen3", "vocab_size": {len(tok)}}}')
    run_cfg = copy.deepcopy(plan.jobs["grpo-student-math-s0"].config)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("ledger.jsonl", "evals.jsonl", "done.json", "config.yaml"):
        (run_dir / name).write_text("finished\n")
    before = {p.name: p.read_text() for p in run_dir.iterdir()}
    holder = _hold_lock(run_dir)
    try:
        started = time.time()
        with pytest.raises(DirectoryInUse, match=f"{run_dir} is in use"):
            train(run_cfg, run_dir)
        assert time.time() - started < 60   # at once: before any model is loaded (a bound against a hang)
    finally:
        holder.kill()
        holder.wait()
    after = {p.name: p.read_text() for p in run_dir.iterdir() if p.name != ".lock"}
    assert after == before
