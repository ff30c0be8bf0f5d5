"""The programs the sandbox runs in child interpreters, as files: linted and read like the rest of the package.

The host never imports them. It reads their text (:func:`program`) and passes it to ``python -I -S -c`` (the launchers)
or writes it as the sandboxed script (the harnesses), so nothing of the host's interpreter state reaches them. A
program that shares helpers with another is sent with its common file first (:data:`PARTS`): the launchers share
``launch_common.py``, the harnesses ``harness_common.py``; each file names what it takes from its common part.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

#: Each program's files, in the order they are joined into one source text.
PARTS = {
    "launcher": ("launch_common", "launcher"),           # unshare launcher: namespaces, rlimits, PID 1
    "bwrap_init": ("launch_common", "bwrap_init"),       # PID 1 inside bwrap's sandbox: uid, rlimits, reaping
    "join_cgroup": ("join_cgroup",),                     # join the run's cgroup, then become bwrap
    "loaded_libraries": ("loaded_libraries",),           # the shared objects an interpreter maps
    "function_harness": ("harness_common", "function_harness"),   # code domain: functions against tests
    "stdio_harness": ("harness_common", "stdio_harness"),         # hub code domain: programs on stdin/stdout
}


@cache
def program(name: str) -> str:
    """The source text of program ``name`` (:data:`PARTS`)."""
    files = resources.files(__name__)
    return "\n\n".join(files.joinpath(f"{part}.py").read_text(encoding="utf-8") for part in PARTS[name])
