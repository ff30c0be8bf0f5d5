"""Live progress in a job's log: what a person running ``tail -f results/<profile>/logs/<job>.log`` sees.

One line per step, or per few seconds when steps are fast (the first and last step always), with steps done and
total, elapsed time and ETA, the step's main numbers, throughput and cumulative FLOPs; a line per evaluation and
per checkpoint; a final summary. Lines are ``key=value`` pairs after a word that says what happened, so they read
as text and ``grep``/``awk`` well::

    progress run=grpo-student-math-s0 step=12/200 6% elapsed=0:00:05 eta=0:01:18 reward=0.312 loss=-0.012 ...
    eval run=grpo-student-math-s0 step=10 math/amc=0.250 math/aime=0.100 seconds=3.2
    checkpoint run=grpo-student-math-s0 step=25 seconds=0.4

They go to the ``opdgrpo.progress`` logger (the job's stderr through the CLI's logging setup).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

log = logging.getLogger("opdgrpo.progress")

#: A step line at least this often (seconds) when steps are faster; every step when they are slower.
EVERY_S = 5.0


def clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) >= 1e4 or (v != 0 and abs(v) < 1e-3) else f"{v:.4g}"
    return str(v)


def fields(values: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={_value(v)}" for k, v in values.items() if v is not None)


class Stages:
    """Lines of a job without steps (the report): one per stage done, with its seconds."""

    def __init__(self, job: str):
        self.job, self.last = job, time.time()

    def __call__(self, stage: str, **values: Any) -> None:
        now = time.time()
        log.info("stage %s", fields({"job": self.job, "stage": stage, **values, "seconds": round(now - self.last, 1)}))
        self.last = now


class Progress:
    """Step lines of one job's loop (``total`` steps; a resumed job starts at ``start``)."""

    def __init__(self, job: str, total: int, start: int = 0, enabled: bool = True, every_s: float = EVERY_S):
        self.job, self.total, self.start, self.enabled, self.every_s = job, total, start, enabled, every_s
        self.began = time.time()
        self.last_line = 0.0
        if enabled and start:
            log.info("resume %s", fields({"run": job, "step": f"{start}/{total}"}))

    def step(self, done: int, values: Mapping[str, Any], step_seconds: float) -> None:
        """After ``done`` steps: a line if this is the first or last step, a slow step, or ``every_s`` has passed."""
        if not self.enabled:
            return
        now = time.time()
        if not (done in (self.start + 1, self.total) or step_seconds >= self.every_s or now - self.last_line >= self.every_s):
            return
        self.last_line = now
        elapsed = now - self.began
        rate = elapsed / max(done - self.start, 1)
        head = {"run": self.job, "step": f"{done}/{self.total}", "pct": f"{100 * done / self.total:.0f}%",
                "elapsed": clock(elapsed), "eta": clock(rate * (self.total - done))}
        log.info("progress %s", fields({**head, **values}))

    def event(self, what: str, values: Mapping[str, Any]) -> None:
        if self.enabled:
            log.info("%s %s", what, fields({"run": self.job, **values}))
