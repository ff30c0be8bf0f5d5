"""Files of a run directory: atomic writes and append-only JSON lines that survive a kill.

A job that is killed mid-write leaves at most a truncated last line in a ``.jsonl`` file; readers
skip it and a resumed job rewrites the file up to its checkpoint, so no step is counted twice.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import yaml

#: The eval set name under which a run trained on a prompt subset (S2) scores those training prompts; the report
#: keeps it out of held-out accuracy.
IN_DOMAIN_SET = "in_domain"


JOB_LOCK = ".lock"

log = logging.getLogger("opdgrpo.runio")

_HELD: set[Path] = set()   # output directories whose job lock this process holds (the lock is re-entrant)


class DirectoryInUse(RuntimeError):
    """Another live process runs a job in this output directory."""


@contextlib.contextmanager
def job_lock(out_dir: Path) -> Iterator[None]:
    """Hold ``out_dir/.lock`` (an exclusive ``flock``, created with ``out_dir`` if missing) while a job runs there, or
    raise :class:`DirectoryInUse` at once, naming the holder's pid and host. Re-entrant within a process: the CLI
    takes it for every job command, and :func:`opdgrpo.train.loop.train` again for callers that train by hand.

    Why: Snakemake never schedules two jobs on one output, but its lock guards a working directory only until someone
    runs ``snakemake --unlock`` (which its lock message suggests); a second ``snakemake`` then starts the jobs the
    first is still running, and two processes write one run (its attempt records, its checkpoint). With this lock the
    second job stops before it touches anything and the first finishes. The lock belongs to the open file, so the
    kernel drops it when the holder exits or is killed (kill -9 included): a stale file never blocks. Where the file
    system has no ``flock`` (some NFS mounts) the job runs unguarded, with a warning."""
    out_dir = Path(out_dir).absolute()
    if out_dir in _HELD:
        yield
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(out_dir / JOB_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
                raise DirectoryInUse(
                    f"{out_dir} is in use by another process ({holder}); two jobs must never write one output "
                    "directory (a second snakemake after `--unlock`?): wait for it to finish or stop it, then rerun"
                ) from None
            log.warning("%s: cannot lock (%s); running without the job lock", out_dir / JOB_LOCK, err)
        else:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}\n".encode(), 0)
        _HELD.add(out_dir)
        try:
            yield
        finally:
            _HELD.discard(out_dir)
    finally:
        os.close(fd)  # releases the lock


def file_sha256(path: Path) -> str:
    """The sha256 of a file's contents, read in 1 MiB blocks (checkpoints are tens of GiB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


#: A run's history files, recorded in its ``done.json`` so the report can tell a whole history from an edited one.
HISTORY = ("evals.jsonl", "ledger.jsonl")


def history_record(run_dir: Path) -> dict[str, Any]:
    """``{file: {"bytes", "sha256"}}`` of a finished run's :data:`HISTORY`, for its ``done.json``."""
    return {name: {"bytes": (run_dir / name).stat().st_size, "sha256": file_sha256(run_dir / name)}
            for name in HISTORY if (run_dir / name).is_file()}


def history_changes(run_dir: Path) -> list[str]:
    """How a finished run's history differs from what its ``done.json`` recorded (deleted, cut, rewritten); [] when
    it is as written, or when the run predates the record. A report built on an edited history would plot a curve
    no run produced."""
    done = Path(run_dir) / "done.json"
    try:
        recorded = json.loads(done.read_text()).get("history") or {}
    except (OSError, ValueError, AttributeError):
        return []
    changes = []
    for name, want in sorted(recorded.items()):
        file = Path(run_dir) / name
        if not file.is_file():
            changes.append(f"{file} is missing")
        elif file.stat().st_size != want["bytes"] or file_sha256(file) != want["sha256"]:
            changes.append(f"{file} differs from the one its run wrote ({file.stat().st_size} bytes, recorded "
                           f"{want['bytes']})")
    return changes


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_yaml(path: Path, obj: Any) -> None:
    atomic_write_text(path, yaml.safe_dump(obj, sort_keys=False))


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one line, all or nothing: a failed write (disk full) is cut back off, so the earlier lines stay and
    the next append does not turn a partial line into a malformed middle line."""
    data = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
        except BaseException:
            os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def iter_jsonl(path: Path, *, missing_ok: bool = False,
               warning: type[Warning] = UserWarning) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of a JSON-lines file, the one reader of run files (ledgers, evaluations).

    A line that is not a JSON object raises ``ValueError`` naming ``path:line``, except the last non-blank line, which
    a writer killed mid-append leaves truncated: it is skipped with a ``warning``. A missing file is an empty one
    with ``missing_ok``, else ``FileNotFoundError``.
    """
    path = Path(path)
    if not path.is_file():
        if missing_ok:
            return
        raise FileNotFoundError(f"{path}: file not found")
    lines = path.read_text(encoding="utf-8").splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if i == last:
                warnings.warn(f"{path}:{i + 1}: skipping truncated last line ({err.msg})", warning, stacklevel=3)
                continue
            raise ValueError(f"{path}:{i + 1}: malformed JSON ({err.msg})") from err
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{i + 1}: expected a JSON object, got {type(record).__name__}")
        yield i + 1, record


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a run's JSON-lines file ([] when it does not exist yet; see :func:`iter_jsonl`)."""
    return [record for _, record in iter_jsonl(path, missing_ok=True)]


def rewrite_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))


def keep_records(path: Path, keep: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """Rewrite a JSON-lines file with only the records ``keep`` accepts (used on resume)."""
    kept = [r for r in read_jsonl(path) if keep(r)]
    rewrite_jsonl(path, kept)
    return kept
