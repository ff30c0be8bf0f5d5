"""Job priorities: long chains and long jobs first, from the config alone, for every profile."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from opdgrpo.config import compose
from opdgrpo.cost.schedule import estimated_seconds, priorities
from opdgrpo.plan.build import build_plan

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("profile", ["smoke", "tiny", "paper"])
def test_every_job_gets_a_priority_above_the_jobs_that_need_it(profile, tmp_path):
    cfg = compose([f"profile={profile}", f"results_dir={tmp_path}"], REPO / "conf")
    plan = build_plan(cfg)
    prio = priorities(cfg, plan)
    assert set(prio) == set(plan.jobs) and all(isinstance(p, int) and p >= 1 for p in prio.values())
    for jid, job in plan.jobs.items():
        for up in job.upstream:
            assert prio[up] > prio[jid], f"{up} must start before {jid}, which needs it"
    assert all(estimated_seconds(cfg, job, plan.jobs) > 0 for job in plan.jobs.values())


def test_tiny_starts_the_long_runs_before_the_short_ones(tmp_path):
    cfg = compose([f"results_dir={tmp_path}"], REPO / "conf")
    plan = build_plan(cfg)
    prio = priorities(cfg, plan)
    runs = sorted(plan.runs(), key=lambda j: -prio[j.id])
    assert runs[0].id == "grpo-student-math+code+ifeval+knowledge-s0"   # the longest run: 400 steps, 4 domains
    subsets = [j for j in runs if j.config.get("train_subset")]           # S2's 60-step subset runs
    assert subsets and max(prio[j.id] for j in subsets) < prio["grpo-student-math+code-s0"]
    assert prio["base-teacher_l"] > prio["base-teacher_m"]               # bigger model, same steps


def _job(jid, upstream, seconds):
    return SimpleNamespace(id=jid, kind="tokenizer", upstream=upstream, config={}, label=jid, seconds=seconds)


def test_priority_follows_the_longest_chain_not_the_job_alone(monkeypatch):
    """a(1) -> b(100) outranks c(50) with nothing after it: list scheduling by critical path."""
    jobs = {"a": _job("a", [], 1), "b": _job("b", ["a"], 100), "c": _job("c", [], 50), "d": _job("d", ["c"], 1)}
    monkeypatch.setattr("opdgrpo.cost.schedule.estimated_seconds", lambda cfg, job, jobs: job.seconds)
    prio = priorities({}, SimpleNamespace(jobs=jobs))
    assert prio["a"] > prio["c"] > prio["d"] and prio["b"] > prio["c"]
