"""A training job under SLURM stops itself before its allocation ends: it saves a checkpoint and exits 130 with time
to spare, whether or not SLURM's warning signal reaches it.

Why the trainer cannot rely on a warning signal. The SLURM plugin runs each job as ``srun -n1 ... snakemake`` (the
job step), and that Snakemake runs the rule's command (torchrun, then its workers) as its own children. SLURM's
``--signal=<sig>@<lead>`` goes to the job step's processes, but under ``proctrack/cgroup`` (the setting SchedMD
recommends, and what most GPU clusters run) only to the step's *tasks*: the direct children of ``slurmstepd``, i.e.
that inner Snakemake. Every process below it gets SIGKILL only, when the step ends or the time limit's ``KillWait``
runs out (``proctrack_cgroup.c``: "only signal slurm tasks unless signal is SIGKILL"). The inner Snakemake, on
SIGTERM, only stops scheduling and waits for its running job (and then reports it failed, however it ended); nothing
forwards the warning. So on such a cluster the workers never hear it, train until the limit, and are killed with
everything since their last periodic checkpoint lost. (Under ``proctrack/linuxproc`` or ``pgid`` the signal reaches every process of the step; the
rules ``exec`` the launcher so that no shell dies between Snakemake and torchrun there: docs/paper-profile.md.)

How the trainer stops in time. The main process asks SLURM for its job's end time at start and every
:data:`POLL_S` seconds after (``squeue -h -j $SLURM_JOB_ID -o %e``; a ``scontrol update TimeLimit=...`` is seen at
the next poll). After each step it stops (saves a checkpoint, exits 130: :class:`opdgrpo.train.loop.Interrupted`)
when what must fit before its next chance to stop, the evaluation due before the next step, that step and a
checkpoint save, plus :data:`EXIT_MARGIN_S`, no longer fits in the time left. Each of those is the longest this
attempt has measured; a save not yet measured is estimated from the checkpoint's bytes
(:func:`opdgrpo.train.checkpoint.expected_save_seconds`). Outside SLURM (no ``SLURM_JOB_ID``), or with no time
limit, nothing of this runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

#: Seconds between two questions to SLURM about the job's end time (one ``squeue`` call each, by the main process).
POLL_S = 60.0
#: Seconds kept back after the save: the processes' exit (the engine's shutdown, torchrun's, Snakemake's) and the
#: clocks of the node and the controller. SLURM enforces a time limit at its periodic check, never before it.
EXIT_MARGIN_S = 30.0
#: SLURM's warning to a training job (``--signal=URG@<lead>``, workflow/rules/common.smk), a backstop for a job that
#: cannot read its end time: SIGURG, whose default action is to do nothing, so the processes that do not handle it
#: (Snakemake, torchrun) carry on as they were, and the workers, which do, stop (:func:`opdgrpo.train.loop.train`).
#: A SIGTERM would make the step's Snakemake report its job failed even when the job then finishes well.
WARNING_SIGNAL = "URG"
#: What ``squeue -o %e`` prints for a job without an end time.
NO_END = ("Unknown", "N/A", "NONE", "INVALID", "")


def job_end(job_id: str, squeue: str = "squeue") -> float | None:
    """The SLURM job's end time (seconds since the epoch), or None: no such job, no time limit, no ``squeue``, or
    SLURM not answering (the caller keeps what it knew)."""
    try:
        done = subprocess.run([squeue, "-h", "-j", str(job_id), "-o", "%e"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = done.stdout.strip().splitlines()[0].strip() if done.returncode == 0 and done.stdout.strip() else ""
    if text in NO_END:
        return None
    try:   # squeue prints local time, as does time.mktime's reading of it: the same node's clock
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


@dataclass
class Durations:
    """The longest step, evaluation and checkpoint save this attempt has measured (seconds); ``save_s`` starts at an
    estimate until a save is measured."""

    step_s: float = 0.0
    eval_s: float = 0.0
    save_s: float = 0.0
    save_measured: bool = False

    def step(self, seconds: float) -> None:
        self.step_s = max(self.step_s, seconds)

    def evaluation(self, seconds: float) -> None:
        self.eval_s = max(self.eval_s, seconds)

    def save(self, seconds: float) -> None:
        self.save_s = max(self.save_s if self.save_measured else 0.0, seconds)
        self.save_measured = True


@dataclass
class TimeLimit:
    """The job's end time, as SLURM last said it, and the decision to stop before it (module docstring)."""

    job_id: str
    query: Callable[[str], float | None] = job_end
    clock: Callable[[], float] = time.time
    poll_s: float = POLL_S
    margin_s: float = EXIT_MARGIN_S
    end: float | None = None
    asked: float = field(default=float("-inf"))

    @classmethod
    def from_environment(cls) -> TimeLimit | None:
        """The limit of the SLURM job this process runs in; None outside SLURM or where ``squeue`` is missing."""
        job = os.environ.get("SLURM_JOB_ID")
        if not job or shutil.which("squeue") is None:
            return None
        return cls(job)

    def seconds_left(self) -> float | None:
        """Seconds until the job's end (asking SLURM again once :attr:`poll_s` has passed), None without a limit."""
        now = self.clock()
        if now - self.asked >= self.poll_s:
            self.asked = now
            end = self.query(self.job_id)
            if end is not None:
                self.end = end
        return None if self.end is None else self.end - now

    def why_stop(self, durations: Durations, evaluation_due: bool) -> str | None:
        """Why the run must stop now (a sentence for the log), or None while the next evaluation (if ``evaluation_due``),
        the next step and a save still fit before the end with :attr:`margin_s` to spare."""
        left = self.seconds_left()
        if left is None:
            return None
        work = durations.step_s + (durations.eval_s if evaluation_due else 0.0)
        need = work + durations.save_s + self.margin_s
        if left >= need:
            return None
        parts = ("an evaluation, " if evaluation_due else "") + "a step"
        saved = "a save" if durations.save_measured else "a save (estimated)"
        return (f"SLURM job {self.job_id} ends in {left:.0f} s, less than {parts} ({work:.0f} s), {saved} "
                f"({durations.save_s:.0f} s) and a {self.margin_s:.0f}-s margin")
