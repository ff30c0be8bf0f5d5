"""Paper-scale verifiers, one module per domain: math (``math-verify``), code (execution against tests in the
sandbox), instruction following (IFEval's checkers) and multiple choice (letter extraction).

Verifiers see decoded completions. A thinking model writes ``<think> ... </think>`` before its answer; only the
text after the last ``</think>`` is the answer (:func:`final_answer_text`), so reasoning that mentions a wrong
candidate or breaks a format rule on the way is not scored. A completion whose last ``<think>`` has no ``</think>``
after it was cut off while thinking: it has no answer (:func:`answer_after_thinking` gives None), and every domain
pays 0 for it, so no reward reads the unfinished reasoning as an answer.
"""

from __future__ import annotations

THINK_START = "<think>"
THINK_END = "</think>"


def final_answer_text(completion: str) -> str:
    """The part of a completion after its last ``</think>`` (all of it when there is none)."""
    cut = completion.rfind(THINK_END)
    return completion if cut < 0 else completion[cut + len(THINK_END):]


def answer_after_thinking(completion: str) -> str | None:
    """The final answer text (:func:`final_answer_text`), or None when the completion ends inside a thinking block
    (its last ``<think>`` is not closed after it): a truncated thought states no answer, whatever it mentions."""
    start = completion.rfind(THINK_START)
    if start >= 0 and THINK_END not in completion[start:]:
        return None
    return final_answer_text(completion)
