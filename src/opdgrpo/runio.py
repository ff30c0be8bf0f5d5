"""Files of a run directory: atomic writes and append-only JSON lines that survive a kill.

A job that is killed mid-write leaves at most a truncated last line in a ``.jsonl`` file; readers
skip it and a resumed job rewrites the file up to its checkpoint, so no step is counted twice.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import yaml

#: The eval set name under which a run trained on a prompt subset (S2) scores those training prompts; the report
#: keeps it out of held-out accuracy.
IN_DOMAIN_SET = "in_domain"


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
