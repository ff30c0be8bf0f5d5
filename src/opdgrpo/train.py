"""The post-training loop shared by GRPO and OPD, top to bottom in one function.

Each step: draw prompts -> sample rollouts with a KV cache -> (GRPO) rewards and group advantages or
(OPD) one forward of each frozen teacher over prompt + completion -> loss -> optimiser step -> one
ledger line with the FLOPs of every component. Held-out avg@k at step 0, every ``eval_every`` steps and
at the end; a checkpoint every ``checkpoint_every`` steps. A rerun resumes from the newest checkpoint
with the same config, dropping ledger and eval lines written after it, so no step is counted twice.
Everything random is seeded by (seed, step), so a resumed run repeats exactly what it would have done.

Rewards, student logits, teacher logits, the loss and the gradient norm are checked for NaN/inf as soon as they
exist; ``train.nonfinite`` says whether a non-finite step stops the run (``stop``, the default; the step leaves no
ledger line and no checkpoint) or is dropped without an optimiser step (``skip``, at most
``train.max_nonfinite_skips`` steps in a row).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import torch

from . import faults, numerics
from . import flops as F
from .checkpoint import clear_run, config_hash, restore_rng, resume_point, save_checkpoint
from .distributed import Workers, shard_bounds
from .subsets import load_subset
from .domains import Task, build_domain
from .evaluation import evaluate, heldout_for
from .inference import FrozenForward
from .losses import aggregation_count, group_advantages, grpo_loss, token_logprobs, topk_reverse_kl
from .models import autocast, load_model, parameter_count
from .peak import matmul_dtype, matmul_peak, mfu_summary
from .rollout import PromptFormat, sample_and_score
from .runio import IN_DOMAIN_SET, append_jsonl, keep_records, read_jsonl, write_json, write_yaml
from .tokenizer import load_tokenizer

log = logging.getLogger("opdgrpo.train")


class Interrupted(RuntimeError):
    """SIGTERM/SIGINT arrived; the run checkpointed and stopped. A rerun resumes it."""


class NonFinite(FloatingPointError):
    """A step produced NaN or inf in ``component`` (rewards, student_logits, teacher_logits, loss, gradients)."""

    def __init__(self, message: str, component: str):
        super().__init__(message)
        self.component = component


#: Keys of ``train`` that only decide what happens after a non-finite step: a run stopped by one is the same run
#: under either setting up to that step, so they stay out of the checkpoint's config hash (switching to ``skip``
#: after a stop resumes the run instead of starting it over).
NONFINITE_KEYS = ("nonfinite", "max_nonfinite_skips")


def check_finite(x: torch.Tensor, component: str, where: str, label: str | None = None) -> None:
    """Raise :class:`NonFinite` if ``x`` holds a NaN or an inf: one ``isfinite().all()`` pass over the tensor."""
    if not bool(torch.isfinite(x).all()):
        what = "NaN" if bool(torch.isnan(x).any()) else "inf"
        text = label or component.replace("_", " ")
        verb = "is" if x.dim() == 0 else "contain"
        raise NonFinite(f"{where}: {text} {verb} {what}", component)


def domain_counts(pools: dict[str, list[Task]], prompts_per_step: int, mix: str) -> dict[str, int]:
    """How many prompts of each domain a step draws: equal shares or shares by pool size."""
    names = sorted(pools)
    if mix == "balanced":
        weights = {d: 1.0 for d in names}
    elif mix == "instance":
        weights = {d: float(len(pools[d])) for d in names}
    else:
        raise ValueError(f"config key `train.mix` must be 'balanced' or 'instance', got {mix!r}")
    total = sum(weights.values())
    exact = {d: prompts_per_step * w / total for d, w in weights.items()}
    counts = {d: int(exact[d]) for d in names}
    for d in sorted(names, key=lambda d: exact[d] - counts[d], reverse=True)[: prompts_per_step - sum(counts.values())]:
        counts[d] += 1
    return counts


@functools.lru_cache(maxsize=32)
def _epoch_order(seed: int, domain: str, epoch: int, size: int) -> tuple[int, ...]:
    """A domain's shuffle of its pool for one epoch. Drawn once, not once per prompt: a 3000-prompt permutation per
    drawn prompt had cost a tiny GRPO step 8.5 ms, and a 17k-prompt hub pool would cost seconds."""
    return tuple(random.Random(f"{seed}-{domain}-{epoch}").sample(range(size), size))


def batch_tasks(pools: dict[str, list[Task]], counts: dict[str, int], step: int, seed: int) -> list[Task]:
    """The prompts of one step: each domain walks its own per-epoch shuffle, so any step is reproducible."""
    tasks = []
    for d in sorted(pools):
        pool, n = pools[d], counts[d]
        for idx in range(step * n, (step + 1) * n):
            epoch, pos = divmod(idx, len(pool))
            tasks.append(pool[_epoch_order(seed, d, epoch, len(pool))[pos]])
    return tasks


def upstream_fingerprint(cfg: dict[str, Any]) -> dict[str, str]:
    """What identifies the checkpoints this run starts from and distils: their run's ``done.json``.

    A rerun of an upstream job (a retrained teacher) leaves this run's config unchanged but its checkpoint
    stale; folding the upstream summaries into the checkpoint's hash makes such a run start over.
    """
    paths = {"student": cfg["student"]["path"], **{f"teacher:{d}": t["path"] for d, t in cfg.get("teachers", {}).items()}}
    if cfg.get("train_subset"):
        paths["subsets"] = cfg["train_subset"]["file"]
    prints = {}
    for role, path in paths.items():
        done = Path(path).parent / "done.json"
        prints[role] = done.read_text() if done.is_file() else str(path)
    return prints


def restrict_to_subset(pools: dict[str, list[Task]], heldout: dict[str, dict[str, list[Task]]], spec: dict[str, Any]) -> dict[str, Any]:
    """Train on one S2 subset only, and score its prompts as the ``in_domain`` eval set (the paper's in-domain accuracy).

    Returns the subset's size and solve rates, which ``done.json`` keeps so the report can rank subsets.
    """
    domain = spec["domain"]
    subset = load_subset(Path(spec["file"]), spec["subset"])
    wanted = subset["prompts"]
    by_prompt = {t.prompt: t for t in pools[domain]}
    missing = [p for p in wanted if p not in by_prompt]
    if missing:
        raise ValueError(f"{spec['file']}: subset {spec['subset']} has {len(missing)} prompts outside the {domain} training pool "
                         f"(e.g. {missing[0]!r}); the domain config changed since the subsets were made: rerun the difficulty job")
    pools[domain] = [by_prompt[p] for p in wanted]
    heldout.setdefault(domain, {})[IN_DOMAIN_SET] = pools[domain][: int(spec.get("eval_size") or len(wanted))]
    return {"subset": spec["subset"], "size": len(wanted),
            **{k: v for k, v in subset.items() if k.endswith("_rate") or k.endswith("_range")}}


def _position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def train(cfg: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    # Bad input fails here, before any compute and before the run directory is touched (a finished run stays
    # intact); then one process at a time owns the run directory.
    from .guards import check_run_inputs, run_dir_lock

    check_run_inputs(cfg)
    workers = Workers(str(cfg["train"].get("distributed", "ddp")))
    try:
        # The main process owns the run directory; the others only read checkpoints it wrote.
        with run_dir_lock(Path(run_dir)) if workers.is_main else contextlib.nullcontext():
            return _train(cfg, Path(run_dir), workers)
    finally:
        workers.close()


#: Seeds of a step's rollout shards: shard s of step t samples with seed * SEED_STRIDE + t + s * SHARD_STRIDE, so
#: shard 0 keeps the seed a one-shard step always had.
SEED_STRIDE, SHARD_STRIDE = 1_000_003, 7_919_113


def _train(cfg: dict[str, Any], run_dir: Path, workers: Workers) -> dict[str, Any]:
    started = time.time()
    torch.set_num_threads(int(cfg["threads"]))
    # The tokenizer's batch calls (Rust, rayon) would otherwise use every core of a machine Snakemake already fills
    # with one-thread jobs; a value set by the user wins.
    os.environ.setdefault("RAYON_NUM_THREADS", str(int(cfg["threads"])))
    method, shared = cfg["method"], cfg["train"]
    kind, steps, seed = method["name"], int(method["steps"]), int(cfg["seed"])  # validated by check_run_inputs
    per_prompt = int(method["group_size"] if kind == "grpo" else method["rollouts_per_prompt"])
    precision = str(shared.get("precision", "fp32"))
    nonfinite = str(shared.get("nonfinite", "stop"))
    max_skips = int(shared.get("max_nonfinite_skips", 3))
    if nonfinite not in ("stop", "skip") or max_skips < 0:
        raise ValueError(f"config keys `train.nonfinite` must be 'stop' or 'skip' and `train.max_nonfinite_skips` >= 0, "
                         f"got {nonfinite!r} and {max_skips}")
    prompts_per_step = int(shared["prompts_per_step"])
    shards = int(shared.get("micro_batches") or workers.world)
    if shards % workers.world or prompts_per_step % shards:
        raise ValueError(f"config key `train.micro_batches` ({shards}) must be a multiple of the number of processes "
                         f"({workers.world}) and divide `train.prompts_per_step` ({prompts_per_step})")
    mine = [s for s in range(shards) if s % workers.world == workers.rank]   # this process's shards of every step
    fmt = PromptFormat.from_config(shared)
    device, main = workers.device, workers.is_main

    # -- what this run works on ---------------------------------------------------------------
    tokenizer = load_tokenizer(Path(cfg["tokenizer"]))
    domains = {name: build_domain(d) for name, d in cfg["domains"].items()}
    pools = {d: domains[d].training_pool() for d in cfg["train_domains"]}
    heldout = heldout_for(domains, cfg["eval_domains"])
    subset_info = restrict_to_subset(pools, heldout, cfg["train_subset"]) if cfg.get("train_subset") else None
    counts = domain_counts(pools, prompts_per_step, str(shared.get("mix", "balanced")))

    # -- resume or start: a checkpoint counts only if this config and its upstream made it ----------
    run_dir.mkdir(parents=True, exist_ok=True)
    ledger_path, evals_path = run_dir / "ledger.jsonl", run_dir / "evals.jsonl"
    hashed = {**cfg, "train": {k: v for k, v in shared.items() if k not in NONFINITE_KEYS}}
    cfg_hash, start, cumulative = config_hash({"config": hashed, "upstream": upstream_fingerprint(cfg)}), 0, 0.0
    streak = 0   # non-finite steps skipped in a row
    ckpt, state = resume_point(run_dir)
    if state and state["config_hash"] != cfg_hash:
        if main:
            log.warning("%s: config or upstream checkpoints changed since the last checkpoint; starting over", cfg["run_id"])
        state = None
    workers.barrier()  # every process has read the checkpoint before the main one may clear it
    if state is None and main:
        clear_run(run_dir)
    param_dtype = getattr(torch, str(shared.get("param_dtype", "float32")))
    attention = str(shared.get("attn_implementation", "eager"))
    student = load_model(ckpt if state else cfg["student"]["path"], dtype=param_dtype, attn_implementation=attention).to(device)
    teachers: dict[str, torch.nn.Module] = {}
    if kind == "opd":
        loaded: dict[str, torch.nn.Module] = {}  # one teacher per domain (check_run_inputs: same tokenizer as the student)
        for d in cfg["train_domains"]:
            path = cfg["teachers"][d]["path"]
            teacher_dtype = getattr(torch, str(cfg["teachers"][d].get("dtype") or shared.get("teacher_dtype", "float32")))
            if path not in loaded:
                loaded[path] = load_model(path, dtype=teacher_dtype, trainable=False,
                                          attn_implementation=attention).eval().to(device)
            teachers[d] = loaded[path]
        teacher_forward = {id(t): FrozenForward(t) for t in loaded.values()}
    optimizer = torch.optim.AdamW(student.parameters(), lr=float(method["lr"]), betas=tuple(method["betas"]),
                                  weight_decay=float(method["weight_decay"]))
    n_params = parameter_count(student)
    # The denominator of MFU, measured once per process before any step (never inside a step's wall time).
    peak = matmul_peak(matmul_dtype(precision, param_dtype), device)
    model, optimizer = workers.prepare(student, optimizer)   # DDP/FSDP wrapper when several processes share the run
    if state:
        workers.load_optimizer_state(model, optimizer, state["optimizer"])
        restore_rng(state)
        start, cumulative = int(state["step"]), float(state["cumulative_flops"])
        streak = int(state.get("nonfinite_streak", 0))
        if main:
            keep_records(ledger_path, lambda r: r["step"] < start)
            keep_records(evals_path, lambda r: r["step"] < start)
            log.info("resuming %s at step %d (%.3g training FLOPs so far)", cfg["run_id"], start, cumulative)
    if main:
        write_yaml(run_dir / "config.yaml", cfg)

    stop = {"signal": None}

    def request_stop(signum, _frame):
        stop["signal"] = signum

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}

    def checkpoint(done_steps: int) -> None:
        # Collectives under FSDP (every process takes part); the main process writes.
        state_dict = workers.state_dict(model) if workers.distributed else None
        optimizer_state = workers.optimizer_state(model, optimizer)
        if main:
            save_checkpoint(run_dir, workers.unwrap(model), tokenizer, optimizer, done_steps, cumulative, cfg_hash,
                            state_dict=state_dict, optimizer_state=optimizer_state, nonfinite_streak=streak)
        workers.barrier()

    def run_eval(step: int) -> dict[str, Any]:
        ev = shared["eval"]
        with workers.full_params(model) as policy, autocast(precision, device.type):
            results, eval_flops = evaluate(policy, tokenizer, domains, heldout, k=int(ev["k"]), temperature=float(ev["temperature"]),
                                           max_new_tokens=int(shared["max_new_tokens"]), batch_size=int(ev["batch_size"]),
                                           seed=seed * SEED_STRIDE + step + 7, fmt=fmt, top_p=float(ev.get("top_p", 1.0)),
                                           top_k=int(ev.get("top_k", 0)), workers=workers)
        faults.kill_point("eval", step)
        record = {"step": step, "cumulative_flops": cumulative, "eval_flops": eval_flops, "results": results}
        if main:
            append_jsonl(evals_path, record)
        return record

    def agree(err: NonFinite | None, where: str) -> None:
        """Every process stops or skips together: a process that found nothing raises too when another did."""
        if workers.any(err is not None):
            raise err or NonFinite(f"{where}: another process found a non-finite value", "other_process")

    lr = float(method["lr"])
    try:
        for step in range(start, steps):
            if step % int(shared["eval_every"]) == 0:
                run_eval(step)
            t0 = time.time()
            warmup = int(method.get("warmup_steps") or 0)
            for group in optimizer.param_groups:
                group["lr"] = lr * min(1.0, (step + 1) / warmup) if warmup else lr

            where = f"run {cfg['run_id']} step {step}"
            # What was computed so far: a skipped step's FLOPs are counted too, up to where it stopped.
            flops = {"rollout": 0.0, "train": 0.0, "old_policy": 0.0, "teacher": 0.0}
            skipped, local = None, []
            loss_sum, metric_sums, tokens = 0.0, {}, {"prompt": 0, "completion": 0, "rollout_computed": 0, "train": 0, "teacher": 0}
            reward_sum, length_sum, n_seqs = 0.0, 0.0, 0
            try:
                # 1. rollouts: the student samples `per_prompt` completions of every prompt, shard by shard
                prompts = batch_tasks(pools, counts, step, seed)
                bounds = shard_bounds(len(prompts), shards)
                err = None
                with workers.full_params(model) as policy:
                    policy.eval()
                    for s in mine:
                        tasks = [t for t in prompts[bounds[s][0]:bounds[s][1]] for _ in range(per_prompt)]
                        generator = torch.Generator(device=device).manual_seed(seed * SEED_STRIDE + step + s * SHARD_STRIDE)
                        with autocast(precision, device.type):
                            scored = sample_and_score(policy, tokenizer, domains, tasks, max_new_tokens=int(shared["max_new_tokens"]),
                                                      temperature=float(shared["temperature"]), generator=generator, fmt=fmt)
                        flops["rollout"] += scored.rollouts.flops
                        if faults.poison("nan_reward", step):
                            scored.rewards[0] = float("nan")
                        local.append((tasks, scored))
                        if err is None:
                            try:
                                check_finite(scored.rewards, "rewards", where)
                            except NonFinite as e:
                                err = e
                    policy.train()
                model.train()
                faults.kill_point("rollout", step)
                agree(err, where)
                # The whole step's normaliser, so the shards' losses add up to the loss of one big batch.
                aggregation = method["aggregation"]
                local_count = sum(aggregation_count(sc.rollouts.completion_mask, aggregation) for _, sc in local)
                normalizer = None if shards == 1 else workers.sum([local_count])[0]

                # 2.-4. per shard: the student's training forward, the loss and its backward (gradients accumulate)
                optimizer.zero_grad(set_to_none=True)
                for i, (tasks, scored) in enumerate(local):
                    ro = scored.rollouts
                    seqs, attn = ro.sequences, ro.attention_mask
                    batch, length = seqs.shape
                    new = length - ro.prompt_len
                    targets, mask = seqs[:, ro.prompt_len:], ro.completion_mask
                    err = None
                    with workers.no_sync(model, skip=i < len(local) - 1):
                        with autocast(precision, device.type):
                            logits = model(input_ids=seqs, attention_mask=attn, position_ids=_position_ids(attn),
                                           logits_to_keep=new + 1).logits[:, :-1]
                        flops["train"] += F.forward_flops(student.config, batch, length, logits_positions=new + 1)  # + backward below
                        if faults.poison("nan_logits", step):
                            logits = logits + float("nan")
                        try:
                            check_finite(logits, "student_logits", where)
                            if kind == "grpo":
                                advantages = group_advantages(scored.rewards, per_prompt,
                                                              scale_by_std=bool(method["scale_by_std"])).to(device)
                                logprobs = token_logprobs(logits, targets)
                                # One optimiser step per batch: the sampling policy is the current one, so the old
                                # log-probabilities are these, detached (no extra forward, none counted).
                                loss, metrics = grpo_loss(logprobs, logprobs.detach(), advantages, mask, clip_eps=float(method["clip_eps"]),
                                                          clip_eps_high=method.get("clip_eps_high"), aggregation=aggregation,
                                                          normalizer=normalizer)
                            else:
                                teacher_logits = torch.empty_like(logits, dtype=torch.float32)
                                with torch.no_grad(), autocast(precision, device.type):
                                    for d, teacher in teachers.items():
                                        rows = torch.tensor([r for r, t in enumerate(tasks) if t.domain == d], dtype=torch.long, device=device)
                                        if len(rows) == 0:
                                            continue
                                        # bit for bit the teacher's own eager forward, fewer copies and casts
                                        out = teacher_forward[id(teacher)](seqs[rows], attn[rows], _position_ids(attn[rows]),
                                                                           logits_to_keep=new + 1)[:, :-1]
                                        flops["teacher"] += F.forward_flops(teacher.config, len(rows), length, logits_positions=new + 1)
                                        out = out[..., : logits.shape[-1]]
                                        if faults.poison("nan_teacher", step):
                                            out = out + float("nan")
                                        check_finite(out, "teacher_logits", where, label=f"teacher logits ({d} teacher)")
                                        teacher_logits[rows] = out.float()
                                loss, metrics = topk_reverse_kl(logits, teacher_logits, mask, k=int(method["top_k"]),
                                                                aggregation=aggregation, normalizer=normalizer)
                            if faults.poison("nan_loss", step):
                                loss = loss + float("nan")
                            check_finite(loss, "loss", where, label=f"{kind} loss")
                        except NonFinite as e:
                            err = e
                        agree(err, where)
                        # DDP averages the processes' gradients: scaled by their number, they add up instead.
                        (loss * workers.world if workers.distributed else loss).backward()
                    flops["train"] += 2 * F.forward_flops(student.config, batch, length, logits_positions=new + 1)
                    loss_sum += loss.item()
                    for name, value in metrics.items():
                        metric_sums[name] = metric_sums.get(name, 0.0) + value
                    tokens["prompt"] += int(attn[:, : ro.prompt_len].sum())
                    tokens["completion"] += int(mask.sum())
                    tokens["rollout_computed"] += int(ro.tokens_computed)
                    tokens["train"] += batch * length
                    tokens["teacher"] += batch * length if kind == "opd" else 0
                    reward_sum += float(scored.rewards.sum())
                    length_sum += sum(scored.response_lengths)
                    n_seqs += batch

                # 4. the update (skipped if the gradients are not finite; the norm is the same on every process)
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float(method["grad_clip"]))
                check_finite(grad_norm, "gradients", where, label="gradient norm")
                optimizer.step()
                faults.kill_point("update", step)
                streak = 0
            except NonFinite as err:
                optimizer.zero_grad(set_to_none=True)
                kept = f"the last good checkpoint is kept in {run_dir} and a rerun resumes from it"
                if nonfinite == "stop":
                    raise NonFinite(f"{err}; run stopped (train.nonfinite: stop), {kept}", err.component) from None
                if streak >= max_skips:
                    raise NonFinite(f"{err}; run stopped after {streak} non-finite steps skipped in a row "
                                    f"(train.max_nonfinite_skips: {max_skips}), {kept}", err.component) from None
                streak += 1
                skipped = err.component
                if main:
                    log.warning("%s; step skipped without an update (%d in a row, at most %d)", err, streak, max_skips)

            # 5. the ledger: every process's FLOPs and tokens, summed
            names = list(flops)
            flops = dict(zip(names, workers.sum([flops[n] for n in names])))
            step_flops = sum(flops.values())
            cumulative += step_flops
            if skipped:
                wall = max(time.time() - t0, 1e-9)
                record = {"step": step, "skipped": skipped, "flops": flops, "step_flops": step_flops,
                          "cumulative_flops": cumulative, "lr": optimizer.param_groups[0]["lr"],
                          "wall_s": round(wall, 3), "achieved_flops_per_s": step_flops / wall}
            else:
                token_names, metric_names = list(tokens), sorted(metric_sums)
                totals = workers.sum([*(tokens[n] for n in token_names), loss_sum, reward_sum, length_sum, n_seqs,
                                      *(metric_sums[n] for n in metric_names)])
                tokens = {n: int(v) for n, v in zip(token_names, totals)}
                loss_total, reward_total, length_total, seq_total = totals[len(token_names):len(token_names) + 4]
                metrics = {n: v / shards for n, v in zip(metric_names, totals[len(token_names) + 4:])}  # mean over shards
                wall = max(time.time() - t0, 1e-9)
                record = {"step": step, "tokens": tokens, "flops": flops, "step_flops": step_flops, "cumulative_flops": cumulative,
                          "reward": reward_total / seq_total, "loss": loss_total, "grad_norm": float(grad_norm),
                          "mean_response_length": length_total / seq_total, "metrics": metrics,
                          "lr": optimizer.param_groups[0]["lr"], "wall_s": round(wall, 3),
                          "achieved_flops_per_s": step_flops / wall}   # training FLOP/s of this step (all processes)
            if main:
                append_jsonl(ledger_path, record)
            done_steps = step + 1
            stopping = workers.any(stop["signal"] is not None)
            if done_steps % int(shared["checkpoint_every"]) == 0 or stopping:
                checkpoint(done_steps)
            if stopping:
                raise Interrupted(f"run {cfg['run_id']}: signal {stop['signal']} after step {step}; checkpoint saved, rerun to resume")

        final = run_eval(steps)
        checkpoint(steps)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)

    summary = {"run": cfg["run_id"], "method": kind, "steps": steps, "cumulative_flops": cumulative,
               "final_eval": final["results"], "parameters": n_params,
               "processes": workers.world, "wall_s": round(time.time() - started, 1), "counted": True,
               "numerics": numerics.report()}   # the machine's fingerprint and which exact fast paths ran
    if main:
        totals: dict[str, float] = {}
        ledger = read_jsonl(ledger_path)
        for record in ledger:
            for component, value in record["flops"].items():
                totals[component] = totals.get(component, 0.0) + value
        # Mean achieved training FLOP/s over the steps' wall time (evaluation excluded) and MFU against the peak.
        summary = {**summary, "flops_by_component": totals, **mfu_summary(ledger, peak, workers.world)}
        if subset_info:
            summary["train_subset"] = subset_info
        write_json(run_dir / "done.json", summary)
    workers.barrier()
    return summary
