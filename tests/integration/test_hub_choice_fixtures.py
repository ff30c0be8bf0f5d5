"""Paper-scale knowledge on the hub fixtures (exact MMLU-Pro, cais/mmlu auxiliary_train and GPQA-diamond schemas) read
through HubChoiceDomain with deterministic GPQA option order."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from opdgrpo.domains.base import heldout_k, heldout_overlap
from opdgrpo.domains.hub_choice import HubChoiceDomain

REPO = Path(__file__).resolve().parents[2]
HUB = REPO / "tests" / "fixtures" / "hub"


# -- the domain over the hub fixtures -------------------------------------------------------------------
def fixture_cfg() -> dict:
    cfg = yaml.safe_load((REPO / "conf" / "domain" / "paper_knowledge.yaml").read_text())
    cfg["train"]["source"] = {"path": str(HUB / "mmlu"), "split": "auxiliary_train",
                              "data_files": {"auxiliary_train": "all/auxiliary_train-*.parquet"}}
    cfg["heldout"]["mmlu_pro"]["source"] = {"path": str(HUB / "mmlu_pro"), "split": "test"}
    cfg["heldout"]["gpqa_diamond"] = {"format": "gpqa", "k": 4, "shuffle_seed": 0, "source": {
        "path": str(HUB / "gpqa"), "split": "train", "data_files": {"train": "gpqa_diamond/train-*.parquet"}}}
    return cfg


@pytest.fixture(scope="module")
def domain():
    return HubChoiceDomain(fixture_cfg())


def test_mmlu_pro_heldout(domain):
    tasks = domain.heldout_sets()["mmlu_pro"]
    by_id = {t.meta["id"]: t for t in tasks}
    assert sorted(by_id) == ["70", "71", "72", "73"]
    assert [(by_id[i].answer, by_id[i].meta["n_options"]) for i in ("70", "71", "72", "73")] == [
        ("B", 10), ("D", 10), ("B", 4), ("C", 5)]  # 73: five N/A fillers dropped
    t = by_id["70"]
    assert t.prompt.startswith("Which quantity is conserved")
    assert "\nA. mass only\nB. kinetic energy and momentum\n" in t.prompt and "\nJ. density\n" in t.prompt
    assert "(A-J)" in t.prompt and '"The answer is (X)"' in t.prompt
    assert "N/A" not in by_id["73"].prompt and "(A-E)" in by_id["73"].prompt
    assert t.meta["group"] == "physics" and t.meta["format"] == "mmlu_pro"
    assert heldout_k(domain.cfg, "mmlu_pro") == 1


def test_mmlu_training_pool(domain):
    pool = domain.training_pool()
    assert len(pool) == 3  # the duplicate question is dropped
    assert [t.answer for t in pool] == ["C", "A", "B"]
    assert all(t.meta["n_options"] == 4 and "(A-D)" in t.prompt for t in pool)
    assert "\nC. carbon dioxide\n" in pool[0].prompt
    assert heldout_overlap(domain.name, pool, domain.heldout_sets()) is None


def test_gpqa_options_shuffled_deterministically(domain):
    tasks = domain.heldout_sets()["gpqa_diamond"]
    right = {"recFixture0001": "1", "recFixture0002": "2", "recFixture0003": "DNA ligase"}
    assert sorted(t.meta["id"] for t in tasks) == sorted(right)
    for t in tasks:
        assert f"\n{t.answer}. {right[t.meta['id']]}\n" in t.prompt  # the gold letter names the correct text
        assert t.meta["n_options"] == 4 and "(A-D)" in t.prompt
        assert "?\n\nOptions:" in t.prompt  # the question's trailing newline is stripped
    assert all(not line.endswith(" ") and ".  " not in line for t in tasks for line in t.prompt.splitlines())
    assert {t.answer for t in tasks} != {"A"}  # the stored-first correct answer does not stay first
    again = HubChoiceDomain(fixture_cfg()).heldout_sets()["gpqa_diamond"]
    assert [(t.prompt, t.answer) for t in again] == [(t.prompt, t.answer) for t in tasks]
    reseeded = fixture_cfg()
    reseeded["heldout"]["gpqa_diamond"]["shuffle_seed"] = 7
    other = HubChoiceDomain(reseeded).heldout_sets()["gpqa_diamond"]
    assert [t.prompt for t in other] != [t.prompt for t in tasks]


def test_score_through_domain(domain):
    t = domain.heldout_sets()["mmlu_pro"][0]
    wrong = next(x for x in "ABCD" if x != t.answer)
    completions = [f"<think>maybe ({wrong})</think> The answer is ({t.answer}).",
                   f"<think>surely ({t.answer})</think> The answer is ({wrong}).",
                   f"<think>The answer is ({t.answer})"]
    assert domain.score([t] * 3, completions) == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        domain.score([t], [])


@pytest.mark.parametrize("edit,match", [
    (lambda c: c["heldout"]["mmlu_pro"].pop("format"), r"`domains\.knowledge\.heldout\.mmlu_pro\.format`"),
    (lambda c: c["train"].update(format="mmlu-pro"), r"`domains\.knowledge\.train\.format` must be one of"),
    (lambda c: c.pop("train"), r"`domains\.knowledge\.train` must be a mapping"),
])
def test_config_errors_name_the_key(edit, match):
    cfg = fixture_cfg()
    edit(cfg)
    with pytest.raises(ValueError, match=match):
        HubChoiceDomain(cfg)


def test_wrong_format_for_the_data_names_columns():
    cfg = fixture_cfg()
    cfg["heldout"]["mmlu_pro"]["format"] = "mmlu"  # MMLU-Pro rows have options, not choices
    with pytest.raises(ValueError, match=r"heldout\.mmlu_pro\.source`: data set lacks column\(s\) \['choices'\]"):
        HubChoiceDomain(cfg).heldout_sets()


def test_inconsistent_mmlu_pro_answer_is_an_error():
    d = HubChoiceDomain(fixture_cfg())
    row = {"question_id": 5, "question": "q", "options": ["x", "y"], "answer": "A", "answer_index": 1,
           "cot_content": "", "category": "c", "src": "s"}
    d._active = ("mmlu_pro", 0)
    with pytest.raises(ValueError, match="question_id=5 has answer 'A' but answer_index 1"):
        d.to_task(row, "domains.knowledge.heldout.mmlu_pro")
    bad = copy.deepcopy(row) | {"answer": "C", "answer_index": 2}
    with pytest.raises(ValueError, match="outside its 2 options"):
        d.to_task(bad, "domains.knowledge.heldout.mmlu_pro")
