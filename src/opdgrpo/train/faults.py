"""Test-only fault injection: kill the process or poison a tensor at a named point of a training step.

``OPDGRPO_FAULT`` holds comma-separated ``<point>:<step>`` items, e.g. ``OPDGRPO_FAULT=checkpoint_write:4`` or
``OPDGRPO_FAULT=nan_loss:1,nan_loss:2``. Kill points (:func:`kill_point`) SIGKILL the process, as an OOM killer or a
preempted node would: ``rollout``, ``update``, ``eval``, ``checkpoint_write``, ``checkpoint_rename``; ``term_eval``
(:func:`signal_point`) sends SIGTERM during an evaluation, as SLURM's warning would. Poison points
(:func:`poison`) are asked by the trainer whether to put a NaN into a tensor: ``nan_loss``, ``nan_logits``,
``nan_teacher``, ``nan_reference``, ``nan_reward``. ``step`` is the training step (for checkpoints: the step the
checkpoint records; for ``eval``: the step the eval is logged at). ``pace:<seconds>`` (:func:`pace`) makes every
training step last at least that long, as a step of a large model would (a run cut by a time limit, whatever the
machine's speed). ``checkpoint_s:<seconds>`` (:func:`pace_checkpoint`) makes every checkpoint save last at least that
long, as a large model's write and hash on a shared filesystem would (the stop signal's lead must cover it).

With the variable unset every call is one dictionary lookup; nothing else runs.
"""

from __future__ import annotations

import os
import signal
import time

ENV = "OPDGRPO_FAULT"


def armed(point: str, step: int) -> bool:
    """Whether ``OPDGRPO_FAULT`` names ``point`` at ``step``."""
    spec = os.environ.get(ENV)
    if not spec:
        return False
    return f"{point}:{step}" in {item.strip() for item in spec.split(",")}


def kill_point(point: str, step: int) -> None:
    """SIGKILL this process if the fault is armed: no handler, no cleanup, no flush, exactly like ``kill -9``."""
    if armed(point, step):
        os.kill(os.getpid(), signal.SIGKILL)


def signal_point(point: str, step: int) -> None:
    """SIGTERM this process if the fault is armed (``term_eval``: SLURM's warning during an evaluation); the trainer's
    handler notes it, as it would the real one."""
    if armed(point, step):
        os.kill(os.getpid(), signal.SIGTERM)


def poison(point: str, step: int) -> bool:
    """Whether the caller should put a NaN into its tensor at this point (the caller does it, so the clean path
    stays byte-for-byte what it was)."""
    return armed(point, step)


def pace(started: float, point: str = "pace") -> None:
    """Sleep until ``started`` + the ``<point>:<seconds>`` of ``OPDGRPO_FAULT`` (``pace``: a training step;
    ``checkpoint_s``: a checkpoint save), if it names one (numbers unchanged)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    for item in spec.split(","):
        name, _, seconds = item.strip().partition(":")
        if name == point:
            time.sleep(max(0.0, started + float(seconds) - time.time()))


def pace_checkpoint(started: float) -> None:
    """A checkpoint save that lasts at least ``checkpoint_s:<seconds>`` (see :func:`pace`)."""
    pace(started, "checkpoint_s")
