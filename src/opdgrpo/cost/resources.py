"""Will each job fit on its GPUs, and how long will it run: ``opdgrpo resources --profile paper``.

Per planned job: the peak memory per device (:mod:`opdgrpo.cost.memory_model`: weights, gradients, optimizer state,
teachers, and the largest of its phases: sampling's KV cache, the training pass's activations, logit chunks and
transients, evaluation's KV cache, or the vLLM engine's reservation) against the memory the profile's ``hardware``
reports to CUDA (:mod:`opdgrpo.cost.gpus`), host memory against ``resources.<kind>.mem_mb``, and the wall time cost
by cost (:mod:`opdgrpo.cost.train_time`, :mod:`opdgrpo.cost.sampling_jobs`) against what the job may run:
``resources.<kind>.runtime`` for a job that starts over, that times ``resources.train.allocations`` for a training
job, which resumes. The Snakefile calls :func:`refuse_unfit` before it schedules anything, so a job that would not
fit or not finish never starts; each message names the job, the estimate and the key to change.
:func:`stop_settings` gives the rules each job's SLURM warning lead and process-group timeout
(:mod:`opdgrpo.cost.stops`).

Our own model: the paper's jobs are ours to size, and no library predicts this trainer's phases.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Mapping, Sequence

from opdgrpo.config import ConfigError
from opdgrpo.cost import engine_share, gpu_counts, train_time
from opdgrpo.cost.engine_memory import pinned_while_asleep, processed_logprobs
from opdgrpo.cost.heldout import thinking_block, thinks
from opdgrpo.cost.job_estimate import ADVICE, DTYPE_BYTES, Hardware, JobEstimate
from opdgrpo.cost.memory_model import ADAM_STATE_BYTES, GIB, Shape, activation_bytes, kv_cache_bytes, layer_params, logit_chunk_bytes, params, root_params
from opdgrpo.cost.model import architecture, cost_block, estimate_run, lengths_for, model_of
from opdgrpo.cost.sampling_jobs import base_estimate, difficulty_estimate
from opdgrpo.cost.stops import StopSettings, stop_settings_of
from opdgrpo.cost.summary import summary, table
from opdgrpo.run_shape import RunShape, Sampling, evaluation_count, train_settings
from opdgrpo.train.checkpoint import CHECKPOINT_S_PER_GB

__all__ = ["ADVICE", "CHECKPOINT_S_PER_GB", "Hardware", "JobEstimate", "StopSettings", "estimate_jobs", "main",
           "refuse_unfit", "stop_settings", "summary", "table", "train_estimate", "unfit"]

#: Kinds of job that start over when they fail or run out of time (retries 0 in workflow/profiles/slurm); training
#: jobs resume from their checkpoint instead.
RESTARTING = ("base", "difficulty", "tokenizer", "report")

#: vLLM's sleep level in the training jobs where ``train.vllm.sleep_level`` is unset: 2 (weights discarded: the next
#: weight sync overwrites them); level 1 copies them to pinned host memory.
DEFAULT_SLEEP_LEVEL = 2


def _bytes(name: str | None, default: str = "float32") -> int:
    return DTYPE_BYTES[str(name or default)]


def _gpus(cfg: Mapping[str, Any], kind: str) -> int:
    res = (cfg.get("resources") or {}).get(kind) or {}
    return int(res.get("processes") or res.get("gpu") or 1) if kind == "train" else int(res.get("gpu") or 1)


# -- training jobs -----------------------------------------------------------------------------------------------
def _frozen(shape: Shape, dtype_bytes: int, shards: int, sharded: bool) -> float:
    """A frozen model's bytes per device: its shard, plus the root unit and two layers gathered (FSDP2's prefetch)."""
    if not sharded:
        return dtype_bytes * params(shape)
    return dtype_bytes * (params(shape) / shards + root_params(shape) + 2 * layer_params(shape))


def _compute_bytes(precision: str) -> int:
    """Bytes of an activation: bfloat16 under ``bf16``; float32 under ``fp32`` and ``auto`` (it resolves per machine,
    at job start: the plan takes the larger)."""
    return 2 if precision == "bf16" else 4


def _train_static(cfg: Mapping[str, Any], rc: Mapping[str, Any], student: Shape, teachers: Sequence[Shape],
                  shape: RunShape) -> tuple[dict[str, float], int]:
    """Weights, gradients, optimizer state and teachers per device; and the residual stream's bytes."""
    t = shape.settings
    sharded, world = shape.sharded, shape.world
    shards = world if sharded else 1
    master = _bytes(t["param_dtype"])
    compute = _compute_bytes(shape.precision)
    gathered = _bytes(t["fsdp"].get("param_dtype"), "bfloat16" if compute == 2 else "float32")
    n = params(student)
    unit = root_params(student) + 2 * layer_params(student)
    # FSDP: the master shard, the root unit and two layers gathered, and, under the hf sampler, the full replica the
    # student samples with in the gathered dtype (opdgrpo.train.fsdp.sampling_replica; refreshed from the shards before
    # each sampling). A vLLM engine syncs from the shards a parameter at a time: no replica.
    replica = n if shape.engine != "vllm" else 0
    static = {"weights": master * n / shards + (gathered * (unit + replica) if sharded else 0.0),
              # DDP keeps its reduction buckets beside the gradients (gradient_as_bucket_view off)
              # FSDP: the unsharded gradients of two layers before their reduce-scatter, and the root unit's
              # (embedding, LM head), which the LM head's backward starts first and which is reduced last: it is
              # held through the whole backward, beside the activations (not measured on a GPU yet)
              "gradients": master * n / shards * (2 if shape.distributed == "ddp" and world > 1 else 1)
              + (gathered * (2 * layer_params(student) + root_params(student)) if sharded else 0.0),
              "optimizer": ADAM_STATE_BYTES * n / shards}
    frozen = [(s, _bytes(t["teacher_dtype"])) for s in teachers]
    if shape.reference:   # the frozen reference: the initial student, in the master dtype
        frozen.append((student, master))
    if frozen:
        static["teachers"] = sum(_frozen(s, b, shards, sharded) for s, b in frozen)
    return static, gathered if sharded else master


def _train_row(cfg: Mapping[str, Any], rc: Mapping[str, Any]) -> int:
    """A training job's longest row: the cost model's padded prompt of its longest domain + ``max_new_tokens``."""
    t = rc["train"]
    block = cost_block(cfg)
    prompt = max(lengths_for(block, d, int(t["max_new_tokens"])).padded_prompt for d in rc["train_domains"])
    return int(prompt + int(t["max_new_tokens"]))


def max_model_len(settings: Mapping[str, Any], row: int) -> int:
    """The engine's ``max_model_len`` as :func:`opdgrpo.train.engines.vllm_engine.engine_args` sets it: the key where it
    is set (it may only raise it), else the job's longest row (here the cost model's padded prompt, an upper bound
    the engine replaces with the job's real longest prompt)."""
    return max(int(settings.get("max_model_len") or 0), int(row))


def _train_phases(cfg: Mapping[str, Any], rc: Mapping[str, Any], student: Shape, teachers: Sequence[Shape],
                  shape: RunShape, residual: int) -> dict[str, float]:
    t = shape.settings
    compute = _compute_bytes(shape.precision)
    row = _train_row(cfg, rc)
    rows = shape.rows_per_shard
    tokens = min(rows * row, shape.microbatch_tokens or rows * row)
    attention = str(t["attn_implementation"])
    chunk = min(shape.logit_chunk_tokens, tokens)
    passes = activation_bytes(student, tokens, row, residual, compute, bool(t["activation_checkpointing"]),
                              attention) + logit_chunk_bytes(student, chunk)
    # one teacher per shard (a shard is one prompt's group, one domain): its final hidden states kept for the
    # chunked LM head, and one chunk of its logits
    passes += max((tokens * s.hidden * 2 + logit_chunk_bytes(s, chunk, copies=1) for s in teachers), default=0.0)
    # beside the student's saved activations, the larger of two transients: the teacher's no-grad forward (its MLP's
    # gate, up and their product for the micro-batch: OPD computes the teacher inside the loss, after the student's
    # forward) and the backward's gradients of one layer's MLP intermediates
    passes += max([4 * tokens * student.intermediate * compute]
                  + [3 * tokens * s.intermediate * compute for s in teachers])
    sampling = kv_cache_bytes(student, rows, row, compute) + 2 * rows * student.vocab * 4
    eval_rows = _eval_rows(shape.evaluation, row)
    return {"sampling": sampling, "training pass": passes,
            "evaluation": kv_cache_bytes(student, eval_rows, row, compute) + 2 * eval_rows * student.vocab * 4}


def _eval_rows(ev: Sampling, row: int) -> int:
    """Rows per evaluation batch: ``batch_size``, capped by ``max_batch_tokens`` where it is set."""
    rows, budget = int(ev.batch_size or 1), ev.max_batch_tokens
    return max(1, min(rows, int(budget) // row)) if budget else rows


def sleep_level(rc: Mapping[str, Any]) -> int:
    """The vLLM sleep level of a training job's engine (``train.vllm.sleep_level``, default 2)."""
    return int(train_settings(rc["train"])["vllm"].get("sleep_level") or DEFAULT_SLEEP_LEVEL)


def _host(est: JobEstimate, rc: Mapping[str, Any], student: Shape, teachers: Sequence[Shape]) -> None:
    """Host memory per node. Loading: every process reads each model whole before it moves or shards it, one model at
    a time; on resume it first reads the checkpoint's trainer state (the full optimizer state, one process's layout:
    opdgrpo.train.checkpoint.resume_point) and holds it until the optimizer takes it. Afterwards: each sleeping
    engine's pinned copies (:func:`~opdgrpo.cost.engine_memory.pinned_while_asleep`: its runtime and CUDA graph pools
    at every sleep level, its weights too at level 1), and during a save the main process's gathered weights and Adam
    state."""
    t, world = train_settings(rc["train"]), est.gpus
    est.host = world * max([_bytes(t["param_dtype"]) * params(student)]
                           + [_bytes(t["teacher_dtype"]) * params(s) for s in teachers])
    est.host_resume = est.host + world * ADAM_STATE_BYTES * params(student)
    asleep = est.engine is not None and engine_share.sleeps(t["vllm"])
    pinned = world * pinned_while_asleep(est.engine, sleep_level(rc)) if asleep else 0.0
    est.host_steady = pinned + (4 + ADAM_STATE_BYTES) * params(student)


def train_estimate(cfg: Mapping[str, Any], job: Any, jobs: Mapping[str, Any], hw: Hardware | None,
                   gpus: int | None = None) -> JobEstimate:
    """A training job's memory and time on ``gpus`` processes (default: its kind's, ``resources.train``); the
    machine's planner asks at each count it considers (:mod:`opdgrpo.cost.gpu_counts`)."""
    rc = job.config
    world = gpus or _gpus(cfg, "train")
    student_model = model_of(rc["student"]["from"], jobs)
    student = Shape.of(architecture(cfg, student_model))
    refs = sorted({spec["from"] for spec in (rc.get("teachers") or {}).values()})   # one model per distinct teacher
    teachers = [Shape.of(architecture(cfg, model_of(ref, jobs))) for ref in refs]
    shape = RunShape.of(rc, world)
    static, residual = _train_static(cfg, rc, student, teachers, shape)
    phases = _train_phases(cfg, rc, student, teachers, shape, residual)
    engine, choice = None, None
    # the engine starts after the models load and before the first step: the trainer holds its weights (under hf
    # the sampling replica too) and its teachers then; gradients and Adam's state come with the first update
    at_start = static.get("weights", 0.0) + static.get("teachers", 0.0)
    if shape.engine == "vllm" and hw:   # sampling and evaluation inside the engine's reservation
        settings = shape.settings["vllm"]
        # asleep during the update (its KV cache freed; its weights to host memory at level 1, discarded at 2): its
        # share only has to fit beside the trainer's static memory; awake throughout, beside the training pass too
        asleep = engine_share.sleeps(settings)
        room = engine_share.colocated_room(hw, sum(static.values()), at_start, phases["training pass"], asleep)
        choice, (engine,) = engine_share.choose(
            [student], hw=hw, settings=settings, key="train.vllm", room=room,
            max_model_lens=[max_model_len(settings, _train_row(cfg, rc))],
            processed=processed_logprobs(shape.rollout.temperature, shape.method.get("engine_is_cap")))
        phases = {"training pass": phases["training pass"] + (0.0 if asleep else engine.share),
                  "vLLM engine": engine.share}
    est = JobEstimate(job.id, "train", world, static, phases, engine=engine, engine_choice=choice)
    est.trainer_at_start = at_start
    _host(est, rc, student, teachers)
    if hw:
        _train_time(cfg, est, job, jobs, hw, student, teachers, thinks(cfg, student_model, rc["train"].get(
            "enable_thinking")))
    return est


def _train_time(cfg: Mapping[str, Any], est: JobEstimate, job: Any, jobs: Mapping[str, Any], hw: Hardware,
                student: Shape, teachers: list[Shape], thinking: bool) -> None:
    """Every cost of a training job (:mod:`opdgrpo.cost.train_time`); a thinking student (a Qwen3 teacher trained
    with GRPO) samples at its thinking lengths."""
    rc = job.config
    new = int(rc["train"]["max_new_tokens"])
    block = thinking_block(cfg, rc["train_domains"], new) if thinking else cost_block(cfg)
    run = estimate_run(cfg, job, jobs, block)
    mean = max(lengths_for(block, d, new).response for d in rc["train_domains"])
    rollouts, evaluation = train_time.sampler_extras(rc, student)
    train_time.add_steps(est, run, rc, hw, est.engine, mean, rollouts)
    est.sets, unsized = train_time.evaluation_sets(cfg, rc, thinking)
    est.notes += [f"evaluation of {u} not counted (no size or expected_rows)" for u in unsized]
    train_time.add_evaluations(est, rc, student, hw, est.engine, evaluation)
    train_time.add_checkpoints(est, rc, student)
    est.startup_h = train_time.attempt_start(cfg, rc, student, teachers, est.engine is not None)
    est.waits["engine start"] = 3600 * est.startup_h[1]
    train_time.attempts(cfg, est, student)


def _evaluations(rc: Mapping[str, Any]) -> tuple[int, int, list[str]]:
    """(evaluations a run makes, rows each samples, the held-out sets without a size to count): every
    ``eval_every`` steps from step 0, and the final one; each set's prompts (``size``, else ``expected_rows``)
    times its ``k``."""
    sets, unsized = train_time.evaluation_sets({"cost_model": {}, "domains": rc["domains"]}, rc, False)
    return evaluation_count(rc), sum(s.rows for s in sets), unsized


# -- the plan ------------------------------------------------------------------------------------------------------
def estimate_jobs(cfg: Mapping[str, Any], plan: Any) -> list[JobEstimate]:
    """Every GPU job of the plan (tokenizer and report jobs run on CPUs and are left out): at its kind's count, or,
    on a profile with a ``machine`` block, at the count chosen for it there (:mod:`opdgrpo.cost.gpu_counts`)."""
    machine = gpu_counts.check(cfg)
    if machine is not None:
        return machine_plan(cfg, plan, machine).estimates
    hw = Hardware.of(cfg)
    cfg = plan.config_for(cfg) if hasattr(plan, "config_for") else cfg   # with the plan's model variants (S6)
    return [e for e in (_estimate(cfg, job, plan.jobs, hw) for job in plan.jobs.values()) if e is not None]


def _estimate(cfg: Mapping[str, Any], job: Any, jobs: Mapping[str, Any], hw: Hardware | None,
              gpus: int | None = None) -> JobEstimate | None:
    """One job's estimate on ``gpus`` GPUs (default: its kind's count); None for a job that runs on CPUs."""
    if job.kind == "train":
        return train_estimate(cfg, job, jobs, hw, gpus)
    if job.kind == "base" and job.config["model"].get("source") in ("hub", "random"):
        return base_estimate(cfg, job, hw, gpus)
    if job.kind == "difficulty":
        return difficulty_estimate(cfg, job, jobs, hw)
    return None


def machine_plan(cfg: Mapping[str, Any], plan: Any, machine: gpu_counts.Machine) -> gpu_counts.MachinePlan:
    """Each GPU job's count on the profile's machine and its estimate there, and the DAG's schedule
    (:func:`opdgrpo.cost.gpu_counts.choose_counts`): a count fits where the job fits in GPU and host memory, vLLM
    would start, and it ends within its runtime where the profile sets one."""
    hw = Hardware.of(cfg)
    cfg = plan.config_for(cfg) if hasattr(plan, "config_for") else cfg

    def fits(e: JobEstimate) -> bool:
        return hw is None or not (memory_problems(cfg, hw, [e]) or overtime(cfg, [e]))

    return gpu_counts.choose_counts(cfg, plan, machine, lambda job, g: _estimate(cfg, job, plan.jobs, hw, g), fits)


def stop_settings(cfg: Mapping[str, Any], plan: Any, estimates: Sequence[JobEstimate] | None = None
                  ) -> dict[str, StopSettings]:
    """Each training, base and difficulty job's SLURM warning lead and process-group timeout, by job id
    (:mod:`opdgrpo.cost.stops`); ``estimates``: :func:`estimate_jobs`' answer, computed here when not given."""
    estimates = estimate_jobs(cfg, plan) if estimates is None else estimates
    kinds = {j.id: j.kind for j in plan.jobs.values() if j.kind in ("train", "base", "difficulty")}
    return stop_settings_of(cfg, kinds, {e.job: e for e in estimates})


def _host_limit(cfg: Mapping[str, Any], kind: str) -> float | None:
    mem_mb = ((cfg.get("resources") or {}).get(kind) or {}).get("mem_mb")
    return float(mem_mb) * 2**20 if mem_mb else None


def unfit(cfg: Mapping[str, Any], estimates: Sequence[JobEstimate]) -> list[str]:
    """One message per job whose peak exceeds the usable memory of ``hardware``, whose host memory exceeds what the
    job asks SLURM for (``resources.<kind>.mem_mb``), or whose time exceeds what it may run (:func:`overtime`);
    none without ``hardware``."""
    hw = Hardware.of(cfg)
    if hw is None:
        return []
    return memory_problems(cfg, hw, estimates) + overtime(cfg, estimates)


def memory_problems(cfg: Mapping[str, Any], hw: Hardware, estimates: Sequence[JobEstimate]) -> list[str]:
    """The memory half of :func:`unfit`: GPU memory, vLLM's start, host memory."""
    out = [f"job `{e.job}`: {e.peak / GIB:.1f} GiB per GPU ({e.peak_phase} peaks) > {hw.budget / GIB:.1f} GiB usable "
           f"on {hw.name}; change: {e.advice()}" for e in estimates if e.peak > hw.budget]
    out += engine_refusals(hw, estimates)
    for e in estimates:
        limit = _host_limit(cfg, e.kind)
        if limit is not None and e.host_peak > limit:
            when = {e.host: f"while its models load (each of {e.gpus} processes reads one whole)",
                    e.host_resume: f"on resume (the trainer state held) while its models load (each of {e.gpus} "
                                   "processes reads one whole)",
                    e.host_steady: "while it runs (sleeping engines' pinned weights, a checkpoint save)"}[e.host_peak]
            out.append(f"job `{e.job}`: {e.host_peak / GIB:.0f} GiB of host memory {when} > resources.{e.kind}.mem_mb "
                       f"({limit / GIB:.0f} GiB); change: a higher resources.{e.kind}.mem_mb")
    return out


def overtime(cfg: Mapping[str, Any], estimates: Sequence[JobEstimate]) -> list[str]:
    """Jobs that cannot finish in what they may run (high end): a job that starts over (base, difficulty) in one
    ``resources.<kind>.runtime``; a training job in ``resources.train.allocations`` allocations of that runtime,
    each less its start-up and the SLURM warning lead."""
    out = []
    for e in estimates:
        runtime, hours = train_time.runtime_h(cfg, e.kind), e.hours_high
        if runtime is None or hours is None:
            continue
        if e.kind in RESTARTING and hours > runtime:
            out.append(f"job `{e.job}`: {hours:.1f} h predicted (high end) > resources.{e.kind}.runtime "
                       f"({runtime:g} h), and a {e.kind} job starts over when it runs out of time; change: a higher "
                       f"resources.{e.kind}.runtime" + (" or more GPUs (resources.base.gpu: its sets are split over "
                                                        "them)" if e.kind == "base" else ""))
        elif e.kind == "train" and e.attempts > train_time.allocations(cfg, e.kind):
            allowed = train_time.allocations(cfg, e.kind)
            need = "more than 10^6" if e.attempts >= 10**6 else str(e.attempts)
            out.append(f"job `{e.job}`: {hours:.1f} h predicted (high end) needs {need} allocations of "
                       f"resources.train.runtime ({runtime:g} h, less {e.startup_h[1]:.2f} h of start-up and a "
                       f"{train_time.lead_seconds(e) / 60:.0f}-minute warning lead each) > resources.train.allocations "
                       f"({allowed}); change: a higher resources.train.allocations (with preemptible-retries in "
                       f"workflow/profiles/slurm) or resources.train.runtime")
    return out


def engine_refusals(hw: Hardware, estimates: Sequence[JobEstimate]) -> list[str]:
    """What vLLM itself would refuse as its engine starts (:mod:`opdgrpo.cost.engine_memory`), one message per job.
    A share the plan chose is the room the job's other memory leaves the engine: the message then names that."""
    out = []
    total = hw.device_bytes
    for e in estimates:
        if e.engine is None:
            continue
        x, advice = e.engine, ADVICE["vLLM start"].format(settings=e.engine_key)
        share_key = f"{e.engine_key}.gpu_memory_utilization"
        if e.share_planned:   # what fills the GPU beside the engine is what to change
            room = e.engine_choice.room if e.engine_choice is not None else x.share
            share_key = f"the plan's share, the room the job's other memory leaves it: {room / GIB:.1f} GiB"
            beside = ADVICE[max(e.static, key=e.static.get)] if e.kind == "train" and e.static else \
                "a smaller model or a GPU with more memory (hardware)"
            advice = f"{beside}, or a lower max_new_tokens (the engine's max_model_len)"
        if e.trainer_at_start + x.share > total:
            out.append(f"job `{e.job}`: vLLM would refuse to start: the trainer holds {e.trainer_at_start / GIB:.1f} "
                       f"GiB when its engine asks for {x.share / GIB:.1f} GiB ({share_key}) of the {total / GIB:.0f} "
                       "GiB device; change: " + (advice if e.share_planned else
                                                  f"a lower {e.engine_key}.gpu_memory_utilization"))
        if not x.starts:
            out.append(f"job `{e.job}`: vLLM would refuse to start: its KV pool ({x.share / GIB:.1f} GiB share "
                       f"({share_key}) - {x.weights / GIB:.1f} weights - {x.profile_peak / GIB:.1f} profiling peak - "
                       f"{x.cudagraph / GIB:.1f} CUDA graphs = {x.pool / GIB:.1f} GiB) cannot hold one row of "
                       f"max_model_len {x.max_model_len} ({x.row / GIB:.2f} GiB); change: {advice}")
    return out


def refuse_unfit(cfg: Mapping[str, Any], plan: Any) -> list[JobEstimate]:
    """Raise :class:`ConfigError` naming every job that would not fit or not finish (what the Snakefile calls before
    scheduling); else the estimates, for :func:`stop_settings` (``stop_settings(cfg, plan, estimates)``)."""
    estimates = estimate_jobs(cfg, plan)
    problems = unfit(cfg, estimates)
    if problems:
        raise ConfigError("jobs that would run out of GPU memory, host memory or time (`opdgrpo resources --profile "
                          f"{cfg.get('profile')}` shows every estimate; usable = the memory CUDA reports x "
                          "hardware.usable_fraction):\n  " + "\n  ".join(problems))
    return estimates


def main(argv: Sequence[str] | None = None) -> int:
    from opdgrpo.config import compose
    from opdgrpo.plan.build import build_plan

    parser = argparse.ArgumentParser(prog="opdgrpo resources",
                                     description="Per job: estimated peak GPU memory per device and wall time.")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. train.max_tokens_per_microbatch=32768")
    parser.add_argument("--profile", help="the profile (same as the override profile=P)")
    parser.add_argument("--conf-dir", default=None)
    args = parser.parse_intermixed_args(argv)
    try:
        cfg = compose(([f"profile={args.profile}"] if args.profile else []) + list(args.overrides), args.conf_dir)
        plan = build_plan(cfg)
        estimates = estimate_jobs(cfg, plan)
        stops = stop_settings(cfg, plan, estimates)
        machine = gpu_counts.Machine.of(cfg)
        on_machine = (machine.gpus, gpu_counts.schedules(plan, machine, estimates)) if machine else None
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(summary(cfg, estimates, stops, on_machine))
    problems = unfit(cfg, estimates)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems else 0
