"""Mechanism ``bwrap`` with a cgroup: join the run's cgroup (argv[1]), then become bwrap (argv[2:]), so that bwrap
and everything in the sandbox start inside it. Without a cgroup the caller starts bwrap itself."""

import os
import sys

if __name__ == "__main__":
    try:
        with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
        os.execv(sys.argv[2], sys.argv[2:])
    except OSError as exc:
        os.write(2, ("opdgrpo-sandbox: launcher failed: %s\n" % exc).encode())
        os._exit(125)
