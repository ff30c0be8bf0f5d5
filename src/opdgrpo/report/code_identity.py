"""The report's code as part of its identity: a digest of the modules that render it, so a changed rule (a new
standard error, a fixed verdict) re-renders a finished report, which the report rule's params carry. Training jobs
keep code out of theirs: rerunning every run on each commit would cost hours; the report costs seconds."""

from __future__ import annotations

import hashlib
from pathlib import Path

#: The packages whose code decides what the report says: its own, and the studies' declarations (claims, checks).
RENDERING_PACKAGES = ("report", "plan/studies")


def code_digest(root: Path | None = None) -> str:
    """sha256 over the relative path and bytes of every ``.py`` file of :data:`RENDERING_PACKAGES` under ``root``
    (the installed ``opdgrpo`` package by default), in sorted order."""
    root = Path(__file__).resolve().parents[1] if root is None else Path(root)
    digest = hashlib.sha256()
    for package in RENDERING_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
