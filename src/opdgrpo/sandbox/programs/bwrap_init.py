"""PID 1 of the bwrap sandbox (mechanism ``bwrap``), started by bwrap once the sandbox root is built (the mounts are
final). As root (bwrap run by root, no user namespace) it first drops to the run's own unprivileged uid and gid: it
holds only CAP_SETUID and CAP_SETGID (bwrap dropped every other capability and set no_new_privs), and setresuid() to
a non-zero uid clears those too. Then it sets the rlimits, forks the program (PID 2) and reaps until the program ends,
writes the program's wait status to the status pipe the caller passed down (bwrap's own exit code would say 128 + n
for both a signal n and an exit code 128 + n), and exits; the kernel then kills whatever is left in the namespace.
From launch_common.py: ``fail``, ``set_limits``, ``detach_stdio``, ``reap_until``, ``run``."""
# ruff: noqa: F821 (names from launch_common.py, which the host sends first)

import os
import sys


def main():
    uid, gid, as_bytes, cpu_s, fsize, nofile, nproc, status_fd = (int(v) for v in sys.argv[1:9])
    os.set_inheritable(status_fd, False)  # the program does not get it
    if os.getuid() == 0 and uid != 0:
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        except OSError as exc:
            fail("cannot drop to uid %d: %s" % (uid, exc))
        if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
            fail("still uid %s gid %s" % (os.getresuid(), os.getresgid()))
    set_limits(as_bytes, cpu_s, fsize, nofile, nproc)   # nproc: this uid's processes (the run's own uid, or the caller's)
    env = dict(os.environ)
    env["OPDGRPO_SANDBOX_PIDNS"] = "1"  # tells the program it may kill(-1) to clean up after itself
    program = os.fork()
    if program == 0:
        try:
            os.execve(sys.executable, [sys.executable, "-I", "-S", sys.argv[9]], env)
        finally:
            os._exit(127)
    detach_stdio()
    os.write(status_fd, str(reap_until(program)).encode())
    os._exit(0)


if __name__ == "__main__":
    run(main)
