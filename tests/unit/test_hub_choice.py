"""Paper-scale knowledge without the hub fixtures: option-letter extraction edge cases, GPQA option order, and the
paper profile's domain config (the domain on the fixtures: tests/integration/test_hub_choice_fixtures.py)."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import yaml

from opdgrpo.domains.hub_choice import HubChoiceDomain, shuffled_options
from opdgrpo.verifiers.choice import extract_letter, score_choice

REPO = Path(__file__).resolve().parents[2]


# -- letter extraction ----------------------------------------------------------------------------------
@pytest.mark.parametrize("completion,n,expected", [
    ("Step by step... The answer is (B).", 4, "B"),
    ("Answer: C", 4, "C"),
    ("**Answer:** D", 4, "D"),
    ("The final answer is: **C**", 4, "C"),
    ("The answer is A because the others fail.", 4, "A"),
    ("The correct answer is option (j).", 10, "J"),
    # boxed, with LaTeX text wrappers and any case
    ("So $\\boxed{C}$", 4, "C"),
    ("\\boxed{\\text{b}}", 4, "B"),
    ("\\boxed{(A)}", 4, "A"),
    ("\\boxed{CO2} is the gas", 4, None),
    # lowercase: only when delimited; a bare "a" is the article
    ("the answer is (b)", 4, "B"),
    ("The answer is a compound of iron.", 4, None),
    ("The answer is b.", 4, None),
    # several candidates: the last explicit statement wins, and statements beat a trailing letter
    ("The answer is (A). Wait, that ignores friction. The answer is (C).", 4, "C"),
    ("Answer: B\nOn reflection the answer is (D)", 4, "D"),
    ("The answer is (B), not C", 4, None),   # a statement naming a second option commits to none
    ("\\boxed{A} ... the answer is (B)", 4, "B"),
    ("Answer: Let's think step by step. ... The answer is (D)", 10, "D"),
    # letters beyond the option count are not options: ignored
    ("The answer is (E).", 4, None),
    ("The answer is (E).", 5, "E"),
    ("The answer is (E). If E is not offered, (B)", 4, "B"),
    ("\\boxed{F}", 4, None),
    # a final lone letter when nothing is stated explicitly
    ("Comparing all options, I pick C.", 4, "C"),
    ("**(B)**", 4, "B"),
    ("It is found in the USA.", 4, None),
    ("I'm not sure", 10, None),
    ("", 4, None),
    ("No idea.", 4, None),
    # a choice stated in other words (no explicit statement): the letter must close the phrase
    ("I think it's D because the others fail.", 4, "D"),
    ("I'd say (b) here.", 4, "B"),
    ("Option C is the answer.", 4, "C"),
    ("It's A good question; the velocity doubles.", 4, None),
    ("If we choose B as the base, then x=3.", 4, None),
    ("Let's pick A = 2 and check.", 4, None),
    ("Option A is correct only for small angles, so B.", 4, None),   # two different cues: no answer
    ("It's B. Final answer: C", 4, "C"),                               # an explicit statement beats any cue
    # reasoning inside <think> is never read; a completion cut off while thinking has no answer
    ("<think>The answer is (A)... hmm, (A)?</think>\nThe answer is (C)", 4, "C"),
    ("<think>The answer is (A)</think>\nI cannot decide.", 4, None),
    ("<think>Long reasoning. The answer is (A)", 4, None),
    ("<think>one</think> draft <think>The answer is (B)", 4, None),
])
def test_extract_letter(completion, n, expected):
    assert extract_letter(completion, n) == expected


def test_score_choice_no_guess_and_validation():
    assert score_choice("The answer is (B)", "B", 4) == 1.0
    assert score_choice("The answer is (B)", "b", 4) == 1.0
    assert score_choice("The answer is (C)", "B", 4) == 0.0
    assert all(score_choice("nothing here", gold, 4) == 0.0 for gold in "ABCD")  # a miss never scores
    with pytest.raises(ValueError, match="gold answer"):
        score_choice("The answer is (E)", "E", 4)
    with pytest.raises(ValueError, match="n_options"):
        extract_letter("The answer is (A)", 0)


# -- GPQA option order ----------------------------------------------------------------------------------
def test_shuffled_options_deterministic_and_pinned():
    opts = ["right", "w1", "w2", "w3"]
    first = shuffled_options(opts, "recAbc", 0)
    assert first == shuffled_options(list(opts), "recAbc", 0)
    assert sorted(first[0]) == sorted(opts) and first[0][first[1]] == "right"
    # Pinned: a change here silently changes every GPQA prompt and its gold letter between runs.
    assert first == (["w2", "w1", "w3", "right"], 3)
    assert shuffled_options(opts, "recAbc", 1) != first


def test_shuffled_options_spread_the_correct_answer():
    counts = collections.Counter(shuffled_options(["r", "a", "b", "c"], f"rec{i}", 0)[1] for i in range(2000))
    assert sorted(counts) == [0, 1, 2, 3] and all(400 <= v <= 600 for v in counts.values()), counts


# -- the paper profile's domain config ---------------------------------------------------------------
def test_conf_file_is_valid():
    cfg = yaml.safe_load((REPO / "conf" / "domain" / "paper_knowledge.yaml").read_text())
    assert cfg["kind"] == "hub_choice" and cfg["name"] == "knowledge"
    assert cfg["train"]["source"] == {"path": "cais/mmlu", "name": "all", "split": "auxiliary_train",
                                      "revision": None, "data_files": None}
    assert cfg["heldout"]["mmlu_pro"]["k"] == 1
    HubChoiceDomain(cfg)  # validates formats without loading anything
