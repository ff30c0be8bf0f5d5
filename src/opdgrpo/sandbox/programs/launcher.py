"""The unshare launcher (mechanism ``unshare``): runs in the child interpreter (``python -I -S -c`` with this text
after launch_common.py) and exec's the program. Plain Python rather than a ``preexec_fn``, so that nothing runs
between fork and exec in the caller's (possibly multi-threaded) process. From launch_common.py: ``fail``,
``set_limits``, ``detach_stdio``, ``reap_until``, ``run``."""
# ruff: noqa: F821 (names from launch_common.py, which the host sends first)

import ctypes
import os
import signal
import sys

LIBC = ctypes.CDLL(None, use_errno=True)
PRIVATE_MOUNTS = False


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

def user_processes(uid):
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                count += os.stat("/proc/" + name).st_uid == uid
            except OSError:
                pass
    return count

def join_cgroup(path):
    # Move this process (and so everything it starts) into the run's own cgroup, before anything else.
    if path:
        try:
            with open(os.path.join(path, "cgroup.procs"), "w") as fh:
                fh.write(str(os.getpid()))
        except OSError as exc:
            fail("cannot join cgroup %s: %s" % (path, exc))

def main():
    as_bytes, cpu_s, fsize, nofile, nproc, namespaces = (int(v) for v in sys.argv[1:7])
    argv = [sys.executable, "-I", "-S", sys.argv[7]]
    join_cgroup(sys.argv[8])
    own_pid_namespace = namespaces and enter_namespaces()
    # a user's RLIMIT_NPROC counts all their processes: their current count plus nproc
    set_limits(as_bytes, cpu_s, fsize, nofile, user_processes(os.getuid()) + nproc if os.geteuid() != 0 else 0)
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
        os.write(write_end, str(reap_until(program)).encode())
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
        os._exit(LAUNCHER_FAILED)
    status = int(data)
    if os.WIFSIGNALED(status):  # die the same way, so the caller sees the program's signal
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    run(main)
