"""Paper-scale math on the hub fixtures (loaded like the hub), and math-verify's worker pool under hangs, deaths and
pathological answers."""

from __future__ import annotations

import copy
import importlib.util
import logging
import time
from pathlib import Path

import datasets
import pytest
from math_cases import CASES
from omegaconf import OmegaConf

from opdgrpo.domains.base import heldout_k, heldout_overlap
from opdgrpo.domains.hub_math import HubMathDomain
from opdgrpo.verifiers.math import MathVerifier

REPO = Path(__file__).resolve().parents[2]
HUB = REPO / "tests" / "fixtures" / "hub"
TEMPLATE = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{}."


def _fixture_module():
    spec = importlib.util.spec_from_file_location("make_math", HUB / "make_math.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FIX = _fixture_module()


@pytest.fixture(autouse=True, scope="module")
def _private_datasets_cache(tmp_path_factory):
    """Keep `datasets`' Arrow cache out of the user's home."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf_cache")))
        yield


def paper_cfg(**verifier) -> dict:
    """conf/domain/paper_math.yaml with every source pointed at its fixture (the only change)."""
    cfg = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "domain" / "paper_math.yaml"))
    cfg["train"]["source"]["path"] = str(HUB / "open-r1__DAPO-Math-17k-Processed")
    paths = {"aime24": "HuggingFaceH4__aime_2024", "aime25": "math-ai__aime25", "amc23": "math-ai__amc23"}
    for name, folder in paths.items():
        cfg["heldout"][name]["source"]["path"] = str(HUB / folder)
    cfg["verifier"].update({"workers": 0, "timeout_s": 2, **verifier})
    return cfg


@pytest.fixture(scope="module")
def domain():
    d = HubMathDomain(paper_cfg())
    yield d
    d.close()


# -- fixtures and data sets ----------------------------------------------------------------------------------
@pytest.mark.parametrize("folder,name,split,features", [
    ("HuggingFaceH4__aime_2024", None, "train", "AIME24_FEATURES"),
    ("math-ai__aime25", None, "test", "AIME25_FEATURES"),
    ("math-ai__amc23", None, "test", "AMC23_FEATURES"),
    ("open-r1__DAPO-Math-17k-Processed", "en", "train", "DAPO_FEATURES"),
])
def test_fixtures_load_like_the_hub_with_its_schema(folder, name, split, features):
    rows = datasets.load_dataset(str(HUB / folder), name, split=split)
    assert rows.features == getattr(FIX, features)     # the committed parquet matches make_math.py
    assert 3 <= len(rows) <= 6


def test_fixture_dtypes_are_the_hubs():
    amc = datasets.load_dataset(str(HUB / "math-ai__amc23"), split="test")
    assert amc.features["answer"].dtype == "float64" and amc[0]["answer"] == 27.0
    aime24 = datasets.load_dataset(str(HUB / "HuggingFaceH4__aime_2024"), split="train")
    assert aime24.features["id"].dtype == "int64" and aime24.features["answer"].dtype == "string"
    aime25 = datasets.load_dataset(str(HUB / "math-ai__aime25"), split="test")
    assert aime25.features["id"].dtype == "string"
    dapo = datasets.load_dataset(str(HUB / "open-r1__DAPO-Math-17k-Processed"), "en", split="train")
    assert dapo[0]["source_prompt"][0]["role"] == "user" and set(dapo[0]["reward_model"]) == {"ground_truth", "style"}


def test_heldout_tasks_per_schema(domain):
    sets = domain.heldout_sets()
    assert {k: len(v) for k, v in sets.items()} == {"aime24": 3, "aime25": 3, "amc23": 4}
    assert [t.answer for t in sets["aime24"]] == ["102", "401", "055"]
    assert [t.answer for t in sets["aime25"]] == ["70", "142", "336^\\circ"]
    assert [t.answer for t in sets["amc23"]] == ["27", "3159", "-1", "7"]       # float64 cast to clean strings
    first = sets["aime24"][0]
    assert first.domain == "math" and first.meta == {"source": "aime24", "id": "60"}
    assert first.prompt == TEMPLATE.replace("{problem}", FIX.SHARED_PROBLEM)
    assert sets["aime25"][0].meta == {"source": "aime25", "id": "0"}
    assert sets["amc23"][2].meta == {"source": "amc23", "id": "2"}
    assert [heldout_k(domain.cfg, n) for n in ("aime24", "aime25", "amc23")] == [16, 16, 4]


def test_training_pool_drops_duplicates_and_heldout_prompts_and_dapo_wrapper(domain):
    pool = domain.training_pool()
    assert [t.answer for t in pool] == ["84", "\\frac{3}{4}", "2\\sqrt{3}", "2"]     # 6 rows - 1 dup - 1 AIME24
    assert all("Answer: $Answer" not in t.prompt and "Remember to put" not in t.prompt for t in pool)
    assert pool[0].prompt.startswith("In triangle $ABC$") and pool[0].prompt.endswith("within \\boxed{}.")
    assert pool[0].meta == {"source": "train", "id": "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"}
    assert heldout_overlap("math", pool, domain.heldout_sets()) is None
    assert len({t.prompt for t in pool}) == len(pool)


def test_explicit_keys_read_structs_and_chat_messages():
    cfg = paper_cfg()
    cfg["train"].update(problem_key="source_prompt", answer_key="reward_model.ground_truth", id_key="extra_info.index")
    cfg["heldout"]["amc23"]["problem_key"] = "question"
    d = HubMathDomain(cfg)
    default = HubMathDomain(paper_cfg())
    assert d.training_pool() == default.training_pool()
    assert [t.prompt for t in d.heldout_sets()["amc23"]] == [t.prompt for t in default.heldout_sets()["amc23"]]


@pytest.mark.parametrize("where,key,column,needle", [
    ("heldout.amc23", "problem_key", "statement", "domains.math.heldout.amc23.problem_key"),
    ("heldout.aime25", "answer_key", "final", "domains.math.heldout.aime25.answer_key"),
    ("train", "answer_key", "reward_model.target", "domains.math.train.answer_key"),
])
def test_missing_column_names_the_config_key(where, key, column, needle):
    cfg = paper_cfg()
    spec = cfg
    for part in where.split("."):
        spec = spec[part]
    spec[key] = column
    d = HubMathDomain(cfg)
    with pytest.raises(ValueError, match=needle.replace(".", r"\.")) as err:
        d.training_pool()
    assert "columns" in str(err.value)


def test_no_default_column_asks_for_the_key(tmp_path):
    folder = tmp_path / "odd"
    folder.mkdir()
    datasets.Dataset.from_list([{"text": "What is 1+1?", "label": "2"}]).to_parquet(str(folder / "test.parquet"))
    cfg = paper_cfg()
    cfg["heldout"] = {"odd": {"source": {"path": str(folder), "split": "test"}}}
    with pytest.raises(ValueError, match=r"domains\.math\.heldout\.odd\.problem_key.*text"):
        HubMathDomain(cfg).heldout_sets()
    cfg["heldout"]["odd"].update(problem_key="text", answer_key="label")
    (task,) = HubMathDomain(cfg).heldout_sets()["odd"]
    assert task.answer == "2" and task.prompt.startswith("What is 1+1?") and len(task.meta["id"]) == 12


def test_heldout_row_without_answer_is_an_error(tmp_path):
    folder = tmp_path / "amc"
    folder.mkdir()
    rows = copy.deepcopy(FIX.AMC23)
    rows[1]["answer"] = None
    datasets.Dataset.from_list(rows, features=FIX.AMC23_FEATURES).to_parquet(str(folder / "test.parquet"))
    cfg = paper_cfg()
    cfg["heldout"]["amc23"]["source"]["path"] = str(folder)
    with pytest.raises(ValueError, match=r"domains\.math\.heldout\.amc23.*held-out row 1 has no answer"):
        HubMathDomain(cfg).heldout_sets()


@pytest.mark.parametrize("mutate,needle", [
    (lambda c: c["heldout"]["aime24"]["source"].update(splt="train"), r"heldout\.aime24\.source.*unknown keys"),
    (lambda c: c["train"]["source"].pop("split"), r"domains\.math\.train\.source"),
    (lambda c: c["heldout"]["amc23"]["source"].update(split="validation"), r"heldout\.amc23\.source.*validation"),
])
def test_bad_source_names_the_key(mutate, needle):
    cfg = paper_cfg()
    mutate(cfg)
    with pytest.raises(ValueError, match=needle):
        HubMathDomain(cfg).training_pool()


# -- the node profile's MATH (conf/domain/node_math.yaml) ----------------------------------------------------

MATH_LIGHTEVAL = HUB / "DigitalLearningGmbH__MATH-lighteval"


def node_cfg() -> dict:
    """conf/domain/node_math.yaml with both sources pointed at the MATH-lighteval fixture (the only change)."""
    cfg = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "domain" / "node_math.yaml"))
    cfg["train"]["source"]["path"] = str(MATH_LIGHTEVAL)
    cfg["heldout"]["math"]["source"]["path"] = str(MATH_LIGHTEVAL)
    cfg["verifier"].update({"workers": 0, "timeout_s": 2})
    return cfg


@pytest.mark.parametrize("split,rows", [("train", FIX.MATH_TRAIN), ("test", FIX.MATH_TEST)])
def test_math_lighteval_fixture_loads_like_the_hub(split, rows):
    loaded = datasets.load_dataset(str(MATH_LIGHTEVAL), "default", split=split)
    assert loaded.features == FIX.MATH_FEATURES and loaded.to_list() == rows     # the committed parquet = make_math.py
    assert {r["level"] for r in FIX.MATH_TRAIN} == {f"Level {i}" for i in range(1, 6)} | {"Level ?"}


def test_node_math_keeps_levels_3_to_5_reads_the_last_box_and_scores_through_math_verify():
    d = HubMathDomain(node_cfg())
    held = d.heldout_sets()["math"]        # size 1000 > the fixture's 5: every row, in a seeded order
    assert sorted(t.answer for t in held) == sorted(["39", "\\frac{3}{2}", "\\left( 3, \\frac{\\pi}{2} \\right)",
                                                     "5\\sqrt{2}", "14"])
    pool = d.training_pool()
    # levels 1, 2 and "?" dropped by `keep`; the level-3 problem shared with the test split by decontamination;
    # the last box read (the level-5 solution boxes a wrong first guess), \fbox{} too
    assert [t.answer for t in pool] == ["\\frac{3}{8}", "5", "0,2"]
    assert all(t.prompt.endswith("within \\boxed{}.") for t in pool + held)
    right = [f"So the answer is $\\boxed{{{t.answer}}}$." for t in held + pool]
    assert d.score(held + pool, right) == [1.0] * len(right)
    assert d.score(held[:1] + pool[:1], ["\\boxed{7}", "The answer is \\boxed{3/8}."]) == [0.0, 1.0]


@pytest.mark.parametrize("mutate,needle", [
    (lambda c: c["train"].update(answer_format="latex"), r"domains\.math\.train\.answer_format.*plain.*boxed"),
    (lambda c: c["heldout"]["math"].update(keep={"level": "Level 3"}), r"heldout\.math\.keep\.level.*non-empty list"),
    (lambda c: c["train"].update(keep=["Level 3"]), r"domains\.math\.train\.keep.*map column names"),
])
def test_node_math_bad_keys_fail_at_construction_naming_them(mutate, needle):
    cfg = node_cfg()
    mutate(cfg)
    with pytest.raises(ValueError, match=needle):
        HubMathDomain(cfg)


@pytest.mark.parametrize("mutate,needle", [
    (lambda c: c["train"].update(keep={"difficulty": ["easy"]}), r"train\.keep.*lacks column.*difficulty"),
    (lambda c: c["heldout"]["math"].update(keep={"level": ["Level 9"]}), r"heldout\.math\.keep.*no row.*Level 9"),
])
def test_node_math_keep_names_its_key_when_it_matches_nothing(mutate, needle):
    cfg = node_cfg()
    mutate(cfg)
    with pytest.raises(ValueError, match=needle):
        HubMathDomain(cfg).training_pool()


def test_a_heldout_solution_without_a_box_is_an_error(tmp_path):
    rows = copy.deepcopy(FIX.MATH_TEST)
    rows[2]["solution"] = "The point is $(3, \\pi/2)$."
    datasets.Dataset.from_list(rows, features=FIX.MATH_FEATURES).to_parquet(str(tmp_path / "test.parquet"))
    cfg = node_cfg()
    cfg["heldout"]["math"]["source"] = {"path": str(tmp_path), "split": "test"}
    with pytest.raises(ValueError, match=r"heldout\.math`: held-out row '[0-9a-f]{12}' has no \\boxed\{\} answer.*format"):
        HubMathDomain(cfg).heldout_sets()


# -- the verifier --------------------------------------------------------------------------------------------


def test_domain_score_in_process(domain):
    tasks = domain.heldout_sets()["amc23"] + domain.training_pool()
    right = [f"Working... therefore $\\boxed{{{t.answer}}}$." for t in tasks]
    assert domain.score(tasks, right) == [1.0] * len(tasks)
    assert domain.score(tasks, ["\\boxed{123456}"] * len(tasks)) == [0.0] * len(tasks)
    with pytest.raises(ValueError, match="2 tasks but 1 completions"):
        domain.score(tasks[:2], ["x"])


def test_worker_pool_matches_in_process_and_survives_hangs_and_deaths(caplog):
    golds, completions = [c[0] for c in CASES], [c[1] for c in CASES]
    expected = MathVerifier(workers=0, timeout_s=2).score(golds, completions)
    assert expected == [c[2] for c in CASES]
    with MathVerifier(workers=2, timeout_s=2, chunk_size=4) as pool:
        assert pool.score(golds, completions) == expected       # chunked over two worker processes
        assert pool.score(golds[:1], completions[:1]) == [1.0]
        assert pool.score([], []) == []
        assert pool.replaced == 0

    faulty = MathVerifier(workers=2, timeout_s=1, chunk_size=1, deadline_s=4,
                          check=__import__("hub_math_faults").faulty_check)
    try:
        assert faulty.score(["1"], ["\\boxed{1}"]) == [1.0]       # workers started and answering
        golds2 = ["1", "2", "3", "4", "5"]
        answers = ["\\boxed{1}", "HANG \\boxed{2}", "\\boxed{3}", "DIE \\boxed{4}", "\\boxed{5}"]
        caplog.set_level(logging.WARNING, logger="opdgrpo.verifiers.math")
        started = time.monotonic()
        assert faulty.score(golds2, answers) == [1.0, 0.0, 1.0, 0.0, 1.0]
        assert time.monotonic() - started < 60                    # the hung chunk waited its deadline, no more
        assert faulty.replaced == 2
        messages = " ".join(r.getMessage() for r in caplog.records)
        assert "missed its 4 s deadline" in messages and "it died" in messages
        assert faulty.score(golds2[:2], ["\\boxed{1}", "\\boxed{2}"]) == [1.0, 1.0]   # replacements work
    finally:
        faulty.close()
    assert all(w.proc.poll() is not None for w in faulty._pool) and not faulty._pool


@pytest.mark.parametrize("workers", [0, 1])
def test_pathological_answer_cannot_hang_the_caller(workers):
    """A tower of powers sends sympy into a huge computation; math-verify's alarm (in a worker's or the caller's
    main thread) stops it and the answer scores 0."""
    with MathVerifier(workers=workers, timeout_s=1) as verifier:
        started = time.monotonic()
        assert verifier.score(["17", "17"], ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{17}"]) == [0.0, 1.0]
        assert time.monotonic() - started < 45
