"""Paper-scale verifiers, one module per domain: math (``math-verify``), code (execution against tests in the
sandbox), instruction following (IFEval's checkers) and multiple choice (letter extraction).

Verifiers see decoded completions. A thinking model writes ``<think> ... </think>`` before its answer; only the
text after the last ``</think>`` is the answer (:func:`final_answer_text`), so reasoning that mentions a wrong
candidate or breaks a format rule on the way is not scored.
"""

from __future__ import annotations

THINK_END = "</think>"


def final_answer_text(completion: str) -> str:
    """The part of a completion after its last ``</think>`` (all of it when there is none)."""
    cut = completion.rfind(THINK_END)
    return completion if cut < 0 else completion[cut + len(THINK_END):]
