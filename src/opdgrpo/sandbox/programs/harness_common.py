"""Shared by the code harnesses (function_harness.py, stdio_harness.py), which the host sends with this file first:
each test runs in a forked child in its own process group, and everything it started is killed when it ends."""

import os
import signal
import sys


def own_pid_namespace():
    """Whether the harness is PID 2 of a sandbox's own PID namespace (launcher.py, bwrap_init.py say so): then
    ``kill(-1)`` ends whatever a test left behind, even what escaped its group (setsid); PID 1 and we are spared."""
    return os.environ.get("OPDGRPO_SANDBOX_PIDNS") == "1" and os.getpid() == 2


def start_in_own_group(child, read_end):
    """Fork; the child closes ``read_end``, takes its own process group and runs ``child()`` (which never returns)."""
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
        child()
    try:
        os.setpgid(pid, pid)  # also here, so a kill cannot race the child's own setpgid
    except OSError:
        pass
    return pid


def kill_all(pid, own_namespace):
    """SIGKILL the child, its group and (in our own PID namespace) everything else but PID 1 and us."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if own_namespace:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
