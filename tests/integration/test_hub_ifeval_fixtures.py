"""The hub instruction-following domain on fixtures with google/IFEval's and allenai/RLVR-IFeval's exact schemas."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from opdgrpo.domains.base import heldout_k
from opdgrpo.domains.hub_ifeval import HubIFEvalDomain
from opdgrpo.verifiers import ifeval

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hub"
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


# -- the domain on fixtures ---------------------------------------------------------------------------
def test_heldout_fixture_through_domain():
    domain = HubIFEvalDomain(_cfg())
    tasks = domain.heldout_sets()["ifeval"]
    assert len(tasks) == 18 and heldout_k(domain.cfg, "ifeval") == 1
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

    cfg = yaml.safe_load((Path(__file__).resolve().parents[2] / "conf" / "domain" / "paper_ifeval.yaml").read_text())
    assert (cfg["name"], cfg["kind"], cfg["reward"]) == ("ifeval", "hub_ifeval", "strict")
    assert cfg["train"]["source"]["path"] == "allenai/RLVR-IFeval"
    assert cfg["heldout"]["ifeval"]["source"] == {**SOURCE, "path": "google/IFEval"} and cfg["heldout"]["ifeval"]["k"] == 1
    cfg["train"]["source"]["path"] = str(FIXTURES / "rlvr_ifeval")
    cfg["heldout"]["ifeval"]["source"]["path"] = str(FIXTURES / "ifeval")
    domain = HubIFEvalDomain(cfg)
    assert len(domain.training_pool()) == 13 and len(domain.heldout_sets()["ifeval"]) == 18
