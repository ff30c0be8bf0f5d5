"""Paper-scale code verifier without the hub fixtures: test decoding, program extraction, output comparison, and
grading given tests in the sandbox (the domain on the fixtures: tests/integration/test_hub_code_fixtures.py)."""

from __future__ import annotations

import base64
import pickle
import zlib

import pytest

from opdgrpo.verifiers.code import (
    VerifierConfig,
    check_completions,
    decode_test_cases,
    extract_program,
    outputs_match,
)


def test_compressed_tests_never_unpickle_code():
    evil = base64.b64encode(zlib.compress(pickle.dumps(print))).decode()  # a pickled global, not a string
    with pytest.raises(ValueError, match="refusing"):
        decode_test_cases(evil)
    with pytest.raises(ValueError, match="neither JSON nor"):
        decode_test_cases("not json, not base64!")


# -- extraction and comparison ---------------------------------------------------------------------------
def test_extract_program_takes_the_last_python_block_of_the_answer():
    text = "```python\nfirst\n```\nand\n```py\nsecond\n```\nthen a shell line\n```bash\nls\n```\n"
    assert extract_program(text) == "second\n"
    assert extract_program("no tags:\n```\nprint(1)\n```\n") == "print(1)\n"
    assert extract_program("```cpp\nint main(){}\n```") == "int main(){}\n"  # any tag when no python block
    assert extract_program("plain text, no block") is None
    assert extract_program("```python\nprint(1)\n") is None  # cut off: never closed
    assert extract_program("<think>```python\nprint(1)\n```") is None  # still thinking: no answer yet
    think = "<think>try:\n```python\nprint('draft')\n```\n</think>final:\n```python\nprint('final')\n```"
    assert extract_program(think) == "print('final')\n"
    assert extract_program("<think>```python\nprint('draft')\n```</think>I give up.") is None


def test_outputs_match_like_livecodebench():
    assert outputs_match("7\n", "7")
    assert outputs_match("  7   \n\n\n", "7\n")
    assert outputs_match("1 2\r\n3\n", "1 2\n3\n")
    assert outputs_match("2.5\n", "2.5000000000\n") and outputs_match("1e1", "10")
    assert not outputs_match("2.5001\n", "2.5\n")
    assert not outputs_match("7\n8\n", "7\n")
    assert not outputs_match("1  2", "1 3") and not outputs_match("Yes", "yes")
    assert outputs_match("1   2", "1 2")  # equal as numbers
    assert outputs_match("", "") and not outputs_match("0", "")
    assert outputs_match("nan", "nan ")  # identical text matches before the number rule


def test_check_completions_directly():
    answers = [{"mode": "stdin", "func_name": None, "tests": [{"input": "2\n", "output": "4\n"}]},
               {"mode": "functional", "func_name": "f", "tests": [{"input": "2", "output": "4"}]}]
    completions = ["```python\nprint(int(input()) ** 2)\n```", "```python\ndef f(x):\n    return x * x\n```"]
    cfg = VerifierConfig(per_test_timeout_s=1.0, memory_mb=512, workers=1)
    assert [r.reward for r in check_completions(answers, completions, cfg)] == [1.0, 1.0]
    with pytest.raises(ValueError):
        check_completions(answers, completions[:1], cfg)
    with pytest.raises(ValueError, match="per_test_timeout_s"):
        VerifierConfig.from_mapping({"per_test_timeout_s": 0}, "domains.code.verifier")


def test_stdio_runner_directly(monkeypatch):
    import opdgrpo.sandbox.stdio as stdio
    from opdgrpo.sandbox.stdio import StdioOutcome, StdioRun, run_stdio_programs

    calls: list[int] = []
    real = stdio.run_python
    monkeypatch.setattr(stdio, "run_python", lambda *a, **k: calls.append(1) or real(*a, **k))
    echo = StdioRun("import sys\nsys.stdout.write(sys.stdin.read()[::-1])\n", ("ab", "xyz"), (100, 100))
    no_prelude = StdioRun("print(deque)\n", ("",), (100,))
    out = run_stdio_programs([echo, echo, no_prelude, StdioRun("print(1)", (), ())], per_test_timeout_s=1.0)
    assert out == [StdioOutcome("ok", ("ba", "zyx")), StdioOutcome("ok", ("ba", "zyx")),
                   StdioOutcome("runtime", ()), StdioOutcome("ok", ())]
    assert len(calls) == 2  # the repeat ran once; a program without tests not at all
    with pytest.raises(ValueError):
        run_stdio_programs([StdioRun("", ("a",), ())])
