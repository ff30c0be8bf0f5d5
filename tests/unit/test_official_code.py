"""The code verifier's comparisons against LiveCodeBench's grader, case by case.

Source: LiveCodeBench/LiveCodeBench, ``lcb_runner/evaluation/testing_util.py``.

* ``grade_stdio``: both outputs are stripped, split on newlines and each line stripped (``get_stripped_lines``);
  the line counts must match; a pair of lines passes when equal as text or, failing that, when both convert
  token by token to ``decimal.Decimal`` (``convert_line_to_decimals``) and the two lists are equal. ``Decimal``
  reads ``inf``/``Infinity`` (equal to each other), ``nan`` (never equal to anything, itself included), ``1e1``,
  ``+5`` and ``1_000``.
* ``grade_call_based``: the expected output is ``json.loads`` of the test's text; the returned value, with a
  top-level tuple turned into a list, must be ``==`` to it. So a dict whose keys are ints never equals the JSON
  object (whose keys are strings), a NaN never equals anything, ``True == 1`` and ``3.0 == 3`` hold.

The cases are our own short inputs with the verdict those rules give. ``departs`` marks where ours deliberately
differs; the reason is documented in :mod:`opdgrpo.verifiers.code` and docs/paper-profile.md.
"""

from __future__ import annotations

import collections
import json
import math

import pytest

from opdgrpo.verifiers.code import VerifierConfig, check_completions, functional_match, outputs_match


def agree(*args):
    *inputs, verdict = args
    return pytest.param(*inputs, verdict, verdict, id=f"agree:{inputs!r:.50}")


def departs(*args, why: str):
    *inputs, official, ours = args
    return pytest.param(*inputs, official, ours, id=f"departs({why}):{inputs!r:.40}")


# (printed output, expected output, LiveCodeBench's verdict)
STDIO = [
    agree("7\n", "7", True),
    agree("  7  \n\n\n", "7\n", True),                    # the whole text is stripped first
    agree("1 2\r\n3\n", "1 2\n3", True),                  # then each line
    agree("2.5\n", "2.500000", True),                     # equal as decimals
    agree("1e1", "10", True),
    agree("+5", "5", True),
    agree("1_000", "1000", True),                         # Decimal reads digit-group underscores
    agree("1   2", "1 2", True),                          # tokens: inner spacing only matters for text
    agree("1.0 2", "1 2.00", True),
    agree("Infinity", "inf", True),                       # Decimal('Infinity') == Decimal('inf')
    agree("-inf", "-Infinity", True),
    agree("3 inf", "3.0 Infinity", True),
    agree("inf", "-inf", False),
    agree("nan", "nan", True),                            # equal as text before any number rule
    agree("NaN", "nan", False),                           # as decimals a NaN equals nothing
    agree("2.5001", "2.5", False),                        # no tolerance beyond exact decimal equality
    agree("1.0000000000000001", "1", False),
    agree("0x10", "16", False),
    agree("7\n8\n", "7\n", False),
    agree("3\n\n4", "3\n4", False),                       # an inner blank line is a line
    agree("1 2", "1 2 3", False),
    agree("a  b", "a b", False),                          # words: text equality only
    agree("Yes", "yes", False),
    agree("TRUE", "True", False),
    agree("", "", True),
    agree("0", "", False),
    agree("sNaN", "1", False),                            # a signalling NaN cannot even be compared
]


@pytest.mark.parametrize("got,expected,official,ours", STDIO)
def test_stdout_against_livecodebench(got, expected, official, ours):
    assert outputs_match(got, expected) is ours


Point = collections.namedtuple("Point", "x y")

# (returned value, expected output text, LiveCodeBench's verdict)
CALL = [
    agree([1, 2], "[1, 2]", True),
    agree((1, 2), "[1, 2]", True),                        # a top-level tuple becomes a list
    agree(Point(1, 2), "[1, 2]", True),
    agree({"1": 2}, '{"1": 2}', True),
    agree({1: 2}, '{"1": 2}', False),                     # int keys are not the JSON object's string keys
    agree([{1: "a"}], '[{"1": "a"}]', False),
    agree({"k": {2: 3}}, '{"k": {"2": 3}}', False),
    agree({True: 1}, '{"true": 1}', False),
    agree({None: 1}, '{"null": 1}', False),
    agree({1.5: 2}, '{"1.5": 2}', False),
    agree(collections.Counter({"a": 2}), '{"a": 2}', True),
    agree(collections.defaultdict(int, {5: 1}), '{"5": 1}', False),
    agree(True, "1", True),                               # Python: True == 1
    agree(3.0, "3", True),
    agree(1, "1.0", True),
    agree(-0.0, "0", True),
    agree(float("inf"), "Infinity", True),
    agree(math.nan, "NaN", False),                        # a NaN equals nothing
    agree([math.nan], "[NaN]", False),
    agree(0.1 + 0.2, "0.3", False),                       # no float tolerance in call-based grading
    agree("1", "1", False),                               # a string is not a number
    agree(None, "null", True),
    agree([1, [2, 3]], "[1, [2, 3]]", True),
    agree({1, 2}, "[1, 2]", False),
    agree(frozenset(), "[]", False),
    agree(collections.deque([1]), "[1]", False),
    departs([(1, 2)], "[[1, 2]]", False, True, why="tuples count as lists at any depth"),
    departs(((1, 2), (3, 4)), "[[1, 2], [3, 4]]", False, True, why="tuples count as lists at any depth"),
]


@pytest.mark.parametrize("value,expected,official,ours", CALL)
def test_returned_value_against_livecodebench(value, expected, official, ours):
    assert functional_match(value, expected) is ours


def test_the_sandbox_grades_as_functional_match_says():
    """functional_match is the comparison the sandboxed grading makes: a few returned values, end to end."""
    values = {"{1: 2}": '{"1": 2}', "{'1': 2}": '{"1": 2}', "float('nan')": "NaN", "[(1, 2)]": "[[1, 2]]",
              "{'k': [{3: 4}]}": '{"k": [{"3": 4}]}', "(1, 2)": "[1, 2]", "float('inf')": "Infinity"}
    answers, completions = [], []
    for returned, expected in values.items():
        answers.append({"mode": "functional", "func_name": "f", "tests": [{"input": "0", "output": expected}]})
        completions.append(f"```python\nclass Solution:\n    def f(self, x):\n        return {returned}\n```")
    results = check_completions(answers, completions, VerifierConfig(per_test_timeout_s=2.0, memory_mb=512, workers=1))
    want = [functional_match(eval(returned), expected) for returned, expected in values.items()]
    assert [r.reward == 1.0 for r in results] == want == [False, True, False, True, False, True, True]
    assert {r.status for r, ok in zip(results, want) if not ok} == {"wrong"}


def test_functional_match_reads_the_expected_text_as_json():
    assert functional_match({"a": [1, 2]}, json.dumps({"a": [1, 2]}))
    with pytest.raises(ValueError):
        functional_match(1, "not json")
