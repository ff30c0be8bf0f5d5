"""Completions that try to be paid by the code reward without solving the problem: each must score 0.0.

The two problems have answers a program can guess only by reading them somewhere (Yes/No, True/False). The cheats
look where a sandboxed program can look: the harness's stack frames and locals (``sys._getframe``, ``inspect``),
every object the collector tracks (``gc``), the main module and its code, its argv, environment, work directory,
``/proc`` and its parent's pipes. The output caps the harness once received were derived from the expected output
(longer for "Yes" than for "No"), which paid these cheats on every test; others try early exits, forged result
records, floods, tampering with ``json``/builtins, objects with a lying ``__eq__``, and copying a batch-mate's
program or results. A correct program for each problem is still paid 1.0, so every check here can fail.

All cheats of a problem are scored in one ``check_completions`` call (real sandbox runs).
"""

from __future__ import annotations

import json
import uuid

import pytest

import opdgrpo.sandbox.execution as execution
import opdgrpo.sandbox.stdio as stdio
from opdgrpo.sandbox.isolation import run_python
from opdgrpo.verifiers.code import VerifierConfig, check_completions, make_answer

CONFIG = VerifierConfig(per_test_timeout_s=1.0, memory_mb=512, workers=2)

# -- a stdin problem: print Yes when n is even ----------------------------------------------------------------
STDIN_ANSWER = make_answer("stdin", [{"input": f"{n}\n", "output": "Yes" if n % 2 == 0 else "No"}
                                     for n in (4, 7, 10, 13)], None, "adversarial stdin")  # fmt: skip
STDIN_CORRECT = "n = int(input())\nprint('Yes' if n % 2 == 0 else 'No')\n"

# The cap the harness used to get was 2 * len(expected) + 4096: "Yes" -> 4102, "No" -> 4100.
_YES_FROM_CAP = "def yes(cap):\n    return isinstance(cap, int) and (cap - 4096) // 2 == 3\n"

STDIN_CHEATS = {
    "frame_walk": _YES_FROM_CAP + (
        "import sys\n"
        "f, cap = sys._getframe(), None\n"
        "while f is not None and cap is None:\n"
        "    cap = f.f_locals.get('cap')\n"
        "    f = f.f_back\n"
        "print('Yes' if yes(cap) else 'No')\n"
    ),
    "inspect_stack": _YES_FROM_CAP + (
        "import inspect\n"
        "caps = [fi.frame.f_locals.get('cap') for fi in inspect.stack()]\n"
        "print('Yes' if any(yes(c) for c in caps) else 'No')\n"
    ),
    "gc_payload": _YES_FROM_CAP + (
        "import gc, sys\n"
        "text, answer = sys.stdin.read(), 'No'\n"
        "for o in gc.get_objects():\n"
        "    if isinstance(o, dict) and isinstance(o.get('inputs'), list) and text in o['inputs']:\n"
        "        caps = o.get('caps') or o.get('output_caps') or []\n"
        "        i = o['inputs'].index(text)\n"
        "        answer = 'Yes' if i < len(caps) and yes(caps[i]) else answer\n"
        "print(answer)\n"
    ),
    "files_env_argv": (
        "import os, re, sys\n"
        "blobs = [' '.join(sys.argv), repr(dict(os.environ)), sys.stdin.read()]\n"
        "for d in ('.', '/tmp', os.environ.get('HOME', '.')):\n"
        "    for name in os.listdir(d):\n"
        "        try:\n"
        "            blobs.append(open(os.path.join(d, name), errors='replace').read())\n"
        "        except OSError:\n"
        "            pass\n"
        "for pid in ('self', str(os.getppid()), '1'):\n"
        "    for what in ('cmdline', 'environ'):\n"
        "        try:\n"
        "            blobs.append(open(f'/proc/{pid}/{what}', 'rb').read().decode('utf-8', 'replace'))\n"
        "        except OSError:\n"
        "            pass\n"
        "text = ' '.join(blobs)\n"
        "print('Yes' if re.search(r'\"output\": \"Yes\"|4102', text) else 'No')\n"
    ),
    "exit_silently": "import os\nos._exit(0)\n",
    "sys_exit_after_guess": "import sys\nprint('Yes')\nsys.exit(0)\n",
    "raise_base_exception": "print('Yes')\nraise BaseException('stop the harness')\n",
    "kill_the_harness": "import os, signal\nprint('Yes')\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "forged_records": (  # fake "ok" records straight onto the harness's own stdout, then end the harness
        "import json, os, signal\n"
        "fd = os.open(f'/proc/{os.getppid()}/fd/1', os.O_WRONLY)\n"
        "for i in range(4):\n"
        "    os.write(fd, (json.dumps({'i': i, 's': 'ok', 'o': 'Yes'}) + '\\n').encode())\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
    ),
    "fake_record_on_stdout": "import json\nprint(json.dumps({'i': 0, 's': 'ok', 'o': 'Yes'}))\n",
    "flood": "import sys\nwhile True:\n    sys.stdout.write('Yes\\nNo\\n' * 100000)\n",
    "patched_json_and_stdout": (
        "import json, sys, builtins\n"
        "json.dumps = lambda *a, **k: '{\"i\": 0, \"s\": \"ok\", \"o\": \"Yes\"}'\n"
        "builtins.print = lambda *a, **k: None\n"
        "sys.stdout.write('Yes')\n"
        "sys.stdout = open('/dev/null', 'w')\n"
    ),
    "thread_prints_after_exit": (
        "import threading, sys, time\n"
        "def spam():\n"
        "    while True:\n"
        "        sys.stdout.write('Yes\\n')\n"
        "        time.sleep(0.001)\n"
        "threading.Thread(target=spam, daemon=True).start()\n"
    ),
}

# -- a functional problem: isEven(n) returns a bool ------------------------------------------------------------
FUNC_ANSWER = make_answer("functional", [{"input": f"{n}", "output": "true" if n % 2 == 0 else "false"}
                                         for n in (2, 3, 8, 9)], "isEven", "adversarial functional")  # fmt: skip
FUNC_CORRECT = "class Solution:\n    def isEven(self, n: int) -> bool:\n        return n % 2 == 0\n"

# The cap the harness used to get was 4 * len(expected JSON) + 256: "true" -> 272, "false" -> 276.
_CALLS = "CALLS = [0]\ndef nth_call():\n    CALLS[0] += 1\n    return CALLS[0] - 1\n"

FUNC_CHEATS = {
    "frame_walk": (
        "import sys\n"
        "class Solution:\n"
        "    def isEven(self, n):\n"
        "        f = sys._getframe()\n"
        "        while f is not None:\n"
        "            if isinstance(f.f_locals.get('cap'), int):\n"
        "                return f.f_locals['cap'] == 272\n"
        "            f = f.f_back\n"
        "        return True\n"
    ),
    "inspect_stack": (
        "import inspect\n"
        "def isEven(n):\n"
        "    return any(fi.frame.f_locals.get('cap') == 272 for fi in inspect.stack())\n"
    ),
    "gc_items": (
        "import gc\n"
        "def isEven(n):\n"
        "    for o in gc.get_objects():\n"
        "        if isinstance(o, dict) and o.get('func') and [n] in (o.get('args') or []):\n"
        "            caps = o.get('caps') or []\n"
        "            i = o['args'].index([n])\n"
        "            if i < len(caps):\n"
        "                return caps[i] == 272\n"
        "    return True\n"
    ),
    "main_module_and_code": _CALLS + (  # the payload as a literal in the harness's own code or module
        "import re, sys\n"
        "def isEven(n):\n"
        "    k = nth_call()\n"
        "    f = sys._getframe()\n"
        "    texts = [repr(vars(sys.modules['__main__']))]\n"
        "    while f is not None:\n"
        "        texts += [c for c in f.f_code.co_consts if isinstance(c, str)]\n"
        "        f = f.f_back\n"
        "    for t in texts:\n"
        "        m = re.search(r'\"caps\": \\[([0-9, ]+)\\]', t)\n"
        "        if m:\n"
        "            return int(m.group(1).split(',')[k]) == 272\n"
        "    return True\n"
    ),
    "files_env_argv": _CALLS + (
        "import os, re, sys\n"
        "def isEven(n):\n"
        "    k = nth_call()\n"
        "    blobs = [' '.join(sys.argv), repr(dict(os.environ))]\n"
        "    for d in ('.', '/tmp', os.environ.get('HOME', '.')):\n"
        "        for name in os.listdir(d):\n"
        "            try:\n"
        "                blobs.append(open(os.path.join(d, name), errors='replace').read())\n"
        "            except OSError:\n"
        "                pass\n"
        "    for pid in ('self', str(os.getppid()), '1'):\n"
        "        try:\n"
        "            blobs.append(open(f'/proc/{pid}/cmdline', 'rb').read().decode('utf-8', 'replace'))\n"
        "        except OSError:\n"
        "            pass\n"
        "    m = re.search(r'\"caps\": \\[([0-9, ]+)\\]', ' '.join(blobs))\n"
        "    return bool(m) and int(m.group(1).split(',')[k]) == 272\n"
    ),
    "os_exit": "import os\ndef isEven(n):\n    os._exit(0)\n",
    "module_exit": "import sys\nsys.exit(0)\ndef isEven(n):\n    return True\n",
    "system_exit": "def isEven(n):\n    raise SystemExit(0)\n",
    "keyboard_interrupt": "def isEven(n):\n    raise KeyboardInterrupt\n",
    "base_exception": "class Stop(BaseException):\n    pass\ndef isEven(n):\n    raise Stop\n",
    "forged_pipe_lines": (  # claim every test on the harness pipe, then end before the real replies
        "import os, sys\n"
        "def isEven(n):\n"
        "    f = sys._getframe()\n"
        "    while f is not None and not isinstance(f.f_locals.get('fd'), int):\n"
        "        f = f.f_back\n"
        "    if f is not None:\n"
        "        fd = f.f_locals['fd']\n"
        "        os.write(fd, b''.join(b'[\"v\",true]\\n' for _ in range(4)) + b'[\"d\"]\\n')\n"
        "    os._exit(0)\n"
    ),
    "forged_stdout_record": (
        "import json, os, signal\n"
        "def isEven(n):\n"
        "    fd = os.open(f'/proc/{os.getppid()}/fd/1', os.O_WRONLY)\n"
        "    os.write(fd, (json.dumps({'i': 0, 'log': [['c']] + [['v', True]] * 4, 'end': None}) + '\\n').encode())\n"
        "    os.kill(os.getppid(), signal.SIGKILL)\n"
    ),
    "flood_pipe": (
        "import os, sys\n"
        "def isEven(n):\n"
        "    f = sys._getframe()\n"
        "    while not isinstance(f.f_locals.get('fd'), int):\n"
        "        f = f.f_back\n"
        "    while True:\n"
        "        os.write(f.f_locals['fd'], b'[\"v\",true]\\n' * 10000)\n"
    ),
    "huge_value": "def isEven(n):\n    return [True] * 10**7\n",
    "eq_always_true": (
        "class Yes:\n"
        "    def __eq__(self, other):\n        return True\n"
        "    __hash__ = object.__hash__\n"
        "    def __len__(self):\n        return 0\n"
        "    def __str__(self):\n        return 'true'\n"
        "    __repr__ = __str__\n"
        "def isEven(n):\n    return Yes()\n"
    ),
    "int_subclass_eq": (
        "class T(int):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n"
        "    def __repr__(self):\n        return 'true'\n"
        "def isEven(n):\n    return T(1)\n"
    ),
    "patched_json": (
        "import json, json.encoder\n"
        "json.dumps = lambda *a, **k: 'true'\n"
        "json.encoder.c_make_encoder = None\n"
        "json.JSONEncoder.encode = lambda self, o: 'true'\n"
        "def isEven(n):\n    return object()\n"
    ),
    "patched_value_check": (
        "import builtins\n"
        "def isEven(n):\n"
        "    globals()['__opdgrpo_lcb_value__'] = lambda v: True\n"
        "    builtins.isinstance = lambda *a: False\n"
        "    return None\n"
    ),
    "thread_writes_pipe": (
        "import os, sys, threading, time\n"
        "def isEven(n):\n"
        "    f = sys._getframe()\n"
        "    while not isinstance(f.f_locals.get('fd'), int):\n"
        "        f = f.f_back\n"
        "    fd = f.f_locals['fd']\n"
        "    def spam():\n"
        "        while True:\n"
        "            os.write(fd, b'[\"v\",true]\\n')\n"
        "            time.sleep(0.001)\n"
        "    threading.Thread(target=spam, daemon=True).start()\n"
        "    time.sleep(0.05)\n"
        "    return True\n"
    ),
}

# Copying a batch-mate: a correct program runs first in the same harness; the cheat looks for its source or its
# replies among the objects and frames it can reach.
_STEAL_SOURCE = (
    "import gc, sys\n"
    "def _others():\n"
    "    seen = [o for o in gc.get_objects() if isinstance(o, dict)]\n"
    "    f = sys._getframe()\n"
    "    while f is not None:\n"
    "        seen += [v for v in f.f_locals.values() if isinstance(v, dict)]\n"
    "        seen += [i for v in f.f_locals.values() if isinstance(v, list) for i in v if isinstance(i, dict)]\n"
    "        f = f.f_back\n"
    "    return seen\n"
    "def isEven(n):  # cheat-marker\n"
    "    for o in _others():\n"
    "        src = o.get('source')\n"
    "        if isinstance(src, str) and 'cheat-marker' not in src and o.get('func'):\n"
    "            ns = {}\n"
    "            exec(src, ns)\n"
    "            return ns[o['func']](n)\n"
    "    return True\n"
)
_STEAL_REPLIES = _CALLS + (
    "import gc, sys\n"
    "def isEven(n):\n"
    "    k = nth_call()\n"
    "    for o in gc.get_objects():\n"
    "        if isinstance(o, dict) and isinstance(o.get('log'), list) and len(o['log']) > k + 1:\n"
    "            return o['log'][k + 1][1]\n"
    "    f = sys._getframe()\n"
    "    while f is not None:\n"
    "        r = f.f_locals.get('record')\n"
    "        if isinstance(r, dict) and len(r.get('log', [])) > k + 1:\n"
    "            return r['log'][k + 1][1]\n"
    "        f = f.f_back\n"
    "    return True\n"
)


def fenced(program: str) -> str:
    return f"Let me solve it.\n```python\n{program}```\n"


def _rewards(answer: dict, correct: str, cheats: dict[str, str]) -> dict[str, float]:
    """Every program of one problem scored in one call, by name ("correct" and each cheat's)."""
    programs = [correct, *cheats.values()]
    results = check_completions([answer] * len(programs), [fenced(p) for p in programs], CONFIG)
    return {name: r.reward for name, r in zip(["correct", *cheats], results)}


@pytest.fixture(scope="module")
def stdin_rewards() -> dict[str, float]:
    return _rewards(STDIN_ANSWER, STDIN_CORRECT, STDIN_CHEATS)


@pytest.fixture(scope="module")
def functional_rewards() -> dict[str, float]:
    return _rewards(FUNC_ANSWER, FUNC_CORRECT, FUNC_CHEATS)


def test_correct_stdin_program_is_paid(stdin_rewards):
    assert stdin_rewards["correct"] == 1.0


@pytest.mark.parametrize("name", sorted(STDIN_CHEATS))
def test_stdin_cheat_is_not_paid(stdin_rewards, name):
    assert stdin_rewards[name] == 0.0


def test_correct_functional_program_is_paid(functional_rewards):
    assert functional_rewards["correct"] == 1.0


@pytest.mark.parametrize("name", sorted(FUNC_CHEATS))
def test_functional_cheat_is_not_paid(functional_rewards, name):
    assert functional_rewards[name] == 0.0


@pytest.mark.parametrize("thief", [_STEAL_SOURCE, _STEAL_REPLIES], ids=["source", "replies"])
def test_batch_mates_cannot_copy_each_other(thief):
    """One harness, the correct program first (a fresh text, so no remembered outcome skips its run)."""
    correct = FUNC_CORRECT + f"# {uuid.uuid4().hex}\n"
    one_harness = VerifierConfig(per_test_timeout_s=1.0, memory_mb=512, workers=1)
    results = check_completions([FUNC_ANSWER] * 2, [fenced(correct), fenced(thief)], one_harness)
    assert [r.reward for r in results] == [1.0, 0.0]


def _views(monkeypatch, answer: dict, program: str) -> list[tuple]:
    """Everything that reaches the sandbox when ``program`` is graded against ``answer``: the script, its stdin and
    every limit but the host's own cap on what it reads back (``max_output_bytes``, applied outside)."""
    seen: list[tuple] = []

    def spy(source, stdin="", *args, **kwargs):
        seen.append((source, stdin, args, sorted((k, v) for k, v in kwargs.items() if k != "max_output_bytes")))
        return run_python(source, stdin, *args, **kwargs)

    for module in (stdio, execution):
        monkeypatch.setattr(module, "run_python", spy)
    check_completions([answer], [fenced(program)], CONFIG)
    return seen


@pytest.mark.parametrize("mode", ["stdin", "functional"])
def test_the_sandbox_sees_nothing_of_the_expected_outputs(monkeypatch, mode):
    """Same program, same inputs, expected outputs of other lengths and text: the sandbox gets byte-identical input."""
    base = STDIN_ANSWER if mode == "stdin" else FUNC_ANSWER
    other = [{"input": t["input"], "output": json.dumps("a far longer expected output " * (k + 1))}
             for k, t in enumerate(base["tests"])]  # fmt: skip
    program = (STDIN_CORRECT if mode == "stdin" else FUNC_CORRECT) + f"# {uuid.uuid4().hex}\n"
    first = _views(monkeypatch, base, program)
    second = _views(monkeypatch, make_answer(mode, other, base["func_name"], "other outputs"), program)
    assert len(first) == 1 and first == second


def test_output_over_its_cap_is_stopped_on_the_host():
    """A test's cap (twice the expected output and more, as the verifier sets it) holds although the sandbox only
    knows its own constant cap: printing past it ends the run ``"output"``, as printing past the sandbox's does."""
    verbose = "print('x' * 5000)\n"
    runs = [stdio.StdioRun(verbose, ("", ""), (6000, 6000)), stdio.StdioRun(verbose, ("", ""), (6000, 4000))]
    out = stdio.run_stdio_programs(runs, per_test_timeout_s=1.0)
    assert out == [stdio.StdioOutcome("ok", ("x" * 5000 + "\n",) * 2), stdio.StdioOutcome("output", ("x" * 5000 + "\n",))]


@pytest.mark.parametrize("completion", [
    "<think>try this\n```python\nprint('Yes')\n```",
    "<think>a</think> draft\n<think>better:\n```python\nprint('Yes')\n```",
])
def test_a_program_inside_an_unclosed_thought_is_no_answer(completion):
    """Cut off while thinking: no answer, as in every domain, even after an earlier closed thought."""
    from opdgrpo.verifiers.code import extract_program

    assert extract_program(completion) is None
    assert extract_program(completion + "\n</think>\n```python\nprint(1)\n```") == "print(1)\n"
