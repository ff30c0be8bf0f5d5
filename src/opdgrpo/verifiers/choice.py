"""Multiple-choice verifier: read the option letter a completion chose, score it against the gold letter.

The extraction follows MMLU-Pro's evaluation (TIGER-AI-Lab/MMLU-Pro, ``evaluate_from_api.py``: ``extract_answer``
"answer is (X)", then ``extract_again`` "Answer: X", then ``extract_final``, the last capital A-J standing alone).
It is our own implementation and departs on purpose where a reward for RL needs it (tests/unit/test_official_choice.py
holds each departure against MMLU-Pro's own reading; tests/unit/test_reward_adversarial.py holds the hedges).

The rule: **one committed answer or nothing.** A letter is read only from an answer statement that names exactly
one option and neither negates nor hedges it; anything else reads None, which scores 0. Under RL a reader that
took one member of a list would pay a policy for listing options, so no joiner is enumerated: any second option in
the statement's sentence voids it, whatever stands between the two (``A or B``, ``A; B``, ``A|B``, ``A vs B``,
``A to C``, ``A (or B)``, ``A, possibly B``, ``A、B``, ``(A)(B)``, ``**A**, **B**``, ``A B C D``).

* Only the final answer text is read: everything up to the last ``</think>`` is reasoning, and a completion whose
  last ``<think>`` is never closed was cut off while thinking and has no answer
  (:func:`~opdgrpo.verifiers.answer_after_thinking`, shared by every domain).
* (1) *Explicit statements*: "answer is X" (also "the correct answer is", "final answer is"), "Answer: X" and
  ``\\boxed{X}``; when there are several, the **last** one is read, so a model that corrects itself is scored on
  its final word (MMLU-Pro takes the first). If that last statement is not committed (below), there is no answer:
  an earlier statement is not read instead. A different letter offered after it ("The answer is (B). Or C.",
  "(B)... or is it (D)?", "B. Maybe C.", a final line ``C``) also leaves no answer; a later sentence that names
  other options without offering them ("A is wrong because ...") does not.
* (2) Only when there is no explicit statement: *cues*. A choice stated in other words, letter after the words
  ("I think it's D because ...", "the correct one is C) 18", "I'd go with (B)", "the answer would be C") or before
  them ("Option C is the answer", "(C) is the right choice", "B is correct"), and a *final lone letter*, a letter
  standing alone at the very end of the text (``... so C.``, ``**(B)**``, or the whole response). Every cue must be
  committed and all must name the same letter. MMLU-Pro's last resort instead takes the last lone capital anywhere
  in the text, which also reads the pronoun "I" and the article "A" as answers and turns a list of candidates into
  its last member; we read a letter only where it is stated as the answer or ends the text. A final letter is not
  read when other lines of the text are lone letters too (one letter per line, a bulleted list of letters), when
  it is bare and unpunctuated after an ordinary word (a cut-off "... moles of H"), or when it is a subscript
  (``H_2``, a cut-off ``H_``).
* *Committed* means: the sentence holding the letter names no other option (a second letter alone, in
  parentheses, in bold or boxed, in the range of this question's options), counting from the last "so", "thus",
  "therefore" or "hence" before the statement ("Option A fails and option B overflows, so D." reads D; "The answer
  is C, not D." reads nothing; MMLU-Pro reads C there), and the clause before the letter holds no negation or
  hedge ("not", "n't", "except", "never", "incorrect", "wrong", "rather than", "if", "maybe", "possibly",
  "could", "might", "either", "or" ...): "The answer isn't C.", "It can't be A.", "I would not pick C.", "Except
  A." and "It could be B." choose nothing (MMLU-Pro reads the letter).
* A capital right after a number is a unit or a symbol, not a choice: ``... is 2 A`` (amperes) and
  ``G. 41,800 J`` (joules) name no option (the second is no answer: its "G." starts the text, it is not a
  statement). A letter in parentheses after a number, ``2 (A)``, still reads. The article "A" and the pronoun "I"
  followed by a word ("A cell divides", "I think C") are words, not options.
* Letters are those of the first ``n_options`` options (A-D for four options). A letter outside that range is
  not an option of this question and is ignored, as if it were not there.
* Case: a lowercase letter counts only when it is delimited, ``(b)`` or ``\\boxed{b}``; a bare lowercase
  ``a`` is nearly always the English article, so "the answer is a compound" reads nothing.
* No guess: MMLU-Pro draws a random letter when extraction fails; here a miss is ``None`` and scores 0, so
  the reward never pays for an unreadable answer.
"""

from __future__ import annotations

import re

from . import answer_after_thinking

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

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
# A number just before a capital: the capital is a unit or a symbol ("2 A", "41,800 J"), not a choice.
_QUANTITY = re.compile(r"\d[\d,.]*\s*\Z")
# What may stand before a bare final letter that has no closing mark after it: a line start (or a bullet), a colon,
# or a concluding word ("so D"). After any other word the text was more likely cut off ("... moles of H").
_BARE_END_OK = re.compile(r"(?:(?:\A|\n)[ \t]*(?:[-*+•]|\d+[.)])?|[:：]"
                          r"|(?i:\b(?:so|thus|therefore|hence|is|be|answer)\b))[\s*_]*\Z")
# A line that is one option letter and nothing else (a bullet or number, markdown, closing punctuation).
_LONE_LINE = re.compile(r"^[ \t]*(?:[-*+•]|\d+[.)])?[ \t]*[*_]*[ \t]*(?:\(\s*(?P<p>[A-Za-z])\s*\)|(?P<b>[A-Z]))"
                        r"[ \t]*[*_]*[.:)]?[*_]*[ \t]*$", re.MULTILINE)

# Any option-like token: a boxed letter, a letter in parentheses (any case), or a capital standing alone (not
# inside a word, a contraction, a LaTeX command, a subscript or superscript, or an abbreviation like "U.S.").
_TOKEN = re.compile(
    r"\\boxed\s*\{\s*(?:\\text(?:bf)?\s*\{\s*)?\(?\s*(?P<x>[A-Za-z])\s*\)?\s*\}"
    r"|\(\s*(?P<p>[A-Za-z])\s*\)"
    r"|(?<![A-Za-z0-9'’\\_^.])(?P<b>[A-Z])(?![A-Za-z0-9'’^]|_(?!_)|\.[A-Za-z])")
# After the article "A" or the pronoun "I", a word (two letters or more) makes it a word, not an option, unless
# that word joins or judges options ("A or B", "A is correct", "I to J").
_NEXT_WORD = re.compile(r"\s+([A-Za-z]{2,}(?:/[A-Za-z]+)?)")
_JOINS = {"or", "and", "and/or", "nor", "vs", "versus", "to", "through", "plus", "but", "then", "also", "too",
          "as", "with", "possibly", "perhaps", "maybe", "probably"}
_JUDGES = {"is", "are", "was", "were", "would", "could", "might", "may", "must", "should", "seems", "fits",
           "matches", "works", "looks", "can", "cannot"}
# Sentences end at a line break, at . ! ? (with closing marks) before a space or the end, and at 。！？.
_SENTENCE_END = re.compile(r"\n|[.!?][*_)\]\"'’”]*(?=\s|\Z)|[。！？]")
# Clauses also end at , ; : and "but": a negation in an earlier clause ("not sure, but it's B") is not the answer's.
_CLAUSE_END = re.compile(r"\n|[.!?][*_)\]\"'’”]*(?=\s|\Z)|[。！？,;:，；：、]|(?i:\bbut\b)")
_CONCLUSION = re.compile(r"(?i:\b(?:so|thus|therefore|hence)\b)")
# After the final statement, a sentence naming another option offers it as an alternative when it asks, or holds
# one of these words ("(B)... or is it (D)?", "B. Maybe C."); an explanation of why the others fail ("A is wrong
# because ...") offers nothing and is allowed.
_ALTERNATIVE = re.compile(r"(?i:\b(?:or|maybe|perhaps|possibly|alternatively|otherwise)\b)|\?")
# Words that undo or weaken a choice when they stand in its clause before the letter.
_UNCOMMITTED = re.compile(
    r"(?i:\b(?:not|never|neither|nor|except|excluding|cannot|incorrect|wrong|false|rather\s+than|instead\s+of"
    r"|other\s+than|eliminat\w*|rul(?:e|ed|ing)\s+out|if|whether|unless|suppos\w*|assum\w*|maybe|perhaps"
    r"|possibly|might|could|either|or)\b|n['’]t\b)")


def _letter(match: re.Match) -> str:
    groups = match.groupdict()
    return next(groups[name] for name in ("p", "b", "x") if groups.get(name)).upper()


def _check_n(n_options: int) -> int:
    n = int(n_options)
    if not 1 <= n <= len(LETTERS):
        raise ValueError(f"n_options must be between 1 and {len(LETTERS)}, got {n_options!r}")
    return n


def _last_end(pattern: re.Pattern, text: str, lo: int, hi: int) -> int:
    """End of the last match of ``pattern`` in ``text[lo:hi]``, or ``lo``."""
    return max((m.end() for m in pattern.finditer(text, lo, hi)), default=lo)


def _options_named(text: str, lo: int, hi: int, valid: str) -> set[str]:
    """The option letters ``text[lo:hi]`` names (see _TOKEN): a unit after a number and the words "A" and "I"
    followed by an ordinary word are not options."""
    named = set()
    for m in _TOKEN.finditer(text, lo, hi):
        letter = _letter(m)
        if letter not in valid:
            continue
        if m.group("b"):
            if _QUANTITY.search(text, 0, m.start()):
                continue
            word = _NEXT_WORD.match(text, m.end(), hi)
            allowed = _JOINS | (_JUDGES if letter == "A" else set())
            if letter in "AI" and word and word.group(1).lower() not in allowed:
                continue
        named.add(letter)
    return named


def _committed(text: str, start: int, match: re.Match, valid: str) -> bool:
    """Whether the answer ``match`` (starting at ``start``, its letter in group L) is one committed choice: no
    negation or hedge in its clause before the letter, and no other option named in its sentence (from the last
    concluding "so"/"thus"/"therefore"/"hence" before it)."""
    lo = _last_end(_SENTENCE_END, text, 0, start)
    end = _SENTENCE_END.search(text, match.end("L"))
    hi = end.start() if end else len(text)
    clause = _last_end(_CLAUSE_END, text, lo, start)
    if _UNCOMMITTED.search(text, clause, match.start("L")):
        return False
    scope = _last_end(_CONCLUSION, text, lo, start)
    return _options_named(text, scope, hi, valid) <= {_letter(match)}


def _alternative_after(text: str, lo: int, letter: str, valid: str) -> bool:
    """Whether a sentence of ``text[lo:]`` offers another option than ``letter`` as an alternative (see
    :data:`_ALTERNATIVE`): then the statement before it was a hedge, not a commitment."""
    starts = [lo] + [m.end() for m in _SENTENCE_END.finditer(text, lo)]
    for a, b in zip(starts, starts[1:] + [len(text)]):
        if _options_named(text, a, b, valid) - {letter} and _ALTERNATIVE.search(text, a, b):
            return True
    return False


def _final_letter(text: str) -> re.Match | None:
    """The lone letter ending the text, when it can be a choice (not a unit, a subscript, a cut-off word or the
    last item of a list of letters)."""
    final = _FINAL.search(text)
    if not final:
        return None
    before, after = text[: final.start("L")], text[final.end("L"):]
    if final.group("b"):
        if _QUANTITY.search(before) or (after.startswith("_") and not after.startswith("__")):
            return None
        if not after.strip() and not _BARE_END_OK.search(before):
            return None
    lone = {_letter(m) for m in _LONE_LINE.finditer(text)}
    return final if lone <= {_letter(final)} else None


def _cues(text: str, lo: int = 0) -> list[re.Match]:
    """The choices stated in other words from ``lo`` on, and the final lone letter."""
    found = [m for pattern in (_CUE_AFTER, _CUE_BEFORE) for m in pattern.finditer(text, lo)]
    final = _final_letter(text)
    if final and final.start("L") >= lo:
        found.append(final)
    return found


def extract_letter(completion: str, n_options: int) -> str | None:
    """The option letter (uppercase) a completion committed to, or None; see the module docstring."""
    valid = LETTERS[: _check_n(n_options)]
    text = answer_after_thinking(completion)
    if text is None:
        return None  # cut off inside its reasoning: no answer was given
    text = text.rstrip()
    statements = sorted((m for pattern in (_STATEMENT, _BOXED) for m in pattern.finditer(text)
                         if _letter(m) in valid), key=lambda m: m.start())
    if statements:
        last = statements[-1]
        letter = _letter(last)
        later = {_letter(m) for m in _cues(text, last.end("L"))} & set(valid)
        if later - {letter} or _alternative_after(text, last.end("L"), letter, valid):
            return None
        return letter if _committed(text, last.start(), last, valid) else None
    cues = [m for m in _cues(text) if _letter(m) in valid]
    if not cues or not all(_committed(text, m.start(), m, valid) for m in cues):
        return None
    letters = {_letter(m) for m in cues}
    return letters.pop() if len(letters) == 1 else None


def score_choice(completion: str, answer: str, n_options: int) -> float:
    """1.0 when the extracted letter is the gold ``answer`` letter, else 0.0 (a miss scores 0, never a guess)."""
    gold = str(answer).strip().upper()
    if len(gold) != 1 or gold not in LETTERS[: _check_n(n_options)]:
        raise ValueError(f"gold answer must be one of the first {n_options} letters, got {answer!r}")
    return float(extract_letter(completion, n_options) == gold)
