"""Multiple-choice verifier: read the option letter a completion chose, score it against the gold letter.

The extraction follows MMLU-Pro's evaluation (TIGER-AI-Lab/MMLU-Pro, ``evaluate_from_api.py``: ``extract_answer``
"answer is (X)", then ``extract_again`` "Answer: X", then ``extract_final``, the last capital A-J standing alone).
It is our own implementation and departs on purpose where a reward for RL needs it (tests/unit/test_official_choice.py
holds each departure against MMLU-Pro's own reading):

* Only the final answer text is read: everything up to the last ``</think>`` is reasoning
  (:func:`~opdgrpo.verifiers.final_answer_text`). A completion that opens ``<think>`` and never closes it was
  cut off while thinking and has no answer.
* (1) *Explicit statements*: "answer is X" (also "the correct answer is", "final answer is"), "Answer: X" and
  ``\\boxed{X}``; when there are several, the **last** one wins, so a model that corrects itself is scored on its
  final word (MMLU-Pro takes the first "answer is").
* (2) Only when there is no explicit statement: *cues*. A choice stated in other words, letter after the words
  ("I think it's D because ...", "the correct one is C) 18", "I'd go with (B)", "the answer would be C") or before
  them ("Option C is the answer", "(C) is the right choice", "B is correct"), and a *final lone letter*, a letter
  standing alone at the very end of the text (``... so C.``, ``**(B)**``). The cues must all name the same letter;
  cues naming different letters are no answer. MMLU-Pro's last resort instead takes the last lone capital
  anywhere in the text, which also reads the pronoun "I" and the article "A" as answers and turns a list of
  candidates into its last member; we read a letter only where it is stated as the answer or ends the text.
* Hedges are not answers: a letter listed with another (``B or C``, ``A, B and D``, ``B/C``, and with the Oxford
  comma ``(A), (F), and (G)``, ``B, C, or D``) counts nowhere, in statements and cues alike, and a final letter after
  "not" (``It's not B.``) is not chosen. MMLU-Pro would read B, A and B there. Under RL a reader that took the last
  of a list would pay a policy for listing every option.
* A final capital right after a number is a unit or a symbol, not a choice: ``... is 2 A`` (amperes) and
  ``G. 41,800 J`` (joules) read no final letter (the second is no answer: its "G." starts the text, it is not a
  statement). A letter in parentheses after a number, ``2 (A)``, still reads.
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
# apostrophe (so "I'm" is no answer). Group L spans the whole token, parentheses included.
_LETTER = r"(?P<L>\(\s*(?P<p>[A-Za-z])\s*\)|(?P<b>[A-Z])(?![A-Za-z0-9']))"
# Between an answer keyword and its letter: a colon, markdown emphasis, the word "option"/"choice".
_GAP = r"\s*[:：]?\s*(?:\*\*|__|\*)?\s*(?:(?i:option|choice)\s+)?"
_STATEMENT = re.compile(r"(?:(?i:answer\s+is)|(?i:answer)\s*(?:\*\*|__)?\s*[:：])" + _GAP + _LETTER)
_BOXED = re.compile(r"\\boxed\s*\{\s*(?:\\text(?:bf)?\s*\{\s*)?(?P<L>\(?\s*(?P<x>[A-Za-z])\s*\)?)\s*\}")
# What may follow a bare letter stated in words: the end, punctuation or markdown, or a word that goes on to the
# reason ("it's D because"); so "it's A good idea" chooses nothing. A letter in parentheses needs no such check.
_CLOSE = r"(?=\s*(?:\Z|[.,;:!?)\]}*_\"'(\-–—]|(?i:because|since|due|here)\b))"
_LETTER_CLOSED = r"(?P<L>\(\s*(?P<p>[A-Za-z])\s*\)|(?P<b>[A-Z])(?![A-Za-z0-9'])" + _CLOSE + ")"
# Cues, letter after the words: "it's D", "I'd go with (B)", "I pick C", "the correct one is C", "the answer would
# be C" (choosing verbs only in the first person: "if we pick B = 2" in reasoning is no choice).
_CUE_AFTER = re.compile(
    r"(?i:\b(?:it(?:'s|’s|\s+is|\s+must\s+be|\s+should\s+be|\s+would\s+be)"
    r"|that(?:'s|’s|\s+is)"
    r"|(?:I|we)(?:'d|’d|'ll|’ll|'m|’m|\s+would|\s+will|\s+am|\s+are)?\s+(?:say|choose|chose|pick|picked|select|"
    r"selected|go\s+with|going\s+with|went\s+with)"
    r"|(?:answer|option|choice|one)\s+(?:would|must|should|will)\s+be"
    r"|(?:correct|right|best|final)\s+(?:answer|option|choice|one)\s+(?:is|would\s+be|must\s+be|should\s+be)))"
    + _GAP + _LETTER_CLOSED)
# Cues, letter before the words: "Option C is the answer", "(C) is the right choice", "B is correct".
_CUE_BEFORE = re.compile(
    r"(?:^|(?<=[^A-Za-z0-9]))(?:(?i:option|choice)\s+)?" + _LETTER
    + r"\s+(?i:is|would\s+be|must\s+be)\s+(?i:the\s+)?(?i:correct|right|best|answer)\b")
# The last token of the text: a letter preceded by a non-alphanumeric (or the start), followed only by
# closing punctuation and markdown.
_FINAL = re.compile(r"(?:^|(?<=[^A-Za-z0-9]))" + _LETTER + r"[\s.)\]*_:!]*\Z")
# A letter in a list of letters: joined to another by a comma, slash, "&", "or" or "and", or by a comma and then
# "and"/"or" (the Oxford comma: "(A), (F), and (G)", "either B, C, or D").
_JOIN = r"\s*(?:,\s*(?i:\b(?:and/or|or|and)\b)|[,/&]|(?i:\b(?:and/or|or|and)\b))\s*(?:(?i:option|choice)\s+)?"
_OTHER_AFTER = re.compile(
    _JOIN + r"(?:\(\s*[A-Za-z]\s*\)|[A-Z](?![A-Za-z0-9']))"
    + r"(?=\s*(?:\Z|[.,;:!?)\]}*_\"'/&]|(?i:\b(?:or|and|because|since|as|both)\b)))")
_OTHER_BEFORE = re.compile(r"(?:\(\s*[A-Za-z]\s*\)|(?<![A-Za-z0-9'])[A-Z])" + _JOIN + r"\Z")
_NEGATED = re.compile(r"(?i:\bnot)\s+(?:(?i:option|choice)\s+)?\Z")
# A number just before a final capital: the capital is a unit or a symbol ("2 A", "41,800 J"), not a choice.
_QUANTITY = re.compile(r"\d[\d,.]*\s*\Z")


def _letter(match: re.Match) -> str:
    groups = match.groupdict()
    return next(groups[name] for name in ("p", "b", "x") if groups.get(name)).upper()


def _listed(text: str, match: re.Match) -> bool:
    """Whether the match's letter stands in a list with another letter (``B or C``, ``A, B and D``)."""
    return bool(_OTHER_AFTER.match(text, match.end("L")) or _OTHER_BEFORE.search(text[: match.start("L")]))


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
    statements = [(m.start(), _letter(m)) for pattern in (_STATEMENT, _BOXED) for m in pattern.finditer(text)
                  if not _listed(text, m)]
    statements = [s for s in sorted(statements) if s[1] in valid]
    if statements:
        return statements[-1][1]
    cues = {_letter(m) for pattern in (_CUE_AFTER, _CUE_BEFORE) for m in pattern.finditer(text)
            if not _listed(text, m)}
    stripped = text.rstrip()
    final = _FINAL.search(stripped)
    before = stripped[: final.start("L")] if final else ""
    if final and not _listed(stripped, final) and not _NEGATED.search(before) and not (
            final.group("b") and _QUANTITY.search(before)):
        cues.add(_letter(final))
    cues &= set(valid)
    return cues.pop() if len(cues) == 1 else None


def score_choice(completion: str, answer: str, n_options: int) -> float:
    """1.0 when the extracted letter is the gold ``answer`` letter, else 0.0 (a miss scores 0, never a guess)."""
    gold = str(answer).strip().upper()
    if len(gold) != 1 or gold not in LETTERS[: _check_n(n_options)]:
        raise ValueError(f"gold answer must be one of the first {n_options} letters, got {answer!r}")
    return float(extract_letter(completion, n_options) == gold)
