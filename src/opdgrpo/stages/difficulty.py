"""S2's data selection: estimate how often the base student and an external teacher solve each training prompt,
then cut the prompts into subsets by those two solve rates.

The paper forms 8 math subsets "from solve rates of a Qwen3-1.7B student and a Qwen3-4B thinking teacher" without
stating its cut points. Our rule, configurable in ``conf/study/s2.yaml``:

1. Draw ``pool_size`` prompts of the domain's training pool (a fixed, seeded sample; ``null``: every prompt).
2. Sample ``k`` completions of each prompt from each model at ``temperature``; solve rate = share rewarded 1.
3. Rank the prompts by the student's rate and cut the ranking into ``student_bins`` groups of equal size; rank each
   group by the teacher's rate and cut it into ``teacher_bins`` equal groups. Ties are broken by a hash of the
   prompt, so the cut is deterministic. ``student_bins x teacher_bins`` subsets (2 x 4 = 8 by default), each named
   ``s<i>t<j>`` (i, j = 0 for the lowest rates).

Rank cuts instead of fixed rate edges because tiny models' rates bunch at a few values (k = 8 allows 9): fixed edges
would leave subsets empty, equal-size cuts never do, and every subset trains on the same number of prompts.

The sampling FLOPs are recorded in ``done.json`` but are data selection, not post-training: they are not charged to
any run (the paper's curves count training FLOPs only).

Under ``train.engine: vllm`` each model is sampled in a process of its own (spawned, one after the other), which
starts one engine at the job's share of the GPU (``train.vllm_alone``), samples, returns the rates and FLOPs, and
exits. Why not two engines in turn in one process: with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine in the
caller's process, as every job here runs it) vLLM 0.32 does not give back all the first engine's GPU memory when it
shuts down (its engine core freezes the garbage collector's heap as it starts), and the second engine refuses to
start when the free memory is below its share. A process that exits gives back all of it. The job stays one DAG
job (its identity, its place in the plan and the 16 runs waiting on it unchanged); ``done.json`` records each model's
sampling process and where vLLM put its engine (``samplers``). Under ``hf`` both models are sampled in the job's own
process, as before, and its results are byte-identical to what they were.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from opdgrpo import gpu_slots, schema
from opdgrpo.domains import Domain, Task, build_domain
from opdgrpo.progress import Progress
from opdgrpo.runio import write_json, write_yaml
from opdgrpo.subsets import bin_by_rates
from opdgrpo.train import numerics
from opdgrpo.train.engines import checkpoint_engine
from opdgrpo.train.evaluation import batch_bounds
from opdgrpo.train.finished import verify_finished
from opdgrpo.train.models import autocast, load_model
from opdgrpo.train.precision import configured as configured_precision
from opdgrpo.train.precision import report as precision_report
from opdgrpo.train.precision import resolve as resolve_precision
from opdgrpo.train.rollout import PromptFormat, sample_and_score
from opdgrpo.train.tokenizer import load_tokenizer

log = logging.getLogger("opdgrpo.stages.difficulty")


@torch.no_grad()
def solve_rates(model, tokenizer, domain: Domain, tasks: Sequence[Task], *, k: int, temperature: float,
                max_new_tokens: int, batch_size: int, seed: int, fmt: PromptFormat = PromptFormat(),
                top_p: float = 1.0, top_k: int = 0, progress: Progress | None = None,
                max_batch_tokens: int | None = None, engine=None) -> tuple[list[float], float]:
    """Per task, the share of ``k`` sampled completions the verifier rewards; plus the sampling FLOPs.
    ``progress``: a line in the job's log per batch sampled. ``max_batch_tokens`` (``studies.S2.max_batch_tokens``):
    each batch's KV-cache budget, as in evaluation (:func:`opdgrpo.train.evaluation.batch_bounds`); the sampled answers
    depend on the batching (one generator draws for every batch), their distribution does not. ``engine``: what
    samples (:mod:`opdgrpo.train.engines`, holding ``model``'s weights); None: the project's sampler on ``model``. An
    engine that schedules its own batches (vLLM) gets all ``len(tasks) x k`` rows in one call, asking for no
    log-probs (the rates read none), seeded per row on CPUs and not on GPUs (vLLM's fast sampler)."""
    model.eval()
    # the generator lives where the sampler draws: the engine's device (a model that only gives an engine its config
    # is on `meta`, where no generator exists), else the model's
    generator = torch.Generator(device=getattr(engine, "device", None) or next(model.parameters()).device).manual_seed(seed)
    repeated = [t for t in tasks for _ in range(k)]
    rewards, flops = [], 0.0
    bounds = batch_bounds(tokenizer, repeated, batch_size=batch_size, max_batch_tokens=max_batch_tokens,
                          max_new_tokens=max_new_tokens, fmt=fmt, key="studies.S2.max_batch_tokens", engine=engine)
    if progress:
        progress.total = len(bounds)   # the caller's estimate counts batch_size rows per batch
    for batch, (start, end) in enumerate(bounds):
        t0 = time.time()
        chunk = sample_and_score(model, tokenizer, {domain.name: domain}, repeated[start:end],
                                 max_new_tokens=max_new_tokens, temperature=temperature, generator=generator,
                                 fmt=fmt, top_p=top_p, top_k=top_k, engine=engine)
        rewards.append(chunk.rewards)
        flops += chunk.rollouts.flops
        if progress:
            progress.step(batch + 1, {"solved": round(float(chunk.rewards.mean()), 4), "flops": flops}, time.time() - t0)
    per_task = torch.cat(rewards).view(len(tasks), k).mean(dim=1)
    return [float(r) for r in per_task], flops


def select(cfg: Mapping[str, Any], out_dir: Path) -> dict[str, Any]:
    """The ``difficulty`` job: rates of both models on the sampled pool, the subsets, written to ``subsets.json``."""
    started = time.time()
    torch.set_num_threads(int(cfg["threads"]))
    for role in ("student", "teacher"):   # their base jobs' outputs whole, before anything is written here
        verify_finished(Path(cfg[role]["path"]))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_yaml(out_dir / "config.yaml", dict(cfg))
    rule, domain_name = cfg["rule"], cfg["domain"]
    domain = build_domain(cfg["domains"][domain_name])
    pool = domain.training_pool()
    size = len(pool) if rule["pool_size"] is None else int(rule["pool_size"])
    if size > len(pool):
        raise ValueError(f"config key `studies.S2.pool_size` ({size}) exceeds the {domain_name} training pool ({len(pool)} prompts)")
    tasks = random.Random(f"s2-pool-{cfg['seed']}").sample(pool, size)
    rates, flops, samplers = {}, {}, {}
    if cfg.get("engine") == "vllm":   # one engine per process: each model's rates from a process of its own
        for role in ("student", "teacher"):
            # the first process checks both models before its engine starts: a teacher vLLM cannot run is refused
            # before the student is sampled, not after
            check = ("student", "teacher") if role == "student" else ()
            rates[role], flops[role], samplers[role] = _in_own_process(cfg, role, tasks, check)
    else:
        tokenizer = load_tokenizer(Path(cfg["tokenizer"]))
        for role in ("student", "teacher"):
            rates[role], flops[role], _ = model_rates(cfg, role, tasks, domain, tokenizer)
    bins = bin_by_rates([t.prompt for t in tasks], rates["student"], rates["teacher"],
                        int(rule["student_bins"]), int(rule["teacher_bins"]))
    subsets = {}
    for name, idx in bins.items():
        s_rates, t_rates = [rates["student"][i] for i in idx], [rates["teacher"][i] for i in idx]
        subsets[name] = {
            "prompts": [tasks[i].prompt for i in idx],
            "student_rate": sum(s_rates) / len(idx), "teacher_rate": sum(t_rates) / len(idx),
            "student_range": [min(s_rates), max(s_rates)], "teacher_range": [min(t_rates), max(t_rates)],
        }
    write_json(out_dir / "subsets.json", {"domain": domain_name, "rule": rule, "subsets": subsets})
    summary = {"domain": domain_name, "prompts": size, "selection_flops": flops, "counted": False,
               "subsets": {n: {k: v for k, v in s.items() if k != "prompts"} | {"size": len(s["prompts"])}
                           for n, s in subsets.items()},
               "wall_s": round(time.time() - started, 1), "numerics": numerics.report()}
    if samplers:   # where each model was sampled: its own process, its engine as vLLM placed it
        summary["samplers"] = samplers
    gpu_slots.record_into(summary)   # on a machine: the GPU slots the job ran on (opdgrpo.launch)
    write_json(out_dir / "done.json", summary)
    return summary


def model_rates(cfg: Mapping[str, Any], role: str, tasks: Sequence[Task], domain: Domain,
                tokenizer) -> tuple[list[float], float, dict[str, Any]]:
    """One model's (``role``: student or teacher) solve rates on ``tasks`` and its sampling FLOPs, in this process;
    plus, under ``train.engine: vllm``, where it sampled (this process's id, its parent's, the engine's placement and
    the precision this process resolved)."""
    rule = cfg["rule"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    prompt_format = cfg.get("prompt_format") or {}
    # A model with its own sampling settings (a thinking teacher: temperature 0.6, top-p 0.95, top-k 20,
    # thinking on) samples with them; otherwise at the rule's temperature from the full distribution.
    sampling = schema.with_defaults(cfg[role].get("sampling") or {}, "model", "sampling")
    fmt = PromptFormat.from_config({**prompt_format, **({"enable_thinking": sampling["enable_thinking"]}
                                                       if "enable_thinking" in sampling else {}),
                                    **({"stop_strings": cfg[role]["stop_strings"]} if "stop_strings" in cfg[role] else {})})
    dtype = getattr(torch, str(cfg[role].get("dtype") or "float32"))
    engine_on = cfg.get("engine") == "vllm"   # then the engine samples; the model gives the config (no weights read)
    model = load_model(cfg[role]["path"], dtype=dtype, trainable=False,
                       attn_implementation=str(cfg[role].get("attn_implementation") or schema.default("model", "attn_implementation")),
                       device="meta" if engine_on else device)
    batches = -(-len(tasks) * int(rule["k"]) // int(rule["batch_size"]))
    max_new_tokens = int(sampling.get("max_new_tokens", cfg["max_new_tokens"]))
    where: dict[str, Any] = {}
    with autocast(resolve_precision(configured_precision(rule, "train.precision"), device), device.type), \
            checkpoint_engine(cfg, cfg[role]["path"], model, tokenizer=tokenizer, tasks=tasks, fmt=fmt,
                              max_new_tokens=max_new_tokens) as engine:
        rates, flops = solve_rates(
            model, tokenizer, domain, tasks, k=int(rule["k"]),
            temperature=float(sampling.get("temperature", rule["temperature"])),
            top_p=float(sampling["top_p"]), top_k=int(sampling["top_k"]), fmt=fmt,
            max_new_tokens=max_new_tokens,
            batch_size=int(rule["batch_size"]), seed=int(cfg["seed"]), max_batch_tokens=rule.get("max_batch_tokens"),
            progress=Progress(f"difficulty-{cfg['domain']} {role}", batches), engine=engine)
        if engine is not None:
            where = {"pid": os.getpid(), "parent_pid": os.getppid(), "engine": dict(engine.placement),
                     "precision": precision_report()}   # the process's own decision (the job's report has none)
    del model
    return rates, flops, where


def check_engine_models(cfg: Mapping[str, Any], roles: Sequence[str]) -> None:
    """The head sizes of the models ``roles`` names against vLLM's CPU attention (on a CPU; a GPU has no such limit),
    each refused with the model's path before any engine starts."""
    if torch.cuda.is_available() or not roles:
        return
    from transformers import AutoConfig

    from opdgrpo.train.engines.vllm_engine import check_cpu_head_dim, import_vllm

    import_vllm()   # its environment, before the check imports a part of it
    for role in roles:
        check_cpu_head_dim(AutoConfig.from_pretrained(cfg[role]["path"]), Path(cfg[role]["path"]))


def _in_own_process(cfg: Mapping[str, Any], role: str, tasks: Sequence[Task],
                    check: Sequence[str]) -> tuple[list[float], float, dict[str, Any]]:
    """:func:`model_rates` in a spawned process that has exited when this returns, so its engine's GPU memory is all
    given back before the next model's engine starts (``check``: the roles whose models that process checks first,
    :func:`check_engine_models`). Spawned, not forked: the child starts without this process's threads and CUDA
    state. Its exception is raised here (its traceback is in the job's log); a process that dies (killed, out of
    memory) is named with its exit code."""
    started, context = time.time(), multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_sample_model, name=f"difficulty-{role}",
                            args=(send, dict(cfg), role, list(tasks), logging.getLogger().level, tuple(check)))
    child.start()
    send.close()   # the child holds the sending end: its exit ends the pipe
    try:
        status, payload = receive.recv()
    except EOFError:
        child.join()
        raise RuntimeError(f"S2's {role} sampling process ({cfg[role]['path']}) died before it returned its solve "
                           f"rates (exit code {child.exitcode}: killed, or out of memory); its log lines are above") from None
    finally:
        receive.close()
    child.join()
    if status == "error":
        raise payload
    log.info("difficulty: the %s's solve rates from process %d, which has exited (%.1f s)", role, payload[2]["pid"],
             time.time() - started)
    return payload


def _sample_model(send, cfg: dict[str, Any], role: str, tasks: list[Task], log_level: int,
                  check: tuple[str, ...]) -> None:
    """The spawned process of :func:`_in_own_process`: the job's settings (threads, logging), the model checks, its
    domain and tokenizer, then :func:`model_rates`; its result (or its exception) sent back through ``send``. It
    ends with ``os._exit`` once its streams are flushed: the engine is already shut down, nothing of it is on disk,
    and the interpreter's own teardown of vLLM's objects took seconds more per model on a CPU."""
    code = 0
    try:
        logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        torch.set_num_threads(int(cfg["threads"]))
        check_engine_models(cfg, check)
        domain = build_domain(cfg["domains"][cfg["domain"]])
        send.send(("ok", model_rates(cfg, role, tasks, domain, load_tokenizer(Path(cfg["tokenizer"])))))
    except BaseException as err:   # noqa: BLE001 - every failure goes back to the job's process, which raises it
        code = 1
        log.error("difficulty: sampling the %s failed", role, exc_info=True)
        try:
            send.send(("error", err))
        except Exception:   # an exception that does not pickle: its text
            send.send(("error", RuntimeError(f"S2's {role} sampling process: {type(err).__name__}: {err}")))
    finally:
        send.close()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
