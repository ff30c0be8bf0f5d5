"""A job's identity is what changes its result: the runtime keys leave the config Snakemake hashes and reach the
job through one environment variable (the finished-DAG side: tests/e2e/test_pipeline.py's dry runs)."""

from __future__ import annotations

import copy
import json

import pytest

from opdgrpo import job_identity
from opdgrpo.config import compose
from opdgrpo.plan.build import build_plan
from opdgrpo.train import checkpoint


def test_the_rules_hash_no_runtime_key_and_the_job_gets_them_back():
    cfg = compose(["profile=smoke", "train.nonfinite=skip", "train.report_to=[tensorboard]"])
    job = build_plan(cfg).jobs["grpo-student-math-s0"]
    hashed = job_identity.identity(job.config)
    assert not set(job_identity.RUNTIME_KEYS) & set(hashed["train"])
    assert hashed["method"] == job.config["method"] and hashed["train"]["max_new_tokens"] == job.config["train"]["max_new_tokens"]
    shared = job_identity.runtime(j.config for j in build_plan(cfg).jobs.values())
    # the keys the jobs' configs name; one left unset (activation_checkpointing) takes its schema default in the job
    assert shared == {"nonfinite": "skip", "max_nonfinite_skips": 3, "report_to": ["tensorboard"]}
    back = job_identity.with_runtime(json.loads(json.dumps(hashed)), {job_identity.ENV: json.dumps(shared)})
    assert back["train"] == job.config["train"]
    # the resume check hashes the same way: a checkpoint stays resumable when only these change
    assert checkpoint.NOT_IDENTITY_KEYS == job_identity.RUNTIME_KEYS


def test_a_config_started_by_hand_keeps_its_own_runtime_keys():
    cfg = {"train": {"nonfinite": "stop", "lr": 1}}
    assert job_identity.with_runtime(dict(cfg), {job_identity.ENV: json.dumps({"nonfinite": "skip"})})["train"] == \
        {"nonfinite": "stop", "lr": 1}
    assert job_identity.with_runtime({"train": {"lr": 1}}, {})["train"] == {"lr": 1}   # no variable: as given


def test_jobs_that_disagree_on_a_runtime_key_name_it():
    with pytest.raises(ValueError, match=r"`train.nonfinite` differs between jobs"):
        job_identity.runtime([{"train": {"nonfinite": "stop"}}, {"train": {"nonfinite": "skip"}}])


def test_the_planners_split_sizes_are_no_part_of_a_jobs_params():
    cfg = compose(["profile=paper"])
    job = build_plan(cfg).jobs["grpo-student-knowledge-s0"]
    assert job.config["domains"]["knowledge"]["heldout"]["mmlu_pro"]["expected_rows"] == 12032
    hashed = job_identity.identity(job.config)
    assert "expected_rows" not in hashed["domains"]["knowledge"]["heldout"]["mmlu_pro"]
    assert hashed["domains"]["knowledge"]["heldout"]["mmlu_pro"]["k"] == 1


@pytest.mark.parametrize("profile", ["smoke", "tiny", "paper"])
def test_every_runtime_key_takes_a_plain_override(profile):
    """A runtime key's default is in the schema, and `train.<key>=value` needs no Hydra `+` in any profile."""
    cfg = compose([f"profile={profile}", "train.report_to=[tensorboard]", "train.nonfinite=skip",
                   "train.max_nonfinite_skips=5", "train.activation_checkpointing=true"])
    assert {k: cfg["train"][k] for k in job_identity.RUNTIME_KEYS} == {
        "nonfinite": "skip", "max_nonfinite_skips": 5, "report_to": ["tensorboard"], "activation_checkpointing": True}


def _spelt_as_before_the_rename(run_config: dict) -> dict:
    """The run config as the planner wrote it before `methods.opd.top_k` became `methods.opd.kl_top_k`."""
    old = copy.deepcopy(run_config)
    old["method"] = {("top_k" if k == "kl_top_k" else k): v for k, v in old["method"].items()}
    return old


def test_a_renamed_key_changes_no_jobs_identity():
    """A rename is not a change of result: Snakemake must not rerun a finished job over it, so the identity spells
    the key by the name it had when the results were made (opdgrpo.schema.RENAMED_KEYS)."""
    plan = build_plan(compose(["profile=smoke"]))
    job = plan.jobs["opd-teacher_m-math-s0"]
    assert job.config["method"]["kl_top_k"] == 16 and "top_k" not in job.config["method"]
    before = _spelt_as_before_the_rename(job.config)
    hashed = job_identity.identity(job.config)
    assert json.dumps(hashed, sort_keys=True) == json.dumps(job_identity.identity(before), sort_keys=True)
    assert hashed["method"] == before["method"] and hashed["method"]["top_k"] == 16
    assert job.config["method"]["kl_top_k"] == 16 and "top_k" not in job.config["method"]   # the config is untouched
    changed = copy.deepcopy(job.config)
    changed["method"]["kl_top_k"] = 8
    assert job_identity.identity(changed)["method"]["top_k"] == 8   # a new value is still a new identity
    grpo = plan.jobs["grpo-student-math-s0"].config
    assert job_identity.identity(grpo)["method"] == grpo["method"]


def test_the_rules_pass_the_old_name_and_the_job_reads_the_new_one():
    """The rules pass a job its identity (old names); where they started it (:data:`job_identity.ENV` set), the job
    reads its config by the current names. A config started by hand is read as written (an old name is an error:
    tests/unit/test_bad_input.py)."""
    cfg = compose(["profile=smoke"])
    job = build_plan(cfg).jobs["opd-teacher_m-math-s0"]
    passed = json.loads(json.dumps(job_identity.identity(job.config), sort_keys=True))
    assert "top_k" in passed["method"] and "kl_top_k" not in passed["method"]
    shared = job_identity.runtime(j.config for j in build_plan(cfg).jobs.values())
    back = job_identity.with_runtime(passed, {job_identity.ENV: json.dumps(shared)})
    assert back["method"] == job.config["method"] and back["train"] == job.config["train"]
    assert job_identity.with_runtime(copy.deepcopy(passed), {})["method"] == passed["method"]


def test_a_checkpoint_written_before_a_rename_still_resumes(monkeypatch):
    """The resume hash is the run config's hash as it was computed before the rename (upstream digests aside)."""
    monkeypatch.setattr(checkpoint, "upstream_fingerprint", lambda cfg: {})
    run_config = build_plan(compose(["profile=smoke"])).jobs["opd-teacher_m-math-s0"].config
    before = _spelt_as_before_the_rename(run_config)
    kept = {k: v for k, v in before["train"].items() if k not in checkpoint.NOT_IDENTITY_KEYS and k != "precision"}
    written = checkpoint.config_hash({"config": {**before, "train": kept}, "upstream": {}})
    assert checkpoint.run_identity(run_config) == written
    assert checkpoint.run_identity({**run_config, "method": {**run_config["method"], "kl_top_k": 8}}) != written
