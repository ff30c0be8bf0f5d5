"""`opdgrpo resources`: every job of the paper profile fits an 8 x 80 GB node; a setting that would not fit is refused
with the knob to change, by the command and by the Snakefile's check; a profile without `hardware` is estimated only."""

from __future__ import annotations

import pytest

from opdgrpo import resources
from opdgrpo.config import ConfigError, compose
from opdgrpo.memory_model import GIB
from opdgrpo.plan import build_plan

HF = "train.engine=hf ~train.vllm ~train.vllm_alone train.micro_batches=64"   # the own sampler: 8 rows per call


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


def test_a_bad_hardware_value_names_its_key():
    with pytest.raises(ConfigError, match="hardware.usable_fraction"):
        compose(["profile=paper", "hardware.usable_fraction=1.5"])


def test_the_hf_engine_is_estimated_by_its_own_kv_cache(paper):
    cfg = compose(["profile=paper", *HF.split()])
    estimates = {e.job: e for e in resources.estimate_jobs(cfg, build_plan(cfg))}
    assert resources.unfit(cfg, list(estimates.values())) == []
    assert "sampling" in estimates["grpo-student-math-s0"].phases and estimates["base-qwen3_32b"].engine_need == 0


def test_engine_settings_under_hf_are_an_error():
    with pytest.raises(ConfigError, match=r"train.vllm_alone.*~train.vllm_alone"):
        compose(["profile=paper", "train.engine=hf", "~train.vllm"])
