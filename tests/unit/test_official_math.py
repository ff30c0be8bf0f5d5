"""The math verifier against math-verify's own regression tests and documented rules, case by case.

Sources: huggingface/Math-Verify ``tests/test_all.py`` (each group below names the test function whose rule it
exercises) and ``README.md`` ("Why is verify function not symmetric?", the extraction environments). Those tests
parse gold and prediction alike with ``LatexExtractionConfig(boxed_match_priority=0)`` and/or
``ExprExtractionConfig()`` and verify with ``float_rounding=6``; the project parses a bare gold string inside
``$...$`` and the completion with math-verify's defaults (:mod:`opdgrpo.verifiers.math`). The cases are our own
short inputs, golds written as a data set stores them, each with the verdict of the rule they exercise.
``departs`` marks the one place the project's settings give another verdict: the completion is parsed with
math-verify's default targets, LaTeX *and* plain expressions (what its README recommends for predictions), so a
bare number is read even where ``test_latex_notation``, which extracts LaTeX only, finds nothing.
"""

from __future__ import annotations

import pytest

from opdgrpo.verifiers.math import verify_one


def case(gold: str, completion: str, official: bool):
    return pytest.param(gold, completion, official, official, id=f"{gold[:20]}|{completion[:30]}")


def departs(gold: str, completion: str, official: bool, ours: bool, why: str):
    return pytest.param(gold, completion, official, ours, id=f"departs({why}):{gold[:20]}|{completion[:30]}")


CASES = [
    # -- test_number_extraction: plain numbers in text ----------------------------------------------------------
    case("-7", "The result is -7", True),
    case("3125000", "The total is 3,125,000.", True),          # thousands separators
    case("2000", "2000.0", True),
    case("0.6", "It is .6", True),                             # no leading zero
    case("1250.75", "$1,250.75", True),                        # a currency sign
    case("48.5", "the price is 48.5€", True),
    case("3", "QWZ3X", False),                                 # a digit inside a word is no answer
    # -- test_simple_fraction_notation ------------------------------------------------------------------------
    case("7/4", "\\frac{7}{4}", True),
    case("-7/4", "-\\frac{7}{4}", True),
    # -- test_latex_notation: environments, malformed commands, styling, the last "=" ---------------------------
    case("5", "Answer \\[ 5 \\]", True),
    case("5", "Answer $ 5 $", True),
    case("5", "Answer \\( 5 \\)", True),
    case("6", "Answer \\( (5+1) \\)", True),
    departs("5", "Answer $ \n 5 \n $", False, True, why="plain expressions are read too"),  # inline math may
    # not span lines, so LaTeX extraction finds nothing; the expression target then reads the bare 5
    case("5", "Answer $$ \n 5 \n $$", True),                   # display math may
    case("1/4", "$\\frac14 $", True),
    case("\\sqrt{5}", "$\\sqrt5 $", True),
    case("1/4", "$\\dfrac{1}{4}$", True),
    case("1/4", "$\\frac{1}{4} \\text{meters}$", True),
    case("1/4", "$k = \\frac{1}{4}$", True),
    # -- test_percent_notation ----------------------------------------------------------------------------------
    case("35\\%", "35 percent", True),
    case("35\\%", "$\\boxed{35}$ pct", True),
    # -- test_sets_handling ---------------------------------------------------------------------------------------
    case("[0,2)", "$[0,2)$", True),
    case("[0,9)", "$[0,2)$", False),
    case("(0,9)", "$[0,9)$", False),
    # -- test_relations_math --------------------------------------------------------------------------------------
    case("x \\geq 3", "Therefore $x >= 3$ is the solution.", True),
    case("x > 3", "So $x < 3$.", False),
    case("x \\leq 4", "$4 \\geq x$", True),                    # a flipped inequality
    case("12", "$x=12$", True),                                # a bare number matches an assignment
    case("y = 12", "$y = 5+7 = 12$", True),                    # the last side of a chain
    case("4a+c = 5", "$4a+c$", False),
    case("x < 1", "$-x > -1$", True),
    # -- test_latex_notation_math: boxed answers at the end of solutions -------------------------------------
    case("17", "so the count is $\\boxed{17}$", True),
    case("\\frac{5}{3}", "$2+\\frac{2}{3}-1=\\boxed{\\frac{5}{3}}$", True),
    case("2\\sqrt{5}", "$\\sqrt{20} = \\boxed{2\\sqrt{5}}$", True),
    case("90^\\circ", "the angle is $\\boxed{90^\\circ}$.", True),
    case("\\text{Alice}", "Therefore $\\boxed{\\text{Alice}}$ wins.", True),
    case("(2, \\frac{\\pi}{3})", "$\\boxed{\\left( 2, \\frac{\\pi}{3} \\right)}$", True),
    case("-3,2", "the roots are $\\boxed{-3,2}$.", True),
    case("1 \\pm \\sqrt{7}", "$x = \\boxed{1 \\pm \\sqrt{7}}$", True),
    case("304_5", "a quotient of $\\boxed{304_5}$", True),
    # -- test_matrix_extraction ---------------------------------------------------------------------------------
    case("\\begin{pmatrix}1 & 0 \\\\ 0 & 1\\end{pmatrix}", "$\\begin{pmatrix}1 & 0 \\\\ 0 & 1\\end{pmatrix}$", True),
    case("\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix}", "$\\begin{pmatrix}1 & 2 \\\\ 3 & 5\\end{pmatrix}$", False),
    # -- README, "Why is verify function not symmetric?": an inequality gold accepts its interval, not back --
    case("1 < x < 2", "$(1,2)$", True),
    case("(1,2)", "$1 < x < 2$", False),
    # -- test_precision: numbers agree to float_rounding=6 --------------------------------------------------
    case("1/3", "$0.333333$", True),
    case("1/3", "$0.33$", False),
]


# -- mixed numbers: math-verify's newer releases read "4 4/9" as 40/9; the installed 0.9.0 reads it as 4
# (and "2 1/2" as 1, "12 3/4" as 3), so :func:`opdgrpo.verifiers.math.improper_fractions` rewrites them first.
CASES += [
    case("4", "The answer is 4 4/9.", False),   # 0.9.0 unguarded: True, a fraction appended to the right integer pays
    case("40/9", "The answer is 4 4/9.", True),
    case("\\frac{40}{9}", "The answer is 4 4/9.", True),
    case("5/2", "so 2 1/2", True),
    case("2", "so 2 1/2", False),
    case("-5/2", "x = -2 1/2", True),
    case("51/4", "It takes 12 3/4 hours.", True),
    case("1", "on 1/2/3", False),                # a date-like run of slashes is no mixed number: left as written
]


@pytest.mark.parametrize("gold,completion,official,ours", CASES)
def test_against_math_verify(gold, completion, official, ours):
    assert verify_one(gold, completion, timeout_s=5) is ours
