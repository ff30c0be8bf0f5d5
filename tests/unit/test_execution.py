"""Batched checking of model-written functions: right scores, isolation between items, speed."""

from __future__ import annotations

import os
import time
import uuid

import pytest
from proc_markers import survivors_after

import opdgrpo.sandbox.execution as execution
from opdgrpo.sandbox.execution import CheckOutcome, ProgramCheck, check_programs
from opdgrpo.sandbox.isolation import isolation

TESTS = (((0,), 1), ((1,), 4), ((2,), 7), ((5,), 16))  # f(x) = 3x + 1


def check(source: str, tests=TESTS, name: str = "f") -> ProgramCheck:
    return ProgramCheck(source, name, tests)


@pytest.fixture
def harness_runs(monkeypatch):
    """Count the sandbox runs check_programs makes (and the items each one carried)."""
    runs: list[int] = []
    real = execution._run_harness

    def counting(batch, *args, **kwargs):
        runs.append(len(batch))
        return real(batch, *args, **kwargs)

    monkeypatch.setattr(execution, "_run_harness", counting)
    return runs


def test_outcome_properties():
    assert CheckOutcome(3, 4, "ok").fraction == 0.75
    assert not CheckOutcome(3, 4, "ok").all_passed
    assert CheckOutcome(4, 4, "ok").all_passed
    assert CheckOutcome(0, 0, "ok").fraction == 0.0 and not CheckOutcome(0, 0, "ok").all_passed


def test_mixed_batch_gives_right_outcomes(harness_runs):
    programs = [
        "def f(x):\n    return x*3+1\n",  # correct
        "def f(x):\n    return x*3\n",  # wrong
        "def f(x):\n    return 1 if x == 0 else x*3+1 if x < 2 else 0\n",  # 2 of 4
        "def f(x)\n    return x\n",  # syntax error
        "def f(x):\n    if x == 2:\n        raise ValueError\n    return x*3+1\n",  # raises on one test
        "def f(x):\n    while True:\n        pass\n",  # infinite loop
        "def f(x):\n    if x == 2:\n        while True:\n            pass\n    return x*3+1\n",  # loops on test 3
        "def g(x):\n    return x*3+1\n",  # wrong name
        "def f(x):\n    print('noise' * 1000)\n    return x*3+1\n",  # prints: still fine
    ]
    out = check_programs([check(p) for p in programs], per_test_timeout_s=0.3, workers=1)
    assert [(o.passed, o.total, o.status) for o in out] == [
        (4, 4, "ok"),
        (0, 4, "ok"),
        (2, 4, "ok"),
        (0, 4, "syntax"),
        (3, 4, "runtime"),
        (0, 4, "timeout"),
        (2, 4, "timeout"),
        (0, 4, "runtime"),
        (4, 4, "ok"),
    ]
    assert out[0].all_passed and out[2].fraction == 0.5
    assert harness_runs == [len(programs)]  # one sandbox run for the whole batch


def test_loop_that_swallows_the_alarm_is_killed():
    src = (
        "def f(x):\n    while True:\n        try:\n            while True:\n                pass\n"
        "        except BaseException:\n            pass\n"
    )
    start = time.monotonic()
    (out,) = check_programs([check(src)], per_test_timeout_s=0.2)
    assert out.status == "timeout" and out.passed == 0
    assert time.monotonic() - start < 0.2 * 5 + 4


def test_hostile_programs_do_not_hurt_batch_mates(harness_runs):
    hostile = {  # program -> expected status (passed is 0 for all)
        "import os\nos._exit(3)\n": "runtime",
        "x = bytearray(10**10)\ndef f(x):\n    return x*3+1\n": "memory",
        "def f(x):\n    return [0] * (10**10)\n": "memory",
        "import ctypes\ndef f(x):\n    return ctypes.string_at(0)\n": "runtime",  # segfault
        # kills its harness: rerun alone, where it does it again
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef f(x):\n    return x*3+1\n": "sandbox",
        # writes garbage into the harness's stdout (found through /proc, as the caller sees it); a program with
        # a uid of its own (bwrap as root) cannot even reopen that pipe (mode 0600, the caller's) and fails at once
        "import os\nppid = [l.split()[1] for l in open('/proc/self/status') if l.startswith('PPid')][0]\n"
        "fd = os.open('/proc/%s/fd/1' % ppid, os.O_WRONLY)\nos.write(fd, b'{garbage\\n' * 50)\n"
        "def f(x):\n    return x*3+1\n": "sandbox" if isolation()["uid"] == os.getuid() else "runtime",
        # patches a builtin: must not leak into later items
        "import builtins\nbuiltins.abs = lambda v: 0\ndef f(x):\n    return abs(x)\n": "ok",
    }
    programs, expected = [], []
    for k, (src, status) in enumerate(hostile.items()):
        good = f"def f(x):\n    return abs(x)*3+1  # {k}\n"
        programs += [good, src]
        expected += [(4, 4, "ok"), (0, 4, status)]
    programs.append("def f(x):\n    return abs(x)*3+1  # last\n")
    expected.append((4, 4, "ok"))
    out = check_programs([check(p) for p in programs], workers=1)
    assert [(o.passed, o.total, o.status) for o in out] == expected
    assert len(harness_runs) > 1  # the fallback ran


def test_killed_harness_alone_is_sandbox_but_others_rebatched(harness_runs):
    killer = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
    good = [f"def f(x):\n    return x*3+{1 if k % 2 else 2}\n# {k}\n" for k in range(6)]
    out = check_programs([check(p) for p in good[:3] + [killer] + good[3:]], workers=1)
    assert [o.passed for o in out] == [0, 4, 0, 0, 4, 0, 4]
    assert out[3].status == "sandbox"
    assert harness_runs == [7, 1, 3]  # batch dies at item 3; item 3 alone; the rest as a new batch


def test_duplicates_are_run_once_and_results_stay_in_order(harness_runs):
    a = check("def f(x):\n    return x*3+1\n")
    b = check("def f(x):\n    return x*3\n")
    c = check("def f(x):\n    return 3*x+1\n")
    inputs = [a, b, a, a, c, b, a]
    out = check_programs(inputs, workers=1)
    assert [o.passed for o in out] == [4, 0, 4, 4, 4, 0, 4]
    assert harness_runs == [3]


def test_outcomes_the_program_decides_are_remembered_and_load_bound_ones_are_not(harness_runs):
    """A completion scored in an earlier step is not run again (ok, syntax, runtime); a timeout, which the machine's
    load can cause, is; so is the same program under other limits."""
    good, broken, raising = check("def f(x):\n    return x*3+1\n"), check("def f(x) return\n"), check("def f(x):\n    1/0\n")
    stuck = check("def f(x):\n    while True:\n        pass\n", tests=(((0,), 0),))
    first = check_programs([good, broken, raising, stuck], per_test_timeout_s=0.2, workers=1)
    assert [o.status for o in first] == ["ok", "syntax", "runtime", "timeout"]
    assert harness_runs == [4]
    again = check_programs([raising, good, stuck, broken], per_test_timeout_s=0.2, workers=1)
    assert again == [first[2], first[0], first[3], first[1]]
    assert harness_runs == [4, 1]   # only the timeout ran again
    check_programs([good], per_test_timeout_s=0.3, workers=1)
    assert harness_runs == [4, 1, 1]   # other limits: not the remembered outcome


def test_comparison_is_by_value_outside_the_sandbox():
    tests = (((1, 2), [1, 2]), ((2, 2), 4.0))
    programs = {
        "def f(a, b):\n    return (a, b) if a == 1 else a * b\n": 2,  # tuple == list, 4 == 4.0
        "class A:\n    def __eq__(self, other):\n        return True\ndef f(a, b):\n    return A()\n": 0,
        "def f(a, b):\n    return {a, b} if a == 1 else 4\n": 1,  # a set is not JSON: that test fails
        "import json\ndef f(a, b):\n    return [1, 2] if a == 1 else 5\nprint(json.dumps({'passed': 2}))\n": 1,
    }
    out = check_programs([check(p, tests) for p in programs])
    assert [o.passed for o in out] == list(programs.values())
    assert out[1].status == "ok"


def test_items_do_not_share_globals():
    first = (
        "import builtins\nbuiltins.len = lambda v: 0\nSTATE = []\n"
        "def f(x):\n    STATE.append(x)\n    return len(STATE)\n"
    )
    second = "def f(x):\n    return len([x]) + len(globals().get('STATE', []))\n"
    tests = (((0,), 1), ((1,), 2))
    out = check_programs([check(first, tests), check(second, ((((0,), 1),) * 2))], workers=1)
    assert out[0].passed == 0  # len is patched inside its own process
    assert out[1] == CheckOutcome(2, 2, "ok")


def test_an_item_sees_only_its_own_module():
    """The harness's warm-up runs before any fork: an item's globals hold its own names and nothing else."""
    source = "def f(x):\n    return sorted(k for k in globals() if k != '__builtins__')\n"
    out = check_programs([check(source, (((0,), ["__name__", "f"]),))], workers=1)
    assert out[0] == CheckOutcome(1, 1, "ok")


def test_background_process_is_cleaned_up_between_items():
    if not isolation()["pid"]:
        pytest.skip("no PID namespace: an item's setsid() daemon cannot be swept")
    marker = f"opdgrpo-daemon-{uuid.uuid4().hex}"
    daemon = (  # the sandbox has its own /proc: the daemon is found by the marker in its argv
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv(sys.executable, [sys.executable, '-c', 'import time\\nwhile True: time.sleep(1)', {marker!r}])\n"
        "time.sleep(0.2)\n"
        "def f(x):\n    return x*3+1\n"
    )
    out = check_programs([check(daemon), check("def f(x):\n    return x*3+1\n")], workers=1)
    assert [o.passed for o in out] == [4, 4]
    assert survivors_after(marker) == []


def test_empty_and_invalid_input():
    assert check_programs([]) == []
    with pytest.raises(ValueError):
        check_programs([check("def f(x): return x", (((object(),), 1),))])
    with pytest.raises(ValueError):
        check_programs([check("def f(x): return x")], per_test_timeout_s=0)


def test_500_checks_are_fast():
    checks = []
    for k in range(500):
        a, b = 2 + k % 7, k
        wrong = k % 5 == 0
        src = f"def f(x):\n    y = x * {a + wrong}\n    return y + {b}\n"
        checks.append(ProgramCheck(src, "f", tuple(((x,), a * x + b) for x in (0, 1, 3, 10, -4))))
    start = time.monotonic()
    out = check_programs(checks)
    elapsed = time.monotonic() - start
    print(f"\n500 checks (500 unique, 5 tests each): {elapsed:.2f} s")
    assert [o.all_passed for o in out] == [k % 5 != 0 for k in range(500)]
    assert all(o.status == "ok" for o in out)
    assert elapsed < 30
