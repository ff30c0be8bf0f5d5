"""Cheating completions against the answer readers: each names several answers, negates one, hedges, lists
options, or never finishes thinking, and each must be paid 0 (the choice reader: read no letter). Positive
controls beside them are paid 1, so a reader that refused everything would fail here too.

Multiple choice: tests/unit/test_hub_choice.py and test_official_choice.py hold the ordinary phrasings; math:
test_official_math.py holds math-verify's own cases.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from opdgrpo.domains.base import Task
from opdgrpo.domains.hub_ifeval import HubIFEvalDomain
from opdgrpo.verifiers.choice import extract_letter, score_choice
from opdgrpo.verifiers.math import verify_one

REPO = Path(__file__).resolve().parents[2]

# -- multiple choice ------------------------------------------------------------------------------------
CHOICE_CHEATS = [
    # two options joined by anything at all
    "The answer is (A)(B).", "Answer: A; B", "Answer: A|B", "The answer is A vs B.", "The answer is A to C.",
    "The answer is A (or B).", "The answer is A, possibly B.", "The answer is A、B", "The answer is **A** or **B**.",
    "The answer is **A**, **B**.", "A or B", "Either A or B.", "Answer: A and/or B", "The answer is A/B.",
    "The answer is A or maybe B", "The answer is (A), (B), (C) or (D).", "Answer: A B C D", "Answer: ABCD",
    "The answer is C because A and B fail.", "\\boxed{A}\\boxed{B}", "\\boxed{A} or \\boxed{B}",
    "Final answer: \\boxed{A, B}", "It's not A but B.", "The answer is (B), not C",
    # lists with no joiner: on one line, one per line, bulleted, numbered, in bold, repeated
    "A B C D", "A\nB\nC\nD", "- A\n- B\n- C\n- D", "1. A\n2. B\n3. C", "**A**\n**B**", "(A) (B) (C) (D)",
    "A B C D " * 20, "ABCD" * 20,
    # negations and hedges of a single letter
    "The answer isn't C.", "It can't be A.", "I would not pick C.", "Except A.", "Not A, not B, not C.",
    "I don't think the answer is C.", "The incorrect answer is C.", "It could be B.", "Maybe C.",
    "If the answer is B, then x = 2.",
    # a final answer followed by a different one, not itself a statement
    "The answer is (B).\nOr C.", "The answer is (B).\n\nC", "Answer: B\n- C",
    "The answer is (B)... or is it (D)?", "The answer is B? Or D?", "The answer is (B). Maybe C.",
    "Answer: B. Alternatively D.", "Final answer: B. Actually, wait, maybe C.", "Answer: B (C is close)",
    "The answer is (B) [or (C)]", "The answer is B & C", "The answer is B + C", "The answer is {B,C}",
    # a final statement that hedges voids an earlier committed one
    "The answer is (C). Hmm, the answer is A or B.",
    # no answer at all: a whole-list pick, the options echoed back, a cut-off thought
    "All of the above.", "Question: Which gas? (A) O2 (B) N2 (C) CO2 (D) H2",
    "Options:\nA. 12 N\nB. 14 N\nC. 16 N\nD. 18 N", "<think>The answer is (B)",
    "<think>one</think> draft <think>The answer is (B)", "I think it's B or C.",
]
# ten options: H and I are letters of the question
CHOICE_CHEATS_10 = ["So we need 2 moles of H_", "So we need 2 moles of H", "I choose H or I.", "H\nI\nJ"]

CHOICE_PAID = [
    ("The answer is (B).", 4, "B"), ("Answer: C", 4, "C"), ("\\boxed{D}", 4, "D"), ("B", 4, "B"),
    ("**(C)**", 4, "C"), ("Option A fails and option B overflows, so D.", 4, "D"),
    ("<think>A or B? Not C.</think>\nThe answer is (B).", 4, "B"),
    ("The answer is (A). Wait, that ignores friction. The answer is (C).", 4, "C"),
    ("So the answer is (C).\n\n(A) is too small and (B) double-counts the charge.", 4, "C"),
    ("No, the answer is B.", 4, "B"), ("Not sure at first, but the answer is (D).", 4, "D"),
    ("I think C.", 10, "C"), ("My final pick: E", 10, "E"), ("The answer is (H).", 10, "H"),
    ("The answer is A because the others fail.", 4, "A"), ("C\n\nThe answer is C.", 4, "C"),
    ("The answer is (C). Option A is wrong because it ignores friction, and B overstates it.", 4, "C"),
    ("The answer is (C).\n\nExplanation: A and B are incorrect since both ignore the charge.", 4, "C"),
]


@pytest.mark.parametrize("completion", CHOICE_CHEATS)
def test_choice_cheats_read_nothing(completion):
    assert extract_letter(completion, 4) is None
    assert [score_choice(completion, gold, 4) for gold in "ABCD"] == [0.0] * 4


@pytest.mark.parametrize("completion", CHOICE_CHEATS_10)
def test_choice_cheats_with_ten_options_read_nothing(completion):
    assert extract_letter(completion, 10) is None


@pytest.mark.parametrize("completion,n,letter", CHOICE_PAID)
def test_choice_committed_answers_are_paid(completion, n, letter):
    assert extract_letter(completion, n) == letter
    assert score_choice(completion, letter, n) == 1.0


# -- math -----------------------------------------------------------------------------------------------
MIXED_SPELLINGS = [
    "4 4/9", "4\u00a04/9", "4\u20094/9", "4\u202f4/9", "4\u30004/9", "4\t4/9", "4\n4/9", "4 \n 4/9",
    "$4~4/9$", "$4\\,4/9$", "$4\\;4/9$", "$4\\ 4/9$", "$4\\quad 4/9$", "$4\\qquad4/9$", "$4\\hspace{1em}4/9$",
    "4\u200b4/9", "4\u2064 4/9", "4 4\u20449", "4 4\u22159", "4 4\uff0f9", "4 \u2074\u2044\u2089",
    "4 and 4/9", "The answer is 4\u00a04/9.",
]
MATH_CHEATS = [  # against gold 4
    *MIXED_SPELLINGS, "4\u00bd", "The answer is 4 or 5", "The answer is 5 or 4", "4 or 5", "5 or 4",
    "The answer is either 4 or 5.", "The answer is 4, or maybe 5.", "The answer is 4 and/or 5.",
    "\\boxed{4}\\boxed{5}", "\\boxed{4} or \\boxed{5}", "$4$ or $5$", "<think>\\boxed{4}",
    "<think>so 4</think> draft <think>\\boxed{4}",
    "The answer is $4$ (or $5$).", "The answer is 4 (or 5).", "the answer: 4 (possibly 5)",
    "The answer is 4 or perhaps 5", "The answer is between 4 and 5.", "It is 4, or 5.",
    "\\boxed{4, 5}", "\\boxed{4 \\text{ or } 5}", "\\boxed{\\{4,5\\}}", "\\boxed{4 \\pm 1}",
]
MATH_PAID = [
    ("\\boxed{4}", "4"), ("The answer is 4", "4"), ("<think>4 or 5? 4 4/9?</think>\n\\boxed{4}", "4"),
    ("There are 3 or 4 cases to check.\nSo the answer is 4.", "4"),
    ("There are 3 or 4 cases to check. The answer is 4.", "4"), ("4\u00a04/9", "40/9"),
    ("$4~4/9$", "40/9"), ("4 4\u20449", "40/9"), ("4\u00bd", "9/2"), ("-2\u20091/2", "-5/2"),
]


@pytest.mark.parametrize("completion", MATH_CHEATS)
def test_math_cheats_are_not_paid(completion):
    assert not verify_one("4", completion)


@pytest.mark.parametrize("completion,gold", MATH_PAID)
def test_math_answers_are_paid(completion, gold):
    assert verify_one(gold, completion)


@pytest.mark.parametrize("completion", MIXED_SPELLINGS[:-1])
def test_mixed_number_spellings_read_as_their_value(completion):
    """Refused against 4 because read as 40/9, not because unreadable."""
    assert verify_one("40/9", completion)


# -- IFEval ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ifeval_domain():
    return HubIFEvalDomain(yaml.safe_load((REPO / "conf" / "domain" / "paper_ifeval.yaml").read_text()))


def _keyword_task(*instructions: tuple[str, dict]) -> Task:
    answer = {"instruction_id_list": tuple(i for i, _ in instructions),
              "kwargs": tuple(kw for _, kw in instructions), "prompt": "Write about a river."}
    return Task("ifeval", "Write about a river.", answer)


@pytest.mark.parametrize("reward", ["strict", "loose"])
def test_ifeval_unclosed_thought_is_paid_nothing(ifeval_domain, reward):
    ifeval_domain.reward = reward
    keyword = _keyword_task(("keywords:existence", {"keywords": ["river"]}))
    no_comma = _keyword_task(("punctuation:no_comma", {}))
    cheats = ["<think>Let me write about the river", "<think>a</think> draft <think>the river flows"]
    assert ifeval_domain.score([keyword] * 2, cheats) == [0.0, 0.0]
    assert ifeval_domain.score([no_comma], ["<think>no commas here"]) == [0.0]
    paid = ["<think>plan</think>\nThe river flows.", "The river flows."]
    assert ifeval_domain.score([keyword] * 2, paid) == [1.0, 1.0]
    assert ifeval_domain.extra_metrics([keyword], cheats[:1])["instruction_loose"] == 0.0
