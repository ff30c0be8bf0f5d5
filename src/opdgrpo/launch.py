"""A job's start on one machine: its GPU count and its GPU slots, then the launcher, ``exec``'d.

``python -m opdgrpo.launch -- COMMAND...`` is what the rules' launcher placeholders (``{PYTHON}``, ``{OPDGRPO}``,
``{LAUNCH_CMD}``, workflow/rules/common.smk) expand to on a profile with a ``machine`` block: the rules' shell text
stays what it is on every profile (Snakemake reruns a job whose rule's shell text changed), and what differs per job
travels in the environment the rules export (:data:`opdgrpo.gpu_slots.MACHINE_ENV`, keyed by the job's ``--out``):

1. **The count.** A torchrun command's ``--nproc_per_node`` becomes the job's count, the planner's choice for it
   (:mod:`opdgrpo.cost.gpu_counts`): one process per GPU.
2. **The slots**, where Snakemake runs the jobs itself (its local executor: the rules fill in the slots at
   ``onstart``; under SLURM they stay empty, SLURM assigns the devices and this step is skipped): the job claims
   its count of GPU slots (:func:`opdgrpo.gpu_slots.claim`, waiting with a message while they are busy), and runs
   with ``CUDA_VISIBLE_DEVICES`` set to its devices alone (``CUDA_DEVICE_ORDER=PCI_BUS_ID`` where unset, so the ids
   are ``nvidia-smi``'s) and the claim in :data:`opdgrpo.gpu_slots.RECORD_ENV`; a job with no GPU (a tokenizer, the
   report) runs with no device visible.
3. **The exec.** This process becomes the command (``os.execvpe``): nothing stands between Snakemake and the
   launcher (docs/paper-profile.md, "Stopping before the time limit"), and the slots' locks, open in this process,
   stay held by it.

The job's log begins with one line saying its count, its slots and how long it waited for them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import PurePath
from typing import Mapping, Sequence

from opdgrpo import gpu_slots

#: torchrun's process count, in both spellings it accepts.
NPROC = ("--nproc_per_node", "--nproc-per-node")


def job_out(command: Sequence[str]) -> str | None:
    """The job's directory: the value of the command's ``--out`` (every job the rules start passes one), normalised
    as :func:`opdgrpo.job_identity.job_key` names jobs."""
    for i, arg in enumerate(command):
        if arg == "--out" and i + 1 < len(command):
            return str(PurePath(command[i + 1]))
        if arg.startswith("--out="):
            return str(PurePath(arg.split("=", 1)[1]))
    return None


def with_processes(command: Sequence[str], count: int) -> list[str]:
    """``command`` with torchrun's ``--nproc_per_node`` set to ``count`` (unchanged where it has none)."""
    out = list(command)
    for i, arg in enumerate(out):
        if arg in NPROC and i + 1 < len(out):
            out[i + 1] = str(count)
        elif arg.split("=", 1)[0] in NPROC and "=" in arg:
            out[i] = f"{arg.split('=', 1)[0]}={count}"
    return out


def prepare(command: Sequence[str], environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command and environment the job runs with (module docstring), its slots claimed where the machine's
    settings name a slot directory."""
    env = dict(environ)
    machine = json.loads(environ.get(gpu_slots.MACHINE_ENV) or "{}")
    out = job_out(command)
    count = int((machine.get("jobs") or {}).get(out or "", 0))
    command = with_processes(command, count) if count else list(command)
    slots = machine.get("slots")
    if not slots:
        return command, env
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if count == 0:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.pop(gpu_slots.RECORD_ENV, None)
        return command, env
    claim = gpu_slots.claim(slots["dir"], [str(d) for d in slots["devices"]], count, out or "?")
    env["CUDA_VISIBLE_DEVICES"] = ",".join(claim.devices)
    env[gpu_slots.RECORD_ENV] = json.dumps(claim.record(), sort_keys=True)
    print(f"gpu slots: job {out} on {count} GPU(s): slots {','.join(map(str, claim.slots))} "
          f"(CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}), after waiting {claim.waited_s:.0f} s",
          file=sys.stderr, flush=True)
    return command, env


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m opdgrpo.launch -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    try:
        command, env = prepare(argv, os.environ)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    os.execvpe(command[0], command, env)
    return 0   # not reached


if __name__ == "__main__":
    sys.exit(main())
