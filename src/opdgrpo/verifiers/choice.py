"""Multiple-choice verifier: read the option letter a completion chose, score it against the gold letter.

The extraction follows the spirit of MMLU-Pro's evaluation (TIGER-AI-Lab/MMLU-Pro, ``compute_accuracy.py``):
look for "answer is (X)", then "Answer: X", then a final letter. It is our own implementation and differs on
purpose where a reward for RL needs it:

* Only the final answer text is read: everything up to the last ``</think>`` is reasoning
  (:func:`~opdgrpo.verifiers.final_answer_text`). A completion that opens ``<think>`` and never closes it was
  cut off while thinking and has no answer.
* Precedence. (1) *Explicit statements*: "answer is X" (also "the correct answer is", "final answer is"),
  "Answer: X" and ``\\boxed{X}``; when there are several, the **last** one wins, so a model that corrects
  itself is scored on its final word (MMLU-Pro takes the first "answer is"). (2) Only when there is no explicit
  statement: a *final lone letter*, a letter standing alone at the very end of the text (``... so C.``,
  ``**(B)**``).
* Letters are those of the first ``n_options`` options (A-D for four options). A letter outside that range is
  not an option of this question and is ignored, as if it were not there.
* Case: a lowercase letter counts only when it is delimited, ``(b)`` or ``\\boxed{b}``; a bare lowercase
  ``a`` is nearly always the English article, so "the answer is a compound" reads nothing.
* No guess: MMLU-Pro draws a random letter when extraction fails; here a miss is ``None`` and scores 0, so
  the reward never pays for an unreadable answer.
"""

from __future__ import annotations

import re

from . import THINK_END, final_answer_text

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
THINK_START = "<think>"

# A letter as an answer: "(b)" in any case, or a bare capital not glued to a following letter, digit or
# apostrophe (so "I'm" is no answer).
_LETTER = r"(?:\(\s*(?P<p>[A-Za-z])\s*\)|(?P<b>[A-Z])(?![A-Za-z0-9']))"
# Between an answer keyword and its letter: a colon, markdown emphasis, the word "option"/"choice".
_GAP = r"\s*[:：]?\s*(?:\*\*|__|\*)?\s*(?:(?i:option|choice)\s+)?"
_STATEMENT = re.compile(r"(?:(?i:answer\s+is)|(?i:answer)\s*(?:\*\*|__)?\s*[:：])" + _GAP + _LETTER)
_BOXED = re.compile(r"\\boxed\s*\{\s*(?:\\text(?:bf)?\s*\{\s*)?\(?\s*(?P<x>[A-Za-z])\s*\)?\s*\}")
# The last token of the text: a letter preceded by a non-alphanumeric (or the start), followed only by
# closing punctuation and markdown.
_FINAL = re.compile(r"(?:^|(?<=[^A-Za-z0-9]))" + _LETTER + r"[\s.)\]*_:!]*\Z")


def _letter(match: re.Match) -> str:
    groups = match.groupdict()
    return next(groups[name] for name in ("p", "b", "x") if groups.get(name)).upper()


def _check_n(n_options: int) -> int:
    n = int(n_options)
    if not 1 <= n <= len(LETTERS):
        raise ValueError(f"n_options must be between 1 and {len(LETTERS)}, got {n_options!r}")
    return n


def extract_letter(completion: str, n_options: int) -> str | None:
    """The option letter (uppercase) a completion chose, or None; see the module docstring for precedence."""
    valid = LETTERS[: _check_n(n_options)]
    if THINK_START in completion and THINK_END not in completion[completion.rfind(THINK_START):]:
        return None  # cut off inside its reasoning: no answer was given
    text = final_answer_text(completion)
    statements = [(m.start(), _letter(m)) for pattern in (_STATEMENT, _BOXED) for m in pattern.finditer(text)]
    statements = [s for s in sorted(statements) if s[1] in valid]
    if statements:
        return statements[-1][1]
    final = _FINAL.search(text.rstrip())
    if final and _letter(final) in valid:
        return _letter(final)
    return None


def score_choice(completion: str, answer: str, n_options: int) -> float:
    """1.0 when the extracted letter is the gold ``answer`` letter, else 0.0 (a miss scores 0, never a guess)."""
    gold = str(answer).strip().upper()
    if len(gold) != 1 or gold not in LETTERS[: _check_n(n_options)]:
        raise ValueError(f"gold answer must be one of the first {n_options} letters, got {answer!r}")
    return float(extract_letter(completion, n_options) == gold)
