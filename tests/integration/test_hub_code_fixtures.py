"""Paper-scale code domain: fixtures through the hub loader, test decoding, and grading in the sandbox."""

from __future__ import annotations

import copy
import json
import time
import uuid
from pathlib import Path

import pytest
import yaml
from proc_markers import survivors_after

from opdgrpo.domains.hub_code import HubCodeDomain
from opdgrpo.sandbox.isolation import isolation
from opdgrpo.verifiers.code import (
    decode_test_cases,
    select_tests,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "hub"
LCB = FIXTURES / "lighteval__code_generation_lite"
DEEPCODER = FIXTURES / "agentica-org__DeepCoder-Preview-Dataset"
FAST = {"per_test_timeout_s": 0.5, "memory_mb": 1024, "workers": 2, "max_tests": None}

# Reference solutions of the fixture problems, by question id.
SOLUTIONS = {
    "abc901_a": "a, b = map(int, input().split())\nprint(a + b)\n",
    "abc902_b": "import sys\n\ndef main():\n    data = sys.stdin.read().split()\n    n = int(data[0])\n"
                "    print(sum(map(int, data[1:1 + n])) / n)\n\nif __name__ == '__main__':\n    main()\n",
    "3901": "class Solution:\n    def rangeSum(self, nums: List[int], k: int) -> int:\n"
            "        return sum(heapq.nlargest(k, nums))\n",
    "3902": "class Solution:\n    def isPalindrome(self, s: str) -> bool:\n        return s == s[::-1]\n",
    "3903": "class Solution:\n    def sortedPairs(self, nums):\n        nums = sorted(nums)\n"
            "        return [(a, b) for i, a in enumerate(nums) for b in nums[i + 1:]]\n",  # tuples: count as lists
}


def config(**changes) -> dict:
    cfg = yaml.safe_load((REPO / "conf" / "domain" / "paper_code.yaml").read_text())
    cfg["train"]["source"]["path"] = str(DEEPCODER)
    cfg["heldout"]["lcb_v6"]["source"]["path"] = str(LCB)
    cfg["verifier"] = dict(FAST)
    for key, value in changes.items():
        node = cfg
        *parents, last = key.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    return cfg


@pytest.fixture(scope="module")
def domain() -> HubCodeDomain:
    return HubCodeDomain(config())


@pytest.fixture(scope="module")
def lcb(domain):
    return {t.meta["question_id"]: t for t in domain.heldout_sets()["lcb_v6"]}


def answer(program: str, thinking: str = "Let me think.") -> str:
    return f"<think>{thinking}</think>\nHere is my solution.\n```python\n{program}```\n"


def grade(domain, tasks, completions):
    return [(r.status, r.passed, r.total) for r in domain.check(tasks, completions)]


# -- loading ----------------------------------------------------------------------------------------------
def test_fixtures_load_through_the_hub_loader(lcb):
    assert sorted(lcb) == ["3901", "3902", "3903", "abc901_a", "abc902_b"]
    modes = {qid: (t.answer["mode"], t.answer["func_name"], len(t.answer["tests"])) for qid, t in lcb.items()}
    assert modes == {"abc901_a": ("stdin", None, 4), "abc902_b": ("stdin", None, 3),
                     "3901": ("functional", "rangeSum", 4), "3902": ("functional", "isPalindrome", 4),
                     "3903": ("functional", "sortedPairs", 2)}
    task = lcb["3901"]
    assert task.domain == "code" and task.meta["platform"] == "leetcode"
    assert task.meta["contest_date"] == "2025-03-15T19:30:00"
    assert "### Problem\nYou are given an integer array nums" in task.prompt
    assert "class Solution:\n    def rangeSum(self, nums: List[int], k: int) -> int:" in task.prompt
    assert "standard input" in lcb["abc901_a"].prompt and not lcb["abc901_a"].prompt.rstrip().endswith("```")
    json.dumps([t.answer for t in lcb.values()] + [t.meta for t in lcb.values()])  # answers and meta stay JSON


def test_compressed_private_tests_decode(lcb):
    import datasets

    rows = {r["question_id"]: r for r in datasets.load_dataset(str(LCB), "v6", split="test")}
    raw = rows["abc901_a"]["private_test_cases"]
    with pytest.raises(ValueError):
        json.loads(raw)  # really compressed
    tests = decode_test_cases(raw)
    assert [t["input"] for t in tests] == ["0 0\n", "1000000000 1000000000\n", "12 30\n"]
    assert {t["testtype"] for t in tests} == {"stdin"}
    # public first, then private, as LiveCodeBench grades them
    assert [t["output"] for t in lcb["abc901_a"].answer["tests"]] == ["7\n", "0\n", "2000000000\n", "42\n"]
    assert lcb["3901"].answer["tests"][1] == {"input": "[5]\n1", "output": "5"}


def test_cumulative_release_with_contest_date_window_equals_the_v6_config(domain, lcb):
    cumulative = HubCodeDomain(config(**{"heldout.lcb_v6.source.name": "release_v6"}))
    assert len(cumulative.heldout_sets()["lcb_v6"]) == 6  # one older problem too
    windowed = HubCodeDomain(config(**{"heldout.lcb_v6.source.name": "release_v6",
                                       "heldout.lcb_v6.contest_date": {"start": "2025-01-01", "end": "2025-05-01"}}))
    assert sorted(t.prompt for t in windowed.heldout_sets()["lcb_v6"]) == sorted(t.prompt for t in lcb.values())


def test_raw_jsonl_route_gives_the_same_tasks(lcb):
    source = {"path": "json", "name": None, "split": "train", "revision": None,
              "data_files": str(FIXTURES / "livecodebench__code_generation_lite" / "test6.jsonl")}
    raw = HubCodeDomain(config(**{"heldout.lcb_v6.source": source,
                                  "heldout.lcb_v6.contest_date": {"start": "2025-03-01", "end": None}}))
    tasks = {t.meta["question_id"]: t for t in raw.heldout_sets()["lcb_v6"]}  # contest_date loads as a timestamp
    assert {q: (t.prompt, t.answer, t.meta) for q, t in tasks.items()} == {
        q: (t.prompt, t.answer, t.meta) for q, t in lcb.items()}


def test_training_pool_is_deepcoder_and_decontaminated():
    pool = HubCodeDomain(config()).training_pool()
    assert len(pool) == 3 and {t.meta["source"] for t in pool} == {"deepcoder"}
    functional = [t for t in pool if t.answer["mode"] == "functional"]
    assert [t.answer["func_name"] for t in functional] == ["countEven"]
    # against the cumulative release, the DeepCoder copy of an older LiveCodeBench problem is removed
    cumulative = HubCodeDomain(config(**{"heldout.lcb_v6.source.name": "release_v6"}))
    held = {t.prompt for t in cumulative.heldout_sets()["lcb_v6"]}
    kept = cumulative.training_pool()
    assert len(kept) == 2 and not held & {t.prompt for t in kept}


def test_max_tests_keeps_the_longest_inputs_for_training_only():
    capped = HubCodeDomain(config(**{"verifier.max_tests": 2}))
    longest = [t for t in capped.training_pool() if "maximum" in t.prompt][0]
    assert [t["input"] for t in longest.answer["tests"]] == ["5\n1 2 3 4 100\n", "4\n9 8 7 6\n"]
    assert all(len(t.answer["tests"]) <= 2 for t in capped.training_pool())
    assert len({t.meta["question_id"]: t for t in capped.heldout_sets()["lcb_v6"]}["abc901_a"].answer["tests"]) == 4
    assert select_tests([{"input": "a"}, {"input": "bbb"}, {"input": "cc"}], 2) == [{"input": "bbb"}, {"input": "cc"}]


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match=r"domains\.code\.verifier.*unknown keys \['timeout'\]"):
        HubCodeDomain(config(**{"verifier.timeout": 3}))
    with pytest.raises(ValueError, match=r"domains\.code\.train.*unknown keys \['shuffle'\]"):
        HubCodeDomain(config(**{"train.shuffle": True}))
    with pytest.raises(ValueError, match=r"domains\.code\.heldout\.lcb_v6\.contest_date"):
        HubCodeDomain(config(**{"heldout.lcb_v6.contest_date": {"begin": "2025-01-01"}}))
    with pytest.raises(ValueError, match=r"contest_date.*no `contest_date` column"):
        HubCodeDomain(config(**{"train.contest_date": {"start": "2024-01-01", "end": None}})).training_pool()
    odd = HubCodeDomain(config())
    with pytest.raises(ValueError, match=r"domains\.code\.train\.source.*columns"):
        odd.to_task({"question": "q", "answer": "a"}, "domains.code.train")


def test_other_deepcoder_test_formats():
    d = HubCodeDomain(config())
    taco = d.to_task({"problem": "P", "tests": json.dumps({"inputs": ["1\n", "2\n"], "outputs": ["1\n", "4\n"]})},
                     "domains.code.train")
    assert taco.answer == {"mode": "stdin", "func_name": None,
                           "tests": [{"input": "1\n", "output": "1\n"}, {"input": "2\n", "output": "4\n"}]}
    assert d.to_task({"problem": "P", "tests": json.dumps({"inputs": [[1]], "outputs": [[1]], "fn_name": "f"})},
                     "domains.code.train") is None  # call-based APPS/TACO: skipped
    prime = [{"input": "3\n", "output": "9\n", "type": "stdin_stdout"}]
    assert d.to_task({"problem": "P", "tests": json.dumps(prime)}, "domains.code.train").answer["tests"] == [
        {"input": "3\n", "output": "9\n"}]
    prime_call = [{"input": [3], "output": [9], "type": "function_call", "fn_name": "sq"}]
    assert d.to_task({"problem": "P", "tests": json.dumps(prime_call)}, "domains.code.train") is None


# -- the node profile's LiveCodeBench split (conf/domain/node_code.yaml) ---------------------------------------

def node_config() -> dict:
    """conf/domain/node_code.yaml with both sources pointed at the LiveCodeBench fixture (the only change but the
    fast verifier)."""
    cfg = yaml.safe_load((REPO / "conf" / "domain" / "node_code.yaml").read_text())
    cfg["train"]["source"]["path"] = str(LCB)
    cfg["heldout"]["lcb"]["source"]["path"] = str(LCB)
    cfg["verifier"] = dict(FAST)
    return cfg


def test_node_code_trains_before_the_window_on_easy_and_medium_and_holds_out_every_problem_after_it():
    d = HubCodeDomain(node_config())
    held = {t.meta["question_id"]: t for t in d.heldout_sets()["lcb"]}
    assert sorted(held) == ["3901", "3902", "3903", "abc901_a", "abc902_b"]     # every difficulty from 2024-08-01
    pool = d.training_pool()
    assert [(t.meta["question_id"], t.meta["difficulty"]) for t in pool] == [("abc351_a", "easy")]
    assert not {t.prompt for t in pool} & {t.prompt for t in held.values()}
    right = "s = input().strip()\nprint(sum(c in 'aeiou' for c in s))\n"
    assert d.score(pool * 2, [answer(right), answer("print(0)\n")]) == [1.0, 0.0]     # in the sandbox
    assert d.score([held["abc901_a"]], [answer(SOLUTIONS["abc901_a"])]) == [1.0]


def test_keep_slices_by_difficulty_and_names_its_key():
    cfg = node_config()
    cfg["heldout"]["lcb"]["keep"] = {"difficulty": ["easy"]}
    easy = HubCodeDomain(cfg).heldout_sets()["lcb"]
    assert sorted(t.meta["question_id"] for t in easy) == ["3902", "abc901_a"]
    cfg["train"]["keep"] = {"difficulty": ["hard"]}
    with pytest.raises(ValueError, match=r"domains\.code\.train\.keep.*no row.*hard"):
        HubCodeDomain(cfg).training_pool()
    cfg["train"]["keep"] = {"rating": [800]}
    with pytest.raises(ValueError, match=r"domains\.code\.train\.keep.*lacks column.*rating"):
        HubCodeDomain(cfg).training_pool()
    cfg["train"]["keep"] = {"difficulty": []}
    with pytest.raises(ValueError, match=r"domains\.code\.train\.keep\.difficulty.*non-empty list"):
        HubCodeDomain(cfg)


# -- grading ---------------------------------------------------------------------------------------------
def test_reference_solutions_pass(domain, lcb):
    tasks = list(lcb.values())
    assert grade(domain, tasks, [answer(SOLUTIONS[t.meta["question_id"]]) for t in tasks]) == [
        ("pass", len(t.answer["tests"]), len(t.answer["tests"])) for t in tasks]
    assert domain.score(tasks, [answer(SOLUTIONS[t.meta["question_id"]]) for t in tasks]) == [1.0] * 5


def test_stdin_failures(domain, lcb):
    task = lcb["abc901_a"]
    cases = {
        "wrong": "a, b = map(int, input().split())\nprint(a * b)\n",
        "timeout": "while True:\n    pass\n",
        "late timeout": "a, b = map(int, input().split())\nif a == 12:\n    while True: pass\nprint(a + b)\n",
        "runtime": "a, b = map(int, input().split())\nprint(a + b)\nraise ValueError('boom')\n",
        "crash": "import os\nos.kill(os.getpid(), 9)\n",
        "syntax": "print(\n",
        "memory": "x = bytearray(10**12)\n",
        "output": "while True:\n    print('y' * 1000)\n",
    }
    got = grade(domain, [task] * (len(cases) + 1), [answer(p) for p in cases.values()] + ["I would print a+b."])
    assert dict(zip(list(cases) + ["no code"], got)) == {
        "wrong": ("wrong", 1, 4),  # only 0*0 == 0+0
        "timeout": ("timeout", 0, 4),
        "late timeout": ("timeout", 3, 4),
        "runtime": ("runtime", 0, 4),
        "crash": ("runtime", 0, 4),
        "syntax": ("syntax", 0, 4),
        "memory": ("memory", 0, 4),
        "output": ("output", 0, 4),
        "no code": ("no_code", 0, 4),
    }


def test_stdin_output_whitespace_decimals_and_exit(domain, lcb):
    pair, avg = lcb["abc901_a"], lcb["abc902_b"]
    programs = [
        (pair, "a, b = map(int, input().split())\nprint('  ', a + b, '   ')\nprint()\nprint()\n"),  # padding
        (pair, "from sys import *\na, b = map(int, stdin.readline().split())\nstdout.write(str(a + b))\nexit(3)\n"),
        (pair, "a, b = map(int, open(0).read().split())\nprint(f'{a + b}.000')\n"),  # equal as decimals
        (avg, "n = int(input())\nxs = list(map(int, input().split()))\nprint('%.10f' % (sum(xs) / n))\n"),
        (avg, "n = int(input())\nxs = list(map(int, input().split()))\nprint(round(sum(xs) / n))\n"),  # 2 != 2.5
        (pair, "a, b = map(int, input().split())\nprint(a + b, end='')\nprint(0)\n"),  # glued: '70' (but '00' == 0)
        (pair, "import threading, sys\ndef main():\n    a, b = map(int, sys.stdin.readline().split())\n"
               "    print(a + b)\nthreading.stack_size(1 << 26)\nthreading.Thread(target=main).start()\n"),
        (pair, "a, b = map(int, input().split())\nq = deque([a])\nq.append(b)\n"  # the prelude's names, no imports
               "print(sum(copy.deepcopy(list(q))) + bisect.bisect_left([], 0) + floor(0.5))\n"),
    ]
    assert grade(domain, [t for t, _ in programs], [answer(p) for _, p in programs]) == [
        ("pass", 4, 4), ("pass", 4, 4), ("pass", 4, 4), ("pass", 3, 3), ("wrong", 1, 3), ("wrong", 1, 4),
        ("pass", 4, 4), ("pass", 4, 4)]


def test_functional_outcomes(domain, lcb):
    task = lcb["3901"]
    cases = {
        "top-level function": ("pass", "def rangeSum(nums, k):\n    return sum(sorted(nums)[len(nums) - k:])\n"),
        "wrong": ("wrong", "class Solution:\n    def rangeSum(self, nums, k):\n        return max(nums)\n"),
        "timeout": ("timeout", "class Solution:\n    def rangeSum(self, nums, k):\n        while True: pass\n"),
        "runtime": ("runtime", "class Solution:\n    def rangeSum(self, nums, k):\n        return nums[99]\n"),
        "wrong name": ("runtime", "class Solution:\n    def range_sum(self, nums, k):\n        return 0\n"),
        "syntax": ("syntax", "class Solution:\n    def rangeSum(self, nums, k)\n        return 0\n"),
        "prints": ("pass", "class Solution:\n    def rangeSum(self, nums, k):\n        print('debug')\n"
                           "        return sum(sorted(nums)[-k:])\n"),
    }
    got = grade(domain, [task] * len(cases), [answer(p) for _, p in cases.values()])
    assert [g[0] for g in got] == [status for status, _ in cases.values()]
    assert got[1] == ("wrong", 1, 4)  # max == sum of the 1 largest for nums=[5], k=1
    bools = grade(domain, [lcb["3902"]] * 2, [
        answer("class Solution:\n    def isPalindrome(self, s):\n        return 1 if s == s[::-1] else 0\n"),
        answer("class Solution:\n    def isPalindrome(self, s):\n        return 'true'\n")])
    assert bools == [("pass", 4, 4), ("wrong", 0, 4)]  # 1 == True, as LiveCodeBench's == says


def test_code_in_thinking_is_not_the_answer(domain, lcb):
    task = lcb["abc901_a"]
    right, wrong = SOLUTIONS["abc901_a"], "print(0)\n"
    draft_right = f"<think>Maybe\n```python\n{right}```\n</think>\nFinal:\n```python\n{wrong}```\n"
    draft_wrong = f"<think>Maybe\n```python\n{wrong}```\n</think>\nFinal:\n```python\n{right}```\n"
    unfinished = f"<think>Maybe\n```python\n{right}```\n"
    assert grade(domain, [task] * 3, [draft_right, draft_wrong, unfinished]) == [
        ("wrong", 1, 4), ("pass", 4, 4), ("no_code", 0, 4)]


def test_batch_scoring_of_many_completions(domain, lcb):
    tasks, completions, expected = [], [], []
    wrong = {"stdin": "print(-1)\n", "functional": "class Solution:\n    def __getattr__(self, n):\n"
                                                  "        return lambda *a: None\n"}
    for round_ in range(8):  # a GRPO-like batch: every problem 8 times, right and wrong, with repeats
        for qid, task in lcb.items():
            good = (round_ + len(qid)) % 3 != 0
            tasks.append(task)
            completions.append(answer(SOLUTIONS[qid] if good else wrong[task.answer["mode"]]))
            expected.append(1.0 if good else 0.0)
    start = time.monotonic()
    assert domain.score(tasks, completions) == expected
    assert time.monotonic() - start < 30


def test_extra_metrics_reuse_the_scores(domain, lcb, monkeypatch):
    import opdgrpo.domains.hub_code as hub_code

    tasks = [lcb["abc901_a"], lcb["abc902_b"], lcb["3902"], lcb["3902"]]
    completions = [answer(SOLUTIONS["abc901_a"]), "no code at all", answer(SOLUTIONS["3902"]), answer("print(\n")]
    assert domain.score(tasks, completions) == [1.0, 0.0, 1.0, 0.0]
    monkeypatch.setattr(hub_code, "check_completions", lambda *a, **k: pytest.fail("graded twice"))
    assert domain.extra_metrics(tasks, completions) == {
        "accuracy_easy": 2 / 3, "accuracy_medium": 0.0,
        "status_no_code": 0.25, "status_pass": 0.5, "status_syntax": 0.25}


def test_expected_outputs_never_enter_the_sandbox(lcb, monkeypatch):
    import opdgrpo.sandbox.stdio as stdio

    seen: list[str] = []
    real = stdio.run_python

    def spy(source, stdin="", **kwargs):
        seen.append(source + stdin)
        return real(source, stdin=stdin, **kwargs)

    monkeypatch.setattr(stdio, "run_python", spy)
    fresh = HubCodeDomain(config())  # nothing remembered from earlier tests
    assert grade(fresh, [lcb["abc901_a"]], [answer(SOLUTIONS["abc901_a"])]) == [("pass", 4, 4)]
    assert len(seen) == 1 and "1000000000 1000000000" in seen[0] and "2000000000" not in seen[0]


def test_background_process_of_a_stdin_program_is_cleaned_up(domain, lcb):
    if not isolation()["pid"]:
        pytest.skip("no PID namespace: a test's setsid() daemon cannot be swept")
    marker = f"opdgrpo-daemon-{uuid.uuid4().hex}"
    daemon = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv(sys.executable, [sys.executable, '-c', 'import time\\nwhile True: time.sleep(1)', {marker!r}])\n"
        "a, b = map(int, input().split())\nprint(a + b)\n"
    )
    assert grade(domain, [lcb["abc901_a"]], [answer(daemon)]) == [("pass", 4, 4)]
    assert survivors_after(marker) == []


def test_domain_does_not_mutate_its_config():
    cfg = config()
    before = copy.deepcopy(cfg)
    HubCodeDomain(cfg).training_pool()
    assert cfg == before
