"""GPU slots on one machine: which of its GPUs a job started by local Snakemake may use, and for how long.

Snakemake's local executor bounds how many GPUs its running jobs ask for (the rules' ``gpu_slots`` resource, at most
``machine.gpus``) but never says which devices a job gets, so two jobs of 2 GPUs would both take devices 0 and 1.
Here each GPU of the machine is a lock file in one directory (:func:`slot_path`); a job claims its count before its
launcher starts (:mod:`opdgrpo.launch`), runs with ``CUDA_VISIBLE_DEVICES`` set to its devices alone, and the files
stay locked while any process of the job lives:

- **claim** (:func:`claim`): under the directory's claim lock, a slot is free when no process holds any lock on its
  file (an exclusive ``flock`` that does not block); the job takes the first free slots in order, all it needs or
  none (a job never holds some while it waits for more, so two waiting jobs cannot block each other), and keeps
  them as shared locks. Taking them shared lets every process of the job hold them too.
- **hold** (:func:`hold`): the claiming process ``exec``s into the launcher, and its lock (an open file, made
  inheritable) goes with it; torchrun starts its workers with their descriptors closed, so each process the job
  starts through the CLI takes its own shared lock on the same files as it starts (:mod:`opdgrpo.cli`). A slot is
  free again when the job's last process exits, however it ends (done, a crash, SIGKILL, out of memory): the kernel
  drops a process's locks with it, so there is nothing to clean up and no state to go stale.
- **wait**: where too few slots are free (jobs of another ``snakemake`` on the same machine and ``slots_dir``, or a
  process left from an earlier run that still holds its GPU), the job waits and says which job and which processes
  hold each busy slot (:func:`holders`: the kernel's lock table), again every minute.

A slot's side file (``gpu-<device>.json``) names the job that last claimed it, for the messages and for
``opdgrpo slots``; it is only information: the lock alone decides.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

#: What the rules export on a machine (JSON): {"jobs": {job directory: its GPU count}, "slots": null or
#: {"dir": the lock directory, "devices": the machine's device ids}}; "slots" is null where SLURM assigns devices.
MACHINE_ENV = "OPDGRPO_MACHINE"
#: What the launcher exports to the job it starts (JSON, :class:`Claim`'s record): the slots it holds.
RECORD_ENV = "OPDGRPO_GPU_SLOTS"
#: Seconds between two looks at busy slots, and between two messages about them.
POLL_S, SAY_EVERY_S = 2.0, 60.0
CLAIM_LOCK = "claim.lock"

#: Locks this process holds for its job (:func:`hold`): kept open until the process exits.
_HELD: list[int] = []


@dataclass(frozen=True)
class Claim:
    """The slots a job holds: their indices on the machine, their device ids (``CUDA_VISIBLE_DEVICES``), the lock
    directory, when they were claimed (seconds since the epoch) and how long the job waited for them."""

    slots: tuple[int, ...]
    devices: tuple[str, ...]
    dir: str
    acquired_at: float
    waited_s: float

    def record(self) -> dict:
        return {**asdict(self), "slots": list(self.slots), "devices": list(self.devices)}


def machine_devices(gpus: int, visible: str | None, found: int) -> list[str]:
    """The device ids of the machine's ``gpus`` slots: the first ``gpus`` of ``CUDA_VISIBLE_DEVICES`` where Snakemake
    runs with it set (``visible``; inside a SLURM allocation, SLURM's), else 0 to gpus-1. ``found``: the GPUs CUDA
    sees (0 on a machine without: the slots then stand for GPUs, as in the rehearsal on CPUs). ValueError naming
    ``machine.gpus`` where the machine has fewer."""
    if visible is not None and visible.strip():
        ids = [d.strip() for d in visible.split(",") if d.strip()]
        if len(ids) < gpus:
            raise ValueError(f"machine.gpus is {gpus}, but CUDA_VISIBLE_DEVICES names {len(ids)} devices ({visible}): "
                             "lower machine.gpus or make more devices visible")
        return ids[:gpus]
    if 0 < found < gpus:
        raise ValueError(f"machine.gpus is {gpus}, but CUDA sees {found} GPUs on this machine: lower machine.gpus")
    return [str(i) for i in range(gpus)]


def slot_path(directory: Path, device: str) -> Path:
    """A slot's lock file: one per device id (``CUDA_VISIBLE_DEVICES`` may name devices by UUID)."""
    return Path(directory) / f"gpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', str(device))}.lock"


@contextlib.contextmanager
def _claim_lock(directory: Path) -> Iterator[None]:
    """The directory-wide lock under which slots are tested and taken (so a test and a take are one step)."""
    fd = os.open(Path(directory) / CLAIM_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _try_free(path: Path) -> int | None:
    """An open descriptor of ``path`` locked exclusively where no process holds a lock on it; else None."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _take(directory: Path, devices: Sequence[str], count: int, job: str) -> list[tuple[int, int]] | None:
    """Under the claim lock: the first ``count`` free slots as (index, descriptor), locked shared; or None (and no
    lock kept) where fewer are free."""
    with _claim_lock(directory):
        taken: list[tuple[int, int]] = []
        for i, device in enumerate(devices):
            fd = _try_free(slot_path(directory, device))
            if fd is not None:
                taken.append((i, fd))
            if len(taken) == count:
                break
        if len(taken) < count:
            for _, fd in taken:
                os.close(fd)
            return None
        now = time.time()
        for i, fd in taken:
            # shared, so the job's other processes may lock it too; the claim lock keeps any other claimant out
            # while the exclusive lock turns shared (flock converts a lock by dropping and retaking it)
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.set_inheritable(fd, True)
            side = slot_path(directory, devices[i]).with_suffix(".json")
            side.write_text(json.dumps({"job": job, "pid": os.getpid(), "since": now, "device": devices[i]}))
        return taken


def claim(directory: Path | str, devices: Sequence[str], count: int, job: str, *,
          say: Callable[[str], None] | None = None, poll_s: float = POLL_S, timeout_s: float | None = None) -> Claim:
    """Wait for ``count`` free slots of ``devices`` in ``directory``, and hold them (module docstring). ``say``
    reports a wait (default: standard error); ``timeout_s`` (tests) raises TimeoutError after so long."""
    if not 1 <= count <= len(devices):
        raise ValueError(f"job {job!r} asks for {count} GPU slots of a machine of {len(devices)}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    started, said = time.monotonic(), None
    while True:
        taken = _take(directory, devices, count, job)
        if taken is not None:
            _HELD.extend(fd for _, fd in taken)
            slots = tuple(i for i, _ in taken)
            return Claim(slots, tuple(devices[i] for i in slots), str(directory), time.time(),
                         round(time.monotonic() - started, 1))
        waited = time.monotonic() - started
        if timeout_s is not None and waited > timeout_s:
            raise TimeoutError(f"job {job!r}: no {count} free GPU slots in {directory} after {timeout_s} s")
        if said is None or time.monotonic() - said >= SAY_EVERY_S:
            say(waiting_message(directory, devices, count, job, waited))
            said = time.monotonic()
        time.sleep(poll_s)


def waiting_message(directory: Path, devices: Sequence[str], count: int, job: str, waited: float) -> str:
    """What a waiting job says: how many slots it needs, and who holds each busy one."""
    busy = [f"slot {i} (device {d}): {describe(directory, d)}" for i, d in enumerate(devices)
            if holders(slot_path(directory, d))]
    return (f"gpu slots: job {job} waits for {count} of {len(devices)} GPU slots ({directory}, waited "
            f"{waited:.0f} s); busy: " + ("; ".join(busy) or "none now (retrying)")
            + ". A slot is free when every process of the job holding it has exited; a process left from an earlier "
              "run holds its slot until it is ended (kill <pid>)")


def describe(directory: Path, device: str) -> str:
    """Who holds a slot: the job that claimed it (its side file) and the processes that hold its lock now."""
    side = slot_path(directory, device).with_suffix(".json")
    try:
        info = json.loads(side.read_text())
        job = f"job {info['job']} (claimed {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info['since']))})"
    except (OSError, ValueError, KeyError):
        job = "an unknown job"
    pids = holders(slot_path(directory, device))
    procs = ", ".join(f"pid {p} ({_cmdline(p)})" if p > 0 else "a process" for p in pids) or "no process now"
    return f"{job}, held by {procs}"


def holders(path: Path) -> list[int]:
    """The processes holding a lock on ``path`` now, from the kernel's lock table (``/proc/locks``); where that is
    unreadable, ``[-1]`` if the file is locked (by a process it cannot name) and ``[]`` if not."""
    try:
        st = path.stat()
    except OSError:
        return []
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        fd = _try_free(path)
        if fd is None:
            return [-1]
        os.close(fd)
        return []
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = [int(f[4]) for f in (line.split() for line in table.splitlines())
            if len(f) >= 6 and f[1] == "FLOCK" and f[5] == key]   # "->" lines are waiters, not holders
    return sorted(set(pids))


def _cmdline(pid: int) -> str:
    try:
        parts = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "exited"
    text = " ".join(" ".join(p.decode(errors="replace").split()) for p in parts if p)
    return text if len(text) <= 120 else text[:117] + "..."


def hold(record: Mapping) -> None:
    """Lock this process's job's slots (``record``: :meth:`Claim.record`, from :data:`RECORD_ENV`) shared, for as long
    as it lives: the job's slots stay busy while any of its processes runs, even if the one that claimed them is gone."""
    for device in record.get("devices") or []:
        fd = os.open(slot_path(Path(record["dir"]), device), os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(fd, fcntl.LOCK_SH)   # a claimant's exclusive test lasts an instant: wait it out
        _HELD.append(fd)


def record_of(environ: Mapping[str, str] = os.environ) -> dict | None:
    """The slots the job runs on (:data:`RECORD_ENV`, set by the launcher), or None where no slot was claimed (no
    machine block, SLURM, a job started by hand)."""
    value = environ.get(RECORD_ENV)
    return json.loads(value) if value else None


def record_into(summary: dict) -> dict:
    """``summary`` (a job's ``done.json``, an attempt's record) with ``gpu_slots``: the slots the job runs on, where
    the launcher claimed some; unchanged elsewhere, so a job off a machine writes what it always wrote."""
    record = record_of()
    if record is not None:
        summary["gpu_slots"] = record
    return summary


def hold_from_env(environ: Mapping[str, str] = os.environ) -> None:
    """:func:`hold` the job's slots where the launcher claimed some (every job process the CLI starts)."""
    record = record_of(environ)
    if record and record.get("devices"):
        hold(record)


def slots_status(directory: Path | str) -> list[str]:
    """One line per slot that a job has claimed in ``directory``: free, or who holds it (``opdgrpo slots``)."""
    directory = Path(directory)
    locks = sorted(directory.glob("gpu-*.lock"), key=lambda p: (len(p.stem), p.stem)) if directory.is_dir() else []
    if not locks:
        return [f"no slot claimed yet in {directory}"]
    lines = []
    for path in locks:
        device = path.stem.removeprefix("gpu-")
        lines.append(f"device {device}: " + (describe(directory, device) if holders(path) else "free"))
    return lines
