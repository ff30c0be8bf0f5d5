"""Run several commands at once and collect each one's result (tests whose commands are independent and mostly
single-core, e.g. Snakemake dry runs, on a machine with more than one core)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence


def run_side_by_side(cmds: Mapping[str, Sequence[str]], timeout: float, **popen) -> dict[str, subprocess.CompletedProcess]:
    """Start every command, wait for all (``timeout`` seconds in all), return name -> CompletedProcess (text output).
    On any error, every command still running is killed before the error propagates."""
    procs = {name: subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
             for name, cmd in cmds.items()}
    deadline = time.time() + timeout
    done = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=max(1.0, deadline - time.time()))
            done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return done
