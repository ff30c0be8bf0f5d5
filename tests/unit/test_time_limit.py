"""A training job's own stop before its SLURM allocation ends (opdgrpo.train.time_limit): reading the end time from
``squeue`` (a stand-in script here), and the decision after each step."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from opdgrpo.attempts import _process_name, launched_by
from opdgrpo.train.time_limit import Durations, TimeLimit, job_end


def _squeue(tmp_path, body: str) -> str:
    """A stand-in for ``squeue`` that runs ``body`` (sh) and records its arguments."""
    script = tmp_path / "squeue"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls'}\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_the_end_time_is_read_from_squeue_in_local_time(tmp_path):
    end = time.time() + 3600
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end))
    assert job_end("42", _squeue(tmp_path, f"echo {stamp}")) == pytest.approx(int(end), abs=1)
    assert (tmp_path / "calls").read_text().split() == ["-h", "-j", "42", "-o", "%e"]


@pytest.mark.parametrize("body", ["echo Unknown", "echo N/A", "echo", "exit 1", "echo not-a-time", "sleep 0; echo NONE"])
def test_no_end_time_is_none(tmp_path, body):
    """No time limit, a job SLURM no longer knows, an error: no end time (the trainer keeps what it knew)."""
    assert job_end("42", _squeue(tmp_path, body)) is None


def test_a_missing_squeue_is_no_end_time(tmp_path):
    assert job_end("42", str(tmp_path / "nowhere" / "squeue")) is None


class _Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_it_stops_when_the_next_step_and_a_save_no_longer_fit_before_the_end():
    clock, asked = _Clock(), []

    def query(job):
        asked.append(clock.now)
        return 1000.0 + 200.0

    limit = TimeLimit("7", query=query, clock=clock, poll_s=60, margin_s=30)
    durations = Durations(save_s=5.0)           # an estimate until a save is measured
    durations.step(10.0)
    durations.step(8.0)                         # the longest step counts
    assert limit.why_stop(durations, evaluation_due=False) is None          # 200 s left >= 10 + 5 + 30
    clock.now = 1000.0 + 200 - 46                                            # 46 s left
    assert limit.why_stop(durations, evaluation_due=False) is None
    clock.now += 2                                                           # 44 s left < 45
    why = limit.why_stop(durations, evaluation_due=False)
    assert why == "SLURM job 7 ends in 44 s, less than a step (10 s), a save (estimated) (5 s) and a 30-s margin"
    assert asked == [1000.0, 1154.0]            # SLURM asked at the start and again once 60 s had passed


def test_an_evaluation_due_before_the_next_step_and_a_measured_save_count():
    clock = _Clock()
    limit = TimeLimit("7", query=lambda job: 1100.0, clock=clock, poll_s=60, margin_s=30)
    durations = Durations(save_s=50.0)
    durations.step(5.0)
    durations.evaluation(20.0)
    durations.save(12.0)                        # measured: replaces the estimate, however large
    assert durations.save_s == 12.0 and durations.save_measured
    assert limit.why_stop(durations, evaluation_due=False) is None          # 100 >= 5 + 12 + 30
    why = limit.why_stop(durations, evaluation_due=True)                     # 100 >= 25 + 12 + 30 too
    assert why is None
    clock.now = 1040.0                                                       # 60 < 67
    assert limit.why_stop(durations, evaluation_due=True).startswith("SLURM job 7 ends in 60 s, less than an "
                                                                      "evaluation, a step (25 s), a save (12 s)")


def test_slurm_not_answering_keeps_the_end_it_knew_and_no_end_never_stops():
    clock, answers = _Clock(), [1500.0, None]
    limit = TimeLimit("7", query=lambda job: answers.pop(0), clock=clock, poll_s=10, margin_s=30)
    assert limit.seconds_left() == 500.0
    clock.now += 20
    assert limit.seconds_left() == 480.0        # the second question went unanswered: the first end stands
    unlimited = TimeLimit("8", query=lambda job: None, clock=clock)
    assert unlimited.why_stop(Durations(step_s=1e9), evaluation_due=True) is None


def test_outside_slurm_there_is_no_limit(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert TimeLimit.from_environment() is None


def test_the_launcher_chain_names_processes_by_what_they_run(tmp_path):
    """A Python process by its module (``-m torch.distributed.run``), any other by its command name: what an
    attempt's record says started it (a shell between Snakemake and the launcher shows as ``bash``)."""
    code = "from opdgrpo.attempts import launched_by; print(*launched_by()[:1])"
    probe = [sys.executable, "-c", code]
    (tmp_path / "starter.py").write_text(f"import subprocess\nsubprocess.run({probe!r}, check=True)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    via_module = subprocess.run([sys.executable, "-m", "starter"], capture_output=True, text=True, env=env, check=True)
    assert via_module.stdout.split() == ["starter"]
    via_bash = subprocess.run(["bash", "-c", f"{sys.executable} -c '{code}'; true"], capture_output=True, text=True,
                              check=True)
    assert via_bash.stdout.split()[0] == "bash"
    assert _process_name(2**22 + 7) is None     # no such process
    assert launched_by()[0] == _process_name(os.getppid())
