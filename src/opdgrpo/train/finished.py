"""What makes a job's output *finished*, and the check a downstream job makes before it trusts one.

Snakemake calls a job done when its ``done.json`` exists; a later job then loads that job's ``checkpoint/`` as its
student or teacher. A ``done.json`` cut short (a full disk, a copy interrupted) or a ``model.safetensors`` truncated
after the fact would still count as done, and the downstream job would only fail deep inside a model load, after it
had cleared its own finished work to start over. So every job that produces a checkpoint records it in its
``done.json`` when it finishes (:func:`checkpoint_record`: each file's size, and a digest of the contents), and a job
that reads it checks the record first (:func:`verify_finished`): ``done.json`` must parse and every file must be there
at its recorded size. The digest, not the text of ``done.json``, is what a downstream run's identity folds in: a
rewritten ``done.json`` (new wall time, new field) with the same weights changes nothing below it, and new weights
always do.

The digest is the cheapest content identity each kind of checkpoint has:

* a post-training checkpoint carries ``manifest.json`` (sha256 of every file, written when it was sealed): its table;
* a checkpoint written by the base stage (scratch pretraining, random models): sha256 of its files, computed once;
* a hub model, a link into the Hugging Face cache: each file's blob name, which the cache names by the content's
  hash; a ``source: random`` model: its settings (architecture and seed), which decide its weights.

Sizes are checked at every start (a stat per file); full hashes are not recomputed (a 32B teacher is 61 GiB).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from opdgrpo.runio import file_sha256

MANIFEST = "manifest.json"


class BrokenUpstream(RuntimeError):
    """A finished job's output that is not whole: the message names the file, what is wrong and how to redo it."""


def _redo(done: Path) -> str:
    return (f"redo that job with `snakemake --forcerun {done}` (it and every job below it run again); "
            "nothing of this job was changed")


def _table_digest(table: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()


def checkpoint_record(checkpoint: Path, *, hash_contents: bool, settings: Any = None) -> dict[str, Any]:
    """``{"files": {name: bytes}, "digest": ...}`` for ``done.json``: see the module docstring for the digest.
    ``hash_contents``: hash the files (small checkpoints the job just wrote); else, where there is no manifest, the
    resolved file names stand for the contents (the Hugging Face cache's content-addressed blobs), with ``settings``
    (JSON) folded in: what decides the weights where the names do not."""
    files = sorted(p for p in checkpoint.rglob("*") if p.is_file())
    sizes = {p.relative_to(checkpoint).as_posix(): p.stat().st_size for p in files}
    manifest = checkpoint / MANIFEST
    if manifest.is_file():
        contents = {name: entry["sha256"] for name, entry in json.loads(manifest.read_text())["files"].items()}
    elif hash_contents:
        contents = {p.relative_to(checkpoint).as_posix(): file_sha256(p) for p in files}
    else:
        contents = {p.relative_to(checkpoint).as_posix(): p.resolve().name for p in files}
    return {"files": sizes, "digest": _table_digest({"contents": contents, "settings": settings})}


def read_done(done: Path) -> dict[str, Any]:
    """A finished job's ``done.json``, or :class:`BrokenUpstream` naming it (missing, cut short, not a record)."""
    try:
        record = json.loads(done.read_text())
    except FileNotFoundError:
        raise BrokenUpstream(f"{done}: missing: the job that writes it has not finished; run snakemake") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise BrokenUpstream(f"{done}: not valid JSON ({err}): cut short or overwritten; {_redo(done)}") from None
    if not isinstance(record, dict):
        raise BrokenUpstream(f"{done}: holds {type(record).__name__}, not a job's record; {_redo(done)}")
    return record


def verify_finished(checkpoint: Path) -> str:
    """The identity of the finished checkpoint ``checkpoint`` (its digest), after checking its job's ``done.json``
    parses and every file it recorded is there at its recorded size; :class:`BrokenUpstream` otherwise.

    A ``done.json`` written before checkpoints were recorded has no ``checkpoint`` entry: its text stands for the
    identity, as it did then, so runs that resumed from such upstreams keep resuming."""
    done = checkpoint.parent / "done.json"
    record = read_done(done)
    entry = record.get("checkpoint")
    if entry is None:
        return done.read_text()
    for name, size in sorted(entry["files"].items()):
        file = checkpoint / name
        if not file.is_file():
            raise BrokenUpstream(f"{file}: missing, though {done} records it; {_redo(done)}")
        actual = file.stat().st_size
        if actual != size:
            raise BrokenUpstream(f"{file}: {actual} bytes, {done} records {size} (truncated or replaced); {_redo(done)}")
    return str(entry["digest"])
