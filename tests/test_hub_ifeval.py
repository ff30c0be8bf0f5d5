"""IFEval checkers (strict and loose, all 25 instruction ids) and the hub instruction-following domain on fixtures
with google/IFEval's and allenai/RLVR-IFeval's exact schemas."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from opdgrpo.domains.hub_ifeval import RLVR_TO_IFEVAL, RLVR_UNVERIFIED, HubIFEvalDomain, rlvr_instruction
from opdgrpo.verifiers import ifeval

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hub"
SOURCE = {"name": None, "split": "train", "revision": None, "data_files": None}


def _make_module():
    spec = importlib.util.spec_from_file_location("make_ifeval", FIXTURES / "make_ifeval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _hf_cache(tmp_path, monkeypatch):
    """Keep the datasets cache of local parquet loads inside the test's temp dir."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


def _cfg(**over):
    cfg = {
        "name": "ifeval", "kind": "hub_ifeval", "reward": "strict",
        "train": {"source": {**SOURCE, "path": str(FIXTURES / "rlvr_ifeval")}, "size": None, "seed": 0},
        "heldout": {"ifeval": {"source": {**SOURCE, "path": str(FIXTURES / "ifeval")}, "k": 1}},
    }
    cfg.update(over)
    return cfg


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


# -- the domain on fixtures ---------------------------------------------------------------------------
def test_heldout_fixture_through_domain():
    domain = HubIFEvalDomain(_cfg())
    tasks = domain.heldout_sets()["ifeval"]
    assert len(tasks) == 18 and domain.eval_k("ifeval") == 1
    by_key = {t.meta["key"]: t for t in tasks}
    t1000 = by_key[1000]
    assert t1000.prompt.startswith("Write a 300+ word summary")
    assert t1000.answer["instruction_id_list"] == ("punctuation:no_comma", "detectable_format:number_highlighted_sections",
                                                   "length_constraints:number_words")
    assert t1000.answer["kwargs"] == ({}, {"num_highlights": 3}, {"num_words": 300, "relation": "at least"})
    covered = {i for t in tasks for i in t.answer["instruction_id_list"]}
    assert covered == set(ifeval.INSTRUCTION_IDS)


def test_training_fixture_mapping_and_skips():
    domain = HubIFEvalDomain(_cfg())
    pool = domain.training_pool()
    assert len(pool) == 13  # 16 rows - 2 unverifiable kinds - 1 multi-turn conversation
    assert domain.skipped == {"verify_paragraph_count": 1, "validate_choice": 1, "messages is not one user turn": 1}
    by_type = {t.meta["constraint_type"]: t for t in pool}
    repeat = by_type["Repeat Prompt"].answer
    assert repeat["instruction_id_list"] == ("combination:repeat_prompt",)
    assert repeat["kwargs"][0]["prompt_to_repeat"] == "Name three primary colors."
    assert by_type["Frequency of All-capital Words"].answer["kwargs"] == (
        {"capital_frequency": 3, "capital_relation": "around"},)
    assert by_type["Letter Frequency"].answer["kwargs"] == ({"letter": "e", "let_frequency": 7, "let_relation": "exactly"},)
    good = "Name three primary colors. Red, blue and yellow."
    assert domain.score([by_type["Repeat Prompt"]], [good]) == [1.0]
    sections = by_type["Multiple Sections"]
    assert domain.score([sections] * 2, ["Chapter: 1 glad\nChapter: 2 happy\nChapter: 3 merry", "Chapter: 1 glad"]) == [1.0, 0.0]


def test_rlvr_mapping_table():
    assert len(RLVR_TO_IFEVAL) == 23 and set(RLVR_UNVERIFIED) == {"verify_paragraph_count", "validate_choice"}
    assert {i for i, _ in RLVR_TO_IFEVAL.values()} <= set(ifeval.INSTRUCTION_IDS)
    assert rlvr_instruction('{"func_name": "validate_word_constraint", "N": 50, "quantifier": "at most"}') == (
        "length_constraints:number_words", {"num_words": 50, "relation": "at most"})
    assert rlvr_instruction('{"func_name": "validate_response_language", "N": null}').startswith(
        "validate_response_language: ")  # RLVR-IFeval's ground truth has no language field
    assert rlvr_instruction("not json") == "ground_truth is not JSON"


def test_score_reward_modes_and_thinking():
    tasks = HubIFEvalDomain(_cfg()).heldout_sets()["ifeval"]
    quote = next(t for t in tasks if t.answer["instruction_id_list"] == ("detectable_format:json_format",))
    preamble = "Sure, here it is:\n{\"ad\": \"soft diapers\"}"
    assert HubIFEvalDomain(_cfg()).score([quote], [preamble]) == [0.0]
    assert HubIFEvalDomain(_cfg(reward="loose")).score([quote], [preamble]) == [1.0]
    # Reasoning before </think> is not scored; the newline after it is not part of the answer.
    thinking = "<think>Maybe plain text, like this, is fine?</think>\n\n{\"ad\": \"soft diapers\"}"
    assert HubIFEvalDomain(_cfg()).score([quote], [thinking]) == [1.0]
    with pytest.raises(ValueError, match="`domains.ifeval.reward`"):
        HubIFEvalDomain(_cfg(reward="lenient"))


def test_extra_metrics_on_a_batch_by_hand():
    domain = HubIFEvalDomain(_cfg())
    by_key = {t.meta["key"]: t for t in domain.heldout_sets()["ifeval"]}
    tasks = [by_key[1075], by_key[1147], by_key[1127]]
    completions = [
        "{\"product\": \"diaper\"}",                                        # json: followed (1 of 1)
        "We addressed the issue promptly.",  # forbidden 'issue' on its only line: not followed, even loosely
        "SECTION 1\nI miss class.\nSECTION 2\nI miss more.\nSECTION 3\nStill.\nSECTION 4\nDone.\n"
        "Can I get my money back for the classes I missed?\n**P.S.**",      # sections yes; end phrase only loose
    ]
    metrics = domain.extra_metrics(tasks, completions)
    # strict: prompts 1/3 (only the JSON one), instructions 2/4 (json, sections); loose: the last line removed
    # rescues the end phrase: prompts 2/3, instructions 3/4.
    assert metrics == pytest.approx({"prompt_strict": 1 / 3, "prompt_loose": 2 / 3,
                                     "instruction_strict": 2 / 4, "instruction_loose": 3 / 4})
    assert domain.score(tasks, completions) == [1.0, 0.0, 0.0]
    rates = domain.constraint_rates(tasks, completions)
    assert rates == {"detectable_format:json_format": 1.0, "detectable_format:multiple_sections": 1.0,
                     "keywords:forbidden_words": 0.0, "startend:end_checker": 0.0}


def test_bad_heldout_row_names_key_and_argument(tmp_path):
    import datasets

    make = _make_module()
    struct = {name: None for name in make.IFEVAL_KWARGS}
    row = {"key": 77, "prompt": "Write 300+ words.", "instruction_id_list": ["length_constraints:number_words"],
           "kwargs": [{**struct, "relation": "at least"}]}  # num_words missing
    (tmp_path / "bad").mkdir()
    datasets.Dataset.from_list([row], features=make.IFEVAL_FEATURES).to_parquet(str(tmp_path / "bad" / "train.parquet"))
    cfg = _cfg(heldout={"ifeval": {"source": {**SOURCE, "path": str(tmp_path / "bad")}}})
    with pytest.raises(ValueError, match=r"domains\.ifeval\.heldout\.ifeval\.source.*key 77.*'num_words'"):
        HubIFEvalDomain(cfg).heldout_sets()


def test_fixture_schema_matches_hub_features():
    import datasets

    make = _make_module()
    ifeval_rows = datasets.load_dataset(str(FIXTURES / "ifeval"), split="train")
    rlvr_rows = datasets.load_dataset(str(FIXTURES / "rlvr_ifeval"), split="train")
    assert ifeval_rows.features == make.IFEVAL_FEATURES
    assert list(ifeval_rows.features["kwargs"].feature) == list(make.IFEVAL_KWARGS)  # the hub's field order
    assert rlvr_rows.features == make.RLVR_FEATURES
    assert rlvr_rows.column_names == ["messages", "ground_truth", "dataset", "constraint_type", "constraint"]
    assert ifeval_rows[0]["kwargs"][0]["num_words"] is None  # unused struct fields come back as nulls


def test_paper_conf_builds_on_fixtures():
    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "conf" / "domain" / "paper_ifeval.yaml").read_text())
    assert (cfg["name"], cfg["kind"], cfg["reward"]) == ("ifeval", "hub_ifeval", "strict")
    assert cfg["train"]["source"]["path"] == "allenai/RLVR-IFeval"
    assert cfg["heldout"]["ifeval"]["source"] == {**SOURCE, "path": "google/IFEval"} and cfg["heldout"]["ifeval"]["k"] == 1
    cfg["train"]["source"]["path"] = str(FIXTURES / "rlvr_ifeval")
    cfg["heldout"]["ifeval"]["source"]["path"] = str(FIXTURES / "ifeval")
    domain = HubIFEvalDomain(cfg)
    assert len(domain.training_pool()) == 13 and len(domain.heldout_sets()["ifeval"]) == 18
