"""GPU counts per job on one machine (opdgrpo.cost.gpu_counts): the paper profile given a `machine` block, its counts
chosen per job where conf leaves them to the planner, kept where conf sets them; each fits; the DAG's simulated wall
time, printed by `opdgrpo resources`; what the rules pass on (slots, priorities, engine shares); bad keys named."""

from __future__ import annotations

import pytest

from opdgrpo.config import ConfigError, compose
from opdgrpo.cost import engine_share, gpu_counts, resources
from opdgrpo.cost.memory_model import GIB
from opdgrpo.cost.schedule import priorities
from opdgrpo.plan.build import build_plan

MACHINE = ["profile=paper", "+machine={gpus: 8}"]
PLANNED = [*MACHINE, "resources.train.gpu=null", "resources.base.gpu=null"]


@pytest.fixture(scope="module")
def planned():
    cfg = compose(PLANNED)
    plan = build_plan(cfg)
    return cfg, plan, resources.machine_plan(cfg, plan, gpu_counts.Machine.of(cfg))


def test_the_planner_chooses_counts_that_fit_and_end_the_dag_sooner(planned):
    cfg, plan, chosen = planned
    ests = chosen.estimates
    assert {e.kind for e in ests} == {"train", "base", "difficulty"} and len(ests) == 41
    assert resources.unfit(cfg, ests) == [] and all(e.peak <= 72 * GIB for e in ests)
    assert {e.gpus for e in ests} <= {1, 2, 4, 8} and len({e.gpus for e in ests}) > 2
    assert {e.gpus_from for e in ests if e.kind != "difficulty"} == {"plan"}
    assert next(e for e in ests if e.kind == "difficulty").gpus == 1   # resources.difficulty.gpu: 1, set
    # the 32B base evaluation does not finish in resources.base.runtime (8 h) on fewer than 8 GPUs
    assert next(e for e in ests if e.job == "base-qwen3_32b").gpus == 8
    gpu_hours = sum(e.hours_high * e.gpus for e in ests)
    assert gpu_hours / 8 <= chosen.high.makespan <= 1.05 * gpu_hours / 8   # the machine kept busy
    assert chosen.low.makespan < chosen.high.makespan
    as_set = resources.machine_plan(*_set_at_8())
    assert {e.gpus_from for e in as_set.estimates if e.kind != "difficulty"} == {"set"}
    assert chosen.high.makespan < as_set.high.makespan   # every run on 8 GPUs: the machine idles more


def _set_at_8():
    cfg = compose(MACHINE)
    return cfg, build_plan(cfg), gpu_counts.Machine.of(cfg)


def test_resources_prints_each_jobs_count_and_the_machines_wall_time(planned, capsys):
    cfg, plan, chosen = planned
    assert resources.main(["--profile", "paper", *PLANNED[1:]]) == 0
    out = capsys.readouterr().out
    low, high = chosen.low.makespan, chosen.high.makespan
    assert f"**{low:,.0f}-{high:,.0f} hours of wall time**" in out and "On one machine of 8 GPUs" in out
    assert "| grpo-student_1p7b-math_s0t0-s0 | 1 (plan) |" in out and "| difficulty-" in out and "1 (set)" in out
    assert "on CPUs" not in out


def test_the_rules_get_each_jobs_slots_priorities_and_engine_share(planned):
    cfg, plan, chosen = planned
    slots = gpu_counts.job_slots(cfg, plan, chosen.estimates)
    assert slots["tokenizer"] == 0 and all(slots[e.job] == e.gpus for e in chosen.estimates)
    prio = priorities(cfg, plan, gpu_counts.machine_hours(plan, chosen.estimates))
    assert all(prio[u] > prio[jid] for jid, job in plan.jobs.items() for u in job.upstream)
    shares = engine_share.engine_plan(cfg, plan, chosen.estimates)   # a planner's count runs on GPUs: the plan's share
    assert all(shares[e.job] == e.engine_choice for e in chosen.estimates if e.kind == "train")


def test_the_rehearsal_rehearses_the_slots_on_cpus():
    cfg = compose(["profile=rehearsal"])
    plan = build_plan(cfg)
    slots = gpu_counts.job_slots(cfg, plan, resources.estimate_jobs(cfg, plan))
    kinds = {(plan.jobs[j].kind, n) for j, n in slots.items()}
    assert kinds == {("tokenizer", 0), ("base", 2), ("train", 2), ("difficulty", 1)}
    assert not gpu_counts.on_gpus(cfg)   # its priorities stay the CPU's


@pytest.mark.parametrize("overrides, key", [
    (["profile=paper", "resources.train.gpu=null"], "`resources.train.gpu` is null.*add a `machine` block"),
    ([*MACHINE, "resources.train.gpu=null", "resources.train.processes=4"], "`resources.train.processes` is set"),
    ([*MACHINE, "resources.base.gpu=null", "~hardware"], "no `hardware` block"),
    (["profile=paper", "+machine={gpus: 4}"], r"`resources.base.gpu` \(8\) is more than the machine's GPUs"),
])
def test_bad_counts_name_their_key(overrides, key):
    cfg = compose(overrides)
    with pytest.raises(ConfigError, match=key):
        resources.estimate_jobs(cfg, build_plan(cfg))


def test_the_machine_block_is_checked_by_its_schema():
    with pytest.raises(ConfigError, match="machine"):
        compose(["profile=paper", "+machine={gpus: 0}"])
    with pytest.raises(ConfigError, match="machine"):
        compose(["profile=paper", "+machine={gpus: 8, slot_dir: x}"])
