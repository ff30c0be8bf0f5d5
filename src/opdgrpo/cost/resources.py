"""Will each job fit on its GPUs, and how long will it run: ``opdgrpo resources --profile paper``.

Per planned job: the peak memory per device (:mod:`opdgrpo.cost.memory_model`: weights, gradients, optimizer state,
teachers, and the largest of its phases: sampling's KV cache, the training pass's activations and logit chunks,
evaluation's KV cache) against the profile's ``hardware`` block, and the wall time from the cost model's FLOPs
(:mod:`opdgrpo.cost.model`) at the throughput ``hardware`` states. The Snakefile calls :func:`refuse_unfit` before it
schedules anything, so a job whose estimate does not fit never starts; the message names the knob to change.

Our own model: the paper's jobs are ours to size, and no library predicts this trainer's phases.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from opdgrpo.config import ConfigError
from opdgrpo.cost.engine_memory import EngineStart, decode_seconds, engine_start
from opdgrpo.cost.memory_model import ADAM_STATE_BYTES, GIB, Shape, activation_bytes, kv_cache_bytes, layer_params, logit_chunk_bytes, params, root_params
from opdgrpo.cost.model import architecture, cost_block, estimate_run, lengths_for, model_of
from opdgrpo.run_shape import RunShape

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

#: What to change when a component is the one that does not fit, per component.
ADVICE = {
    "weights": "train.distributed=fsdp or more GPUs per run (resources.train.gpu)",
    "optimizer": "train.distributed=fsdp or more GPUs per run (resources.train.gpu)",
    "gradients": "train.distributed=fsdp or more GPUs per run (resources.train.gpu)",
    "teachers": "train.distributed=fsdp (teachers are sharded like the student) or a smaller teacher",
    "sampling": "more train.micro_batches (fewer rows per sampling call) or a lower train.max_new_tokens",
    "training pass": "a lower train.max_tokens_per_microbatch, train.activation_checkpointing=true, or a lower "
                     "train.logit_chunk_tokens",
    "evaluation": "a lower {eval_knob} (or batch_size beside it)",
    "vLLM engine": "a lower train.vllm.gpu_memory_utilization (the engine's share of a GPU beside the trainer)",
    "vLLM engine alone": "a higher train.vllm_alone.gpu_memory_utilization, or a smaller model",
    "vLLM start": "a lower max_new_tokens (the engine's max_model_len is the longest prompt + max_new_tokens), a "
                  "lower max_num_batched_tokens/max_num_seqs in {settings} (vLLM's profiling peak), or a higher "
                  "{settings}.gpu_memory_utilization",
}

#: Seconds per GB of a checkpoint save: written once and read back for its sha256 manifest (ours, an assumption of
#: 1 GB/s each way on a cluster's shared filesystem; the job log prints each save's seconds).
CHECKPOINT_S_PER_GB = 2.0

#: vLLM's own default share of a GPU (``gpu_memory_utilization``).
VLLM_DEFAULT_SHARE = 0.9

#: The batch knob of each kind of job's evaluation (the rows sampled at once).
EVAL_KNOBS = {"train": "train.eval.max_batch_tokens", "base": "pretrain.eval.max_batch_tokens",
              "difficulty": "studies.S2.max_batch_tokens"}


@dataclass(frozen=True)
class Hardware:
    """The ``hardware`` block: one GPU model and the throughput wall times are estimated from."""

    name: str
    memory_gib: float
    usable_fraction: float
    bf16_tflops: float
    train_mfu: float
    sampling_mfu: float
    memory_tbps: float | None = None

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> Hardware | None:
        block = cfg.get("hardware")
        if not block:
            return None
        return cls(str(block["name"]), float(block["memory_gib"]), float(block["usable_fraction"]),
                   float(block["bf16_tflops"]), float(block["train_mfu"]), float(block["sampling_mfu"]),
                   float(block["memory_tbps"]) if block.get("memory_tbps") else None)

    @property
    def budget(self) -> float:
        return self.memory_gib * self.usable_fraction * GIB


@dataclass
class JobEstimate:
    job: str
    kind: str
    gpus: int
    static: dict[str, float]                       # bytes held for the whole job, per device
    phases: dict[str, float]                       # bytes of each phase, per device; the largest one is the peak
    hours: float | None = None
    hours_high: float | None = None                # sampling bound by decode waves (hardware.memory_tbps)
    host: float = 0.0                              # bytes of host memory per node while the models load
    host_resume: float = 0.0                       # the same on resume: the trainer state is held while they load
    signal_lead_s: float | None = None             # training jobs: a step, an evaluation and a checkpoint save
    engine: EngineStart | None = None              # vLLM's start-up memory (engine jobs on a device with hardware)
    engine_key: str = "train.vllm"                 # the settings block that engine reads
    trainer_at_start: float = 0.0                  # what a colocated trainer holds when its engine starts
    notes: list[str] = field(default_factory=list)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get) if self.phases else "-"

    @property
    def peak(self) -> float:
        return sum(self.static.values()) + (max(self.phases.values()) if self.phases else 0.0)

    def advice(self) -> str:
        """The knob of the largest contributor: its peak phase when that outweighs every static component."""
        parts = {**self.static, self.peak_phase: self.phases.get(self.peak_phase, 0.0)}
        return ADVICE[max(parts, key=parts.get)].format(eval_knob=EVAL_KNOBS[self.kind])


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


def _compute_bytes(train: Mapping[str, Any]) -> int:
    """Bytes of an activation: bfloat16 under ``bf16``; float32 under ``fp32`` and ``auto`` (it resolves per machine,
    at job start: the plan takes the larger)."""
    return 2 if train.get("precision") == "bf16" else 4


def _train_static(cfg: Mapping[str, Any], rc: Mapping[str, Any], student: Shape, teachers: Sequence[Shape],
                  shape: RunShape) -> tuple[dict[str, float], int]:
    """Weights, gradients, optimizer state and teachers per device; and the residual stream's bytes."""
    t = rc["train"]
    sharded, world = shape.sharded, shape.world
    shards = world if sharded else 1
    master = _bytes(t.get("param_dtype"))
    compute = _compute_bytes(t)
    gathered = _bytes((t.get("fsdp") or {}).get("param_dtype"), "bfloat16" if compute == 2 else "float32")
    n = params(student)
    unit = root_params(student) + 2 * layer_params(student)
    # FSDP: the master shard, the root unit and two layers gathered, and, under the hf sampler, the full replica the
    # student samples with in the gathered dtype (opdgrpo.train.fsdp.sampling_replica; refreshed from the shards before
    # each sampling). A vLLM engine syncs from the shards a parameter at a time: no replica.
    replica = n if str(t.get("engine") or "hf") != "vllm" else 0
    static = {"weights": master * n / shards + (gathered * (unit + replica) if sharded else 0.0),
              # DDP keeps its reduction buckets beside the gradients (gradient_as_bucket_view off)
              # FSDP: the unsharded gradients of two layers before their reduce-scatter, and the root unit's
              # (embedding, LM head), which the LM head's backward starts first and which is reduced last: it is
              # held through the whole backward, beside the activations (not measured on a GPU yet)
              "gradients": master * n / shards * (2 if shape.distributed == "ddp" and world > 1 else 1)
              + (gathered * (2 * layer_params(student) + root_params(student)) if sharded else 0.0),
              "optimizer": ADAM_STATE_BYTES * n / shards}
    frozen = [(s, _bytes(t.get("teacher_dtype"))) for s in teachers]
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
    t = rc["train"]
    compute = _compute_bytes(t)
    row = _train_row(cfg, rc)
    rows = shape.rows_per_shard
    tokens = min(rows * row, shape.microbatch_tokens or rows * row)
    attention = str(t.get("attn_implementation", "eager"))
    chunk = min(shape.logit_chunk_tokens, tokens)
    passes = activation_bytes(student, tokens, row, residual, compute, bool(t.get("activation_checkpointing")),
                              attention) + logit_chunk_bytes(student, chunk)
    # one teacher per shard (a shard is one prompt's group, one domain): its final hidden states kept for the
    # chunked LM head, and one chunk of its logits
    passes += max((tokens * s.hidden * 2 + logit_chunk_bytes(s, chunk, copies=1) for s in teachers), default=0.0)
    sampling = kv_cache_bytes(student, rows, row, compute) + 2 * rows * student.vocab * 4
    ev = t.get("eval") or {}
    eval_rows = _eval_rows(ev, row)
    return {"sampling": sampling, "training pass": passes,
            "evaluation": kv_cache_bytes(student, eval_rows, row, compute) + 2 * eval_rows * student.vocab * 4}


def _eval_rows(ev: Mapping[str, Any], row: int) -> int:
    """Rows per evaluation batch: ``batch_size``, capped by ``max_batch_tokens`` where it is set."""
    rows = int(ev.get("batch_size") or 64)
    budget = ev.get("max_batch_tokens")
    return max(1, min(rows, int(budget) // row)) if budget else rows


def train_estimate(cfg: Mapping[str, Any], job: Any, jobs: Mapping[str, Any], hw: Hardware | None) -> JobEstimate:
    rc = job.config
    world = _gpus(cfg, "train")
    student = Shape.of(architecture(cfg, model_of(rc["student"]["from"], jobs)))
    refs = sorted({spec["from"] for spec in (rc.get("teachers") or {}).values()})   # one model per distinct teacher
    teachers = [Shape.of(architecture(cfg, model_of(ref, jobs))) for ref in refs]
    shape = RunShape.of(rc, world)
    static, residual = _train_static(cfg, rc, student, teachers, shape)
    phases = _train_phases(cfg, rc, student, teachers, shape, residual)
    engine = None
    if rc["train"].get("engine") == "vllm" and hw:   # sampling and evaluation inside the engine's reservation
        settings = rc["train"].get("vllm") or {}
        share = float(settings.get("gpu_memory_utilization", VLLM_DEFAULT_SHARE))
        phases = {"training pass": phases["training pass"], "vLLM engine": share * hw.memory_gib * GIB}
        # asleep during the update (level 1: KV cache freed, weights to host memory); the trainer's sampling
        # replica stays (it refreshes the engine's weights)
        engine = engine_start(student, gpu_bytes=hw.memory_gib * GIB, settings=settings,
                              max_model_len=max_model_len(settings, _train_row(cfg, rc)))
    est = JobEstimate(job.id, "train", world, static, phases, engine=engine)
    # the engine starts after the models load and before the first step: the trainer holds its weights (under hf
    # the sampling replica too) and its teachers then; gradients and Adam's state come with the first update
    est.trainer_at_start = static.get("weights", 0.0) + static.get("teachers", 0.0)
    # every process reads each model whole into host memory before it moves or shards it, one model at a time
    t = rc["train"]
    est.host = world * max([_bytes(t.get("param_dtype")) * params(student)]
                           + [_bytes(t.get("teacher_dtype")) * params(s) for s in teachers])
    # on resume every process first reads the checkpoint's trainer state (the full optimizer state, one process's
    # layout: opdgrpo.train.checkpoint.resume_point) and holds it while the models load, until the optimizer takes it
    est.host_resume = est.host + world * ADAM_STATE_BYTES * params(student)
    if hw:
        rollout, rest = _train_hours(cfg, job, jobs, hw, world, bool(rc["train"].get("activation_checkpointing")))
        new = int(t["max_new_tokens"])
        mean = max(lengths_for(cost_block(cfg), d, new).response for d in rc["train_domains"])
        evals, eval_rows, unsized = _evaluations(rc)
        if unsized:
            est.notes.append(f"evaluation of {', '.join(unsized)} not counted (no size or expected_rows)")
        prompt = max(lengths_for(cost_block(cfg), d, new).prompt for d in rc["eval_domains"] or rc["train_domains"])
        evaluation = (evals * 2 * params(student) * eval_rows * (prompt + mean)
                      / (world * hw.bf16_tflops * 1e12 * hw.sampling_mfu) / 3600)
        est.hours = rollout + rest + evaluation
        steps = max(1, shape.steps)
        step_h, eval_h = (rollout + rest) / steps, evaluation / evals
        if engine is not None and hw.memory_tbps:   # rollouts: one call per GPU a step; evaluation: a share each
            waves = steps * decode_seconds(engine, shape.rows_per_shard, new, mean, hw.memory_tbps) / 3600
            eval_waves = evals * decode_seconds(engine, math.ceil(eval_rows / world), new, mean, hw.memory_tbps) / 3600
            est.hours_high = max(rollout, waves) + rest + max(evaluation, eval_waves)
            step_h, eval_h = (max(rollout, waves) + rest) / steps, max(evaluation, eval_waves) / evals
        # SLURM's warning must leave time to finish the step or the evaluation under way (the trainer stops between
        # them: train._stop_before) and save a checkpoint: the full weights and Adam's state (fp32, 12 bytes a
        # parameter) gathered, written and hashed
        est.signal_lead_s = 3600 * max(step_h, eval_h) + CHECKPOINT_S_PER_GB * 12 * params(student) / 1e9
    return est


def _evaluations(rc: Mapping[str, Any]) -> tuple[int, int, list[str]]:
    """(evaluations a run makes, rows each samples, the held-out sets without a size to count): every
    ``eval_every`` steps from step 0, and the final one; each set's prompts (``size``, else ``expected_rows``)
    times its ``k``."""
    t = rc["train"]
    steps, every = int(rc["method"]["steps"]), int(t.get("eval_every") or 0)
    evals = (math.ceil(steps / every) if every else 0) + 1
    k, rows, unsized = int((t.get("eval") or {}).get("k") or 1), 0, []
    for d in rc["eval_domains"]:
        for name, spec in (rc["domains"][d].get("heldout") or {}).items():
            size = spec.get("size") or spec.get("expected_rows")
            if size is None:
                unsized.append(f"{d}.{name}")
                continue
            rows += int(size) * int(spec.get("k") or k)
    return evals, rows, unsized


def _train_hours(cfg: Mapping[str, Any], job: Any, jobs: Mapping[str, Any], hw: Hardware, world: int,
                 recompute: bool) -> tuple[float, float]:
    """(rollout hours, the rest): rollouts at ``sampling_mfu``, the passes and teachers at ``train_mfu``;
    checkpointing adds one forward (a third of a forward+backward) to the training pass. Evaluation: the caller."""
    flops = estimate_run(cfg, job, jobs).flops
    peak = world * hw.bf16_tflops * 1e12
    train = flops["train"] * (4 / 3 if recompute else 1.0) + flops["old_policy"] + flops["reference"] + flops["teacher"]
    return flops["rollout"] / hw.sampling_mfu / peak / 3600, train / hw.train_mfu / peak / 3600


# -- sampling-only jobs: base-model evaluation and S2's solve rates ------------------------------------------------
def _sampling_estimate(cfg: Mapping[str, Any], job_id: str, kind: str, models: Sequence[tuple[str, int]],
                       rows: int, row: int, rows_total: int, hw: Hardware | None, prompt: int) -> JobEstimate:
    """One GPU; each model sampled in turn (the largest sets the peak), ``rows`` rows of ``row`` positions a batch
    (``prompt`` of them the prompt), ``rows_total`` rows per model."""
    tokens = rows_total * row
    shapes = [(Shape.of(architecture(cfg, name)), b) for name, b in models]
    biggest, dtype_bytes = max(shapes, key=lambda sb: params(sb[0]) * sb[1])
    est = JobEstimate(job_id, kind, 1, {"weights": dtype_bytes * params(biggest)},
                      {"evaluation": max(kv_cache_bytes(s, rows, row, 2) + 2 * rows * s.vocab * 4 for s, _ in shapes)},
                      host=dtype_bytes * params(biggest))
    if hw:
        flops = sum(2 * params(s) * tokens for s, _ in shapes)
        est.hours = flops / (hw.bf16_tflops * 1e12 * hw.sampling_mfu) / 3600
    settings = _engine_alone(cfg)
    if hw and settings is not None:   # the engine reserves its share; the model's weights and its KV pool live inside
        reserved = float(settings.get("gpu_memory_utilization", VLLM_DEFAULT_SHARE)) * hw.memory_gib * GIB
        weights = 2 * params(biggest)   # the engine's bf16 copy
        est.static = {"weights": min(weights, reserved)}
        est.phases = {"vLLM engine alone": reserved - est.static["weights"]}   # its KV-cache pool
        # one engine at a time (S2: student, then teacher): the one with the least room decides
        starts = [engine_start(s, gpu_bytes=hw.memory_gib * GIB, settings=settings,
                               max_model_len=max_model_len(settings, row)) for s, _ in shapes]
        est.engine = min(starts, key=lambda e: e.pool - e.row)
        est.engine_key = "train.vllm_alone"
        if hw.memory_tbps and est.hours is not None:   # each model's rows in waves of what its pool holds
            mean = min(float(cost_block(cfg)["response_tokens"] or row - prompt), row - prompt)
            waves = sum(decode_seconds(x, rows_total, row - prompt, mean, hw.memory_tbps) for x in starts) / 3600
            est.hours_high = max(est.hours, waves)
    return est


def _engine_alone(cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """The settings of a sampling-only job's engine (``train.vllm`` with ``train.vllm_alone`` over it, as the plan
    merges them), or None under ``hf``."""
    train = cfg["train"]
    if train.get("engine") != "vllm":
        return None
    return {**(train.get("vllm") or {}), **(train.get("vllm_alone") or {})}


def base_estimate(cfg: Mapping[str, Any], job: Any, hw: Hardware | None) -> JobEstimate:
    ev = job.config["pretrain"].get("eval") or {}
    prompt = cost_block(cfg)["padded_prompt_tokens"] or 0
    row = int(prompt + int(ev.get("max_new_tokens") or cfg["train"]["max_new_tokens"]))
    block = job.config["model"]
    return _sampling_estimate(cfg, job.id, "base", [(job.config["name"], _bytes(block.get("dtype")))],
                              _eval_rows(ev, row), row, _heldout_rows(cfg, ev) * int(ev.get("k") or 1), hw, prompt)


def difficulty_estimate(cfg: Mapping[str, Any], job: Any, jobs: Mapping[str, Any], hw: Hardware | None) -> JobEstimate:
    rc, rule = job.config, job.config["rule"]
    names = [jobs[u].config["name"] for u in job.upstream if jobs[u].kind == "base"]
    models = [(n, _bytes(rc[role].get("dtype"))) for n, role in zip(names, ("student", "teacher"))]
    prompt = cost_block(cfg)["padded_prompt_tokens"] or 0
    row = int(prompt + int(rc["max_new_tokens"]))
    return _sampling_estimate(cfg, job.id, "difficulty", models, _eval_rows(rule, row), row,
                              int(rule.get("pool_size") or 0) * int(rule["k"]), hw, prompt)


def _heldout_rows(cfg: Mapping[str, Any], ev: Mapping[str, Any]) -> int:
    """Prompts a base evaluation scores: ``max_prompts`` per held-out set, where the config bounds it."""
    sets = sum(len(d.get("heldout") or {}) for d in cfg["domains"].values())
    return sets * int(ev.get("max_prompts") or 0)


# -- the plan ------------------------------------------------------------------------------------------------------
def estimate_jobs(cfg: Mapping[str, Any], plan: Any) -> list[JobEstimate]:
    """Every GPU job of the plan (tokenizer and report jobs run on CPUs and are left out)."""
    hw = Hardware.of(cfg)
    cfg = plan.config_for(cfg) if hasattr(plan, "config_for") else cfg   # with the plan's model variants (S6)
    out = []
    for job in plan.jobs.values():
        if job.kind == "train":
            out.append(train_estimate(cfg, job, plan.jobs, hw))
        elif job.kind == "base" and job.config["model"].get("source") in ("hub", "random"):
            out.append(base_estimate(cfg, job, hw))
        elif job.kind == "difficulty":
            out.append(difficulty_estimate(cfg, job, plan.jobs, hw))
    return out


def _host_limit(cfg: Mapping[str, Any], kind: str) -> float | None:
    mem_mb = ((cfg.get("resources") or {}).get(kind) or {}).get("mem_mb")
    return float(mem_mb) * 2**20 if mem_mb else None


def unfit(cfg: Mapping[str, Any], estimates: Sequence[JobEstimate]) -> list[str]:
    """One message per job whose peak exceeds the usable memory of ``hardware``, or whose models read into host
    memory exceed what the job asks SLURM for (``resources.<kind>.mem_mb``); none without ``hardware``."""
    hw = Hardware.of(cfg)
    if hw is None:
        return []
    out = [f"job `{e.job}`: {e.peak / GIB:.1f} GiB per GPU ({e.peak_phase} peaks) > {hw.budget / GIB:.1f} GiB usable "
           f"on {hw.name}; change: {e.advice()}" for e in estimates if e.peak > hw.budget]
    out += engine_refusals(hw, estimates)
    for e in estimates:
        limit = _host_limit(cfg, e.kind)
        if limit is not None and max(e.host, e.host_resume) > limit:
            when = "on resume (the trainer state held) while" if e.host_resume > e.host else "while"
            out.append(f"job `{e.job}`: {max(e.host, e.host_resume) / GIB:.0f} GiB of host memory {when} its models "
                       f"load (each of {e.gpus} processes reads one whole) > resources.{e.kind}.mem_mb "
                       f"({limit / GIB:.0f} GiB); change: a higher resources.{e.kind}.mem_mb")
    return out


def engine_refusals(hw: Hardware, estimates: Sequence[JobEstimate]) -> list[str]:
    """What vLLM itself would refuse as its engine starts (:mod:`opdgrpo.cost.engine_memory`), one message per job."""
    out = []
    total = hw.memory_gib * GIB
    for e in estimates:
        if e.engine is None:
            continue
        x, advice = e.engine, ADVICE["vLLM start"].format(settings=e.engine_key)
        if e.trainer_at_start + x.share > total:
            out.append(f"job `{e.job}`: vLLM would refuse to start: the trainer holds {e.trainer_at_start / GIB:.1f} "
                       f"GiB when its engine asks for {x.share / GIB:.1f} GiB ({e.engine_key}.gpu_memory_utilization) "
                       f"of the {total / GIB:.0f} GiB device; change: a lower {e.engine_key}.gpu_memory_utilization")
        if not x.starts:
            out.append(f"job `{e.job}`: vLLM would refuse to start: its KV pool ({x.share / GIB:.1f} GiB share - "
                       f"{x.weights / GIB:.1f} weights - {x.profile_peak / GIB:.1f} profiling peak = "
                       f"{x.pool / GIB:.1f} GiB) cannot hold one row of max_model_len {x.max_model_len} "
                       f"({x.row / GIB:.2f} GiB); change: {advice}")
    return out


def refuse_unfit(cfg: Mapping[str, Any], plan: Any) -> None:
    """Raise :class:`ConfigError` naming every job that would not fit (what the Snakefile calls before scheduling)."""
    problems = unfit(cfg, estimate_jobs(cfg, plan))
    if problems:
        raise ConfigError("jobs that would run out of GPU memory (`opdgrpo resources --profile "
                          f"{cfg.get('profile')}` shows every estimate; usable = hardware.memory_gib x "
                          "hardware.usable_fraction):\n  " + "\n  ".join(problems))


def table(cfg: Mapping[str, Any], estimates: Sequence[JobEstimate]) -> str:
    hw = Hardware.of(cfg)
    comps = ["weights", "gradients", "optimizer", "teachers"]
    head = ("| job | GPUs | " + " | ".join(comps) + " | peak phase (GiB) | peak GiB / GPU | fits | host GiB / node | hours "
            "| GPU-hours | vLLM rows at once |\n|---|---|" + "---|" * (len(comps) + 7))
    lines = [head]
    for e in estimates:
        cells = [f"{e.static.get(c, 0.0) / GIB:.1f}" for c in comps]
        fits = "-" if hw is None else ("yes" if e.peak <= hw.budget else "**no**")
        hours = "-" if e.hours is None else _span(e.hours, e.hours_high, ".1f")
        gpu_hours = "-" if e.hours is None else _span(e.hours * e.gpus, (e.hours_high or 0) * e.gpus or None, ".0f")
        lines.append(f"| {e.job} | {e.gpus} | " + " | ".join(cells) + f" | {e.peak_phase} "
                     f"({e.phases.get(e.peak_phase, 0.0) / GIB:.1f}) | {e.peak / GIB:.1f} | {fits} | {_host(e)} | {hours} "
                     f"| {gpu_hours} | {_rows_at_once(e)} |")
    return "\n".join(lines)


def _host(e: JobEstimate) -> str:
    return f"{e.host / GIB:.0f}" + (f", {e.host_resume / GIB:.0f}" if e.host_resume > e.host else "")


def _span(low: float, high: float | None, fmt: str) -> str:
    """``low``, or ``low-high`` where the decode-bound estimate is higher."""
    return format(low, fmt) if high is None or format(high, fmt) == format(low, fmt) else f"{low:{fmt}}-{high:{fmt}}"


def _rows_at_once(e: JobEstimate) -> str:
    """Rows of the engine's ``max_model_len`` its KV pool holds at once (more in one call wait or are preempted)."""
    if e.engine is None:
        return "-"
    return f"{e.engine.rows_at_once} of {e.engine.max_model_len}"


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
        estimates = estimate_jobs(cfg, build_plan(cfg))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(summary(cfg, estimates))
    problems = unfit(cfg, estimates)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems else 0


def summary(cfg: Mapping[str, Any], estimates: Sequence[JobEstimate]) -> str:
    hw = Hardware.of(cfg)
    if hw is None:
        where = "no `hardware` block in this profile: memory is estimated, not checked, and no wall time is given"
    else:
        where = (f"{hw.name}: {hw.memory_gib:g} GiB x {hw.usable_fraction:g} usable; wall time at "
                 f"{hw.bf16_tflops:g} TFLOP/s x MFU {hw.train_mfu:g} (training passes, teachers) and "
                 f"{hw.sampling_mfu:g} (sampling)"
                 + (f"; the high end bounds sampling by decode waves at {hw.memory_tbps:g} TB/s (continuous "
                    "batching of 'vLLM rows at once' rows; a step reads the weights and their KV cache; at least the "
                    "longest row's steps)" if hw.memory_tbps else "")
                 + "; training jobs' hours include their held-out evaluations. 'vLLM rows at once': rows of the "
                   "engine's max_model_len its KV pool holds after vLLM's start-up checks (its share less its "
                   "weights and profiling peak; a pool short of one row is refused here, as vLLM would refuse it)")
    on_cpus = sorted(kind for kind, block in (cfg.get("resources") or {}).items()
                     if isinstance(block, Mapping) and "gpu" in block and not block.get("gpu"))
    if hw is not None and on_cpus:   # e.g. the rehearsal: the paper's plan, run on CPUs
        where += (f"\n\nThis profile runs its {', '.join(on_cpus)} jobs on CPUs (resources.<kind>.gpu: 0): the figures "
                  f"below are what its plan would need on the {hw.name} of its `hardware` block, not what it uses here.")
    low = sum((e.hours or 0.0) * e.gpus for e in estimates)
    high = sum((e.hours_high or e.hours or 0.0) * e.gpus for e in estimates)
    total = (f"{low:,.0f}" if round(high) == round(low) else f"{low:,.0f}-{high:,.0f}")
    node = (f"{low / 8:,.0f}" if round(high) == round(low) else f"{low / 8:,.0f}-{high / 8:,.0f}")
    return (f"# Estimated peak GPU memory per device and wall time: profile `{cfg.get('profile')}`, "
            f"{len(estimates)} GPU jobs\n\n{where}\n\n{table(cfg, estimates)}\n\n"
            + (f"Total: {total} GPU-hours ({node} hours of one 8-GPU node)\n" if hw else "")
            + _signal_lead(estimates)
            + "".join(f"note: {line}\n" for line in _over_runtime(cfg, estimates))
            + "".join(f"note: job `{e.job}`: {line}\n" for e in estimates for line in e.notes))


def _signal_lead(estimates: Sequence[JobEstimate]) -> str:
    """The SLURM warning a training job needs (``--signal=TERM@<s>`` in workflow/profiles/slurm): the longer of a
    step and an evaluation, plus a checkpoint save, over the training jobs (high-end times)."""
    leads = [e for e in estimates if e.signal_lead_s]
    if not leads:
        return ""
    worst = max(leads, key=lambda e: e.signal_lead_s)
    return (f"SLURM warning lead: at least {math.ceil(worst.signal_lead_s / 60)} minutes for `{worst.job}` (a step or "
            "an evaluation, then a checkpoint save); set `--signal=TERM@<seconds>` in workflow/profiles/slurm "
            "(it ships 120 s, for the CPU profiles)\n")


def _over_runtime(cfg: Mapping[str, Any], estimates: Sequence[JobEstimate]) -> list[str]:
    """Jobs whose high-end hours exceed what they ask SLURM for (``resources.<kind>.runtime``, minutes)."""
    out = []
    for e in estimates:
        runtime = ((cfg.get("resources") or {}).get(e.kind) or {}).get("runtime")
        hours = e.hours_high or e.hours
        if runtime and hours and hours * 60 > float(runtime):
            out.append(f"job `{e.job}` may outlive resources.{e.kind}.runtime ({float(runtime) / 60:g} h): "
                       f"{hours:.1f} h at the high end (training jobs resume from their checkpoint; base and "
                       f"difficulty jobs start over)")
    return out
