"""Run model-written Python in a subprocess sandbox, never in the caller's process.

Why each piece is there:

* **Own interpreter.** The program runs in ``sys.executable -I -S`` (isolated mode: no environment
  variables, no user site, no script directory on ``sys.path``; ``-S``: no ``site``, so start-up takes
  a few milliseconds and only the standard library is importable). The source is written to
  ``main.py`` in a fresh temporary directory, which is the child's cwd, ``HOME`` and ``TMPDIR``, and is
  deleted afterwards.
* **Minimal environment.** Nothing of the caller's environment (tokens, credentials) is inherited.
* **Resource limits** (``setrlimit``, set before the program is exec'd, soft = hard so the program
  cannot raise them): address space, CPU seconds (SIGXCPU at the limit, SIGKILL a second later), file
  size, open files, no core files, and processes for non-root users (see below).
* **Wall clock.** The child gets its own session and process group; at the deadline, and also after a
  normal exit, the whole group is SIGKILLed so no grandchild outlives the run.
* **Namespaces** (Linux). Before exec'ing the program, a small launcher calls ``unshare`` for a new
  mount namespace (every mount read-only except a bind mount of the work directory), a new network
  namespace (only a downed loopback, so no network) and a new PID namespace. The program runs as
  PID 2 under a tiny init (PID 1), which mounts a fresh read-only ``/proc`` (only the sandbox's
  processes are visible) and, on Linux >= 6.14, caps the namespace's ``pid_max`` (a fork-bomb bound
  that also holds for root). When the program exits or the group is killed, that init exits and the
  kernel kills every process left in the namespace, including ones that escaped the process group
  with ``setsid``. The PID namespace also confines ``kill(-1, ...)`` to the sandbox (the launcher
  then sets ``OPDGRPO_SANDBOX_PIDNS=1`` in the program's environment). This works as root (our CI);
  as another user it is tried inside a new user namespace. Where the OS refuses both (no
  privileges, user namespaces disabled) the launcher continues **silently without them**: the
  program then has the network, can write wherever its uid can, and only the process-group kill
  bounds its descendants.
* **No privileges.** The capability bounding set is emptied and ``no_new_privs`` set before exec,
  so even a root program cannot raise its rlimits, remount or override file permissions.
* **Output cap.** stdout and stderr are read concurrently (one ``selectors`` loop, so nothing can
  block the caller) and each is cut at ``max_output_bytes``; going over stops the run (``"output"``).

Not isolated: file *reads*. The program runs with the caller's uid (root in CI) and can read anything
that uid can (writes outside the work directory are blocked only by the mount namespace). Run the
trainer as an unprivileged user where that matters. See "Guarantees" in ``docs/design-notes.md``.

The module keeps no shared state and uses no ``preexec_fn`` (which is unsafe in threaded programs),
so :func:`run_python` may be called from several threads at once. Linux (or at least POSIX) only.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

__all__ = ["SandboxResult", "run_python", "isolation"]

log = logging.getLogger(__name__)

_SCRIPT = "main.py"
_LAUNCHER_FAILED = 125  # exit code of the launcher itself failing (the ``env``/``timeout`` convention)
_CHUNK = 65536
_POLL_S = 0.05

# The launcher runs in the child interpreter (``python -I -S -c _LAUNCHER ...``) and exec's the program.
# It is plain Python rather than a ``preexec_fn`` so that nothing runs between fork and exec in the
# caller's (possibly multi-threaded) process.
_LAUNCHER = r"""
import ctypes, os, resource, signal, sys

LIBC = ctypes.CDLL(None, use_errno=True)
PRIVATE_MOUNTS = False

def fail(message):
    os.write(2, ("opdgrpo-sandbox: launcher failed: " + message + "\n").encode())
    os._exit(125)

def unshare(flags):
    return LIBC.unshare(flags) == 0

def enter_namespaces():
    # CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID: allowed to root. Otherwise try inside a new user
    # namespace (CLONE_NEWUSER), mapping our own uid/gid so files we create keep their owner.
    NEWNS, NEWNET, NEWPID, NEWUSER = 0x00020000, 0x40000000, 0x20000000, 0x10000000
    if not unshare(NEWNS | NEWNET | NEWPID):
        uid, gid = os.getuid(), os.getgid()
        if not unshare(NEWUSER | NEWNS | NEWNET | NEWPID):
            return False
        try:
            maps = (("uid_map", "%d %d 1" % (uid, uid)), ("setgroups", "deny"), ("gid_map", "%d %d 1" % (gid, gid)))
            for name, text in maps:
                with open("/proc/self/" + name, "w") as fh:
                    fh.write(text)
        except OSError:
            pass
    read_only_except(os.getcwd())
    return True

class MountAttr(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]

def mount_setattr(path, recursive, attr_set, attr_clr):
    # mount_setattr(2), Linux >= 5.12; 442 on every architecture that uses the generic syscall table
    attr = MountAttr(attr_set, attr_clr, 0, 0)
    flags = 0x8000 if recursive else 0  # AT_RECURSIVE
    return LIBC.syscall(442, -100, path, flags, ctypes.byref(attr), ctypes.sizeof(attr)) == 0

def read_only_except(workdir):
    # In our own mount namespace: every mount read-only, except a bind mount of the working directory.
    # Done before the program runs, by a process that holds the capabilities, and the program cannot
    # undo it (no CAP_SYS_ADMIN over this mount namespace; a nested one gets the mounts locked).
    MS_REC, MS_PRIVATE, MS_BIND, RDONLY = 0x4000, 0x40000, 0x1000, 1
    path = workdir.encode()
    global PRIVATE_MOUNTS
    if LIBC.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False
    PRIVATE_MOUNTS = True  # nothing mounted from now on propagates back to the caller's namespace
    if LIBC.mount(path, path, None, MS_BIND, None) != 0:
        return False
    os.chdir(workdir)  # onto the bind mount: the old cwd is a directory of the read-only mount
    return mount_setattr(b"/", True, RDONLY, 0) and mount_setattr(path, False, 0, RDONLY)

def mount_proc(max_processes):
    # As PID 1 of the new PID namespace: a /proc that shows only this namespace's processes (not the
    # caller's environment or command line), read-only like everything else. Since Linux 6.14 the
    # pid_max sysctl is per PID namespace: capping it bounds the processes in the namespace, also for
    # root, whom RLIMIT_NPROC does not bind. (Never written on older kernels, where it is global.)
    MS_NOSUID, MS_NODEV, MS_NOEXEC, RDONLY = 2, 4, 8, 1
    if not PRIVATE_MOUNTS or LIBC.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        return
    try:
        release = tuple(int(v) for v in os.uname().release.split("-")[0].split(".")[:2])
        if release >= (6, 14):
            with open("/proc/sys/kernel/pid_max", "w") as fh:
                fh.write(str(max_processes))
    except (OSError, ValueError):
        pass
    mount_setattr(b"/proc", False, RDONLY, 0)

def drop_privileges():
    # Empty the capability bounding set, so that after exec even root holds no capability: it cannot
    # raise its rlimits back, remount, write pid_max, override file permissions of other users, ...
    # and no_new_privs, so no setuid binary gives them back. Best effort (needs CAP_SETPCAP).
    PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
    for cap in range(64):
        if LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # EINVAL: past the last
            break
    LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)

def limit(resource_id, soft, hard=None):
    hard = soft if hard is None else hard
    current_hard = resource.getrlimit(resource_id)[1]
    if current_hard != resource.RLIM_INFINITY:
        hard = min(hard, current_hard)
        soft = min(soft, hard)
    resource.setrlimit(resource_id, (soft, hard))

def user_processes(uid):
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                count += os.stat("/proc/" + name).st_uid == uid
            except OSError:
                pass
    return count

def main():
    as_bytes, cpu_s, fsize, nofile, nproc, namespaces = (int(v) for v in sys.argv[1:7])
    argv = [sys.executable, "-I", "-S", sys.argv[7]]
    own_pid_namespace = namespaces and enter_namespaces()
    try:
        limit(resource.RLIMIT_CORE, 0)
        limit(resource.RLIMIT_AS, as_bytes)
        limit(resource.RLIMIT_CPU, cpu_s, cpu_s + 1)
        limit(resource.RLIMIT_FSIZE, fsize)
        limit(resource.RLIMIT_NOFILE, nofile)
        # RLIMIT_NPROC counts every process of the real uid system-wide, and does not bind root at
        # all (CAP_SYS_RESOURCE), so it is set only for other users: their current count plus nproc.
        if os.geteuid() != 0:
            limit(resource.RLIMIT_NPROC, user_processes(os.getuid()) + nproc)
    except (OSError, ValueError) as exc:
        fail("setrlimit: %s" % exc)
    env = dict(os.environ)
    if not own_pid_namespace:
        drop_privileges()
        os.execve(sys.executable, argv, env)
    env["OPDGRPO_SANDBOX_PIDNS"] = "1"  # tells the program it may kill(-1) to clean up after itself
    read_end, write_end = os.pipe()
    init = os.fork()  # PID 1 of the new namespace
    if init == 0:
        os.close(read_end)
        # pids below 300 are only used before the first wrap-around, so that is 300 + nproc at most
        # at first and nproc + 2 (init, program) after.
        mount_proc(300 + nproc + 2)
        program = os.fork()
        if program == 0:
            os.close(write_end)
            try:
                drop_privileges()
                os.execve(sys.executable, argv, env)
            finally:
                os._exit(127)
        detach_stdio()
        while True:  # as PID 1 we also reap orphans; stop when the program itself is gone
            pid, status = os.waitpid(-1, 0)
            if pid == program:
                break
        os.write(write_end, str(status).encode())
        os._exit(0)  # the kernel now kills whatever is left in the namespace
    os.close(write_end)
    detach_stdio()
    data = b""
    while True:
        chunk = os.read(read_end, 64)
        if not chunk:
            break
        data += chunk
    os.waitpid(init, 0)
    if not data:
        os._exit(125)
    status = int(data)
    if os.WIFSIGNALED(status):  # die the same way, so the caller sees the program's signal
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))

def detach_stdio():
    # Keep only the program's copies of the pipes open, so EOF means "program and descendants done".
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)

try:
    main()
except SystemExit:
    raise
except BaseException as exc:
    fail(repr(exc))
"""


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one sandboxed run.

    ``status`` is ``"ok"`` only when the program exited 0 within every limit; otherwise one word:
    ``"timeout"`` (wall clock), ``"cpu"`` (RLIMIT_CPU, SIGXCPU), ``"memory"`` (MemoryError under the
    address-space limit), ``"output"`` (stdout or stderr over the cap; both are truncated),
    ``"signal"`` (killed by another signal), ``"error"`` (nonzero exit) or ``"sandbox"`` (the sandbox
    itself could not start or set its limits). A program that handles SIGXCPU is SIGKILLed one CPU
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
    open_files: int = 64,
    processes: int = 64,
    namespaces: bool = True,
    idle_timeout_s: float | None = None,
) -> SandboxResult:
    """Run ``source`` as a Python program in a sandbox and return what happened.

    ``stdin`` is fed to the program and then closed. Limits: ``timeout_s`` wall-clock seconds for
    the whole run; ``memory_mb`` of address space per process; ``cpu_s`` CPU seconds per process
    (default: ``timeout_s``, rounded up); ``file_mb`` largest file it may write; ``open_files``
    descriptors per process; ``processes`` more processes than the user already has (ignored for
    root, whom RLIMIT_NPROC does not bind); ``max_output_bytes`` per stream. ``namespaces=False``
    skips the mount, network and PID namespaces (as if the OS refused them). ``idle_timeout_s``
    also stops the run (``"timeout"``) once neither stdout nor stderr has received anything for that
    long: a bound for a program that is stopped (SIGSTOP) or stuck and otherwise expected to write.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_output_bytes < 0 or (idle_timeout_s is not None and idle_timeout_s <= 0):
        raise ValueError("timeout_s, memory_mb and idle_timeout_s must be positive, max_output_bytes non-negative")
    cpu = max(1, math.ceil(timeout_s if cpu_s is None else cpu_s))
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="opdgrpo-sandbox-")
    proc: subprocess.Popen | None = None
    try:
        with open(os.path.join(workdir, _SCRIPT), "w", encoding="utf-8", errors="replace") as fh:
            fh.write(source)
        argv = [
            sys.executable, "-I", "-S", "-c", _LAUNCHER,
            str(memory_mb * 1024 * 1024), str(cpu), str(file_mb * 1024 * 1024), str(open_files),
            str(processes), str(int(namespaces)), _SCRIPT,
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
            )
        except OSError as exc:
            log.warning("sandbox could not start: %s", exc)
            return SandboxResult("sandbox", "", f"could not start sandbox: {exc}", None, time.monotonic() - start)
        data = stdin.encode("utf-8", errors="replace")
        reason, out, err = _communicate(proc, data, start + timeout_s, max_output_bytes, idle_timeout_s)
        _kill_group(proc.pid)  # before reaping, so the group id cannot have been reused
        returncode = proc.wait()
        stdout = out.decode("utf-8", errors="replace")
        stderr = err.decode("utf-8", errors="replace")
        status = reason or _classify(returncode, stderr)
        if status == "sandbox":
            log.warning("sandbox launcher failed: %s", stderr.strip()[-500:])
        return SandboxResult(status, stdout, stderr, returncode, time.monotonic() - start)
    finally:
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
        _remove_tree(workdir)


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


@functools.lru_cache(maxsize=1)
def isolation() -> dict[str, bool]:
    """Which namespaces the sandbox actually gets on this machine.

    ``{"network": ..., "pid": ..., "filesystem": ...}``, measured by running a probe program (cached):
    in its own PID namespace the program is PID 2; in its own network namespace the only interface is
    the loopback; in its own read-only mount namespace it cannot write the directory that holds its
    working directory (which the caller can).
    """
    probe = (
        "import os, socket\n"
        "print(os.getpid(), ','.join(n for _, n in socket.if_nameindex()),"
        " int(os.access(os.path.dirname(os.getcwd()), os.W_OK)))\n"
    )
    result = run_python(probe, timeout_s=10.0)
    if result.status != "ok":
        return {"network": False, "pid": False, "filesystem": False}
    pid, names, writable = (result.stdout.split() + ["", "", ""])[:3]
    return {"network": names == "lo", "pid": pid == "2", "filesystem": writable == "0"}
