"""The vLLM engine's share of its GPU (``gpu_memory_utilization``) and ``max_num_seqs``, chosen per job by the plan.

Why the plan chooses them: a fixed share sized for the job that needs the most room beside its trainer leaves every
other job's engine idle memory, and the rows its pool holds at once bound the decode (the largest cost line of the
paper's GPU-hours). What each job can give its engine is known before it runs (:mod:`opdgrpo.cost.resources`), so
each job's engine gets the most that fits:

- **beside a trainer** (a training job): the engine sleeps during the update (vLLM's sleep mode releases its weights,
  KV cache and its other pools at level 1 and 2 alike), so its share only has to fit beside the trainer's static
  memory (weights, gradients, optimizer state, teachers) within the usable memory, and vLLM's own start check (the
  share free beside what the trainer holds when the engine starts) must pass. The training pass runs while the
  engine sleeps and is held to the usable memory on its own. An engine that never sleeps
  (``enable_sleep_mode: false``) must also leave the training pass its room;
- **alone on its GPU** (base evaluation, S2's difficulty job): the usable memory;
- **max_num_seqs**: the rows of the job's ``max_model_len`` that pool holds, solved together with the profiling run's
  sampler pass over that many rows (:func:`opdgrpo.cost.engine_memory.fitted_seqs`); a sampling-only job that
  samples two models takes the smaller of their two.

A value set by hand (``train.vllm.*``, ``train.vllm_alone.*``, in conf or on the command line) is kept and checked
like any other (:func:`opdgrpo.cost.resources.unfit`). Either way the values are not part of a job's identity
(:data:`opdgrpo.job_identity.ENGINE_RUNTIME_KEYS`): they change how much memory the engine takes and how many rows it
decodes at once, not the distribution it samples, so a changed estimate reruns no job. The rules export every job's
values in one environment variable, keyed by the job's directory (:func:`engine_env`, workflow/rules/common.smk), and
each job puts its own back into its engine's settings (:func:`opdgrpo.job_identity.engine_settings_of`).
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

from opdgrpo.cost.engine_memory import EngineStart, engine_start, fitted_seqs
from opdgrpo.cost.job_estimate import EngineChoice, Hardware
from opdgrpo.cost.memory_model import Shape
from opdgrpo.job_identity import ENGINE_RUNTIME_KEYS, hand_set, job_key
from opdgrpo.run_shape import train_settings

#: Shares are chosen in steps of a hundredth, rounded down.
SHARE_STEP = 0.01


def share_of(room: float, hw: Hardware) -> float:
    """``room`` bytes as a share of the device, rounded down to :data:`SHARE_STEP` (at least one step: a share with
    no room is then refused as vLLM would refuse it, naming what fills the GPU)."""
    return max(SHARE_STEP, math.floor(room / hw.device_bytes / SHARE_STEP + 1e-9) * SHARE_STEP)


def colocated_room(hw: Hardware, static: float, trainer_at_start: float, training_pass: float, sleeps: bool) -> float:
    """The bytes an engine beside a trainer may take: the usable memory less the trainer's static memory (and less
    its training pass when the engine never sleeps), and no more than the device less what the trainer holds when
    the engine starts (vLLM's free-memory check)."""
    return min(hw.budget - static - (0.0 if sleeps else training_pass), hw.device_bytes - trainer_at_start)


def sleeps(settings: Mapping[str, Any]) -> bool:
    """Whether a training job's engine sleeps during the update: on GPUs it does unless ``enable_sleep_mode`` is set
    false (:func:`opdgrpo.train.engines.vllm_engine.engine_args`)."""
    return settings.get("enable_sleep_mode") is not False


def choose(shapes: Sequence[Shape], *, hw: Hardware, settings: Mapping[str, Any], key: str, room: float,
           max_model_lens: Sequence[int], processed: bool = False) -> tuple[EngineChoice, list[EngineStart]]:
    """The job's engine settings and each of its engines' starts (one per model it samples, in turn): a share set
    by hand, else ``room`` as a share; a ``max_num_seqs`` set by hand, else the rows each model's pool holds at
    that share (:func:`~opdgrpo.cost.engine_memory.fitted_seqs`), the smallest of them (one setting serves every
    engine of the job)."""
    share, seqs = hand_set(settings, key)
    choice = EngineChoice(share if share is not None else share_of(room, hw), seqs, share is not None,
                          seqs is not None, key, 0.0 if share is not None else room)
    at = {**settings, "gpu_memory_utilization": choice.gpu_memory_utilization}
    if seqs is None:
        fitted = min(fitted_seqs(s, gpu_bytes=hw.device_bytes, settings=at, max_model_len=n, processed=processed)
                     for s, n in zip(shapes, max_model_lens))
        choice = EngineChoice(choice.gpu_memory_utilization, fitted, choice.share_by_hand, False, key, choice.room)
    at["max_num_seqs"] = choice.max_num_seqs
    return choice, [engine_start(s, gpu_bytes=hw.device_bytes, settings=at, max_model_len=n, processed=processed)
                    for s, n in zip(shapes, max_model_lens)]


def _runs_on_gpus(cfg: Mapping[str, Any], kind: str) -> bool:
    """Whether jobs of ``kind`` run on GPUs: ``resources.<kind>.gpu`` above 0, or unset on a profile with a
    ``machine`` block (the planner's count per job, :mod:`opdgrpo.cost.gpu_counts`)."""
    gpu = ((cfg.get("resources") or {}).get(kind) or {}).get("gpu")
    return bool(cfg.get("machine")) if gpu is None else bool(gpu)


def _settings_of(job: Any) -> tuple[Mapping[str, Any], str] | None:
    """A job's engine settings and their key, or None where it has no vLLM engine."""
    rc = job.config
    if job.kind == "train":
        train = train_settings(rc["train"])
        return (train["vllm"], "train.vllm") if train["engine"] == "vllm" else None
    if job.kind in ("base", "difficulty") and rc.get("engine") == "vllm":
        return rc["vllm"], "train.vllm_alone"   # the plan gives an engine job the block (Planner.engine)
    return None


def engine_plan(cfg: Mapping[str, Any], plan: Any, estimates: Sequence[Any]) -> dict[str, EngineChoice]:
    """Every job with a vLLM engine: the settings the rules pass it. The plan's choice (its estimate's,
    :func:`opdgrpo.cost.resources.estimate_jobs`) where the profile has ``hardware`` and the job's kind runs on
    GPUs (``resources.<kind>.gpu``); elsewhere what is set by hand, which the job's config no longer carries
    (:func:`opdgrpo.job_identity.identity`), and None for the rest (vLLM's defaults)."""
    chosen = {e.job: e.engine_choice for e in estimates if getattr(e, "engine_choice", None) is not None}
    out = {}
    for job in plan.jobs.values():
        found = _settings_of(job)
        if found is None:
            continue
        if job.id in chosen and _runs_on_gpus(cfg, job.kind):
            out[job.id] = chosen[job.id]
            continue
        share, seqs = hand_set(*found)
        out[job.id] = EngineChoice(share, seqs, share is not None, seqs is not None, found[1])
    return out


def engine_env(choices: Mapping[str, EngineChoice], plan: Any) -> str:
    """What the rules export as :data:`opdgrpo.job_identity.ENGINE_ENV` (JSON): each job's values that are not left
    to vLLM, keyed by the job's output directory (the ``--out`` its rule passes; a job finds its own entry by it:
    :func:`opdgrpo.job_identity.engine_settings_of`)."""
    out = {}
    for job_id, choice in sorted(choices.items()):
        values = {name: getattr(choice, name) for name in ENGINE_RUNTIME_KEYS if getattr(choice, name) is not None}
        if values:
            out[job_key(plan.jobs[job_id].out_dir)] = values
    return json.dumps(out, sort_keys=True)
