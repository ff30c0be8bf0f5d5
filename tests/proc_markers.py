"""Find processes left behind by a sandboxed run: the tests tag them with a unique marker in their argv or
environment and scan the caller's /proc for it (the sandboxed program sees its own /proc, so it cannot report
the pid the caller sees)."""

from __future__ import annotations

import os
import time


def survivors(marker: str) -> list[str]:
    """Pids (as strings) of live processes, other than this one, with ``marker`` in their cmdline or environ."""
    needle = marker.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                if fh.read().rpartition(")")[2].split()[0] == "Z":  # zombies count as gone
                    continue
            hit = False
            for part in ("environ", "cmdline"):
                with open(f"/proc/{name}/{part}", "rb") as fh:
                    hit = hit or needle in fh.read()
        except OSError:
            continue
        if hit:
            found.append(name)
    return found


def survivors_after(marker: str, grace_s: float = 3.0) -> list[str]:
    """The survivors still there after waiting up to ``grace_s`` for them to go (empty when all went)."""
    end = time.monotonic() + grace_s
    while (left := survivors(marker)) and time.monotonic() < end:
        time.sleep(0.05)
    return left
