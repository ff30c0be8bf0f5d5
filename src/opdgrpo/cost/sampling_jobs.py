"""The jobs that only sample: a base model's evaluation and S2's solve rates (memory per device and wall time).

A base job runs under torchrun with ``resources.base.gpu`` processes, one vLLM engine per GPU (tensor parallel 1,
``external_launcher``): each held-out set's rows are split into contiguous shares, one per process, and gathered
in rank order (:func:`opdgrpo.train.evaluation.batch_bounds`), so a set takes as long as one share, and the sets
run one after another. Every engine has its own KV pool (``vLLM rows at once``, per GPU). S2's difficulty job is
one process on one GPU that samples its student, then its teacher, each in its own engine.

Per set the low end puts the sampling FLOPs at ``hardware.sampling_mfu``; the high end is at least the decode of a
share in waves of the rows the pool holds (:func:`opdgrpo.cost.engine_memory.decode_seconds`). A thinking model's
answers are as long as ``cost_model.thinking`` says (:mod:`opdgrpo.cost.heldout`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from opdgrpo import schema
from opdgrpo.cost import engine_share, overheads
from opdgrpo.cost.engine_memory import EngineStart, decode_seconds
from opdgrpo.cost.heldout import EvalSet, base_cap, base_sets, response_tokens, thinks
from opdgrpo.cost.job_estimate import DTYPE_BYTES, Hardware, JobEstimate
from opdgrpo.cost.memory_model import Shape, kv_cache_bytes, params
from opdgrpo.cost.model import architecture, cost_block, lengths_for
from opdgrpo.run_shape import train_settings


@dataclass(frozen=True)
class Sampler:
    """One model a sampling job runs, and what it samples."""

    name: str
    dtype_bytes: int
    sets: list[EvalSet]
    cap: int                  # new tokens at most per answer


def _bytes(name: str | None) -> int:
    return DTYPE_BYTES[str(name or "float32")]


def engine_settings(cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """The settings of a sampling-only job's engine (``train.vllm`` with ``train.vllm_alone`` over it, as the plan
    merges them), or None under ``hf``."""
    train = train_settings(cfg["train"])
    if train["engine"] != "vllm":
        return None
    return {**train["vllm"], **train["vllm_alone"]}


def longest_prompt(cfg: Mapping[str, Any], domains: Sequence[str], cap: int) -> int:
    """The longest prompt block among ``domains`` (the cost model's padded prompt): the engine's ``max_model_len``
    is the job's longest prompt + the cap, and a base job samples every domain."""
    block = cost_block(cfg)
    return int(max(lengths_for(block, d, cap).padded_prompt for d in domains))


def _eval_rows(ev: Mapping[str, Any], row: int) -> int:
    """Rows per evaluation batch of the own sampler: ``batch_size`` (a base job's ``pretrain.eval`` read with its
    schema defaults, a difficulty job's rule), capped by ``max_batch_tokens`` where set."""
    rows = int(ev["batch_size"])
    budget = ev.get("max_batch_tokens")
    return max(1, min(rows, int(budget) // row)) if budget else rows


def estimate(cfg: Mapping[str, Any], job_id: str, kind: str, samplers: Sequence[Sampler], batch: Mapping[str, Any],
             prompt: int, gpus: int, hw: Hardware | None) -> JobEstimate:
    """Memory and time of a job sampling each of ``samplers`` in turn over ``gpus`` processes (one engine each);
    ``batch``: the own sampler's batch keys; ``prompt``: the longest prompt block."""
    shapes = [(Shape.of(architecture(cfg, s.name)), s) for s in samplers]
    biggest, first = max(shapes, key=lambda sb: params(sb[0]) * sb[1].dtype_bytes)
    row = prompt + max(s.cap for s in samplers)
    rows = _eval_rows(batch, row)
    est = JobEstimate(job_id, kind, gpus, {"weights": first.dtype_bytes * params(biggest)},
                      {"evaluation": max(kv_cache_bytes(s, rows, row, 2) + 2 * rows * s.vocab * 4 for s, _ in shapes)},
                      host=gpus * first.dtype_bytes * params(biggest))   # each process reads the model whole (CPU)
    est.sets = list(samplers[-1].sets)
    settings = engine_settings(cfg)
    if settings is not None:   # the engine reads the weights onto its GPU; the job's own model is built on `meta`
        est.host = 0.0
    starts: list[EngineStart | None] = [None] * len(shapes)
    if hw and settings is not None:   # the engine reserves its share; the weights and the KV pool live inside
        # alone on its GPU: the usable memory is the engine's (the job's own model is on `meta`)
        est.engine_choice, starts = engine_share.choose(
            [s for s, _ in shapes], hw=hw, settings=settings, key="train.vllm_alone", room=hw.budget,
            max_model_lens=[max(int(settings.get("max_model_len") or 0), prompt + x.cap) for _, x in shapes])
        reserved = starts[0].share
        est.static = {"weights": min(2 * params(biggest), reserved)}   # the engine's bf16 copy
        est.phases = {"vLLM engine alone": reserved - est.static["weights"]}   # its KV-cache pool
        est.engine = min(starts, key=lambda e: e.pool - e.row)   # one engine at a time: the tightest decides
        est.engine_key = "train.vllm_alone"
    if hw:
        for (shape, sampler), start in zip(shapes, starts):
            _time(cfg, est, shape, sampler, start, hw, kind)
    return est


def _time(cfg: Mapping[str, Any], est: JobEstimate, shape: Shape, sampler: Sampler, start: EngineStart | None,
          hw: Hardware, kind: str) -> None:
    """Add one model's sampling, code scoring and start-up to ``est`` (each set's share per process in turn)."""
    line = "evaluation" if kind == "base" else "solve rates"
    peak = hw.bf16_tflops * 1e12 * hw.sampling_mfu
    for s in sampler.sets:
        share = math.ceil(s.rows / est.gpus)
        low = 2 * params(shape) * s.rows * (s.prompt + s.response) / (est.gpus * peak) / 3600
        high = low
        if start is not None and hw.memory_tbps:
            high = max(low, decode_seconds(start, share, sampler.cap, s.response, hw.memory_tbps,
                                           hw.decode_efficiency) / 3600)
        est.add(line, low, high)
        domain = cfg["domains"].get(s.domain) or {}
        code = [overheads.scoring_seconds(domain, share, kind == "base", end) / 3600 for end in (0, 1)]
        est.add("code scoring", *code)
        # a process that finishes its share waits in the gather for the slowest one (its share may hold every
        # long answer), and the scoring after it
        est.waits["evaluation share"] = max(est.waits.get("evaluation share", 0.0), 3600 * high)
        est.waits["code scoring"] = max(est.waits.get("code scoring", 0.0), 3600 * code[1])
    weights = sampler.dtype_bytes * params(shape)
    engine = overheads.ENGINE_START_S if start is not None else (0.0, 0.0)
    up = [(overheads.load_seconds(weights, end) + engine[end]) / 3600 for end in (0, 1)]
    est.add("start-ups", *up)
    est.startup_h = (est.startup_h[0] + up[0], est.startup_h[1] + up[1])
    est.waits["engine start"] = max(est.waits.get("engine start", 0.0), 3600 * up[1])


def base_estimate(cfg: Mapping[str, Any], job: Any, hw: Hardware | None, gpus: int | None = None) -> JobEstimate:
    """A base job: the model's evaluation over every held-out set, split over ``gpus`` processes (default
    ``resources.base.gpu``; the machine's planner asks at each count it considers)."""
    rc = job.config
    name = rc["name"]
    cap = base_cap(cfg, rc)
    sets, unsized = base_sets(cfg, rc, thinks(cfg, name))
    gpus = gpus or int(((cfg.get("resources") or {}).get("base") or {}).get("gpu") or 1)
    prompt = longest_prompt(cfg, sorted(rc.get("domains") or cfg["domains"]), cap)
    est = estimate(cfg, job.id, "base", [Sampler(name, _bytes(rc["model"].get("dtype")), sets, cap)],
                   schema.with_defaults(rc["pretrain"].get("eval") or {}, "config.schema.yaml#/$defs/pretrain", "eval"),
                   prompt, gpus, hw)
    est.notes += [f"evaluation of {u} not counted (no size or expected_rows)" for u in unsized]
    return est


def difficulty_estimate(cfg: Mapping[str, Any], job: Any, jobs: Mapping[str, Any], hw: Hardware | None) -> JobEstimate:
    """S2's difficulty job: ``pool_size`` prompts x ``k`` answers from the student, then from the teacher (a thinking
    teacher at its thinking lengths), on one GPU."""
    rc, rule = job.config, job.config["rule"]
    names = [jobs[u].config["name"] for u in job.upstream if jobs[u].kind == "base"]
    domain, cap = rc["domain"], int(rc["max_new_tokens"])
    samplers = []
    for name, role in zip(names, ("student", "teacher")):
        sampling = rc[role].get("sampling") or {}
        own_cap = int(sampling.get("max_new_tokens") or cap)
        prompt_len = lengths_for(cost_block(cfg), domain, own_cap).prompt
        pool = EvalSet(domain, "pool", int(rule.get("pool_size") or 0), int(rule["k"]),
                       response_tokens(cfg, domain, own_cap, thinks(cfg, name)), prompt_len)
        samplers.append(Sampler(name, _bytes(rc[role].get("dtype")), [pool], own_cap))
    return estimate(cfg, job.id, "difficulty", samplers, rule, longest_prompt(cfg, [domain], cap), 1, hw)

