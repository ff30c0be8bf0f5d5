"""What the planned jobs read from the Hugging Face hub, and the check every job makes at its start, in process and
without network (the caches are empty temporary directories; nothing here reaches the hub). Downloads from a
stand-in hub, and the jobs run offline as subprocesses: tests/integration/test_fetch.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from opdgrpo.config import compose
from opdgrpo.plan.build import build_plan
from opdgrpo.stages import fetch, hub_cache

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
FIXTURES = REPO / "tests" / "fixtures" / "hub"

#: The paper profile cut to S3 (the student's math runs) and no base evaluation: 5 jobs, one model, 4 data sets.
MATH_ONLY = [*(f"studies.{s}=null" for s in ("S1", "S1b", "S2", "S4", "S5", "S5b")),
             *(f"models.{m}=null" for m in ("student_1p7b", "student_8b", "student_olmo3", "olmo3_7b_think", "qwen3_4b",
                                            "qwen3_8b", "qwen3_14b", "qwen3_32b")),
             "pretrain.eval.max_prompts=0"]
MATH_SETS = ["domains.math.train.source", "domains.math.heldout.aime24.source", "domains.math.heldout.aime25.source",
             "domains.math.heldout.amc23.source"]


@pytest.fixture
def empty_caches(tmp_path, monkeypatch):
    """Both libraries' caches in empty temporary directories (they read these when called)."""
    import datasets.config
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    return tmp_path


def _plan(tmp_path, *overrides):
    cfg = compose(["profile=paper", f"results_dir={tmp_path}/results", *overrides], CONF)
    return cfg, build_plan(cfg)


def test_the_paper_plan_reads_every_model_and_data_set_once(tmp_path):
    cfg, plan = _plan(tmp_path)
    items = fetch.used_items(plan.jobs.values())
    keys = {k: item for item in items for k in item.keys}
    assert len(items) == len({item.identity for item in items}) == 19   # 9 models, 10 data sets
    models = {f"models.{m}.path" for m, block in cfg["models"].items() if block.get("source") == "hub"}
    assert models <= set(keys) and len(models) == 9
    # a tokenizer read from its model's repo is that model's snapshot: one item, both keys
    assert keys["tokenizer.path"].keys == ["tokenizer.path", "models.student.path"]
    assert keys["models.student_olmo3.tokenizer.path"] is keys["models.student_olmo3.path"]
    assert keys["domains.knowledge.train.source"].spec == {"path": "cais/mmlu", "name": "all", "split": "auxiliary_train",
                                                           "revision": None, "data_files": None}
    assert sum(item.kind == "dataset" for item in items) == 10


def test_a_dry_run_lists_what_the_jobs_read_and_names_what_none_reads(tmp_path, empty_caches):
    cfg, plan = _plan(tmp_path, *MATH_ONLY)
    lines: list[str] = []
    assert fetch.run(cfg, list(plan.jobs.values()), dry_run=True, out=lines.append) == 0
    rows = [line for line in lines if not line.startswith("#")]
    assert [r.split()[0] for r in rows[:5]] == ["to"] * 5            # "to fetch": nothing is cached
    assert "tokenizer.path, models.student.path: Qwen/Qwen3-4B-Base (revision main) from https://" in rows[0]
    assert [k for k in MATH_SETS if any(f" {k}: " in r for r in rows[1:5])] == MATH_SETS
    unused = [r for r in rows if r.startswith("unused")]
    assert len(unused) == 6 and all("read by no planned job, not fetched" in r for r in unused)
    assert any("domains.knowledge.train.source: cais/mmlu (name all, split auxiliary_train" in r for r in unused)
    assert rows[-1] == "total: 0 B on disk for 5 item(s) (5 to fetch)"
    assert not (empty_caches / "hub").exists()                     # no download, not even a cache folder


def test_a_job_offline_fails_at_start_naming_each_missing_item_and_the_fetch_command(tmp_path, empty_caches, monkeypatch):
    _, plan = _plan(tmp_path, *MATH_ONLY)
    monkeypatch.setattr(hub_cache, "offline_mode", lambda: True)
    base, run = plan.jobs["base-student"], plan.jobs["grpo-student-math-s0"]
    with pytest.raises(ValueError) as err:
        hub_cache.require_cached("base", base.config, base.label, "paper")
    assert "config key `models.student.path`: Qwen/Qwen3-4B-Base (revision main) is not on this machine" in str(err.value)
    assert "`opdgrpo fetch --profile paper`" in str(err.value)
    with pytest.raises(ValueError) as err:
        hub_cache.require_cached("train", run.config, run.label, "paper")
    lines = str(err.value).splitlines()
    assert [line.split("`")[1] for line in lines[:-1]] == MATH_SETS
    assert "open-r1/DAPO-Math-17k-Processed (name en, split train, revision main) is not on this machine" in lines[0]
    assert "HF_HUB_OFFLINE" in lines[-1] and "`opdgrpo fetch --profile paper`" in lines[-1]


def test_with_network_a_missing_item_is_logged_and_left_to_the_job(tmp_path, empty_caches, monkeypatch, caplog):
    _, plan = _plan(tmp_path, *MATH_ONLY)
    monkeypatch.setattr(hub_cache, "offline_mode", lambda: False)
    with caplog.at_level(logging.WARNING, logger=hub_cache.__name__):
        hub_cache.require_cached("tokenizer", plan.jobs["tokenizer"].config, "", "paper")
    assert "config key `tokenizer.path`" in caplog.text and "this job downloads them now" in caplog.text


def test_local_paths_are_checked_not_fetched(tmp_path, empty_caches):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    local = fetch.fetch_item(hub_cache.Item("model", {"path": str(model), "revision": None}, ["models.student.path"]))
    assert local.status == "local" and hub_cache.size(local.files) == 2
    gone = fetch.fetch_item(hub_cache.Item("model", {"path": str(tmp_path / "gone"), "revision": None}, ["models.x.path"]))
    assert gone.status == "failed" and "config key `models.x.path`" in gone.error and "is not a directory" in gone.error
    data = hub_cache.Item("dataset", {"path": str(FIXTURES / "math-ai__amc23"), "split": "test"}, ["domains.math.heldout.amc23.source"])
    found = fetch.fetch_item(data)
    assert found.status == "local" and hub_cache.size(found.files) > (FIXTURES / "math-ai__amc23" / "test.parquet").stat().st_size
    wrong = fetch.fetch_item(hub_cache.Item("dataset", {**data.spec, "split": "nope"}, data.keys))
    assert wrong.status == "failed" and "nope" in wrong.error


def test_the_tiny_profiles_read_nothing_from_the_hub(tmp_path):
    plan = build_plan(compose(["profile=smoke", f"results_dir={tmp_path}/results"], CONF))
    assert fetch.used_items(plan.jobs.values()) == []
