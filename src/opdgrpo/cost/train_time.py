"""A training job's wall time, cost by cost, and the allocations it needs.

Per run (``hardware`` given): rollouts at ``sampling_mfu`` (the high end: at least the decode of each GPU's shard in
waves of its engine's pool), the training passes and teachers' forwards at ``train_mfu`` (activation checkpointing
adds a forward), every held-out evaluation set by set (each set's own k and its rows split over the processes),
code scoring of the rollouts and of LiveCodeBench, checkpoint saves (write and sha256, the other processes
waiting), and every attempt's start (models read, engine started, on resume the checkpoint hashed and read).

A training job resumes: SLURM warns it ``signal_lead_s`` before its limit, it checkpoints and exits, and Snakemake
submits it again (``preemptible-retries`` in workflow/profiles/slurm, planned as ``resources.train.allocations``).
So an allocation of ``resources.train.runtime`` minutes yields that much work less its start and the warning lead;
:func:`attempts` counts the allocations the high end needs, each paying its start again.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from opdgrpo.cost import overheads
from opdgrpo.cost.engine_memory import EngineStart, StepExtra, decode_seconds, processed_logprobs, step_extra
from opdgrpo.cost.heldout import EvalSet, sets_of
from opdgrpo.cost.job_estimate import Hardware, JobEstimate
from opdgrpo.cost.memory_model import Shape, params
from opdgrpo.cost.model import RunEstimate
from opdgrpo.run_shape import RunShape

#: The SLURM warning lead beyond a step (or an evaluation) and a save, for what the estimate leaves out.
LEAD_MARGIN = 1.25


def evaluation_sets(cfg: Mapping[str, Any], rc: Mapping[str, Any], thinking: bool) -> tuple[list[EvalSet], list[str]]:
    """What one held-out evaluation of a training run samples: every eval domain's sets in full, each at its own k
    (else ``train.eval.k``), answers up to ``train.max_new_tokens``."""
    t = rc["train"]
    return sets_of(cfg, rc["domains"], rc["eval_domains"], k=int((t.get("eval") or {}).get("k") or 1),
                   max_prompts=None, cap=int(t["max_new_tokens"]), thinking=thinking)


def _per_gpu(hw: Hardware, world: int) -> float:
    return world * hw.bf16_tflops * 1e12


def sampler_extras(rc: Mapping[str, Any], student: Shape) -> tuple[StepExtra, StepExtra]:
    """What vLLM's slow sampler path adds per row and decode step to a training job's (rollouts, evaluations)
    (:func:`opdgrpo.cost.engine_memory.step_extra`): the path is taken where the engine runs under
    ``processed_logprobs`` (rollouts at a ``train.temperature`` other than 1 with ``methods.grpo.engine_is_cap``:
    :func:`~opdgrpo.cost.engine_memory.processed_logprobs`), for every sampling of the engine; it costs most where the
    sampling cuts the distribution (evaluation's ``top_k``/``top_p``). On GPUs no request carries its own seed (the
    engine draws every row from its own stream), so the seeded rows' loop is not priced."""
    shape = RunShape.of(rc)
    processed = processed_logprobs(shape.rollout.temperature, shape.method.get("engine_is_cap"))
    ev = shape.evaluation
    rollouts = step_extra(student, processed=processed, seeded=False, top_k_top_p=False, asks_logprobs=processed
                          or shape.rollout.temperature == 1.0)
    evaluation = step_extra(student, processed=processed, seeded=False, top_k_top_p=ev.top_k > 0 or ev.top_p < 1,
                            asks_logprobs=False)
    return rollouts, evaluation


def _slow_note(est: JobEstimate, line: str, hours: float) -> None:
    """Say what the slow sampler path costs a line, where it costs anything."""
    if hours > 0:
        est.notes.append(f"{line}: vLLM's slow sampler path (processed_logprobs: train.temperature other than 1 with "
                         f"methods.grpo.engine_is_cap) adds {60 * hours:.1f} min at the high end")


def add_steps(est: JobEstimate, run: RunEstimate, rc: Mapping[str, Any], hw: Hardware, engine: EngineStart | None,
              mean: float, extra: StepExtra | None = None) -> None:
    """Rollouts, training passes and teachers, and the rollouts' code scoring; ``mean``: the longest domain's mean
    response (the decode bound's); ``extra``: the slow sampler's cost per row and step (:func:`sampler_extras`)."""
    world, flops = est.gpus, run.flops
    shape = RunShape.of(rc, world)
    steps, new = max(1, shape.steps), shape.rollout.max_new_tokens
    recompute = 4 / 3 if shape.settings["activation_checkpointing"] else 1.0
    rollout = flops["rollout"] / hw.sampling_mfu / _per_gpu(hw, world) / 3600
    high = rollout
    calls = max(1, shape.shards // world)   # engine calls per GPU a step: one per shard it samples
    if engine is not None and hw.memory_tbps:
        def decode(x: StepExtra | None) -> float:
            return steps * calls * decode_seconds(engine, shape.rows_per_shard, new, mean, hw.memory_tbps,
                                                  hw.decode_efficiency, x) / 3600

        high = max(rollout, decode(extra))
        _slow_note(est, "rollouts", high - max(rollout, decode(None)))
    est.add("rollouts", rollout, high)
    passes = flops["train"] * recompute + flops["old_policy"] + flops["reference"]
    est.add("training passes", passes / hw.train_mfu / _per_gpu(hw, world) / 3600)
    if flops["teacher"]:
        est.add("teachers", flops["teacher"] / hw.train_mfu / _per_gpu(hw, world) / 3600)
    # each process scores its own rows; a multi-domain step may give one process only code rows
    scoring = [0.0, 0.0]
    for d, n in run.rows.items():
        share = min(n, shape.rows_per_shard * calls)
        for end in (0, 1):
            scoring[end] = max(scoring[end], overheads.scoring_seconds(rc["domains"][d], share, False, end))
    est.add("code scoring", steps * scoring[0] / 3600, steps * scoring[1] / 3600)
    est.waits["code scoring"] = scoring[1]
    est.step_s = 3600 * sum(high for _, high in est.costs.values()) / steps


def add_evaluations(est: JobEstimate, rc: Mapping[str, Any], student: Shape, hw: Hardware,
                    engine: EngineStart | None, extra: StepExtra | None = None) -> None:
    """Every held-out evaluation: per set, its rows over the processes (one engine call each), then code scoring;
    ``extra``: the slow sampler's cost per row and step (:func:`sampler_extras`)."""
    shape = RunShape.of(rc, est.gpus)
    world, new, n = est.gpus, shape.evaluation.max_new_tokens, shape.evaluations
    peak = _per_gpu(hw, world) * hw.sampling_mfu
    one, slow = 0.0, 0.0
    for s in est.sets:
        share = math.ceil(s.rows / world)
        low = n * 2 * params(student) * s.rows * (s.prompt + s.response) / peak / 3600
        high = low
        if engine is not None and hw.memory_tbps:
            def decode(x: StepExtra | None) -> float:
                return n * decode_seconds(engine, share, new, s.response, hw.memory_tbps, hw.decode_efficiency, x) / 3600

            high = max(low, decode(extra))
            slow += high - max(low, decode(None))
        est.add("evaluation", low, high)
        code = [overheads.scoring_seconds(rc["domains"][s.domain], share, True, end) for end in (0, 1)]
        est.add("code scoring", n * code[0] / 3600, n * code[1] / 3600)
        one += 3600 * high / n + code[1]
        est.waits["evaluation share"] = max(est.waits.get("evaluation share", 0.0), 3600 * high / n)
        est.waits["code scoring"] = max(est.waits.get("code scoring", 0.0), code[1])
    est.eval_s = one
    _slow_note(est, "evaluation", slow)


def add_checkpoints(est: JobEstimate, rc: Mapping[str, Any], student: Shape) -> None:
    """A save every ``checkpoint_every`` steps and at the end: the main process writes and hashes, the rest wait."""
    steps, every = int(rc["method"]["steps"]), int(rc["train"].get("checkpoint_every") or 0)
    saves = math.ceil(steps / every) if every else 1
    save = overheads.checkpoint_seconds(params(student))
    est.add("checkpoints", saves * save / 3600)
    est.waits["checkpoint save"] = save


def attempt_start(cfg: Mapping[str, Any], rc: Mapping[str, Any], student: Shape, teachers: list[Shape],
                  engine: bool) -> tuple[float, float]:
    """Hours (low, high) one attempt spends before its first step: the student (bf16 on disk) and the teachers read,
    the engine started."""
    weights = 2 * params(student) + sum(2 * params(s) for s in teachers)
    return tuple((overheads.load_seconds(weights, end) + (overheads.ENGINE_START_S[end] if engine else 0.0)) / 3600
                 for end in (0, 1))   # type: ignore[return-value]


def allocations(cfg: Mapping[str, Any], kind: str) -> int:
    """Allocations a job of ``kind`` may take: ``resources.<kind>.allocations`` (the first and the resubmissions,
    ``preemptible-retries`` + 1 in workflow/profiles/slurm); 1 where unset."""
    return int(((cfg.get("resources") or {}).get(kind) or {}).get("allocations") or 1)


def runtime_h(cfg: Mapping[str, Any], kind: str) -> float | None:
    runtime = ((cfg.get("resources") or {}).get(kind) or {}).get("runtime")
    return float(runtime) / 60 if runtime else None


def attempts(cfg: Mapping[str, Any], est: JobEstimate, student: Shape) -> None:
    """The allocations the work needs at each end, and their starts (the first reads the models; every later one also
    hashes and reads the checkpoint it resumes from) as the ``start-ups`` cost. An allocation yields its runtime less
    its start and the warning lead; a job without a runtime takes one."""
    work = [sum(c[end] for c in est.costs.values()) for end in (0, 1)]
    resume = overheads.checkpoint_seconds(params(student)) / 3600
    est.waits["resume"] = 3600 * resume
    runtime, lead = runtime_h(cfg, est.kind), lead_seconds(est) / 3600
    counts = []
    for end in (0, 1):
        usable = (runtime - est.startup_h[end] - resume - lead) if runtime else math.inf
        counts.append(max(1, math.ceil(work[end] / usable)) if usable > 0 else 10**6)
    est.attempts = counts[1]
    est.add("start-ups", *(counts[end] * est.startup_h[end] + (min(counts[end], 10**3) - 1) * resume
                           for end in (0, 1)))


def lead_seconds(est: JobEstimate) -> float:
    """The SLURM warning a training job needs: the longer of a step and an evaluation under way (the trainer stops
    between them), then a checkpoint save, high end, with :data:`LEAD_MARGIN`."""
    return LEAD_MARGIN * (max(est.step_s, est.eval_s) + est.waits.get("checkpoint save", 0.0))
