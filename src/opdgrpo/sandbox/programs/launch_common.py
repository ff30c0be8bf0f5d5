"""Shared by the sandbox's launchers (launcher.py, bwrap_init.py), which the host sends with this file first:
failing with the launcher's own exit code, the program's rlimits, and the PID-1 duties of reaping and detaching."""

import os
import resource

LAUNCHER_FAILED = 125   # the launcher itself failed (the ``env``/``timeout`` convention)


def fail(message):
    os.write(2, ("opdgrpo-sandbox: launcher failed: " + message + "\n").encode())
    os._exit(LAUNCHER_FAILED)


def limit(resource_id, soft, hard=None):
    hard = soft if hard is None else hard
    current_hard = resource.getrlimit(resource_id)[1]
    if current_hard != resource.RLIM_INFINITY:
        hard = min(hard, current_hard)
        soft = min(soft, hard)
    resource.setrlimit(resource_id, (soft, hard))


def set_limits(as_bytes, cpu_s, fsize, nofile, nproc):
    """The program's rlimits. RLIMIT_NPROC counts every process of the real uid system-wide and does not bind root
    (CAP_SYS_RESOURCE): ``nproc`` (0: none) is set for other users only."""
    try:
        limit(resource.RLIMIT_CORE, 0)
        limit(resource.RLIMIT_AS, as_bytes)
        limit(resource.RLIMIT_CPU, cpu_s, cpu_s + 1)
        limit(resource.RLIMIT_FSIZE, fsize)
        limit(resource.RLIMIT_NOFILE, nofile)
        if nproc and os.geteuid() != 0:
            limit(resource.RLIMIT_NPROC, nproc)
    except (OSError, ValueError) as exc:
        fail("setrlimit: %s" % exc)


def detach_stdio():
    """Keep only the program's copies of the pipes open, so EOF means "program and descendants done"."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def reap_until(program):
    """As PID 1, reap orphans too; return the program's wait status once it is gone."""
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == program:
            return status


def run(main):
    """``main()``, with any error but an exit reported as the launcher's own failure."""
    try:
        main()
    except SystemExit:
        raise
    except BaseException as exc:
        fail(repr(exc))
