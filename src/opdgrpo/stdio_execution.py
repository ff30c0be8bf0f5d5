"""Run whole programs (standard input in, standard output out) against many test inputs, in the sandbox.

Competitive-programming problems (LiveCodeBench's ``stdin`` problems, DeepCoder, TACO) give a program a
test's input on standard input and compare what it prints. :func:`run_stdio_programs` runs ONE sandboxed
interpreter (:func:`opdgrpo.sandbox.run_python`) per program, so a program that kills or floods its own
run costs nobody else anything. Inside it a small harness (the program run in the sandbox):

1. reads its payload (the program, the test inputs, the per-test output caps) from its standard input;
2. runs the optional prelude (common imports) and compiles the program once;
3. per test, writes the input to a file in the sandbox's work directory and forks a fresh child (its own
   process group) whose stdin is that file, whose stdout is a pipe to the harness and whose stderr is
   ``/dev/null``; the child executes the program as ``__main__`` (so an ``if __name__ == "__main__":``
   guard runs). The harness reads the pipe under a wall-clock limit per test and an output cap,
   then SIGKILLs the child's group (and, in the sandbox's own PID namespace, every other process
   but itself, so nothing a test started outlives it);
4. prints one JSON line per test (what the program printed, or why it stopped) and stops at the first
   test that did not end normally (time limit, exception, memory, output cap): with an all-tests-pass
   reward, the rest cannot change the verdict.

Expected outputs never enter the sandbox: the harness returns what each run printed, and the caller
compares it (:func:`opdgrpo.verifiers.code.outputs_match`). A program therefore cannot pass by finding
the answers in the harness's memory. Each test runs in a fresh process forked from the harness, like a
judge that starts the program once per test, but without paying the interpreter start-up per test.

A program that calls ``exit()``/``sys.exit()`` (any code) is treated as having finished normally, as
LiveCodeBench's grader does; an uncaught exception is a runtime error. After the program's top-level code
returns, the child does what interpreter shutdown does (joins non-daemon threads, runs ``atexit``
handlers), so the common ``threading.Thread(target=main).start()`` idiom for a deeper stack works.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

from .sandbox import run_python

__all__ = ["StdioRun", "StdioOutcome", "run_stdio_programs"]

_STARTUP_S = 3.0  # sandbox start-up and payload parsing, on top of the per-test limits
_PER_TEST_SLACK_S = 0.5  # fork, file write and pipe reads around each test's own limit
_STOP_STATUSES = ("timeout", "runtime", "memory", "output")


@dataclass(frozen=True)
class StdioRun:
    """One program and the inputs of its tests; ``output_caps[i]`` bytes of stdout are kept for test ``i``
    (more stops the run with status ``"output"``)."""

    source: str
    inputs: tuple[str, ...]
    output_caps: tuple[int, ...]


@dataclass(frozen=True)
class StdioOutcome:
    """What happened to one program.

    ``outputs`` holds what the program printed for each test that finished normally, in order; it is shorter
    than the inputs when the run stopped early, and ``status`` then says why: ``"timeout"``, ``"runtime"``
    (an uncaught exception or a crash), ``"memory"`` (MemoryError), ``"output"`` (over the cap),
    ``"syntax"`` (the program does not compile; no test ran) or ``"sandbox"`` (the harness or the
    sandbox failed, or the program broke the harness's protocol). ``"ok"``: every test finished.
    """

    status: str
    outputs: tuple[str, ...]


def run_stdio_programs(
    runs: Sequence[StdioRun],
    per_test_timeout_s: float = 6.0,
    memory_mb: int = 1024,
    *,
    workers: int | None = None,
    prelude: str = "",
) -> list[StdioOutcome]:
    """Run each program on its inputs in its own sandbox; one :class:`StdioOutcome` per run, in order.

    ``per_test_timeout_s`` is the wall-clock limit of each test, ``memory_mb`` the address-space limit of
    every process, ``workers`` how many sandboxes run at once (default: CPU count, at most 4).
    ``prelude`` is executed before the program in each test's namespace (e.g. the imports LiveCodeBench's
    grader puts in front of every solution). Identical runs are executed once.
    """
    if per_test_timeout_s <= 0 or memory_mb <= 0:
        raise ValueError("per_test_timeout_s and memory_mb must be positive")
    keys: dict[str, int] = {}
    unique: list[StdioRun] = []
    order: list[int] = []
    for run in runs:
        if len(run.inputs) != len(run.output_caps):
            raise ValueError("StdioRun.inputs and output_caps must have the same length")
        key = json.dumps([run.source, list(run.inputs), list(run.output_caps)])
        if key not in keys:
            keys[key] = len(unique)
            unique.append(run)
        order.append(keys[key])
    if not unique:
        return []
    n_workers = max(1, min(workers or min(4, os.cpu_count() or 1), len(unique)))

    def one(run: StdioRun) -> StdioOutcome:
        return _run_one(run, per_test_timeout_s, memory_mb, prelude)

    if n_workers == 1:
        results = [one(run) for run in unique]
    else:
        with ThreadPoolExecutor(n_workers) as pool:
            results = list(pool.map(one, unique))
    return [results[i] for i in order]


def _run_one(run: StdioRun, limit: float, memory_mb: int, prelude: str) -> StdioOutcome:
    if not run.inputs:
        return StdioOutcome("ok", ())
    payload = json.dumps({"source": run.source, "prelude": prelude, "inputs": list(run.inputs),
                          "caps": list(run.output_caps), "timeout": limit})  # fmt: skip
    n = len(run.inputs)
    timeout = n * (limit + _PER_TEST_SLACK_S) + _STARTUP_S
    # JSON escaping can grow text up to 6x (\uXXXX); plus each record's own framing
    cap = sum(6 * c + 64 for c in run.output_caps) + 4096
    largest_input = max(len(text.encode("utf-8", "replace")) for text in run.inputs)
    result = run_python(
        _HARNESS, stdin=payload, timeout_s=timeout, memory_mb=memory_mb, max_output_bytes=cap,
        cpu_s=timeout + 1, file_mb=max(16, largest_input // (1 << 20) + 2),
        idle_timeout_s=limit + _PER_TEST_SLACK_S + _STARTUP_S,
    )  # fmt: skip
    return _parse(result.stdout, n, result.status)


def _parse(stdout: str, n: int, run_status: str) -> StdioOutcome:
    """The well-formed records at the start of the harness output, turned into an outcome."""
    outputs: list[str] = []
    for line in stdout.split("\n")[:-1]:  # the last piece is empty or a line cut short
        try:
            record: Any = json.loads(line)
        except ValueError:
            return StdioOutcome("sandbox", tuple(outputs))
        if not isinstance(record, dict):
            return StdioOutcome("sandbox", tuple(outputs))
        if record.get("compile") == "syntax" and not outputs:
            return StdioOutcome("syntax", ())
        if record.get("i") != len(outputs) or len(outputs) >= n:
            return StdioOutcome("sandbox", tuple(outputs))
        status = record.get("s")
        if status == "ok" and isinstance(record.get("o"), str):
            outputs.append(record["o"])
            continue
        if status in _STOP_STATUSES:
            return StdioOutcome(status, tuple(outputs))
        return StdioOutcome("sandbox", tuple(outputs))
    if len(outputs) == n:
        return StdioOutcome("ok", tuple(outputs))
    # the harness stopped without saying why: the sandbox's own verdict on the run
    status = {"timeout": "timeout", "cpu": "timeout", "memory": "memory", "output": "output"}.get(run_status, "sandbox")
    return StdioOutcome(status, tuple(outputs))


# The harness. Reads {"source", "prelude", "inputs", "caps", "timeout"} from stdin; prints per test
# {"i": index, "s": "ok", "o": stdout} or {"i": index, "s": "timeout"|"runtime"|"memory"|"output"} (and stops),
# or a single {"compile": "syntax"} when the program does not compile.
_HARNESS = r'''
import io, json, os, select, signal, sys, time

_exit, _fork, _waitpid = os._exit, os.fork, os.waitpid
RUNTIME, MEMORY = 101, 102  # child exit codes (0: finished normally)
INPUT_FILE = "stdin.txt"


def child(code, base, out_w):
    try:
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
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


def kill_all(pid):
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if OWN_PID_NAMESPACE:  # also whatever escaped the group (setsid); PID 1 and we are spared
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass


def run_test(code, base, text, cap, limit):
    with open(INPUT_FILE, "w", encoding="utf-8", errors="replace") as fh:
        fh.write(text)
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    pid = _fork()
    if pid == 0:
        os.close(read_end)
        child(code, base, write_end)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass
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
                kill_all(pid)  # descendants may hold the pipe open: end them, then drain what is left
                drain_until = time.monotonic() + 0.5
    os.close(read_end)
    kill_all(pid)
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
    OWN_PID_NAMESPACE = os.environ.get("OPDGRPO_SANDBOX_PIDNS") == "1" and os.getpid() == 2
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
    for index, (text, cap) in enumerate(zip(payload["inputs"], payload["caps"])):
        record = run_test(code, base, text, cap, limit)
        record["i"] = index
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()
        if record["s"] != "ok":
            return


main()
'''
