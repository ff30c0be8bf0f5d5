"""`opdgrpo resources`: every job of the paper profile fits an 8 x 80 GB node; a setting that would not fit is refused
with the knob to change, by the command and by the Snakefile's check; a profile without `hardware` is estimated only."""

from __future__ import annotations

import importlib.util

import pytest

from opdgrpo.config import ConfigError, compose
from opdgrpo.cost import resources
from opdgrpo.cost.memory_model import GIB
from opdgrpo.plan.build import build_plan

HF = ("train.engine=hf ~train.vllm ~train.vllm_alone methods.grpo.engine_is_cap=null train.micro_batches=64"   # the own sampler: 8 rows per call
      " train.max_tokens_per_microbatch=32768"   # its bf16 replica (16 GB for the 8B) leaves less room for the pass
      " resources.base.mem_mb=600000")   # each base process reads the model whole to sample it (488 GiB for the 32B)


@pytest.fixture(scope="module")
def paper():
    cfg = compose(["profile=paper"])
    return cfg, build_plan(cfg)


def test_every_paper_job_fits_its_gpus(paper, capsys):
    cfg, plan = paper
    estimates = resources.estimate_jobs(cfg, plan)
    kinds = {e.kind for e in estimates}
    assert kinds == {"train", "base", "difficulty"}
    assert len(estimates) == len([j for j in plan.jobs.values() if j.kind in ("train", "base", "difficulty")])
    assert resources.unfit(cfg, estimates) == []
    assert all(0 < e.peak <= 72 * GIB and e.hours > 0 for e in estimates)
    assert resources.main(["--profile", "paper"]) == 0
    out = capsys.readouterr().out
    assert "| **no** |" not in out and "GPU-hours" in out


def test_the_node_profile_fits_an_h100_and_its_budget(capsys):
    """profile=node, three seeds of S3 and S4 on one machine of 8 GPUs, each job at the planner's count: every job
    fits an H100 80GB and finishes in one allocation, the whole profile stays within 170 GPU-hours at the high end,
    and the DAG within 24 hours of the machine's wall time (docs/node-profile.md)."""
    from opdgrpo.cost import gpu_counts

    cfg = compose(["profile=node"])
    plan = build_plan(cfg)
    estimates = resources.estimate_jobs(cfg, plan)
    assert len(estimates) == 19 and resources.unfit(cfg, estimates) == []
    assert all(e.attempts == 1 for e in estimates)
    assert sum(e.hours_high * e.gpus for e in estimates) <= 170
    low, high = gpu_counts.schedules(plan, gpu_counts.Machine.of(cfg), estimates)
    assert low.makespan <= high.makespan <= 24 and high.gpu_hours <= 192
    assert resources.main(["--profile", "node"]) == 0
    assert "| **no** |" not in capsys.readouterr().out


def test_fsdp_shards_what_ddp_replicates(paper):
    cfg, plan = paper
    job = plan.jobs["grpo-student-math-s0"]
    fsdp = resources.train_estimate(cfg, job, plan.jobs, None)
    ddp_cfg = dict(job.config, train=dict(job.config["train"], distributed="ddp"))
    ddp = resources.train_estimate(cfg, type(job)(**{**job.__dict__, "config": ddp_cfg}), plan.jobs, None)
    assert ddp.static["optimizer"] == pytest.approx(8 * fsdp.static["optimizer"])
    n = fsdp.static["optimizer"]   # Adam: 8 bytes per parameter over 8 shards, so as many bytes as parameters
    assert ddp.static["weights"] == pytest.approx(4 * n)   # float32 replicas
    assert fsdp.static["weights"] < 0.7 * ddp.static["weights"]   # a float32 shard, the gathered units, the bf16 replica


@pytest.mark.parametrize("override,knob", [
    (f"{HF} train.eval.max_batch_tokens=2000000", "train.eval.max_batch_tokens"),
    (f"{HF} pretrain.eval.max_batch_tokens=500000", "pretrain.eval.max_batch_tokens"),
    ("train.max_tokens_per_microbatch=131072", "train.max_tokens_per_microbatch"),
    ("train.distributed=ddp ~train.fsdp", "train.distributed=fsdp"),
    ("train.activation_checkpointing=false", "train.activation_checkpointing=true"),
    ("resources.train.mem_mb=300000", "a higher resources.train.mem_mb"),
    ("train.vllm.gpu_memory_utilization=0.9", "a lower train.vllm.gpu_memory_utilization"),
    ("train.vllm_alone.gpu_memory_utilization=0.35", "a higher train.vllm_alone.gpu_memory_utilization"),
])
def test_a_job_that_does_not_fit_is_refused_naming_the_knob(override, knob, capsys):
    cfg = compose(["profile=paper", *override.split()])
    with pytest.raises(ConfigError, match="would run out of GPU memory") as err:
        resources.refuse_unfit(cfg, build_plan(cfg))
    assert knob in str(err.value)
    assert resources.main(["--profile", "paper", *override.split()]) == 1
    assert knob in capsys.readouterr().err


def test_without_a_hardware_block_memory_is_estimated_not_checked(capsys):
    cfg = compose(["profile=tiny"])
    resources.refuse_unfit(cfg, build_plan(cfg))   # nothing to check against
    assert resources.main(["--profile", "tiny"]) == 0
    assert "no `hardware` block" in capsys.readouterr().out


def test_a_profile_on_cpus_says_its_gpu_figures_are_the_plans_not_its_own(paper, capsys):
    """The rehearsal runs the paper's composition on CPUs: its table prices the plan on the hardware block's GPUs,
    and says so; the paper profile, whose jobs take GPUs, does not."""
    assert resources.main(["--profile", "rehearsal"]) == 0
    out = capsys.readouterr().out
    assert "runs its base, difficulty, train jobs on CPUs" in out and "not what it uses here" in out
    cfg, plan = paper
    assert "on CPUs" not in resources.summary(cfg, resources.estimate_jobs(cfg, plan))


def test_a_bad_hardware_value_names_its_key():
    with pytest.raises(ConfigError, match="hardware.usable_fraction"):
        compose(["profile=paper", "hardware.usable_fraction=1.5"])


def test_the_hf_engine_is_estimated_by_its_own_kv_cache(paper):
    cfg = compose(["profile=paper", *HF.split()])
    estimates = {e.job: e for e in resources.estimate_jobs(cfg, build_plan(cfg))}
    assert resources.unfit(cfg, list(estimates.values())) == []
    assert "sampling" in estimates["grpo-student-math-s0"].phases and estimates["base-qwen3_32b"].engine is None


def test_engine_settings_under_hf_are_an_error():
    with pytest.raises(ConfigError, match=r"train.vllm_alone.*~train.vllm_alone"):
        compose(["profile=paper", "train.engine=hf", "~train.vllm"])


# -- vLLM's own start-up rule (opdgrpo.cost.engine_memory) ---------------------------------------------------------------

def _shape(cfg, name):
    from opdgrpo.cost.memory_model import Shape
    from opdgrpo.cost.model import architecture

    return Shape.of(architecture(cfg, name))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed: scripts/install.sh --vllm")
@pytest.mark.parametrize("model", ["qwen3_32b", "student", "student_olmo3"])
def test_the_planner_applies_vllms_own_start_up_rule(paper, model):
    """The KV bytes of one ``max_model_len`` row are vLLM's own ``FullAttentionSpec.max_memory_usage_bytes`` summed
    over layers, and the planner says "starts" exactly where vLLM's ``_check_enough_kv_cache_memory`` (given the pool
    less the null block, as ``check_enough_kv_cache_memory`` passes it) does not raise."""
    from types import SimpleNamespace

    import torch
    from vllm.v1.core.kv_cache_utils import _check_enough_kv_cache_memory
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from opdgrpo.cost.engine_memory import BLOCK, EngineStart, kv_row_bytes

    shape = _shape(paper[0], model)
    for length in (8704, 9692, 40960):
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=shape.kv_heads, head_size=shape.head_dim,
                                 dtype=torch.bfloat16)
        stub = SimpleNamespace(model_config=SimpleNamespace(max_model_len=length),
                               parallel_config=SimpleNamespace(decode_context_parallel_size=1))
        full, windowed = shape.layers - shape.sliding_layers, shape.sliding_layers
        if windowed:   # Olmo-3's sliding layers: vLLM's SlidingWindowSpec keeps the window (+ one block) per row
            assert kv_row_bytes(shape, length) >= full * spec.max_memory_usage_bytes(stub)
            continue
        row = full * spec.max_memory_usage_bytes(stub)
        assert kv_row_bytes(shape, length) == row
        null = row / (length // BLOCK + (length % BLOCK > 0))
        for pool in (row + null - 1, row + null, 3 * row):
            start = EngineStart(share=0, weights=0, profile_peak=0, pool=pool, row=row, max_model_len=length)
            try:
                _check_enough_kv_cache_memory(int(pool - null), lambda: row, length, lambda available: 0)
                vllm_starts = True
            except ValueError:
                vllm_starts = False
            assert start.starts == vllm_starts, (model, length, pool)


def test_a_32b_engine_sized_to_the_models_context_is_refused_as_vllm_would(capsys):
    """Qwen3-32B's base evaluation at its 40,960-token context (what the engine used to take): 61 GiB of weights
    leave no KV pool for one such row in a 0.9 share of the 79.19 GiB an H100 reports. At the job's longest row
    (a LiveCodeBench prompt, 1,500, + 8,192) it starts, with a pool of three such rows (so each GPU's share of a set
    decodes in waves of three), after vLLM's CUDA graph estimate."""
    cfg = compose(["profile=paper"])
    estimates = {e.job: e for e in resources.estimate_jobs(cfg, build_plan(cfg))}
    start = estimates["base-qwen3_32b"].engine
    assert start.max_model_len == 1500 + 8192 and start.starts and start.rows_at_once == 3
    assert start.cudagraph == pytest.approx(0.52 * GIB * 64 / 36)
    assert "| 3 of 9692 |" in resources.summary(cfg, list(estimates.values()))
    override = ["profile=paper", "+train.vllm_alone.max_model_len=40960"]
    cfg = compose(override)
    with pytest.raises(ConfigError, match=r"base-qwen3_32b`: vLLM would refuse to start: its KV pool .* max_model_len "
                                          r"40960.*lower max_new_tokens"):
        resources.refuse_unfit(cfg, build_plan(cfg))


def test_a_colocated_engine_must_find_its_share_free_beside_the_trainer():
    """vLLM asks for gpu_memory_utilization x the device free at its start; the trainer's weights, sampling replica
    and teachers are already there."""
    cfg = compose(["profile=paper", "train.vllm.gpu_memory_utilization=0.85"])
    problems = resources.unfit(cfg, resources.estimate_jobs(cfg, build_plan(cfg)))
    assert any("vLLM would refuse to start: the trainer holds" in p and "a lower train.vllm.gpu_memory_utilization" in p
               for p in problems)


def test_gpu_hours_are_a_range_with_sampling_bound_by_decode(paper):
    """With ``hardware.memory_tbps`` each engine job's sampling gets a decode-bound high end (continuous batching of
    the rows its KV pool holds, at least the longest row's steps); the total reads as a range; without it the
    sampling lines have none (the other costs keep their own ranges)."""
    from opdgrpo.cost.engine_memory import EngineStart, decode_seconds

    cfg, plan = paper
    estimates = {e.job: e for e in resources.estimate_jobs(cfg, plan)}
    assert all(e.hours_high is not None and e.hours_high >= e.hours for e in estimates.values())
    assert estimates["base-qwen3_32b"].hours_high > 1.5 * estimates["base-qwen3_32b"].hours   # three rows at a time
    text = resources.summary(cfg, list(estimates.values()))
    low = sum(e.hours * e.gpus for e in estimates.values())
    high = sum(e.hours_high * e.gpus for e in estimates.values())
    assert f"Total: {low:,.0f}-{high:,.0f} GPU-hours" in text and "decode" in text
    no_bandwidth = compose(["profile=paper", "~hardware.memory_tbps"])
    for e in resources.estimate_jobs(no_bandwidth, build_plan(no_bandwidth)):
        for line in ("rollouts", "evaluation", "solve rates"):
            if line in e.costs:
                assert e.costs[line][0] == e.costs[line][1], (e.job, line)
    # the bound itself: one row at a time of 1000 tokens reading 1 GB each step at 1 TB/s is 1 s; the longest row
    # bounds a call whose rows all fit at once; at half the bandwidth it takes twice as long
    one = EngineStart(share=0, weights=1e9, profile_peak=0, pool=1.0, row=1.0, max_model_len=1000)
    assert decode_seconds(one, rows=1, longest=1000, mean=1000, tbps=1.0) == pytest.approx(1.0, rel=1e-6)
    assert decode_seconds(one, rows=1, longest=1000, mean=1000, tbps=1.0, efficiency=0.5) == pytest.approx(2.0)
    many = EngineStart(share=0, weights=1e9, profile_peak=0, pool=100.0, row=1.0, max_model_len=1000)
    assert decode_seconds(many, rows=10, longest=1000, mean=100, tbps=1.0) == pytest.approx(1000 * (1e9 + 5) / 1e12)


def test_host_memory_on_resume_holds_the_trainer_state_while_the_models_load(paper):
    """A resumed run's processes each read the checkpoint's full optimizer state (Adam: 8 bytes per parameter)
    before the models load: S1's 32B-teacher OPD reads 488 GiB per node at a fresh start, 728 on resume, so a
    node of 600 GB fits the start and not the resume, and the refusal says so."""
    from opdgrpo.cost.memory_model import ADAM_STATE_BYTES

    cfg, plan = paper
    estimates = {e.job: e for e in resources.estimate_jobs(cfg, plan)}
    opd = estimates["opd-qwen3_32b-code-s0"]
    student = estimates["grpo-student-code-s0"]
    assert opd.host_resume - opd.host == pytest.approx(student.host_resume - student.host)
    assert opd.host_resume - opd.host == pytest.approx(8 * ADAM_STATE_BYTES * student.host / (8 * 4))
    assert round(opd.host / GIB) == 488 and round(opd.host_resume / GIB) == 728
    assert "| 488, 728 |" in resources.summary(cfg, list(estimates.values()))
    tight = compose(["profile=paper", "resources.train.mem_mb=600000"])
    problems = resources.unfit(tight, resources.estimate_jobs(tight, build_plan(tight)))
    assert any("opd-qwen3_32b-code-s0`: 728 GiB of host memory on resume" in p for p in problems)


def test_an_unset_distributed_key_is_planned_as_the_trainer_runs_it(paper):
    """The trainer runs DDP where `train.distributed` is unset; the planner used to read the raw key and leave DDP's
    gradient buckets out there."""
    cfg, plan = paper
    job = plan.jobs["grpo-student-math-s0"]
    unset = {k: v for k, v in job.config["train"].items() if k not in ("distributed", "fsdp")}
    ddp = dict(job.config["train"], distributed="ddp")
    ddp.pop("fsdp", None)
    estimate = [resources.train_estimate(cfg, type(job)(**{**job.__dict__, "config": dict(job.config, train=t)}),
                                         plan.jobs, None) for t in (unset, ddp)]
    assert estimate[0].static == estimate[1].static


def test_training_jobs_hours_count_their_evaluations(paper):
    """S5's joint GRPO evaluates four held-out domains (MMLU-Pro's 12,032 questions among them, `expected_rows`) at
    step 0, every 10 steps and at the end: most of its time. Evaluating only at the end takes it off; a held-out set
    with neither `size` nor `expected_rows` is named as not counted."""
    cfg, plan = paper
    job = plan.jobs["grpo-student-math+code+ifeval+knowledge-s0"]
    hw = resources.Hardware.of(cfg)
    every = resources.train_estimate(cfg, job, plan.jobs, hw)
    evals, rows, unsized = resources._evaluations(job.config)
    assert evals == 640 // 10 + 1 and rows == 30 * 16 * 2 + 40 * 4 + 175 * 4 + 541 + 12032 and unsized == []
    once_cfg = dict(job.config, train=dict(job.config["train"], eval_every=10_000))
    once = resources.train_estimate(cfg, type(job)(**{**job.__dict__, "config": once_cfg}), plan.jobs, hw)
    assert every.hours > 2 * once.hours and every.hours_high > once.hours_high
    domains = {**job.config["domains"]}
    domains["knowledge"] = dict(domains["knowledge"], heldout={"mmlu_pro": dict(domains["knowledge"]["heldout"]["mmlu_pro"],
                                                                                expected_rows=None)})
    blind = resources.train_estimate(cfg, type(job)(**{**job.__dict__, "config": dict(job.config, domains=domains)}),
                                     plan.jobs, hw)
    assert blind.notes == ["evaluation of knowledge.mmlu_pro not counted (no size or expected_rows)"]


def test_the_slurm_warning_lead_covers_a_step_an_evaluation_and_a_checkpoint(paper):
    """The paper's training jobs need far more than the SLURM profile's 120 s: S5's runs evaluate MMLU-Pro's 12,032
    questions, and the warning may come just before an evaluation; each lead is a step or an evaluation and a save,
    with a margin. Base and difficulty jobs do not resume: they keep the default."""
    from opdgrpo.cost.overheads import checkpoint_seconds

    cfg, plan = paper
    estimates = resources.estimate_jobs(cfg, plan)
    stops = resources.stop_settings(cfg, plan, estimates)
    leads = {e.job: stops[e.job].signal_lead_s for e in estimates if e.kind == "train"}
    assert all(lead > checkpoint_seconds(4.0e9) for lead in leads.values())   # at least a 4B save
    worst = max(leads, key=leads.get)
    assert "ifeval+knowledge" in worst and leads[worst] > 20 * 60
    assert f"| {worst} | {leads[worst] / 60:.0f} min |" in resources.summary(cfg, estimates, stops)
    assert all(stops[e.job].signal_lead_s == 120 for e in estimates if e.kind != "train")


def test_the_table_is_a_markdown_table(paper):
    """Its delimiter row has as many cells as its header (GitHub renders no table otherwise)."""
    cfg, plan = paper
    lines = resources.table(cfg, resources.estimate_jobs(cfg, plan)).splitlines()
    assert len({line.count("|") for line in lines}) == 1
