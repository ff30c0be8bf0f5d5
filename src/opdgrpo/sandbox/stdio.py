"""Run whole programs (standard input in, standard output out) against many test inputs, in the sandbox.

Competitive-programming problems (LiveCodeBench's ``stdin`` problems, DeepCoder, TACO) give a program a
test's input on standard input and compare what it prints. :func:`run_stdio_programs` runs ONE sandboxed
interpreter (:func:`opdgrpo.sandbox.isolation.run_python`) per program, so a program that kills or floods its own
run costs nobody else anything. Inside it a small harness (the program run in the sandbox):

1. reads its payload (the program, the test inputs, one constant output cap) from its standard input;
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

Expected outputs never enter the sandbox, nor anything derived from them: the harness returns what each run
printed, and the caller compares it (:func:`opdgrpo.verifiers.code.outputs_match`). A program therefore cannot
pass by finding the answers in the harness's memory. In particular the harness's output cap is the constant
:data:`OUTPUT_CAP_BYTES`: a cap computed from the expected output (say, twice its length) would sit in the
harness's frames, where a program can read it and print "Yes" or "No" by its size. The per-test caps of a
:class:`StdioRun` (which callers derive from the expected outputs) are enforced here, on the host, after the run.

Each test runs in a fresh process forked from the harness, like a judge that starts the program once per test, but
without paying the interpreter start-up per test.

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

from opdgrpo.sandbox.isolation import run_python
from opdgrpo.sandbox.programs import program

__all__ = ["StdioRun", "StdioOutcome", "run_stdio_programs"]

_STARTUP_S = 3.0  # sandbox start-up and payload parsing, on top of the per-test limits
_PER_TEST_SLACK_S = 0.5  # fork, file write and pipe reads around each test's own limit
_STOP_STATUSES = ("timeout", "runtime", "memory", "output")
#: Most bytes of standard output the harness keeps per test (more: the run stops, ``"output"``). A constant, never
#: derived from the expected output: what the sandbox sees must say nothing about the answer.
OUTPUT_CAP_BYTES = 16 << 20


@dataclass(frozen=True)
class StdioRun:
    """One program and the inputs of its tests; a test that printed more than ``output_caps[i]`` bytes ends the run
    with status ``"output"``. The caps are checked on the host and never reach the sandbox (they may be derived
    from the expected outputs); the sandbox itself stops a test at :data:`OUTPUT_CAP_BYTES`."""

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
                          "cap": OUTPUT_CAP_BYTES, "timeout": limit})  # fmt: skip
    n = len(run.inputs)
    timeout = n * (limit + _PER_TEST_SLACK_S) + _STARTUP_S
    # Host side only: JSON escaping can grow text up to 6x (\uXXXX); plus each record's own framing. Going over
    # ends the run, which the program cannot tell from its inside.
    cap = sum(6 * min(c, OUTPUT_CAP_BYTES) + 64 for c in run.output_caps) + 4096
    largest_input = max(len(text.encode("utf-8", "replace")) for text in run.inputs)
    result = run_python(
        _HARNESS, stdin=payload, timeout_s=timeout, memory_mb=memory_mb, max_output_bytes=cap,
        cpu_s=timeout + 1, file_mb=max(16, largest_input // (1 << 20) + 2),
        idle_timeout_s=limit + _PER_TEST_SLACK_S + _STARTUP_S,
    )  # fmt: skip
    return _within_caps(_parse(result.stdout, n, result.status), run.output_caps)


def _within_caps(outcome: StdioOutcome, caps: Sequence[int]) -> StdioOutcome:
    """The outcome cut at the first test whose output is longer than its cap (status ``"output"``)."""
    for k, (text, cap) in enumerate(zip(outcome.outputs, caps)):
        if len(text.encode("utf-8", "replace")) > cap:
            return StdioOutcome("output", outcome.outputs[:k])
    return outcome


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


# The harness (opdgrpo/sandbox/programs/stdio_harness.py): its protocol is in its docstring.
_HARNESS = program("stdio_harness")
