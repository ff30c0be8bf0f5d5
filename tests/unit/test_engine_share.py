"""The vLLM engine's share and max_num_seqs, chosen per job by the plan (opdgrpo.cost.engine_share) from vLLM 0.32's
own start-up arithmetic (opdgrpo.cost.engine_memory): what the profiling run's sampler pass keeps, the fixed point
of max_num_seqs and the pool, what a sleeping engine pins in host memory, what the slow sampler path costs, and the
path of the values from the plan to the engine outside every job's identity."""

from __future__ import annotations

import argparse
import json

import pytest

from opdgrpo import job_identity
from opdgrpo.config import ConfigError, compose
from opdgrpo.cost import engine_memory as em
from opdgrpo.cost import resources
from opdgrpo.cost.engine_share import engine_env, engine_plan
from opdgrpo.cost.memory_model import GIB, Shape, params
from opdgrpo.plan.build import build_plan
from opdgrpo.train import checkpoint

TOY = Shape(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=1000, tied=True)


@pytest.fixture(scope="module")
def paper():
    cfg = compose(["profile=paper"])
    plan = build_plan(cfg)
    return cfg, plan, {e.job: e for e in resources.estimate_jobs(cfg, plan)}


# -- vLLM's start-up arithmetic ---------------------------------------------------------------------------------------

def test_the_sampler_pass_keeps_the_logits_three_float32_copies_and_the_triton_scratch():
    """_dummy_sampler_run: bf16 logits held by the caller, Sampler.forward's float32 copy, forward_native's
    probabilities and exponential noise (+ its log-softmax under processed_logprobs), and the Triton top-k/top-p
    kernel's scratch rows (the rows rounded up to a power of two, at most one per SM)."""
    v = TOY.vocab
    assert em.sampler_peak_bytes(TOY, 3, processed=False) == 3 * v * (2 + 12) + 4 * v * 4
    assert em.sampler_peak_bytes(TOY, 3, processed=True) == 3 * v * (2 + 16) + 4 * v * 4
    assert em.sampler_peak_bytes(TOY, 1, processed=False) == v * 14 + v * 4
    assert em.sampler_peak_bytes(TOY, 1024, processed=False) == 1024 * v * 14 + em.TRITON_SCRATCH_ROWS * v * 4


def test_the_profiling_peak_is_the_forward_or_the_sampler_pass_whichever_is_larger():
    """profile_run frees the forward's intermediates before the sampler pass; its output hidden states stay."""
    forward = 100 * (3 * TOY.intermediate + 4 * TOY.hidden) * 2
    assert em.profile_peak_bytes(TOY, 100, 1, False) == forward + em.NON_TORCH_BYTES   # one row: the forward's
    many = em.profile_peak_bytes(TOY, 100, 4096, False)
    assert many == 100 * TOY.hidden * 2 + em.sampler_peak_bytes(TOY, 4096, False) + em.NON_TORCH_BYTES


def test_max_num_seqs_is_the_fixed_point_of_the_rows_and_the_sampler_pass(paper):
    """The plan's max_num_seqs is the most rows of max_model_len the pool holds after a sampler pass over that many
    rows (found by bisection; the pool shrinks as the rows grow): one more would not fit, and a brute-force search
    agrees. vLLM's default 1024 leaves the same share fewer rows."""
    cfg, _, _ = paper
    from opdgrpo.cost.model import architecture

    hw = resources.Hardware.of(cfg)
    for model, share in (("student", 0.62), ("student_8b", 0.63), ("qwen3_32b", 0.9)):
        shape = Shape.of(architecture(cfg, model))
        settings = {"gpu_memory_utilization": share}
        n = em.fitted_seqs(shape, gpu_bytes=hw.device_bytes, settings=settings, max_model_len=9692)

        def start(k):
            return em.engine_start(shape, gpu_bytes=hw.device_bytes, settings={**settings, "max_num_seqs": k},
                                   max_model_len=9692)

        assert start(n).holds(n) and start(n).rows_at_once == n
        assert not start(n + 1).holds(n + 1)
        assert n == max(k for k in range(1, 200) if start(k).holds(k))
        assert start(1024).rows_at_once <= n


def test_rows_at_once_leave_the_null_block():
    row = 1000.0
    start = em.EngineStart(share=0, weights=0, profile_peak=0, pool=3 * row, row=row, max_model_len=16 * 10)
    assert start.rows_at_once == 2 and start.holds(2) and not start.holds(3)


def test_a_sleeping_engine_pins_its_runtime_and_graph_pools_at_every_level():
    """CuMemBackend.suspend offloads the `runtime` and `cudagraph` pools at levels 1 and 2, the weights at 1 only."""
    start = em.engine_start(TOY, gpu_bytes=80 * GIB, settings={"max_num_seqs": 8, "max_num_batched_tokens": 512},
                            max_model_len=160)
    runtime = 8 * 10 * 4 + 512 * 8   # the block table (8 rows of 10 int32 block ids) and the slot mapping
    assert em.pinned_while_asleep(start, 2) == pytest.approx(start.cudagraph + runtime)
    assert em.pinned_while_asleep(start, 1) == pytest.approx(start.cudagraph + runtime + 2 * params(TOY))
    eager = em.engine_start(TOY, gpu_bytes=80 * GIB, settings={"max_num_seqs": 8, "enforce_eager": True,
                                                                "max_num_batched_tokens": 512}, max_model_len=160)
    assert em.pinned_while_asleep(eager, 2) == runtime


def test_decode_reads_each_tokens_kv_once_and_the_weights_each_step():
    """A row that has finished reads nothing while the longest one goes on: 10 rows of mean 100 tokens, the longest
    1000, all at once: 1000 steps of the weights and 1000 tokens' KV (half a row each)."""
    many = em.EngineStart(share=0, weights=1e9, profile_peak=0, pool=1e6, row=1.0, max_model_len=1000)
    assert em.decode_seconds(many, rows=10, longest=1000, mean=100, tbps=1.0) == pytest.approx((1000 * 1e9 + 500) / 1e12)
    # in waves of 2 rows: 500 steps, the same tokens' KV
    two = em.EngineStart(share=0, weights=1e9, profile_peak=0, pool=2.5, row=1.0, max_model_len=1000)
    assert em.decode_seconds(two, rows=10, longest=100, mean=100, tbps=1.0) == pytest.approx((500 * 1e9 + 500) / 1e12)


# -- the slow sampler path -------------------------------------------------------------------------------------------

def test_processed_logprobs_only_off_temperature_one_with_the_engine_correction():
    assert not em.processed_logprobs(1.0, 3.0) and not em.processed_logprobs(0.7, None)
    assert em.processed_logprobs(0.7, 3.0)


def test_the_slow_sampler_costs_a_sort_where_top_k_top_p_cut_and_a_loop_over_seeded_rows():
    v = TOY.vocab
    assert em.step_extra(TOY, processed=False, seeded=False, top_k_top_p=True, asks_logprobs=False) == em.StepExtra()
    slow = em.step_extra(TOY, processed=True, seeded=False, top_k_top_p=True, asks_logprobs=False)
    assert slow.bytes_per_row == v * (em.SORT_BYTES_PER_ENTRY + em.LOG_SOFTMAX_BYTES_PER_ENTRY)
    rollouts = em.step_extra(TOY, processed=True, seeded=False, top_k_top_p=False, asks_logprobs=True)
    assert rollouts == em.StepExtra()   # the full distribution, log-probs asked for either way
    seeded = em.step_extra(TOY, processed=False, seeded=True, top_k_top_p=False, asks_logprobs=False)
    assert seeded == em.StepExtra(0.0, em.SEEDED_ROW_SECONDS)
    start = em.EngineStart(share=0, weights=1e9, profile_peak=0, pool=1e6, row=1.0, max_model_len=1000)
    base = em.decode_seconds(start, rows=10, longest=1000, mean=100, tbps=1.0)
    assert em.decode_seconds(start, 10, 1000, 100, 1.0, extra=slow) == pytest.approx(base + 1000 * slow.bytes_per_row / 1e12)
    assert em.decode_seconds(start, 10, 1000, 100, 1.0, extra=seeded) == pytest.approx(base + 1000 * em.SEEDED_ROW_SECONDS)


def test_no_shipped_paper_job_keeps_the_slow_path_and_a_tempered_grpo_run_pays_for_it(paper):
    """The paper's rollouts sample at temperature 1: no job runs under processed_logprobs. At 0.7 GRPO's engine
    correction needs the tempered log-probs: its evaluations (top-k 20, top-p 0.95) pay the slow path; OPD's do not."""
    _, _, estimates = paper
    assert not any("slow sampler" in note for e in estimates.values() for note in e.notes)
    _, _, hot = _estimates("train.temperature=0.7")
    grpo, opd = hot["grpo-student-math-s0"], hot["opd-self_n8-math-s0"]
    assert any(note.startswith("evaluation: vLLM's slow sampler path") for note in grpo.notes)
    assert not any("slow sampler" in note for note in opd.notes)
    assert grpo.costs["evaluation"][1] > estimates["grpo-student-math-s0"].costs["evaluation"][1]


# -- the plan's choice -------------------------------------------------------------------------------------------------

def _estimates(*overrides):
    cfg = compose(["profile=paper", *overrides])
    plan = build_plan(cfg)
    return cfg, plan, {e.job: e for e in resources.estimate_jobs(cfg, plan)}


def test_every_training_engine_gets_what_its_trainer_leaves_and_holds_20_rows(paper):
    """Asleep during the update, a training job's engine fits beside the trainer's static memory within the usable
    memory; vLLM's start check holds; max_num_seqs is the rows the pool holds; every GRPO and OPD job of the paper
    holds at least 20 rows of its max_model_len at once."""
    cfg, _, estimates = paper
    hw = resources.Hardware.of(cfg)
    train = [e for e in estimates.values() if e.kind == "train"]
    for e in train:
        choice, start = e.engine_choice, e.engine
        assert not choice.share_by_hand and not choice.seqs_by_hand, e.job
        assert sum(e.static.values()) + start.share <= hw.budget, e.job
        assert hw.budget - sum(e.static.values()) - start.share < 0.01 * hw.device_bytes, e.job   # nothing left idle
        assert e.trainer_at_start + start.share <= hw.device_bytes, e.job
        assert start.rows_at_once == choice.max_num_seqs >= 20, e.job
    assert min(e.engine.rows_at_once for e in train) == estimates["grpo-qwen3_8b-code-s0"].engine.rows_at_once
    base = estimates["base-qwen3_32b"].engine_choice   # the base and S2 jobs keep the profile's own settings
    assert (base.gpu_memory_utilization, base.max_num_seqs, base.share_by_hand, base.seqs_by_hand) == (0.9, 128, True, True)


def test_a_value_set_by_hand_wins_and_is_checked():
    cfg, plan, estimates = _estimates("train.vllm.gpu_memory_utilization=0.5", "+train.vllm.max_num_seqs=16")
    e = estimates["grpo-student-math-s0"]
    assert e.engine_choice.share_by_hand and e.engine_choice.gpu_memory_utilization == 0.5
    assert e.engine_choice.seqs_by_hand and e.engine.rows_at_once == 16
    assert "0.50 (set)" in resources.summary(cfg, list(estimates.values()))
    _, _, only_share = _estimates("train.vllm.gpu_memory_utilization=0.5")
    assert not only_share["grpo-student-math-s0"].engine_choice.seqs_by_hand   # the rows then fitted to 0.5
    assert only_share["grpo-student-math-s0"].engine.rows_at_once > 16
    with pytest.raises(ConfigError, match=r"`train.vllm.gpu_memory_utilization` must be a fraction"):
        compose(["profile=paper", "train.vllm.gpu_memory_utilization=1.5"])
    with pytest.raises(ConfigError, match=r"`train.vllm_alone.max_num_seqs` must be an integer"):
        compose(["profile=paper", "train.vllm_alone.max_num_seqs=0"])


def test_a_planned_share_without_room_names_what_fills_the_gpu():
    """Under DDP the trainer's replicas leave the engine no room: the refusal names the plan's share and the static
    memory's knob, not a share nobody set."""
    cfg = compose(["profile=paper", "train.distributed=ddp", "~train.fsdp"])
    problems = resources.unfit(cfg, resources.estimate_jobs(cfg, build_plan(cfg)))
    message = next(p for p in problems if "grpo-student-math-s0`: vLLM would refuse to start" in p)
    assert "the plan's share" in message and "change: train.distributed=fsdp" in message
    assert "gpu_memory_utilization" not in message


def test_an_engine_that_never_sleeps_leaves_the_training_pass_its_room(paper):
    cfg, _, estimates = paper
    _, _, awake = _estimates("+train.vllm.enable_sleep_mode=false")
    asleep, up = estimates["grpo-student-math-s0"], awake["grpo-student-math-s0"]
    assert up.engine.share < asleep.engine.share
    assert up.peak <= resources.Hardware.of(cfg).budget and up.peak_phase == "training pass"
    assert up.host_steady < asleep.host_steady   # nothing pinned: it never sleeps


def test_the_summary_says_where_each_value_comes_from(paper):
    cfg, _, estimates = paper
    text = resources.summary(cfg, list(estimates.values()))
    assert "| vLLM share | vLLM max_num_seqs | vLLM rows at once |" in text
    e = estimates["opd-qwen3_32b-code-s0"]
    assert f"| {e.engine_choice.gpu_memory_utilization:.2f} (plan) | {e.engine.rows_at_once} (plan) | " \
           f"{e.engine.rows_at_once} of 9692 |" in text
    assert "| 0.90 (set) | 128 (set) | 3 of 9692 |" in text


# -- from the plan to the engine, outside the jobs' identity ---------------------------------------------------------

def test_the_engine_keys_leave_the_identity_and_the_resume_hash():
    cfg = {"train": {"lr": 1, "vllm": {"dtype": "bfloat16", "gpu_memory_utilization": 0.5, "max_num_seqs": 8},
                     "vllm_alone": {"gpu_memory_utilization": 0.9, "max_num_batched_tokens": 8192}},
           "vllm": {"max_num_seqs": 128, "dtype": "bfloat16"}, "method": {"name": "grpo"}}
    hashed = job_identity.identity(cfg)
    assert hashed["train"]["vllm"] == {"dtype": "bfloat16"} and hashed["vllm"] == {"dtype": "bfloat16"}
    assert hashed["train"]["vllm_alone"] == {"max_num_batched_tokens": 8192}
    assert cfg["train"]["vllm"]["max_num_seqs"] == 8   # the config itself is left as it is
    plain = {"train": {"lr": 1, "vllm": {"dtype": "bfloat16"}}, "method": {"name": "grpo"}}
    assert job_identity.identity(plain) == plain


def test_a_changed_share_resumes_a_checkpoint(paper, monkeypatch):
    _, plan, _ = paper
    monkeypatch.setattr(checkpoint, "upstream_fingerprint", lambda cfg: {})
    job = plan.jobs["grpo-student-math-s0"]
    one = json.loads(json.dumps(job.config))
    other = json.loads(json.dumps(job.config))
    other["train"]["vllm"].update(gpu_memory_utilization=0.5, max_num_seqs=7)
    assert checkpoint.run_identity(one) == checkpoint.run_identity(other)
    other["train"]["vllm"]["dtype"] = "float32"
    assert checkpoint.run_identity(one) != checkpoint.run_identity(other)


def test_the_rules_export_each_jobs_values_and_the_job_puts_them_back(paper, monkeypatch):
    """engine_env (what the rules export) keys each job's values by its directory; the CLI reads its own entry by
    `--out` into the engine block its engine reads (a training job's train.vllm, a sampling job's vllm), where
    engine_args passes them to vllm.LLM. A config that carries another value is refused, naming the key."""
    from opdgrpo import cli
    from opdgrpo.train.engines.vllm_engine import engine_args

    cfg, plan, estimates = paper
    choices = engine_plan(cfg, plan, list(estimates.values()))
    env = engine_env(choices, plan)
    monkeypatch.setenv(job_identity.ENGINE_ENV, env)
    monkeypatch.delenv(job_identity.ENV, raising=False)
    for job_id, path in (("opd-qwen3_32b-code-s0", ("train", "vllm")), ("base-qwen3_32b", ("vllm",))):
        job = plan.jobs[job_id]
        args = argparse.Namespace(out=job.out_dir, config_json=json.dumps(job_identity.identity(job.config)),
                                  config_file=None)
        got = cli._job_config(args)
        block = got["train"]["vllm"] if path[0] == "train" else got["vllm"]
        assert block["gpu_memory_utilization"] == choices[job_id].gpu_memory_utilization
        assert block["max_num_seqs"] == choices[job_id].max_num_seqs
        llm = engine_args(type("C", (), {"dtype": "bfloat16"})(), max_len=9692, settings=block, seed=0, cuda=True,
                          world=8, shares_gpu=path[0] == "train")
        assert (llm["gpu_memory_utilization"], llm["max_num_seqs"]) == (block["gpu_memory_utilization"],
                                                                        block["max_num_seqs"])
    clash = plan.jobs["grpo-student-math-s0"].config
    args = argparse.Namespace(out=plan.jobs["grpo-student-math-s0"].out_dir, config_file=None,
                              config_json=json.dumps({**clash, "train": {**clash["train"], "vllm": {"max_num_seqs": 3}}}))
    with pytest.raises(SystemExit, match=r"`train.vllm.max_num_seqs` is 3 in the job's config"):
        cli._job_config(args)


@pytest.mark.parametrize("profile", ["smoke", "tiny", "rehearsal"])
def test_nothing_is_chosen_for_jobs_that_run_on_cpus(profile):
    """Without `hardware` (smoke, tiny) or on CPUs (the rehearsal prices the paper's plan on its hardware block but
    runs on CPUs) the rules export only what conf sets by hand, as the jobs' configs carried it before."""
    cfg = compose([f"profile={profile}"])
    plan = build_plan(cfg)
    exported = json.loads(engine_env(engine_plan(cfg, plan, resources.estimate_jobs(cfg, plan)), plan))
    set_by_hand = {job_identity.job_key(j.out_dir): {k: v for k, v in (j.config.get("vllm") or {}).items()
                                                     if k in job_identity.ENGINE_RUNTIME_KEYS}
                   for j in plan.jobs.values() if j.kind in ("base", "difficulty")}
    assert exported == {k: v for k, v in set_by_hand.items() if v}


def test_a_training_job_started_by_hand_on_a_gpu_without_a_share_says_so(paper, monkeypatch, caplog):
    """The rules' config no longer carries the share: a training job started by hand without the rules' variable
    would give its engine vLLM's default 0.9 beside the trainer, and says so."""
    import torch

    from opdgrpo import cli

    _, plan, _ = paper
    job = plan.jobs["grpo-student-math-s0"]
    args = argparse.Namespace(out=job.out_dir, config_file=None,
                              config_json=json.dumps(job_identity.identity(job.config)))
    monkeypatch.delenv(job_identity.ENGINE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with caplog.at_level("WARNING", logger="opdgrpo"):
        cli._job_config(args)
    assert "vLLM takes its default 0.9 beside the trainer" in caplog.text
