"""Code verifier: run the program a completion ends with against hidden tests, in the sandbox.

A task's answer (built by :func:`make_answer`) is a JSON-friendly dict::

    {"mode": "stdin" | "functional", "func_name": str | None, "tests": [{"input": str, "output": str}, ...]}

The grading rules follow LiveCodeBench's evaluator (``lcb_runner/evaluation/testing_util.py``), re-implemented
here on top of the project's sandbox:

* **Program.** The last fenced ```` ```python ```` block of the final answer (the text after ``</think>``;
  see :func:`extract_program`), else the last fenced block of any language. LiveCodeBench's generic
  extraction also takes the last fenced block. Unclosed blocks (a cut-off generation) do not count.
* **Prelude.** Both modes run the program after the same standard-library imports LiveCodeBench puts in
  front of every solution (``from typing import *``, ``collections``, ``heapq``, ``math``, ...;
  :data:`PRELUDE`), so starter code using ``List[int]`` works unchanged.
* **stdin tests.** The program runs as ``__main__`` with the test input on standard input
  (:mod:`opdgrpo.sandbox.stdio`, one sandbox per program, a fresh forked process per test).
  Its output matches (:func:`outputs_match`) when, after stripping the whole text and then each line,
  both have the same number of lines and every line is equal, or both lines are whitespace-separated
  numbers that are equal as decimals (``1.0`` == ``1``, ``Infinity`` == ``inf``, a NaN equals nothing; no
  tolerance beyond that, as in LiveCodeBench's ``Decimal`` comparison).
* **functional tests.** The input is one JSON value per line, one per argument; the program's
  ``Solution().<func_name>(*args)`` is called (or a top-level ``<func_name>`` when there is no
  ``Solution`` class with that method), through :func:`opdgrpo.sandbox.execution.check_programs`; the returned
  value must equal the JSON-decoded expected output (:func:`functional_match`). As in LiveCodeBench, where it
  is compared with ``==``, a dict with a key that is not a string (``{1: 2}``) never equals the JSON object
  ``{"1": 2}``, a NaN equals nothing, ``True == 1`` and ``3.0 == 3``. One deliberate departure: tuples count as
  lists at any depth (``[(1, 2)]`` equals ``[[1, 2]]``); LiveCodeBench turns only a top-level tuple into a list,
  so a list of tuples fails there although its own comment means not to penalise tuples.
* **Reward.** 1.0 only when every test passes (pass@1 as LiveCodeBench counts it), else 0.0.

Expected outputs never enter the sandbox, nor anything derived from them (a length, a cap, a hash): the sandboxed
process reports what the program printed or returned, and the comparison happens here. An output cap computed from
the expected text and sent to the harness let a program read it from the harness's frames and answer a yes/no
problem by its size; the sandbox's caps are constants, and the length-derived cap of a stdin test is applied here.
"""

from __future__ import annotations

import base64
import io
import json
import math
import pickle
import re
import zlib
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping, Sequence

from opdgrpo.sandbox.execution import ProgramCheck, check_programs
from opdgrpo.sandbox.stdio import StdioRun, run_stdio_programs

from . import answer_after_thinking

__all__ = [
    "PRELUDE", "VerifierConfig", "CodeResult", "extract_program", "decode_test_cases", "make_answer",
    "select_tests", "outputs_match", "functional_match", "check_completions", "score_completions",
]  # fmt: skip

MODES = ("stdin", "functional")

# The imports every solution gets for free (LiveCodeBench's grader prepends the same modules and star-imports).
# Order matters: `builtins` comes after the modules whose names would shadow built-ins (math.pow, io.open,
# operator.abs), and the plain module imports come last, so `random`, `bisect`, `copy` and `datetime` name the
# modules, not the same-named functions and classes. Star-imported `stdin`/`stdout` are rebound to each test's
# streams by the harness.
#: The modules star-imported, in this order.
PRELUDE_STAR_IMPORTS = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                        "statistics", "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing")
#: The modules then imported by name.
PRELUDE_MODULES = ("bisect", "collections", "copy", "datetime", "functools", "heapq", "io", "itertools", "json", "math",
                   "operator", "random", "re", "statistics", "string", "sys")
PRELUDE = ("".join(f"from {m} import *\n" for m in PRELUDE_STAR_IMPORTS)
           + f"import {', '.join(PRELUDE_MODULES[:13])}\nimport {', '.join(PRELUDE_MODULES[13:])}\n"
           + "sys.setrecursionlimit(50000)\n")

_SHIM = "__opdgrpo_entry__"
_FENCE = re.compile(r"^[ \t]*```+[ \t]*([^\s`]*)[^\n]*$", re.MULTILINE)
_PYTHON_TAGS = ("python", "python3", "py", "py3")


@dataclass(frozen=True)
class VerifierConfig:
    """``verifier:`` block of a code domain.

    ``per_test_timeout_s``: wall-clock limit per test (LiveCodeBench uses 6 s); ``memory_mb``: address-space
    limit of each sandboxed process; ``workers``: sandboxes run at once (null: CPU count, at most 4);
    ``max_tests``: most tests kept per training problem (null: all; the ones with the longest inputs are
    kept, as DeepCoder's trainer does; held-out sets keep all tests unless their own ``max_tests`` says otherwise).
    """

    per_test_timeout_s: float = 6.0
    memory_mb: int = 1024
    workers: int | None = None
    max_tests: int | None = None

    KEYS = ("per_test_timeout_s", "memory_mb", "workers", "max_tests")

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any] | None, where: str) -> "VerifierConfig":
        cfg = dict(cfg or {})
        unknown = sorted(set(cfg) - set(cls.KEYS))
        if unknown:
            raise ValueError(f"config key `{where}` has unknown keys {unknown}; known: {list(cls.KEYS)}")
        try:
            out = cls(
                per_test_timeout_s=float(cfg.get("per_test_timeout_s", cls.per_test_timeout_s)),
                memory_mb=int(cfg.get("memory_mb", cls.memory_mb)),
                workers=None if cfg.get("workers") is None else int(cfg["workers"]),
                max_tests=None if cfg.get("max_tests") is None else int(cfg["max_tests"]),
            )
        except (TypeError, ValueError) as err:
            raise ValueError(f"config key `{where}`: {err}") from err
        if out.per_test_timeout_s <= 0 or out.memory_mb <= 0:
            raise ValueError(f"config key `{where}`: per_test_timeout_s and memory_mb must be positive")
        if (out.workers is not None and out.workers < 1) or (out.max_tests is not None and out.max_tests < 1):
            raise ValueError(f"config key `{where}`: workers and max_tests must be at least 1 (or null)")
        return out


@dataclass(frozen=True)
class CodeResult:
    """How one completion fared: ``status`` is ``"pass"`` (every test passed) or why not:
    ``"no_code"``, ``"syntax"``, ``"wrong"`` (ran, some output differs), ``"timeout"``, ``"runtime"``,
    ``"memory"``, ``"output"`` (printed too much), ``"sandbox"``. ``passed`` counts tests known to pass."""

    status: str
    passed: int
    total: int

    @property
    def reward(self) -> float:
        return 1.0 if self.status == "pass" else 0.0


# -- the program --------------------------------------------------------------------------------------
def extract_program(completion: str) -> str | None:
    """The program a completion ends with, or None.

    Only the final answer counts: the text after the last ``</think>``; a completion whose last ``<think>`` is never
    closed (cut off while thinking) has no answer (:func:`answer_after_thinking`, as in every domain). In it, the last
    closed fenced
    block tagged python (``python``, ``py``, ``python3``), else the last closed fenced block of any tag.
    """
    text = answer_after_thinking(completion)
    if text is None:
        return None
    blocks: list[tuple[str, str]] = []
    opening: re.Match | None = None
    for fence in _FENCE.finditer(text):
        if opening is None:
            opening = fence
        elif fence.group(1) == "":  # a bare fence closes the open block
            blocks.append((opening.group(1).lower(), text[opening.end() + 1 : fence.start()]))
            opening = None
        else:  # a new tagged fence before a close: the earlier one was never closed
            opening = fence
    if not blocks:
        return None
    tagged = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    program = tagged[-1] if tagged else blocks[-1][1]
    return program if program.strip() else None


# -- tests ---------------------------------------------------------------------------------------------
class _StringsOnly(pickle.Unpickler):
    """Unpickle plain data only: LiveCodeBench's compressed tests are a pickled str, and a data file must
    never be able to make ``pickle`` import and call something."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from test data")


def decode_test_cases(raw: Any, where: str = "test cases") -> list[dict[str, Any]]:
    """Test cases from a data set cell: a JSON list (LiveCodeBench public tests, DeepCoder), a list
    already, or LiveCodeBench's compressed form base64(zlib(pickle(JSON string))) of private tests."""
    if isinstance(raw, list):
        return raw
    if not isinstance(raw, str):
        raise ValueError(f"{where}: expected a JSON string, got {type(raw).__name__}")
    if not raw.strip():
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        try:
            packed = zlib.decompress(base64.b64decode(raw.encode("ascii"), validate=True))
            value = _StringsOnly(io.BytesIO(packed)).load()
            if isinstance(value, bytes):
                value = value.decode("utf-8")
            value = json.loads(value) if isinstance(value, str) else value
        except Exception as err:  # garbage can make the unpickler fail in many ways; all mean "not test data"
            raise ValueError(f"{where}: neither JSON nor base64(zlib(pickle(JSON))): "
                             f"{type(err).__name__}: {err}") from err
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list of test cases, got {type(value).__name__}")
    return value


def make_answer(mode: str, tests: Sequence[Mapping[str, Any]], func_name: str | None, where: str) -> dict[str, Any]:
    """A task answer; checks that every test has string ``input``/``output`` and, for functional tests,
    that inputs and outputs are JSON (so a bad row fails when the data set loads, not mid-training)."""
    if mode not in MODES:
        raise ValueError(f"{where}: test mode must be one of {MODES}, got {mode!r}")
    if mode == "functional" and not func_name:
        raise ValueError(f"{where}: functional tests need a function name (metadata `func_name`)")
    if not tests:
        raise ValueError(f"{where}: no test cases")
    clean = []
    for k, test in enumerate(tests):
        inp, out = test.get("input"), test.get("output")
        if not isinstance(inp, str) or not isinstance(out, str):
            raise ValueError(f"{where}: test {k} needs string `input` and `output`, got {sorted(test)}")
        if mode == "functional":
            try:
                functional_args(inp)
                json.loads(out)
            except ValueError as err:
                raise ValueError(f"{where}: functional test {k} is not JSON: {err}") from err
        clean.append({"input": inp, "output": out})
    return {"mode": mode, "func_name": func_name if mode == "functional" else None, "tests": clean}


def select_tests(tests: Sequence[Mapping[str, Any]], max_tests: int | None) -> list[Mapping[str, Any]]:
    """At most ``max_tests`` tests: those with the longest inputs (the most demanding), in their order."""
    if max_tests is None or len(tests) <= max_tests:
        return list(tests)
    keep = sorted(range(len(tests)), key=lambda i: (-len(tests[i]["input"]), i))[:max_tests]
    return [tests[i] for i in sorted(keep)]


def functional_args(text: str) -> list[Any]:
    """A functional test's arguments: one JSON value per line."""
    return [json.loads(line) for line in text.split("\n") if line.strip()]


# -- comparison ------------------------------------------------------------------------------------------
def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(token) for token in line.split()]
    except (InvalidOperation, ValueError):
        return None


def _equal_decimals(a: list[Decimal], b: list[Decimal]) -> bool:
    try:
        return a == b  # infinities compare as numbers; a quiet NaN equals nothing
    except InvalidOperation:  # a signalling NaN cannot be compared at all
        return False


def outputs_match(got: str, expected: str) -> bool:
    """LiveCodeBench's stdout rule: same number of lines after stripping; each line equal after stripping,
    or both lines whitespace-separated numbers equal as decimals (``Infinity`` == ``inf``)."""
    got_lines, want_lines = _lines(got), _lines(expected)
    if len(got_lines) != len(want_lines):
        return False
    for mine, theirs in zip(got_lines, want_lines):
        if mine == theirs:
            continue
        a, b = _decimals(mine), _decimals(theirs)
        if a is None or b is None or not _equal_decimals(a, b):
            return False
    return True


# Runs on every returned value in the sandbox (and here, for :func:`functional_match`), before the value goes back
# as JSON: JSON would turn a dict key 1 into "1" and a NaN into NaN, which then compare equal to the expected JSON
# where LiveCodeBench's ``prediction == expected`` does not. Such a value is replaced by one JSON cannot encode,
# which the harness reports as a wrong answer. Builtins come from the builtins module, not the program's globals.
# It runs in the program's own process, so a program can switch it off (rebind the name, patch ``builtins``); that
# lets through only a value whose JSON equals the expected one (int keys for str keys), never a wrong answer: the
# comparison with the expected value happens on the host.
_VALUE_CHECK = """
def __opdgrpo_lcb_value__(value):
    import builtins as b
    seen, stack = b.set(), [value]
    while stack:
        item = stack.pop()
        if b.isinstance(item, b.float):
            if item != item:
                return b.object()
        elif b.isinstance(item, (b.dict, b.list, b.tuple)):
            if b.id(item) in seen:
                continue
            seen.add(b.id(item))
            if b.isinstance(item, b.dict):
                if not b.all(b.isinstance(key, b.str) for key in item):
                    return b.object()
                stack.extend(item.values())
            else:
                stack.extend(item)
    return value
"""
_value_check_ns: dict[str, Any] = {}
exec(_VALUE_CHECK, _value_check_ns)  # the same code the sandbox runs
_lcb_value = _value_check_ns["__opdgrpo_lcb_value__"]


def functional_match(value: Any, expected_output: str) -> bool:
    """Whether a value a program returned passes a functional test whose expected output is ``expected_output``
    (JSON text): the comparison grading makes, in the sandbox (:data:`_VALUE_CHECK`) and then in
    :func:`opdgrpo.sandbox.execution.check_programs` (the value's JSON round trip ``==`` the decoded expected output)."""
    expected = json.loads(expected_output)
    try:
        returned = json.loads(json.dumps(_lcb_value(value)))
    except (TypeError, ValueError):
        return False  # not JSON-serialisable: the harness reports no value
    return returned == expected


# -- scoring --------------------------------------------------------------------------------------------
def check_completions(answers: Sequence[Mapping[str, Any]], completions: Sequence[str],
                      config: VerifierConfig = VerifierConfig()) -> list[CodeResult]:  # fmt: skip
    """Grade each completion against its answer's tests; one :class:`CodeResult` per completion, in order."""
    if len(answers) != len(completions):
        raise ValueError(f"{len(answers)} answers but {len(completions)} completions")
    results: list[CodeResult | None] = [None] * len(completions)
    stdin_jobs: list[tuple[int, str, Mapping[str, Any]]] = []
    func_jobs: list[tuple[int, str, Mapping[str, Any]]] = []
    for i, (answer, completion) in enumerate(zip(answers, completions)):
        total = len(answer["tests"])
        program = extract_program(completion)
        if program is None:
            results[i] = CodeResult("no_code", 0, total)
        elif answer["mode"] == "stdin":
            stdin_jobs.append((i, program, answer))
        elif answer["mode"] == "functional":
            func_jobs.append((i, program, answer))
        else:
            raise ValueError(f"answer {i}: unknown test mode {answer['mode']!r}; expected one of {MODES}")
    for i, result in zip([j[0] for j in stdin_jobs], _check_stdin(stdin_jobs, config)):
        results[i] = result
    for i, result in zip([j[0] for j in func_jobs], _check_functional(func_jobs, config)):
        results[i] = result
    return [r for r in results if r is not None]


def score_completions(answers: Sequence[Mapping[str, Any]], completions: Sequence[str],
                      config: VerifierConfig = VerifierConfig()) -> list[float]:  # fmt: skip
    """Rewards: 1.0 when every test passes, else 0.0."""
    return [r.reward for r in check_completions(answers, completions, config)]


def _check_stdin(jobs, config: VerifierConfig) -> list[CodeResult]:
    runs = []
    for _, program, answer in jobs:
        expected = [t["output"] for t in answer["tests"]]
        # Checked on the host after the run (opdgrpo.sandbox.stdio), never sent to the sandbox: a program must not
        # learn the expected output's length.
        caps = tuple(2 * len(e.encode("utf-8", "replace")) + 4096 for e in expected)
        runs.append(StdioRun(program, tuple(t["input"] for t in answer["tests"]), caps))
    outcomes = run_stdio_programs(runs, config.per_test_timeout_s, config.memory_mb,
                                  workers=config.workers, prelude=PRELUDE)  # fmt: skip
    results = []
    for (_, _, answer), outcome in zip(jobs, outcomes):
        expected = [t["output"] for t in answer["tests"]]
        total = len(expected)
        matched = [outputs_match(got, want) for got, want in zip(outcome.outputs, expected)]
        passed = sum(matched)
        if outcome.status == "ok" and passed == total:
            status = "pass"
        elif not all(matched):
            status = "wrong"
        else:
            status = outcome.status
        results.append(CodeResult(status, passed, total))
    return results


def _check_functional(jobs, config: VerifierConfig) -> list[CodeResult]:
    checks = []
    for _, program, answer in jobs:
        tests = tuple((tuple(functional_args(t["input"])), json.loads(t["output"])) for t in answer["tests"])
        checks.append(ProgramCheck(_with_entry(program, answer["func_name"]), _SHIM, tests))
    if not checks:
        return []
    budget = sum(config.per_test_timeout_s * (len(c.tests) + 1) + 0.5 for c in checks)
    outcomes = check_programs(checks, per_test_timeout_s=config.per_test_timeout_s,
                              batch_timeout_s=math.ceil(budget) + 5, memory_mb=config.memory_mb,
                              workers=config.workers)  # fmt: skip
    results = []
    for outcome in outcomes:
        if outcome.all_passed:
            status = "pass"
        elif outcome.status == "ok":
            status = "wrong"
        else:
            status = outcome.status
        results.append(CodeResult(status, outcome.passed, outcome.total))
    return results


def _with_entry(program: str, func_name: str) -> str:
    """The program with the prelude in front and an entry point after it that calls
    ``Solution().<func_name>`` (LeetCode style) or else a top-level ``<func_name>``, fresh per call, and passes
    what it returns through :data:`_VALUE_CHECK`."""
    name = json.dumps(func_name)
    return (
        f"{PRELUDE}\n{program}\n\n{_VALUE_CHECK}\n"
        f"def {_SHIM}(*args):\n"
        f"    cls = globals().get('Solution')\n"
        f"    if isinstance(cls, type) and hasattr(cls, {name}):\n"
        f"        return __opdgrpo_lcb_value__(getattr(cls(), {name})(*args))\n"
        f"    return __opdgrpo_lcb_value__(globals()[{name}](*args))\n"
    )
