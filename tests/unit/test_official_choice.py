"""The multiple-choice verifier against MMLU-Pro's own answer extraction, case by case.

Source: TIGER-AI-Lab/MMLU-Pro, ``evaluate_from_api.py`` and ``evaluate_from_local.py`` (the same three functions in
``compute_accuracy.py``): ``extract_answer`` takes the first ``answer is \\(?([A-J])\\)?``; failing that
``extract_again`` takes ``.*[aA]nswer:\\s*([A-J])`` (the first line that has one, its last occurrence); failing that
``extract_final`` takes the last capital A-J standing alone as a word anywhere in the text; failing all three the
evaluation draws a random letter. The cases below are our own short inputs, each with the letter those rules give
(``None``: no letter, where MMLU-Pro would guess at random).

``agree`` cases: ours reads the same letter. ``departs`` cases: ours deliberately reads another one (or none); the
reason is one of DEPARTURES, each documented in :mod:`opdgrpo.verifiers.choice` and docs/paper-profile.md.
"""

from __future__ import annotations

import pytest

from opdgrpo.verifiers.choice import extract_letter, score_choice

DEPARTURES = {
    "last statement wins": "a model that corrects itself is scored on its final statement; MMLU-Pro takes the first",
    "lowercase in parentheses": "(b) is read as B; MMLU-Pro's patterns are capital-only",
    "outside the options": "a letter beyond the question's options is not an answer (MMLU-Pro accepts A-J always)",
    "a word, not an option": "the pronoun I or the article A is not read as an option letter",
    "several options": "a statement whose sentence names another option (B or C; A, B and D; C, not D) is not one "
                       "committed answer",
    "negated": "a letter after a negation or hedge in its clause ('not B', 'isn't C', 'except A') is not chosen",
    "a unit, not an option": "a capital right after a number is a unit or symbol (2 A, 41,800 J), not an option",
    "no stated answer": "a letter that neither is stated as the answer nor ends the text is not read",
}


def agree(completion: str, n: int, letter: str | None):
    return pytest.param(completion, n, letter, letter, id=f"agree:{completion[:40]}")


def departs(completion: str, n: int, official: str | None, ours: str | None, why: str):
    assert why in DEPARTURES, why
    return pytest.param(completion, n, official, ours, id=f"departs({why}):{completion[:40]}")


CASES = [
    # -- extract_answer: "answer is (X)" --------------------------------------------------------------------------
    agree("After checking the units, the answer is (C).", 10, "C"),
    agree("so the answer is D", 10, "D"),
    agree("Thus the answer is (J)", 10, "J"),
    departs("The answer is C, not D.", 4, "C", None, "several options"),   # one rule: a second option voids it
    agree("ANSWER IS NOT GIVEN, BUT THE BEST FIT IS (B)", 4, "B"),   # capitals: only the final lone letter reads
    agree("The answer is a sum of two forces.", 4, None),
    departs("The answer is (B). Wait, I misread the table. The answer is (D).", 10, "B", "D", "last statement wins"),
    departs("the answer is (b)", 10, None, "B", "lowercase in parentheses"),
    departs("The answer is (E).", 4, "E", None, "outside the options"),
    departs("The answer is B or C.", 4, "B", None, "several options"),
    # -- extract_again: "Answer: X" -------------------------------------------------------------------------------
    agree("Answer: B", 4, "B"),
    agree("Working shown above.\nFinal answer: G", 10, "G"),
    agree("answer: A", 4, "A"),
    agree("Answer: (C)", 4, "C"),            # the parenthesis defeats extract_again; extract_final reads C
    agree("**Answer:** D", 4, "D"),
    departs("Answer: B\nOn reflection, Answer: D", 4, "B", "D", "last statement wins"),
    departs("Answer: A, B and D", 4, "A", None, "several options"),
    # -- extract_final: the last lone capital letter -------------------------------------------------------------
    agree("Comparing all options, I pick C.", 4, "C"),
    agree("**(B)**", 4, "B"),
    agree("$\\boxed{H}$", 10, "H"),
    agree("Option A fails and option B overflows, so D.", 4, "D"),
    agree("I think it's D because the other values are too small.", 4, "D"),
    agree("I think it's D because the other values are too small.", 10, "D"),
    agree("The correct one is C) 18.", 4, "C"),
    agree("Option C is the answer.", 4, "C"),
    agree("I'd go with (B) here.", 4, "B"),
    agree("B is correct.", 4, "B"),
    agree("(C) is the right choice, since the rate doubles.", 4, "C"),
    agree("I choose option G.", 10, "G"),
    agree("So it's A.", 4, "A"),
    agree("The correct option is (F), which matches the data.", 10, "F"),
    agree("I think the answer would be C.", 4, "C"),
    agree("My final pick: E", 10, "E"),
    agree("No idea.", 4, None),
    agree("It is found in the USA.", 4, None),
    departs("I'm not sure.", 10, "I", None, "a word, not an option"),
    departs("A cell divides in two.", 4, "A", None, "a word, not an option"),
    departs("It is either B or C.", 4, "C", None, "several options"),
    # the Oxford comma joins a list too (found in published MMLU-Pro responses; a policy listing every
    # option would be paid for the last one)
    departs("The answer is (A), (F), and (G).", 10, "A", None, "several options"),
    departs("It is either B, C, or D.", 4, "D", None, "several options"),
    departs("The current through the resistor is 2 A", 4, "A", None, "a unit, not an option"),
    departs("G. 41,800 J", 10, "J", None, "a unit, not an option"),
    agree("so the charge is 2 (C)", 4, "C"),
    departs("It's not B.", 4, "B", None, "negated"),
    departs("Both B and D look plausible, but D fits the data.", 4, "D", None, "no stated answer"),
    departs("D. Because the others fail.", 4, "D", None, "no stated answer"),
]


@pytest.mark.parametrize("completion,n,official,ours", CASES)
def test_letter_against_mmlu_pro(completion, n, official, ours):
    assert extract_letter(completion, n) == ours


@pytest.mark.parametrize("completion,gold", [
    ("I think it's D because the other values are too small.", "D"),
    ("The correct one is C) 18.", "C"),
    ("Option C is the answer.", "C"),
])
def test_common_phrasings_score(completion, gold):
    """Phrasings that once scored 0 although they state one letter: each now scores 1 for its letter and 0 for every
    other."""
    assert score_choice(completion, gold, 4) == 1.0
    assert all(score_choice(completion, other, 4) == 0.0 for other in "ABCD" if other != gold)


@pytest.mark.parametrize("completion", [
    "It is either B or C.", "B or C.", "The answer is B or C.", "Answer: A, B and D", "I think it's B or C.",
    "A is correct. Actually, C is correct.", "Option B is the answer, or maybe option D.", "It's not B.",
    "Option C is not the answer.", "C is incorrect.", "It's not A, and not B.",
    "The answer is (A), (B), and (C).", "It is either A, B, or D.", "Answer: A, C, and/or D",
])
def test_hedges_score_nothing(completion):
    """A response naming several options, or only rejecting one, pays for no letter."""
    assert extract_letter(completion, 4) is None
    assert all(score_choice(completion, gold, 4) == 0.0 for gold in "ABCD")
