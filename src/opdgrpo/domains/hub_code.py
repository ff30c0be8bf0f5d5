"""Paper-scale code domain: LiveCodeBench held out, DeepCoder (or LiveCodeBench-format rows) for training.

Rows of two shapes become tasks (:meth:`HubCodeDomain.to_task` tells them apart by their columns):

* **LiveCodeBench** (``livecodebench/code_generation_lite`` and its parquet mirror
  ``lighteval/code_generation_lite``): eleven string columns ``question_title, question_content, platform,
  question_id, contest_id, contest_date, starter_code, difficulty, public_test_cases, private_test_cases,
  metadata``. Tests are public + private (LiveCodeBench grades on both); private ones may be compressed
  (:func:`~opdgrpo.verifiers.code.decode_test_cases`); ``metadata`` is a JSON string with ``func_name`` for
  functional (LeetCode) problems.
* **DeepCoder** (``agentica-org/DeepCoder-Preview-Dataset``): ``problem`` and ``tests`` (a JSON string), with
  ``starter_code`` and ``metadata`` (``{func_name}``) in the ``lcbv5`` config. ``tests`` is a list of
  ``{input, output, testtype}`` (``lcbv5``, ``codeforces``), a list of ``{input, output, type}``
  (``primeintellect``) or a dict ``{inputs, outputs[, fn_name]}`` (``taco``). Call-based problems of the
  last two are skipped: their expected values follow the APPS convention, where ``[x]`` may mean the
  value ``x`` or the list ``[x]``, which this verifier does not guess at.

The prompt is the problem statement plus an instruction in LiveCodeBench's style (read stdin and print, or
complete the starter code), the same for both shapes. So a training problem that is also a held-out problem
(DeepCoder's ``lcbv5`` rows are LiveCodeBench problems of May 2023 - Jul 2024) gets the same prompt and
:class:`~opdgrpo.domains.hub.HubDomain` drops it from the training pool.

Config keys on top of :class:`~opdgrpo.domains.hub.HubDomain`'s (see ``conf/domain/paper_code.yaml``):

* ``verifier: {per_test_timeout_s, memory_mb, workers, max_tests}`` (:class:`~opdgrpo.verifiers.code.VerifierConfig`);
* per set (``train`` or ``heldout.<set>``): ``contest_date: {start, end}`` keeps LiveCodeBench rows with
  ``start <= contest_date < end`` (ISO dates; either may be null), e.g. the v6 window out of ``release_v6``;
  ``keep: {difficulty: [easy, ...]}`` keeps rows of those LiveCodeBench difficulties (any column:
  :class:`~opdgrpo.domains.hub.HubDomain`);
  ``max_tests`` caps tests per problem (default: ``verifier.max_tests`` for ``train``, all for held-out sets).

Reward: 1.0 when the program passes every test (:mod:`opdgrpo.verifiers.code`). :meth:`HubCodeDomain.extra_metrics`
adds accuracy per LiveCodeBench difficulty and the share of each outcome (no code block, timeout, ...) to the
evaluation log, reusing the results :meth:`HubCodeDomain.score` just computed.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from datetime import datetime
from typing import Any, Mapping, Sequence

from ..verifiers.code import (
    CodeResult,
    VerifierConfig,
    check_completions,
    decode_test_cases,
    make_answer,
    select_tests,
)
from .base import Task
from .hub import HubDomain

LCB_COLUMNS = ("question_title", "question_content", "platform", "question_id", "contest_id", "contest_date",
               "starter_code", "difficulty", "public_test_cases", "private_test_cases", "metadata")  # fmt: skip
DEEPCODER_COLUMNS = ("problem", "tests")
TRAIN_KEYS = ("source", "size", "seed", "contest_date", "keep", "max_tests", "expected_rows")
HELDOUT_KEYS = ("source", "size", "seed", "k", "contest_date", "keep", "max_tests", "expected_rows")
_RECENT = 8192  # completions whose results check() remembers

STDIN_INSTRUCTION = (
    "Write a complete Python 3 program that reads the input from standard input and prints the answer to "
    "standard output. The program is run on hidden tests, so do not hard-code the examples. Give the whole "
    "program in one ```python code block."
)
FUNCTIONAL_INSTRUCTION = (
    "Complete the starter code below so that it solves the problem; keep its class and method signature. "
    "Give the whole solution in one ```python code block."
)


PROBLEM_HEADER = "### Problem"   # a problem's first line; a base model's next problem starts with it too


def build_problem(question: str, starter_code: str, mode: str) -> str:
    """The user message for one problem (before the domain's ``prompt_template``)."""
    instruction = FUNCTIONAL_INSTRUCTION if mode == "functional" else STDIN_INSTRUCTION
    text = f"{PROBLEM_HEADER}\n{question.strip()}\n\n### Instructions\n{instruction}\n"
    if starter_code and starter_code.strip():
        text += f"\n```python\n{starter_code.rstrip()}\n```\n"
    return text


def _metadata(value: Any, where: str) -> dict[str, Any]:
    """``metadata`` as a dict: a JSON string (LiveCodeBench), a struct (DeepCoder) or null."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            parsed = json.loads(value)
        except ValueError as err:
            raise ValueError(f"{where}: `metadata` is not JSON: {err}") from err
        return parsed if isinstance(parsed, dict) else {}
    raise ValueError(f"{where}: `metadata` must be a JSON string, a mapping or null, got {type(value).__name__}")


def _date(value: Any, where: str) -> datetime:
    """An ISO date string, or a datetime (``datetime.date`` is promoted): the raw ``test6.jsonl`` read by the
    ``json`` builder gives ``contest_date`` as a timestamp, the parquet configs as a string."""
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value))
    except ValueError as err:
        raise ValueError(f"{where}: not an ISO date: {value!r}") from err


class HubCodeDomain(HubDomain):
    """Code problems from hub data sets, scored by running the program in the sandbox (see module docs)."""

    def prompt_markers(self) -> tuple[str, ...]:
        """The problem's own header (:func:`build_problem`) on a line of its own: a completion that writes it has
        begun a next problem, whose program the verifier must not run. No "Question:" stop: a program may print it."""
        return tuple(dict.fromkeys(super().prompt_markers() + (f"\n{PROBLEM_HEADER}\n",)))

    def __init__(self, cfg: Mapping[str, Any]):
        super().__init__(cfg)
        self._recent: OrderedDict[tuple[str, str], CodeResult] = OrderedDict()
        self._lock = threading.Lock()
        self.verifier = VerifierConfig.from_mapping(cfg.get("verifier"), f"domains.{self.name}.verifier")
        self._check_spec(cfg.get("train"), f"domains.{self.name}.train", TRAIN_KEYS)
        for set_name, spec in (cfg.get("heldout") or {}).items():
            self._check_spec(spec, f"domains.{self.name}.heldout.{set_name}", HELDOUT_KEYS)

    @staticmethod
    def _check_spec(spec: Any, where: str, keys: Sequence[str]) -> None:
        if not isinstance(spec, Mapping):
            raise ValueError(f"config key `{where}` must be a mapping with a `source`, got {spec!r}")
        unknown = sorted(set(spec) - set(keys))
        if unknown:
            raise ValueError(f"config key `{where}` has unknown keys {unknown}; known: {list(keys)}")
        window = spec.get("contest_date")
        if window is not None:
            if not isinstance(window, Mapping) or set(window) - {"start", "end"}:
                raise ValueError(f"config key `{where}.contest_date` must be {{start, end}} (ISO dates or null), "
                                 f"got {window!r}")
            for edge in ("start", "end"):
                if window.get(edge) is not None:
                    _date(window[edge], f"config key `{where}.contest_date.{edge}`")
        limit = spec.get("max_tests")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise ValueError(f"config key `{where}.max_tests` must be an integer >= 1 (or null), got {limit!r}")

    def _spec_at(self, where: str) -> tuple[str, Mapping[str, Any]]:
        """``("train" | "heldout", block)`` from the key ``_tasks`` passes (``domains.<name>.train`` or
        ``domains.<name>.heldout.<set>``)."""
        prefix = f"domains.{self.name}."
        key = where[len(prefix):] if where.startswith(prefix) else where
        if key == "train":
            return "train", self.cfg["train"]
        if key.startswith("heldout."):
            return "heldout", (self.cfg.get("heldout") or {})[key[len("heldout."):]]
        raise KeyError(f"no train or held-out set at {where!r}")

    # -- rows -> tasks ------------------------------------------------------------------------------
    def to_task(self, row: Mapping[str, Any], where: str) -> Task | None:
        role, spec = self._spec_at(where)
        max_tests = spec.get("max_tests", self.verifier.max_tests if role == "train" else None)
        if all(c in row for c in LCB_COLUMNS):
            return self._lcb_task(row, where, spec, max_tests)
        if all(c in row for c in DEEPCODER_COLUMNS):
            if spec.get("contest_date") is not None:
                raise ValueError(f"config key `{where}.contest_date`: the data set has no `contest_date` column "
                                 f"(columns: {sorted(row)}); remove the window or use LiveCodeBench rows")
            return self._deepcoder_task(row, where, max_tests)
        raise ValueError(f"config key `{where}.source`: rows have columns {sorted(row)}; expected LiveCodeBench "
                         f"columns {list(LCB_COLUMNS)} or DeepCoder columns {list(DEEPCODER_COLUMNS)}")

    def _lcb_task(self, row: Mapping[str, Any], where: str, spec: Mapping[str, Any], max_tests) -> Task | None:
        at = f"config key `{where}.source`, question {row['question_id']!r}"
        date = _date(row["contest_date"], f"{at}: `contest_date`")
        window = spec.get("contest_date")
        if window is not None:  # before decoding the (large) tests of rows outside the window
            start, end = window.get("start"), window.get("end")
            if (start is not None and date < _date(start, "start")) or (end is not None and date >= _date(end, "end")):
                return None
        tests = (decode_test_cases(row["public_test_cases"], f"{at}: `public_test_cases`")
                 + decode_test_cases(row["private_test_cases"], f"{at}: `private_test_cases`"))  # fmt: skip
        mode = _single_mode(tests, "testtype", at)
        func_name = _metadata(row["metadata"], at).get("func_name")
        answer = make_answer(mode, select_tests(tests, max_tests), func_name, at)
        meta = {k: row[k] for k in ("question_id", "question_title", "platform", "contest_id", "difficulty")}
        meta.update(source="livecodebench", contest_date=date.isoformat())
        prompt = self.prompt(build_problem(row["question_content"], row["starter_code"] or "", mode))
        return Task(self.name, prompt, answer, meta)

    def _deepcoder_task(self, row: Mapping[str, Any], where: str, max_tests) -> Task | None:
        at = f"config key `{where}.source`"
        try:
            raw = json.loads(row["tests"]) if isinstance(row["tests"], str) else row["tests"]
        except ValueError as err:
            raise ValueError(f"{at}: `tests` is not JSON: {err}") from err
        func_name = None
        if isinstance(raw, Mapping):  # TACO / APPS: {"inputs": [...], "outputs": [...], "fn_name"?}
            if raw.get("fn_name"):
                return None
            tests = [{"input": _text(i), "output": _text(o)}
                     for i, o in zip(raw.get("inputs") or [], raw.get("outputs") or [])]  # fmt: skip
            mode = "stdin"
        elif isinstance(raw, list) and all(isinstance(t, Mapping) for t in raw):
            if not raw:
                return None
            if "testtype" in raw[0]:  # LiveCodeBench's format (configs lcbv5, codeforces)
                mode = _single_mode(raw, "testtype", at)
                func_name = _metadata(row.get("metadata"), at).get("func_name")
                tests = raw
            elif "type" in raw[0]:  # PrimeIntellect: {input, output, type: stdin_stdout | function_call[, fn_name]}
                if any(t.get("type") != "stdin_stdout" for t in raw):
                    return None
                tests = [{"input": _text(t.get("input")), "output": _text(t.get("output"))} for t in raw]
                mode = "stdin"
            else:
                raise ValueError(f"{at}: test cases have neither `testtype` nor `type`: {sorted(raw[0])}")
        else:
            raise ValueError(f"{at}: unrecognised `tests` (expected a list of {{input, output, testtype|type}} "
                             f"or a dict {{inputs, outputs}}): {str(row['tests'])[:200]!r}")
        if not tests:
            return None
        answer = make_answer(mode, select_tests(tests, max_tests), func_name, at)
        prompt = self.prompt(build_problem(row["problem"], row.get("starter_code") or "", mode))
        return Task(self.name, prompt, answer, {"source": "deepcoder"})

    # -- scoring ------------------------------------------------------------------------------------
    def check(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[CodeResult]:
        """Per-completion :class:`~opdgrpo.verifiers.code.CodeResult` s (status, tests passed). The last
        results are remembered, so :meth:`extra_metrics` right after :meth:`score` runs nothing again."""
        keys = [(t.prompt, c) for t, c in zip(tasks, completions)]
        with self._lock:
            cached = {k: self._recent[k] for k in keys if k in self._recent}
        todo = [i for i, k in enumerate(keys) if k not in cached]
        fresh = check_completions([tasks[i].answer for i in todo], [completions[i] for i in todo],
                                  self.verifier) if todo else []  # fmt: skip
        with self._lock:
            for i, result in zip(todo, fresh):
                self._recent[keys[i]] = cached[keys[i]] = result
                self._recent.move_to_end(keys[i])
            while len(self._recent) > _RECENT:
                self._recent.popitem(last=False)
        return [cached[k] for k in keys]

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        return [r.reward for r in self.check(tasks, completions)]

    def extra_metrics(self, tasks: Sequence[Task], completions: Sequence[str]) -> dict[str, float]:
        """Accuracy per LiveCodeBench difficulty (``accuracy_easy`` ...; rows that carry one) and the share of
        completions per outcome (``status_pass``, ``status_no_code``, ``status_timeout``, ...): a cut-off or
        unformatted answer (``no_code``) and a wrong program read the same in the accuracy."""
        results = self.check(tasks, completions)
        metrics: dict[str, float] = {}
        by_level: dict[str, list[float]] = {}
        for task, result in zip(tasks, results):
            level = task.meta.get("difficulty")
            if level:
                by_level.setdefault(str(level), []).append(result.reward)
        for level, rewards in sorted(by_level.items()):
            metrics[f"accuracy_{level}"] = sum(rewards) / len(rewards)
        for status in sorted({r.status for r in results}):
            metrics[f"status_{status}"] = sum(r.status == status for r in results) / len(results)
        return metrics


def _single_mode(tests: Sequence[Mapping[str, Any]], key: str, at: str) -> str:
    """The one test mode (``stdin`` or ``functional``) all of a problem's tests share."""
    modes = {t.get(key) for t in tests}
    if len(modes) != 1 or not modes <= {"stdin", "functional"}:
        raise ValueError(f"{at}: tests must all be `stdin` or all `functional`, got {key} {sorted(map(str, modes))}")
    return modes.pop()


def _text(value: Any) -> str:
    """A TACO/PrimeIntellect stdin test value as text (some store a list of lines)."""
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return "" if value is None else str(value)

