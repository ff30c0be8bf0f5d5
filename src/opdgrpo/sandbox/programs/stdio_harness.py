"""The hub code domain's harness (opdgrpo.sandbox.stdio): reads {"source", "prelude", "inputs", "cap", "timeout"}
from stdin; runs the program once per test in a forked child with the test's input as its stdin; prints per test
{"i": index, "s": "ok", "o": stdout} or {"i": index, "s": "timeout"|"runtime"|"memory"|"output"} (and stops), or a
single {"compile": "syntax"} when the program does not compile. ``cap`` (bytes of stdout kept per test) is a
constant: nothing here depends on an expected output, which a program could find in these frames. From
harness_common.py: ``own_pid_namespace``, ``start_in_own_group``, ``kill_all``."""
# ruff: noqa: F821 (names from harness_common.py, which the host sends first)

import json
import os
import select
import sys
import time

_exit, _waitpid = os._exit, os.waitpid
RUNTIME, MEMORY = 101, 102  # child exit codes (0: finished normally)
INPUT_FILE = "stdin.txt"


def child(code, base, out_w):
    try:
        fd = os.open(INPUT_FILE, os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
        os.dup2(out_w, 1)
        os.close(out_w)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
        old = {"stdin": sys.stdin, "stdout": sys.stdout, "stderr": sys.stderr}
        sys.stdin = sys.__stdin__ = open(0, "r", encoding="utf-8", errors="replace", closefd=False)
        sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
        sys.stderr = sys.__stderr__ = open(2, "w", closefd=False)
        namespace = dict(base)
        namespace["__name__"] = "__main__"
        for name, stream in old.items():  # a prelude's `from sys import *` bound the harness's streams
            if namespace.get(name) is stream:
                namespace[name] = getattr(sys, name)
        status = 0
        try:
            exec(code, namespace)
        except SystemExit:
            pass
        except MemoryError:
            status = MEMORY
        except BaseException:
            status = RUNTIME
        if not status:  # what interpreter shutdown does: join non-daemon threads, run atexit handlers
            try:
                if "threading" in sys.modules:
                    sys.modules["threading"]._shutdown()
                if "atexit" in sys.modules:
                    sys.modules["atexit"]._run_exitfuncs()
            except BaseException:
                pass
        try:
            sys.stdout.flush()
        except MemoryError:
            status = status or MEMORY
        except BaseException:
            status = status or RUNTIME
        _exit(status)
    except BaseException:
        _exit(RUNTIME)


def run_test(code, base, text, cap, limit):
    with open(INPUT_FILE, "w", encoding="utf-8", errors="replace") as fh:
        fh.write(text)
    read_end, write_end = os.pipe()
    pid = start_in_own_group(lambda: child(code, base, write_end), read_end)
    os.close(write_end)
    deadline = time.monotonic() + limit
    data = bytearray()
    verdict = None
    exit_status = None
    drain_until = None
    while True:
        now = time.monotonic()
        if drain_until is not None and now >= drain_until:
            break
        if drain_until is None and now >= deadline:
            verdict = "timeout"
            break
        wait = min(0.05, (drain_until or deadline) - now)
        if select.select([read_end], [], [], max(wait, 0))[0]:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            data += chunk
            if len(data) > cap:
                verdict = "output"
                break
            continue
        if exit_status is None:
            done, status = _waitpid(pid, os.WNOHANG)
            if done:
                exit_status = status
                kill_all(pid, OWN_PID_NAMESPACE)  # descendants may hold the pipe open: end them, then drain what is left
                drain_until = time.monotonic() + 0.5
    os.close(read_end)
    kill_all(pid, OWN_PID_NAMESPACE)
    if exit_status is None:
        exit_status = _waitpid(pid, 0)[1]
    if verdict is not None:
        return {"s": verdict}
    if os.WIFEXITED(exit_status) and os.WEXITSTATUS(exit_status) == 0:
        return {"s": "ok", "o": data.decode("utf-8", "replace")}
    if os.WIFEXITED(exit_status) and os.WEXITSTATUS(exit_status) == MEMORY:
        return {"s": "memory"}
    return {"s": "runtime"}


def main():
    global OWN_PID_NAMESPACE
    OWN_PID_NAMESPACE = own_pid_namespace()
    payload = json.loads(sys.stdin.read())
    base = {"__builtins__": __builtins__}
    if payload["prelude"]:
        exec(compile(payload["prelude"], "<prelude>", "exec"), base)
    try:
        code = compile(payload["source"], "<solution>", "exec")
    except BaseException:
        sys.stdout.write(json.dumps({"compile": "syntax"}) + "\n")
        return
    limit = payload["timeout"]
    cap = payload["cap"]
    for index, text in enumerate(payload["inputs"]):
        record = run_test(code, base, text, cap, limit)
        record["i"] = index
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()
        if record["s"] != "ok":
            return



if __name__ == "__main__":
    main()
