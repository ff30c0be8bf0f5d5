"""Attempts of one training job: a run longer than one SLURM allocation finishes over several.

Snakemake resubmits a failed job up to ``retries`` times (workflow/profiles/slurm) and tells the job its attempt
number (the rules pass ``--attempt``). A job stopped by SLURM's warning signal checkpoints and exits 130; the next
attempt resumes from that checkpoint, so every step runs exactly once over all attempts.

Snakemake retries every failure alike: it does not see why a job failed. So the job itself decides, from
``attempts.jsonl`` in the run directory (one ``begin`` line per attempt, one ``end`` line when it ends on its own),
whether a retry should train at all. Attempt ``n > 1`` trains only if attempt ``n - 1``

- ended ``interrupted`` (a signal: checkpointed and stopped), or was killed without writing an ``end`` line (SIGKILL
  at the time limit, out of memory, a lost node), and
- left a newer checkpoint than the one it started from (it made progress);

or if attempt ``n - 1`` ended ``done`` but its job still failed (killed while exiting, at the very end of its
allocation, after which Snakemake deleted ``done.json``): then it resumes at the final checkpoint, trains no step and
writes what was lost.

Otherwise (a crash, a non-finite step, an attempt that never got to checkpoint) it refuses in seconds, before loading
any model, with exit status 4 and a message naming the attempt and its error, so a real error is not trained into
again and again: the remaining retries each end the same way at once, and Snakemake reports the failure with the
log. A new ``snakemake`` invocation starts again at attempt 1, which always trains (after a fix, or to retry by hand).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from opdgrpo import gpu_slots

ATTEMPTS = "attempts.jsonl"
#: Exit statuses of ``opdgrpo train``: interrupted and checkpointed (retry resumes), non-finite step, not retried.
INTERRUPTED, NONFINITE, NOT_RETRIED = 130, 3, 4


class NotRetried(RuntimeError):
    """This attempt refuses to train: the previous one failed for a reason a retry would repeat."""


def records(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / ATTEMPTS
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:   # a line cut by a kill mid-write
            continue
    return out


def _append(run_dir: Path, record: dict[str, Any]) -> None:
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(run_dir) / ATTEMPTS, "a") as f:
        f.write(json.dumps(record) + "\n")


def checkpoint_step(run_dir: Path) -> int:
    """The step of the newest checkpoint (0 without one), read without loading its tensors."""
    import torch

    for name in ("checkpoint", "checkpoint.old"):
        state = Path(run_dir) / name / "trainer_state.pt"
        if state.is_file():
            try:
                return int(torch.load(state, mmap=True, weights_only=False, map_location="cpu")["step"])
            except Exception:   # corrupt: the trainer's resume_point says so and falls back
                continue
    return 0


def _process_name(pid: int) -> str | None:
    """A short name of process ``pid``: a Python process by the module it runs (``-m torch.distributed.run``) or its
    script's file name, any other by its command name; None once the process is gone or /proc is missing."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    args = [a.decode(errors="replace") for a in argv if a]
    if args and Path(args[0]).name.startswith("python"):
        if "-m" in args[1:-1]:
            return args[args.index("-m") + 1]
        if "-c" in args[1:]:
            return "python -c"
        return Path(args[1]).name if len(args) > 1 else comm
    return comm


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def launched_by(depth: int = 6) -> list[str]:
    """The processes above this one, nearest first, up to ``slurmstepd`` (a SLURM job step) or ``depth`` of them:
    which process a signal to the job step reaches and which one waits for this (docs/paper-profile.md, "Stopping
    before the time limit"); the rules ``exec`` the launcher, so no shell stands between it and Snakemake."""
    names, pid = [], os.getppid()
    while pid > 1 and len(names) < depth:
        name = _process_name(pid)
        if name is None:
            break
        names.append(name)
        if name == "slurmstepd":
            break
        pid = _parent(pid)
    return names


def begin(run_dir: Path, attempt: int) -> int:
    """Check that attempt ``attempt`` may train (raises NotRetried), record it and return its starting step."""
    step = checkpoint_step(run_dir)
    if attempt > 1:
        seen = records(run_dir)
        starts = [i for i, r in enumerate(seen) if "begin" in r]
        if starts:
            prev = seen[starts[-1]]
            ends = [r for r in seen[starts[-1] + 1:] if "end" in r]
            how = ends[-1]["end"] if ends else "killed"
            if how == "done":
                # Trained to the end, then killed on its way out (the allocation's end, a node lost): Snakemake
                # deleted done.json as possibly incomplete. Resuming at the final checkpoint runs no step; it
                # repeats the final evaluation (seeded by step: the same numbers) and writes done.json again.
                print(f"== attempt {attempt}: attempt {prev['attempt']} trained to the end (checkpoint step {step}) "
                      "but its job did not exit cleanly: writing what it left unwritten", file=sys.stderr, flush=True)
            elif how not in ("interrupted", "killed"):
                raise NotRetried(f"attempt {attempt}: not training, attempt {prev['attempt']} ended {how}"
                                 f" ({ends[-1].get('error', '')}); a retry would repeat it. Fix it and rerun snakemake")
            elif step <= int(prev["step"]):
                raise NotRetried(f"attempt {attempt}: not training, attempt {prev['attempt']} ({how}) left no checkpoint "
                                 f"past step {prev['step']}: the allocation is too short for a step and a checkpoint "
                                 "after the warning signal (raise resources.train.runtime or the --signal lead time)")
        # Snakemake deletes the job log before each attempt: it starts with what the earlier ones did.
        first = max((i for i in starts if seen[i]["attempt"] == 1), default=0)
        for i, r in enumerate(seen[first:], first):
            if "begin" in r:
                after = next((e for e in seen[i + 1:] if "end" in e or "begin" in e), {})
                print(f"== attempt {r['attempt']} (SLURM job {r.get('slurm_job') or '-'}, began {r['begin']}): "
                      f"from step {r['step']}, {after.get('end', 'killed')} at checkpoint step {after.get('step', step)}",
                      file=sys.stderr, flush=True)
    begun = {"attempt": attempt, "begin": time.strftime("%Y-%m-%dT%H:%M:%S"), "step": step,
             "slurm_job": os.environ.get("SLURM_JOB_ID"), "launched_by": launched_by()}
    _append(run_dir, gpu_slots.record_into(begun))   # on a machine: the GPU slots of this attempt
    print(f"== attempt {attempt} (SLURM job {os.environ.get('SLURM_JOB_ID', '-')}): "
          f"{'resuming at step ' + str(step) if step else 'starting'}", file=sys.stderr, flush=True)
    return step


def end(run_dir: Path, attempt: int, how: str, error: str | None = None, why: str | None = None) -> None:
    """Record how attempt ``attempt`` ended: ``done``, ``interrupted`` (``why``: the signal, or the SLURM allocation's
    end, :mod:`opdgrpo.train.time_limit`), ``nonfinite``, ``refused`` or ``crashed``; ``at``: when (seconds since the
    epoch), after the checkpoint it names was saved."""
    step = checkpoint_step(run_dir)
    _append(run_dir, {"attempt": attempt, "end": how, "step": step, "at": round(time.time(), 3),
                      **({"why": why} if why else {}), **({"error": error[-500:]} if error else {})})
    print(f"== attempt {attempt}: {how} at checkpoint step {step}", file=sys.stderr, flush=True)
