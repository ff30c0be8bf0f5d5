"""Files of a run directory: atomic writes and append-only JSON lines that survive a kill.

A job that is killed mid-write leaves at most a truncated last line in a ``.jsonl`` file; readers
skip it and a resumed job rewrites the file up to its checkpoint, so no step is counted twice.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSON-lines file; a truncated last line (a killed writer) is dropped."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: not a JSON record ({err})") from err
    return records


def rewrite_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))


def keep_records(path: Path, keep: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """Rewrite a JSON-lines file with only the records ``keep`` accepts (used on resume)."""
    kept = [r for r in read_jsonl(path) if keep(r)]
    rewrite_jsonl(path, kept)
    return kept
