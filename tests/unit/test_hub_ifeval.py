"""IFEval checkers (strict and loose, all 25 instruction ids) and the RLVR-IFeval mapping, without loading the hub
fixtures (the domain on them: tests/integration/test_hub_ifeval_fixtures.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from opdgrpo.domains.hub_ifeval import RLVR_TO_IFEVAL, RLVR_UNVERIFIED, rlvr_instruction
from opdgrpo.verifiers import ifeval

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hub"


def _make_module():
    spec = importlib.util.spec_from_file_location("make_ifeval", FIXTURES / "make_ifeval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- every instruction id: one response that follows it, one that does not ----------------------------
CASES = [
    ("keywords:existence", {"keywords": ["cat", "Dog"]}, "A cat met a dog.", "A cat sat alone."),
    ("keywords:frequency", {"keyword": "war", "frequency": 2, "relation": "at least"}, "War is bad. No more war.",
     "War is bad."),
    ("keywords:forbidden_words", {"forbidden_words": ["rock"]}, "Rocky roads are fine.", "We ROCK today."),
    ("keywords:letter_frequency", {"letter": "#", "let_frequency": 2, "let_relation": "at least"}, "#sun #sea",
     "#sun only"),
    ("language:response_language", {"language": "fr"}, "Bonjour, je suis très content de vous voir aujourd'hui.",
     "The quick brown fox jumps over the lazy dog near the river bank."),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"}, "Dr. Smith came. He sat.",
     "One is here. Two is here. Three is here."),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First part.\n***\nSecond part.",
     "First part.\n***\n***\nSecond part."),
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"}, "one two three four five",
     "one two three"),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "trade"},
     "Tea came first.\n\n\"Trade, then, grew.", "Tea came first.\n\nCommerce grew."),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Send [name] to [address].", "Send [name]."),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hello there.\n\nP.S. See you.",
     "Hello there.\n\nPS see you."),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* first\n* second", "* first\n* second\n- third"),
    ("detectable_format:constrained_response", {}, "My answer is maybe.", "Maybe."),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and **two**", "*one* and ** **"),
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2},
     "SECTION 1\nRoses.\nSECTION 2\nViolets.", "SECTION 1\nRoses and violets."),
    ("detectable_format:json_format", {}, "```json\n{\"name\": \"Ada\"}\n```", "{name: Ada}"),
    ("detectable_format:title", {}, "<<Ode to Tea>>\nWarm cups.", "<< >>\nWarm cups."),
    ("combination:two_responses", {}, "Yes.\n******\nNo.", "Yes.\n******\nYes."),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a poem about tea."},
     "write a poem about tea. Tea is warm.", "Sure! Write a poem about tea."),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Done here. Any other questions?\"",
     "Any other questions? Bye."),
    ("change_case:capital_word_frequency", {"capital_frequency": 3, "capital_relation": "at least"},
     "I LOVE NASA.", "I love nasa."),
    ("change_case:english_capital", {}, "THIS IS A LONG ENGLISH SENTENCE ABOUT THE WEATHER TODAY.",
     "This is a long English sentence about the weather today."),
    ("change_case:english_lowercase", {}, "this is an english sentence about the weather today.",
     "This is an English sentence about the weather today."),
    ("punctuation:no_comma", {}, "No commas here.", "Yes, commas."),
    ("startend:quotation", {}, "\"Quoted answer.\"", "Quoted answer."),
]


def test_cases_cover_every_instruction_id():
    assert sorted(c[0] for c in CASES) == sorted(ifeval.INSTRUCTION_IDS)
    assert len(ifeval.INSTRUCTION_IDS) == 25


@pytest.mark.parametrize("instruction_id,kwargs,good,bad", CASES, ids=[c[0] for c in CASES])
def test_each_instruction_passes_and_fails(instruction_id, kwargs, good, bad):
    assert ifeval.follows(instruction_id, kwargs, good)
    assert not ifeval.follows(instruction_id, kwargs, bad)
    result = ifeval.check([instruction_id], [kwargs], "prompt", bad)
    assert result["strict"] == [False] and result["prompt_strict"] is False
    assert ifeval.check([instruction_id], [kwargs], "prompt", good)["loose"] == [True]


def test_blank_response_follows_nothing():
    for instruction_id in ("punctuation:no_comma", "keywords:forbidden_words"):
        kwargs = {"forbidden_words": ["x"]} if "forbidden" in instruction_id else {}
        result = ifeval.check([instruction_id], [kwargs], "p", "  \n ")
        assert result["strict"] == [False] and result["loose"] == [False]


def test_relations_official_and_extended():
    words = "one two three four"  # 4 words
    for relation, target, expected in [("less than", 4, False), ("less than", 5, True), ("at least", 4, True),
                                       ("at most", 4, True), ("at most", 3, False), ("exactly", 4, True),
                                       ("exactly", 5, False), ("around", 5, True), ("around", 6, False)]:
        assert ifeval.follows("length_constraints:number_words", {"num_words": target, "relation": relation},
                              words) is expected, (relation, target)


def test_strict_and_loose_differ():
    # A preamble line breaks the quotation rule strictly; loose forgives it (first line removed).
    preamble = "Here is my answer:\n\"Tea is warm.\""
    assert ifeval.check(["startend:quotation"], [{}], "p", preamble) == {
        "strict": [False], "prompt_strict": False, "loose": [True], "prompt_loose": True}
    # Markdown bold around the end phrase: loose removes the asterisks.
    bold = "Done. **Any other questions?**"
    result = ifeval.check(["startend:end_checker"], [{"end_phrase": "Any other questions?"}], "p", bold)
    assert result["strict"] == [False] and result["loose"] == [True]
    # A comma in the sign-off line only: loose drops the last line; the other instruction holds either way.
    signed = "tea is warm and green\nbest, bot"
    result = ifeval.check(["punctuation:no_comma", "change_case:english_lowercase"], [{}, {}], "p", signed)
    assert result["strict"] == [False, True] and result["prompt_strict"] is False
    assert result["loose"] == [True, True] and result["prompt_loose"] is True


def test_loose_variants_are_iFEvals_eight():
    variants = ifeval.loose_variants("a*\nb\nc*")
    assert variants == ["a*\nb\nc*", "a\nb\nc", "b\nc*", "a*\nb", "b", "b\nc", "a\nb", "b"]


def test_kwargs_struct_with_nulls():
    struct = {name: None for name in _make_module().IFEVAL_KWARGS}  # the hub's union struct, all null
    words = {**struct, "relation": "at least", "num_words": 3}
    assert ifeval.validate("length_constraints:number_words", words) == {"num_words": 3, "relation": "at least"}
    assert ifeval.validate("punctuation:no_comma", struct) == {}
    result = ifeval.check(["punctuation:no_comma", "length_constraints:number_words"], [struct, words], "p",
                          "one two three")
    assert result["strict"] == [True, True]
    with pytest.raises(ValueError, match="number_words.*'num_words'"):
        ifeval.validate("length_constraints:number_words", {**struct, "relation": "at least"})
    with pytest.raises(ValueError, match="'relation'.*'more than'"):
        ifeval.validate("length_constraints:number_words", {"num_words": 3, "relation": "more than"})
    with pytest.raises(ValueError, match="unknown IFEval instruction id"):
        ifeval.validate("keywords:key_sentences", {})
    with pytest.raises(ValueError, match="nth_paragraph"):
        ifeval.validate("length_constraints:nth_paragraph_first_word",
                        {"num_paragraphs": 2, "nth_paragraph": 3, "first_word": "a"})


def test_sentence_and_word_counts_without_punkt_data():
    assert ifeval.count_sentences("Dr. Smith went home. He slept.") == 2
    assert ifeval.count_sentences("Pi is 3.14 today. Is it? Yes!") == 3
    assert ifeval.count_words("It's a well-known fact.") == 6  # \w+ runs, as IFEval counts
    assert ifeval.word_tokens("HELLO WORLD. NASA is OK.") == ["HELLO", "WORLD", ".", "NASA", "is", "OK", "."]


def test_no_nltk_download_attempted(monkeypatch):
    import nltk

    def refuse(*args, **kwargs):
        raise AssertionError(f"NLTK data was requested: {args}")

    monkeypatch.setattr(nltk, "download", refuse)
    monkeypatch.setattr(nltk.data, "load", refuse)
    monkeypatch.setattr(nltk.data, "find", refuse)
    ifeval._sentence_splitter.cache_clear()
    ifeval._word_tokenizers.cache_clear()
    try:
        for instruction_id, kwargs, good, bad in CASES:
            ifeval.check([instruction_id], [kwargs], "p", good)
            ifeval.check([instruction_id], [kwargs], "p", bad)
    finally:
        ifeval._sentence_splitter.cache_clear()
        ifeval._word_tokenizers.cache_clear()


def test_aggregate_four_metrics_by_hand():
    results = [
        {"strict": [True, True], "loose": [True, True]},    # all followed
        {"strict": [False, True], "loose": [True, True]},   # loose rescues one
        {"strict": [False], "loose": [False]},              # nothing
    ]
    assert ifeval.aggregate(results) == pytest.approx({
        "prompt_strict": 1 / 3, "prompt_loose": 2 / 3, "instruction_strict": 3 / 5, "instruction_loose": 4 / 5})


def test_rlvr_mapping_table():
    assert len(RLVR_TO_IFEVAL) == 23 and set(RLVR_UNVERIFIED) == {"verify_paragraph_count", "validate_choice"}
    assert {i for i, _ in RLVR_TO_IFEVAL.values()} <= set(ifeval.INSTRUCTION_IDS)
    assert rlvr_instruction('{"func_name": "validate_word_constraint", "N": 50, "quantifier": "at most"}') == (
        "length_constraints:number_words", {"num_words": 50, "relation": "at most"})
    assert rlvr_instruction('{"func_name": "validate_response_language", "N": null}').startswith(
        "validate_response_language: ")  # RLVR-IFeval's ground truth has no language field
    assert rlvr_instruction("not json") == "ground_truth is not JSON"
