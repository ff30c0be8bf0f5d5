"""Check many small model-written Python functions against hidden tests, fast, in the sandbox.

This is the reward of the code domain: a training step scores hundreds of completions, and one
sandboxed interpreter per completion (~20 ms each) would dominate the step. So :func:`check_programs`

1. deduplicates identical checks (a GRPO group often repeats a completion);
2. runs ONE harness program per batch through :func:`opdgrpo.sandbox.isolation.run_python`, with the items
   as JSON on its stdin. The harness forks a fresh process per item (so items cannot see or
   corrupt each other's globals), in its own process group and with stdio on ``/dev/null``. Each test
   call (and the module's own top-level code) runs under a ``setitimer`` alarm; the harness also
   enforces a per-item deadline and SIGKILLs a stuck item. Results come back through a pipe and the
   harness prints one JSON line per item, as it finishes (a harness silent for longer than an item's
   budget, e.g. one an item SIGSTOPped, ends the run early);
3. remembers, per process, the outcome of every check whose verdict cannot depend on the machine's load
   (``ok``, ``syntax``, ``runtime``: the program ran to its end or failed by itself), so a completion seen
   in an earlier step or evaluation is not run again; a policy that has learnt a function writes it
   again and again (a tiny GRPO code step spent about a fifth of its time in the sandbox). ``timeout``,
   ``memory`` and ``sandbox`` outcomes are always run afresh. A program that draws random numbers keeps
   its first draw, which is as fair a sample of its behaviour as a fresh one;
4. if the batch run does not end ``"ok"`` or its output stops parsing, keeps the items whose lines
   arrived intact and in order, runs the item that was in flight alone (its own ``run_python``), and
   runs the rest as a new batch. So a program that kills or floods its harness costs its batch-mates
   nothing but a restart, and is scored on its own.

The expected values never enter the sandbox, nor anything derived from them: the harness returns what each
call returned (as JSON) and the comparison ``result == expected`` happens here, after a JSON round trip of
both sides (so tuples equal lists, ``3 == 3.0`` and ``True == 1`` as in Python, and a result that is not
JSON-serialisable fails). A program therefore cannot pass by printing a fake verdict or by returning
an object whose ``__eq__`` always says yes. The harness's size limits are constants (:data:`VALUE_CAP_BYTES`,
:data:`ITEM_CAP_BYTES`): a limit computed from the expected result (say, a few times its length) would sit
in the harness's frames, where a program can read it and answer a yes/no question by its size. The host's
own limit on a batch's output is computed from the expected results, but it only ever ends a run. The items
travel on the harness's stdin (not in its script, a file the program can read), and an item's process drops
the other items before its program runs. Test arguments reach the function as JSON values (lists, not
tuples). Only the standard library is importable in the sandbox.

Outcome statuses (one word): ``"ok"`` (every test ran; some may still be wrong), ``"syntax"``
(does not compile; passed 0), ``"runtime"`` (a test raised, the module's own code raised, the function
is missing, or the process died), ``"timeout"`` (a test or the module hit its time limit; the item
stops at the first one), ``"memory"`` (MemoryError), ``"sandbox"`` (the program broke the harness's
protocol or the sandbox failed; passed 0).
"""

from __future__ import annotations

import json
import logging
import os
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

from opdgrpo.sandbox.isolation import SandboxResult, run_python
from opdgrpo.sandbox.programs import program

__all__ = ["ProgramCheck", "CheckOutcome", "check_programs"]

log = logging.getLogger(__name__)

_SEVERITY = {"ok": 0, "runtime": 1, "memory": 2, "timeout": 3}
_ITEM_SLACK_S = 0.5  # per item, on top of one time limit per test plus one for the module's own code
_STARTUP_S = 3.0  # sandbox start-up allowance for a run of one item
_REMEMBERED = ("ok", "syntax", "runtime")  # outcomes the program decides alone, never the machine's load
#: Most bytes of one returned value's JSON the harness sends back (longer: the test fails). A constant, never
#: derived from the expected value: what the sandbox sees must say nothing about the answer.
VALUE_CAP_BYTES = 4 << 20
#: Most bytes one item's process may send the harness in all (more: the item is a protocol breach, passed 0).
ITEM_CAP_BYTES = 16 << 20
_MEMO_SIZE = 65536  # outcomes kept per process (least recently used dropped): a few MB at most
_memo: "OrderedDict[tuple, CheckOutcome]" = OrderedDict()


@dataclass(frozen=True)
class ProgramCheck:
    """A program and the hidden tests of one function in it.

    ``tests`` is ``((args_tuple, expected_result), ...)`` with JSON-serialisable values.
    """

    source: str
    func_name: str
    tests: tuple[tuple[tuple, object], ...]


@dataclass(frozen=True)
class CheckOutcome:
    passed: int
    total: int
    status: str

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total


@dataclass(frozen=True)
class _Item:
    check: ProgramCheck
    expected: tuple[Any, ...]  # JSON round-tripped
    payload: dict[str, Any]  # what the harness gets: nothing derived from the expected values
    output_budget: int  # bytes of the harness's record this item may take; host side only


def check_programs(
    checks: Sequence[ProgramCheck],
    per_test_timeout_s: float = 0.5,
    batch_timeout_s: float = 30.0,
    memory_mb: int = 512,
    *,
    workers: int | None = None,
) -> list[CheckOutcome]:
    """Score each check; returns one :class:`CheckOutcome` per input, in order.

    ``per_test_timeout_s`` bounds each call (and the module's top-level code); ``batch_timeout_s``
    bounds one harness run; ``memory_mb`` is the address-space limit of every process. Unique items
    are split round-robin over ``workers`` concurrent harness runs (default: CPU count, at most 4).
    """
    if per_test_timeout_s <= 0 or batch_timeout_s <= 0:
        raise ValueError("per_test_timeout_s and batch_timeout_s must be positive")
    index_of: dict[str, int] = {}
    items: list[_Item] = []
    order: list[int] = []
    for check in checks:
        item = _item(check)
        key = json.dumps([check.source, check.func_name, item.payload["args"], item.expected])
        if key not in index_of:
            index_of[key] = len(items)
            items.append(item)
        order.append(index_of[key])
    if not items:
        return []
    memo_keys = [(key, per_test_timeout_s, memory_mb) for key in index_of]   # in item order; other limits, other key
    scored = {i: _memo[k] for i, k in enumerate(memo_keys) if k in _memo}
    for i in scored:
        _memo.move_to_end(memo_keys[i])
    fresh = [i for i in range(len(items)) if i not in scored]
    if fresh:
        scored.update(_run_fresh(fresh, items, per_test_timeout_s, batch_timeout_s, memory_mb, workers))
    for i in fresh:
        if scored[i].status in _REMEMBERED:
            _memo[memo_keys[i]] = scored[i]
    while len(_memo) > _MEMO_SIZE:
        _memo.popitem(last=False)
    return [scored[i] for i in order]


def _run_fresh(fresh: list[int], items: list[_Item], per_test_s: float, batch_s: float, memory_mb: int,
               workers: int | None) -> dict[int, CheckOutcome]:
    """Run the items not remembered, split round-robin over concurrent harness runs."""
    n_workers = max(1, min(workers or min(4, os.cpu_count() or 1), len(fresh)))
    shards = [fresh[k::n_workers] for k in range(n_workers)]

    def run_shard(shard: list[int]) -> dict[int, CheckOutcome]:
        return _score_all(shard, items, per_test_s, batch_s, memory_mb)

    if n_workers == 1:
        return run_shard(shards[0])
    scored: dict[int, CheckOutcome] = {}
    with ThreadPoolExecutor(n_workers) as pool:
        for part in pool.map(run_shard, shards):
            scored.update(part)
    return scored


def _item(check: ProgramCheck) -> _Item:
    if not isinstance(check.source, str) or not isinstance(check.func_name, str):
        raise TypeError("ProgramCheck.source and func_name must be str")
    try:
        args = [json.loads(json.dumps(list(a))) for a, _ in check.tests]
        expected_text = [json.dumps(e) for _, e in check.tests]
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"tests of {check.func_name!r} must be ((args_tuple, expected), ...) of JSON values: {exc}"
        ) from exc
    # A result much longer than the expected one cannot equal it: the host stops reading a harness whose items
    # replied far more than that (the run ends, its items are rerun, the culprit alone). Never sent to the sandbox.
    budget = sum(4 * len(text) + 256 + 64 for text in expected_text) + 256
    payload = {"source": check.source, "func": check.func_name, "args": args}
    return _Item(check, tuple(json.loads(t) for t in expected_text), payload, budget)


def _score_all(
    pending: list[int], items: list[_Item], per_test_s: float, batch_s: float, memory_mb: int
) -> dict[int, CheckOutcome]:
    """Batch, keep the intact prefix, run the item in flight alone, batch the rest; repeat."""
    scored: dict[int, CheckOutcome] = {}
    while pending:
        alone = len(pending) == 1
        timeout = _item_budget(items[pending[0]], per_test_s) + _STARTUP_S if alone else batch_s
        result = _run_harness([items[i] for i in pending], per_test_s, timeout, memory_mb)
        records = _parse(result.stdout, len(pending))
        for i, record in zip(pending, records):
            scored[i] = _score(items[i], record)
        if len(records) == len(pending):
            break
        suspect = pending[len(records)]
        if alone:
            scored[suspect] = _failed(items[suspect], result)
            break
        log.info("harness batch of %d ended %r after %d items; running the next one alone",
                 len(pending), result.status, len(records))  # fmt: skip
        scored.update(_score_all([suspect], items, per_test_s, batch_s, memory_mb))
        pending = pending[len(records) + 1 :]
    return scored


def _item_budget(item: _Item, per_test_s: float) -> float:
    return per_test_s * (len(item.expected) + 1) + _ITEM_SLACK_S


def _run_harness(batch: list[_Item], per_test_s: float, timeout_s: float, memory_mb: int) -> SandboxResult:
    payload = json.dumps({"timeout": per_test_s, "slack": _ITEM_SLACK_S, "value_cap": VALUE_CAP_BYTES,
                          "item_cap": ITEM_CAP_BYTES, "items": [it.payload for it in batch]})  # fmt: skip
    cap = 4096 + sum(it.output_budget for it in batch)
    # The harness prints a line per item as it finishes: a longer silence means it is stuck (an item
    # SIGSTOPped it, say), so the batch ends then instead of at its full timeout.
    idle = max(_item_budget(it, per_test_s) for it in batch) + _STARTUP_S
    return run_python(_HARNESS, stdin=payload, timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=cap,
                      cpu_s=timeout_s + 1, idle_timeout_s=idle)  # fmt: skip


def _parse(stdout: str, n: int) -> list[dict[str, Any]]:
    """The complete, well-formed records at the start of the harness output, in order."""
    records: list[dict[str, Any]] = []
    lines = stdout.split("\n")[:-1]  # the last piece is empty or a line cut short
    for line in lines[:n]:
        try:
            record = json.loads(line)
        except ValueError:
            break
        if not (isinstance(record, dict) and record.get("i") == len(records) and isinstance(record.get("log"), list)):
            break
        records.append(record)
    return records


def _score(item: _Item, record: dict[str, Any]) -> CheckOutcome:
    """Turn one harness record into an outcome, comparing returned values with the expected ones."""
    total = len(item.expected)
    entries, end = record["log"], record.get("end")
    if end == "protocol" or not all(isinstance(e, list) and e for e in entries):
        return CheckOutcome(0, total, "sandbox")
    died = "timeout" if end == "timeout" else "runtime"
    if not entries:
        return CheckOutcome(0, total, died)
    head, results = entries[0], entries[1:]
    tag = head[0] if isinstance(head[0], str) else None
    if tag != "c":
        status = {"s": "syntax", "t": "timeout", "n": "runtime"}.get(tag)  # type: ignore[arg-type]
        if tag == "x":
            status = "memory" if head[1:] == ["MemoryError"] else "runtime"
        return CheckOutcome(0, total, status or "sandbox")
    if len(results) > total:
        return CheckOutcome(0, total, "sandbox")
    passed, status = 0, "ok"
    for expected, entry in zip(item.expected, results):
        kind = entry[0]
        if kind == "v" and len(entry) == 2 and entry[1] == expected:
            passed += 1
        elif kind == "t":
            status = _worse(status, "timeout")
        elif kind == "e":
            status = _worse(status, "memory" if entry[1:] == ["MemoryError"] else "runtime")
    if len(results) < total:
        status = _worse(status, died)
    return CheckOutcome(passed, total, status)


def _worse(a: str, b: str) -> str:
    return a if _SEVERITY[a] >= _SEVERITY[b] else b


def _failed(item: _Item, result: SandboxResult) -> CheckOutcome:
    """An item run alone that produced no usable record: its sandbox status says why."""
    status = result.status if result.status in ("timeout", "memory") else "sandbox"
    if result.status == "cpu":
        status = "timeout"
    return CheckOutcome(0, len(item.expected), status)


# The harness (opdgrpo/sandbox/programs/function_harness.py): its protocol is in its docstring.
_HARNESS = program("function_harness")
