"""The post-training loop shared by GRPO and OPD; :func:`_loop` and :func:`_step` read top to bottom.

Each step: draw prompts -> the student samples rollouts, shard by shard, and the verifiers score them -> the
log-probs that stay fixed over the step's updates, without gradients (the sampling policy's when the batch gets
several updates; a frozen reference model's when GRPO has a KL term) -> ``method.updates_per_batch`` passes over
the batch, each cut into ``method.minibatches`` optimiser updates (both 1 by default: one update per batch); per
update and shard: the student's training forward, the run's objective (GRPO's clipped policy gradient, or OPD's
reverse KL to each prompt's domain teacher) and its backward (a shard is one micro-batch; with
``train.max_tokens_per_microbatch`` a process's rows of the update are repacked by length into micro-batches within
that many padded tokens, :mod:`opdgrpo.train.microbatch`), then clip and update -> one ledger line with the
FLOPs of every component (one line per sampled batch, whatever the number of updates). Every update of a step uses
the step's learning rate (``method.warmup_steps`` counts steps). Held-out avg@k at step 0, every ``eval_every``
steps and at the end; a checkpoint every ``checkpoint_every`` steps. A rerun resumes from the newest checkpoint of
the same run, dropping ledger and eval lines written after it, so no step is counted twice; everything random is
seeded by (seed, step), so a resumed run repeats exactly what it would have done, except where a vLLM engine samples
on a GPU: there requests carry no seed of their own (vLLM's fast sampler), the engine's stream is seeded by (seed,
the attempt's first step), and a resumed run samples other rows from the same distribution (docs/design-notes.md,
"The vLLM engine").

Non-finite values (rewards, student logits, teacher logits, the loss, the gradient norm) are checked where each
phase ends (:class:`NonFiniteCheck`); ``train.nonfinite`` says whether such a step stops the run (``stop``, the default; the
step leaves no ledger line and no checkpoint) or is dropped without an optimiser step (``skip``, at most
``train.max_nonfinite_skips`` steps in a row).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from opdgrpo import gpu_slots
from opdgrpo.domains import Task, build_domain
from opdgrpo.progress import Progress, clock
from opdgrpo.run_shape import RunShape
from opdgrpo.runio import append_jsonl, history_record, job_lock, keep_records, read_jsonl, write_json, write_yaml
from opdgrpo.subsets import restrict_to_subset
from opdgrpo.tracking import Tracker
from opdgrpo.train import faults, fsdp, numerics
from opdgrpo.train import flops as flop_formulas
from opdgrpo.train.batching import batch_tasks, domain_counts, engine_seed, eval_seed, rollout_seed, shard_bounds
from opdgrpo.train.checkpoint import check_precision, clear_run, expected_save_seconds, history_gaps, restore_rng, resume_point, run_identity, save_checkpoint
from opdgrpo.train.distributed import Workers
from opdgrpo.train.evaluation import evaluate, heldout_for
from opdgrpo.train.finished import checkpoint_record
from opdgrpo.train.inference import FrozenForward
from opdgrpo.train.logit_chunks import reduced_forward
from opdgrpo.train.losses import aggregation_count
from opdgrpo.train.microbatch import repack
from opdgrpo.train.models import autocast, enable_activation_checkpointing, load_model, parameter_count
from opdgrpo.train.objectives import Objective, Shard, build_objective, position_ids
from opdgrpo.train.packed_rows import PackedRows, pack, packed_flops, packed_logits, warn_chunked, worth_packing
from opdgrpo.train.peak import mfu_summary, run_peak
from opdgrpo.train.precision import resolve as resolve_precision
from opdgrpo.train.rollout import PromptFormat, sample_and_score
from opdgrpo.train.step_stats import StepStats, components
from opdgrpo.train.time_limit import WARNING_SIGNAL, Durations, TimeLimit
from opdgrpo.train.tokenizer import load_tokenizer

log = logging.getLogger("opdgrpo.train.loop")


class Interrupted(RuntimeError):
    """SIGTERM/SIGINT arrived, or the SLURM allocation is about to end (:mod:`opdgrpo.train.time_limit`); the run
    checkpointed and stopped. A rerun resumes it. ``why``: which of them, for the attempt's record."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why


class NonFinite(FloatingPointError):
    """A step produced NaN or inf in ``component`` (rewards, student_logits, teacher_logits, reference_logits,
    loss, gradients)."""

    def __init__(self, message: str, component: str):
        super().__init__(message)
        self.component = component


def check_finite(x: torch.Tensor, component: str, where: str, label: str | None = None) -> None:
    """Raise :class:`NonFinite` if ``x`` holds a NaN or an inf: one ``isfinite().all()`` pass over the tensor."""
    if not bool(torch.isfinite(x).all()):
        what = "NaN" if bool(torch.isnan(x).any()) else "inf"
        text = label or component.replace("_", " ")
        verb = "is" if x.dim() == 0 else "contain"
        raise NonFinite(f"{where}: {text} {verb} {what}", component)


#: The test-only fault (:mod:`opdgrpo.train.faults`) that poisons each checked component.
POISON = {"rewards": "nan_reward", "student_logits": "nan_logits", "teacher_logits": "nan_teacher",
          "reference_logits": "nan_reference", "loss": "nan_loss"}


class NonFiniteCheck:
    """A phase's non-finite check: injects an armed fault, remembers the first non-finite value and lets the phase
    run to its end, where :meth:`agree` makes every process stop or skip together (so no process is left waiting
    in a collective the others skipped)."""

    def __init__(self, workers: Workers, where: str, step: int):
        self.workers, self.where, self.step = workers, where, step
        self.error: NonFinite | None = None

    def check(self, tensor: torch.Tensor, component: str, label: str | None = None) -> torch.Tensor:
        if faults.poison(POISON[component], self.step):   # the caller's clean path stays what it was
            tensor = tensor + float("nan")
        if self.error is None:
            try:
                check_finite(tensor, component, self.where, label)
            except NonFinite as err:
                self.error = err
        return tensor

    def agree(self) -> None:
        if self.workers.any(self.error is not None):
            raise self.error or NonFinite(f"{self.where}: another process found a non-finite value", "other_process")


@dataclass
class Run:
    """Everything the loop reads, set up once by :func:`_setup`; ``start``, ``cumulative`` and ``streak`` move."""

    cfg: dict[str, Any]
    run_dir: Path
    workers: Workers
    tokenizer: Any
    domains: dict[str, Any]
    pools: dict[str, list[Task]]
    heldout: dict[str, dict[str, list[Task]]]
    counts: dict[str, int]
    fmt: PromptFormat
    student: torch.nn.Module       # the model itself (saved, counted)
    model: torch.nn.Module         # the same, wrapped for several processes
    optimizer: torch.optim.Optimizer
    objective: Objective
    identity: str                  # what a checkpoint must carry to be resumed (checkpoint.run_identity)
    peak: dict[str, Any]
    subset: dict[str, Any] | None
    start: int = 0
    cumulative: float = 0.0
    streak: int = 0                # non-finite steps skipped in a row
    shape: RunShape | None = None      # steps, shards, passes, caps, sampling, its precision resolved here (opdgrpo.run_shape)
    progress: Progress | None = None   # lines in the job's log (main process)
    tracker: Tracker | None = None     # train.report_to (main process)
    reference: FrozenForward | None = None   # GRPO's frozen reference model (beta > 0), else None
    engine: Any = None                 # train.engine vllm: the colocated engine (opdgrpo.train.engines); None: hf
    limit: TimeLimit | None = None     # the SLURM allocation's end (main process, under SLURM), else None
    durations: Durations = field(default_factory=Durations)   # the longest step, evaluation and save measured

    @property
    def main(self) -> bool:
        return self.workers.is_main

    @property
    def ledger(self) -> Path:
        return self.run_dir / "ledger.jsonl"

    @property
    def evals(self) -> Path:
        return self.run_dir / "evals.jsonl"


def train(cfg: dict[str, Any], run_dir: Path, collective_timeout_s: float | None = None) -> dict[str, Any]:
    """Train one run into ``run_dir`` (resuming it if it has a checkpoint of the same run); returns ``done.json``.
    ``collective_timeout_s``: the process group's timeout (:class:`opdgrpo.train.distributed.Workers`)."""
    # Bad input fails here, before any compute and before the run directory is touched (a finished run stays
    # intact); then one process at a time owns the run directory.
    from opdgrpo.train.preflight import check_run_inputs

    check_run_inputs(cfg)
    expandable_segments()
    workers = Workers.from_config(cfg["train"], collective_timeout_s)
    workers.log_collectives(collective_timeout_s)
    together = True
    try:
        # The main process owns the run directory; the others only read checkpoints it wrote.
        # Signals are noted from here on: SLURM's warning arriving while the models load stops the run after its
        # first step (checkpointed) instead of killing it with nothing saved.
        with job_lock(Path(run_dir)) if workers.is_main else contextlib.nullcontext(), _stop_requests() as stop:
            started = time.time()
            run = _setup(cfg, Path(run_dir), workers)
            try:
                return _finish(run, _loop(run, stop), started)
            finally:
                if run.tracker:
                    run.tracker.close()
                _close_engine(run)
    except (Interrupted, NonFinite):   # every process stops here, together (they agreed on it)
        raise
    except BaseException:
        # This process's own error: it leaves without the closing barrier, which the others, waiting in another
        # collective, would never reach (both would hang until the collective timeout); torchrun then stops them.
        together = False
        raise
    finally:
        if together:
            workers.close()


def expandable_segments() -> bool:
    """On GPUs, PyTorch's allocator grows segments in place (``expandable_segments:True``) unless the user set
    ``PYTORCH_CUDA_ALLOC_CONF``: a training step's tensors change size from step to step (rollout lengths), and fixed
    segments fragment into reserved memory that no tensor uses. vLLM's sleep-mode pool switches it off around its own
    allocations. Must run before CUDA's first allocation; True when it set the variable."""
    if not torch.cuda.is_available() or "PYTORCH_CUDA_ALLOC_CONF" in os.environ or torch.cuda.is_initialized():
        return False
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return True


# --------------------------------------------------------------------------------------------------------------------
# The loop


def _loop(run: Run, stop: dict[str, Any]) -> dict[str, Any]:
    """Every step from ``run.start``, then the final evaluation and checkpoint; returns the final evaluation.
    ``stop["signal"]``: a SIGTERM/SIGINT noted by :func:`_stop_requests` (checkpoint and stop after the step)."""
    shape = run.shape
    for step in range(run.start, shape.steps):
        if step % shape.eval_every == 0:
            _evaluate(run, step)
            if step > run.start and run.workers.any(stop["signal"] is not None):
                _stop_before(run, step, stop)   # the warning came during the evaluation: no step after it
        t0 = time.time()
        stats = _step(run, step).all_reduce(run.workers)
        faults.pace(t0)
        run.cumulative += sum(stats.flops.values())
        wall = max(time.time() - t0, 1e-9)
        run.durations.step(wall)
        line = stats.ledger_line(step, run.cumulative, run.optimizer.param_groups[0]["lr"], wall)
        if run.main:
            append_jsonl(run.ledger, line)
            run.tracker.step(line)
            run.progress.step(step + 1, _progress_values(line, wall), wall)
        out_of_time = _out_of_time(run, step + 1)
        stopping = run.workers.any(stop["signal"] is not None or out_of_time is not None)
        if (step + 1) % shape.checkpoint_every == 0 or stopping:
            _checkpoint(run, step + 1)
        if stopping:
            why = out_of_time or (f"signal {stop['signal']}" if stop["signal"] is not None else "another process stopped")
            raise Interrupted(f"run {run.cfg['run_id']}: {why}; stopped after step {step}, checkpoint saved, rerun to "
                              "resume", why)
    final = _evaluate(run, shape.steps)
    _checkpoint(run, shape.steps)
    return final


def _stop_before(run: Run, step: int, stop: dict[str, Any]) -> None:
    """Stop at the start of ``step``: checkpoint the state after ``step`` updates unless the last periodic checkpoint
    holds it. So SLURM's warning needs to cover an evaluation or a step, not both; the attempt made progress
    (``step > run.start``), and the next one redoes this evaluation (it resumes at ``step``)."""
    if step % run.shape.checkpoint_every != 0:
        _checkpoint(run, step)
    why = f"signal {stop['signal']}" if stop["signal"] is not None else "another process stopped"
    raise Interrupted(f"run {run.cfg['run_id']}: {why} during the evaluation at step {step}; checkpoint saved, rerun "
                      "to resume", why)


def _out_of_time(run: Run, done_steps: int) -> str | None:
    """Why the main process must stop after ``done_steps`` steps before its SLURM allocation ends (what comes next, an
    evaluation if one is due and a step, and a save would not fit: :mod:`opdgrpo.train.time_limit`), else None."""
    if run.limit is None:
        return None
    return run.limit.why_stop(run.durations, evaluation_due=done_steps % run.shape.eval_every == 0
                              or done_steps >= run.shape.steps)


def _step(run: Run, step: int) -> StepStats:
    """One step (one sampled batch) on this process's shards: sample and score; cut into mini-batches of training
    micro-batches (the shards, or rows repacked by ``train.max_tokens_per_microbatch``); the log-probs fixed over
    the batch; then per pass over the batch and mini-batch: forward/loss/backward per micro-batch, update."""
    _set_lr(run, step)
    stats = StepStats.of(components(reference=run.shape.reference), teachers=run.objective.teacher_domains)
    where = f"run {run.cfg['run_id']} step {step}"
    clock = time.time()

    def lap(phase: str) -> None:   # the ledger's phase_s (what a pilot or a slow run is read by)
        nonlocal clock
        stats.seconds[phase], clock = time.time() - clock, time.time()

    try:
        guard = NonFiniteCheck(run.workers, where, step)
        shards = _sample(run, step, stats, guard)                                   # 1. rollouts and rewards
        faults.kill_point("rollout", step)
        guard.agree()
        lap("sample")
        minibatches = _minibatches(run, shards)                                     # 2. micro-batches by update
        _fixed_logprobs(run, [m for group in minibatches for m in group], stats,    # 3. old policy, reference
                        NonFiniteCheck(run.workers, where, step))
        lap("fixed_logprobs")
        for epoch in range(run.shape.updates_per_batch):                      # 4. passes over the batch,
            for minibatch in minibatches:                                           #    one update per mini-batch
                _train_minibatch(run, step, minibatch, stats, where, first_pass=epoch == 0)
        lap("train")
        run.streak = 0
    except NonFinite as err:
        stats.skipped = _skip_or_stop(run, err)
    return stats


# --------------------------------------------------------------------------------------------------------------------
# The phases of a step


def _progress_values(line: dict[str, Any], wall: float) -> dict[str, Any]:
    """What a step's log line shows besides the step count and times."""
    if line.get("skipped"):
        return {"skipped": line["skipped"], "flops": line["cumulative_flops"]}
    return {"reward": line["reward"], "loss": line["loss"], "len": line["mean_response_length"],
            "gen_tok_s": round(line["tokens"]["completion"] / wall), "flops": line["cumulative_flops"]}


def _set_lr(run: Run, step: int) -> None:
    lr, warmup = float(run.shape.method["lr"]), int(run.shape.method["warmup_steps"] or 0)
    for group in run.optimizer.param_groups:
        group["lr"] = lr * min(1.0, (step + 1) / warmup) if warmup else lr


def _sample(run: Run, step: int, stats: StepStats, guard: NonFiniteCheck) -> list[Shard]:
    """The student samples ``rollouts_per_prompt`` completions of each of its shards' prompts; verifiers score them."""
    prompts = batch_tasks(run.pools, run.counts, step, int(run.cfg["seed"]))
    bounds, rollout = shard_bounds(len(prompts), run.shape.shards), run.shape.rollout
    per_prompt, device, shards = run.objective.rollouts_per_prompt, run.workers.device, []
    # OPD's loss does not read rewards: `score_rollouts: false` leaves the ledger's `reward` null and skips the
    # verifiers (the code sandbox is about a third of an OPD code step); held-out evaluation scores as always.
    stats.scored = run.objective.needs_rewards or bool(run.shape.method.get("score_rollouts"))
    with run.workers.full_params(run.model) as policy, _engine_awake(run):
        policy.eval()
        if run.engine:   # the weights after ``step`` updates, into the engine in memory (once per version)
            run.engine.sync(policy, version=step)
        for s in run.shape.mine(run.workers.rank):
            tasks = [t for t in prompts[bounds[s][0]:bounds[s][1]] for _ in range(per_prompt)]
            generator = torch.Generator(device=device).manual_seed(rollout_seed(int(run.cfg["seed"]), step, s))
            with autocast(run.shape.precision, device.type):
                scored = sample_and_score(policy, run.tokenizer, run.domains, tasks, max_new_tokens=rollout.max_new_tokens,
                                          temperature=rollout.temperature, generator=generator, fmt=run.fmt,
                                          engine=run.engine, engine_logprobs=True, with_rewards=stats.scored)
            stats.flops["rollout"] += scored.rollouts.flops
            if stats.scored:
                scored.rewards = guard.check(scored.rewards, "rewards")
            shards.append(Shard(tasks, scored))
            stats.add_sampled(shards[-1])
        policy.train()
    run.model.train()
    return shards


def _fixed_logprobs(run: Run, shards: list[Shard], stats: StepStats, guard: NonFiniteCheck) -> None:
    """Before the first update, without gradients: each shard's log-probs under the sampling policy when the batch
    gets more than one update (the PPO ratio's denominator; ledger ``old_policy``), and under the frozen reference
    model when GRPO has a KL term (``beta > 0``; ledger ``reference``). Nothing with one update and no reference."""
    old_policy = run.shape.old_policy
    if not old_policy and run.reference is None:
        return
    with torch.no_grad(), autocast(run.shape.precision, run.workers.device.type):
        for shard in shards:
            attn, keep = shard.attention_mask, shard.new_tokens + 1
            one = _one_chunk(run, shard)
            if old_policy:   # the trained model as it sampled (DDP or FSDP too): the first update's own forward
                if shard.packed is not None:
                    logits = guard.check(packed_logits(run.model, shard.packed), "student_logits", "old-policy logits")
                    shard.old_logprobs = run.objective.logprobs(logits, shard.targets)
                elif one:
                    logits = run.model(input_ids=shard.sequences, attention_mask=attn, position_ids=position_ids(attn),
                                       logits_to_keep=keep).logits[:, :-1]
                    logits = guard.check(logits, "student_logits", "old-policy logits")
                    shard.old_logprobs = run.objective.logprobs(logits, shard.targets)
                else:
                    (shard.old_logprobs,) = _chunked_forward(
                        run, run.model, shard, *_logprob_reduce(run, shard, guard, "student_logits", "old-policy logits"))
                stats.flops["old_policy"] += _student_flops(run, shard)
            if run.reference is not None:
                if one:
                    logits = run.reference(shard.sequences, attn, position_ids(attn), logits_to_keep=keep)[:, :-1]
                    logits = guard.check(logits, "reference_logits")
                    shard.ref_logprobs = run.objective.logprobs(logits, shard.targets)
                else:
                    (shard.ref_logprobs,) = run.reference.reduced(
                        shard.sequences, attn, position_ids(attn), keep,
                        *_logprob_reduce(run, shard, guard, "reference_logits", None), run.shape.logit_chunk_tokens)
                stats.flops["reference"] += flop_formulas.forward_flops(run.reference.model.config,
                                                                        *shard.sequences.shape, logits_positions=keep)
    guard.agree()


def _logprob_reduce(run: Run, shard: Shard, guard: NonFiniteCheck, component: str, label: str | None):
    """``(reduce, extras)``: the objective's log-probs of the shard's tokens from a chunk of logits, checked."""
    def reduce(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor]:
        logits = guard.check(logits, component, label)
        return (run.objective.logprobs(logits, targets),)   # the chunk's own targets
    return reduce, (shard.targets,)


def _minibatches(run: Run, shards: list[Shard]) -> list[list[Shard]]:
    """This process's training micro-batches by mini-batch: the step's shards cut into ``method.minibatches``
    consecutive groups (``RunShape.of`` makes every group hold the same number of shards of every process); with
    ``train.max_tokens_per_microbatch`` each group's rows repacked by length within it (:mod:`opdgrpo.train.microbatch`),
    as many micro-batches on every process; with ``train.packed_row_tokens`` each micro-batch's layout for the
    student's passes decided once (:func:`_student_layout`)."""
    per_minibatch = run.shape.shards // run.shape.minibatches
    groups: list[list[Shard]] = [[] for _ in range(run.shape.minibatches)]
    for index, shard in zip(run.shape.mine(run.workers.rank), shards):
        groups[index // per_minibatch].append(shard)
    cap = run.shape.microbatch_tokens
    if cap is not None:
        groups = [repack(group, cap, run.workers.max, int(run.tokenizer.pad_token_id), run.objective.advantages)
                  for group in groups]
    if run.shape.packed_row_tokens is not None:
        for shard in (s for group in groups for s in group):
            shard.packed = _student_layout(run, shard, run.shape.packed_row_tokens)
    return groups


def _train_minibatch(run: Run, step: int, shards: list[Shard], stats: StepStats, where: str, first_pass: bool) -> None:
    """One optimiser update: forward, loss and backward per shard (gradients accumulate), then clip and step.
    The shards' tokens, rewards and lengths are counted on the first pass over the batch only."""
    normalizer = _normalizer(run, shards)
    run.optimizer.zero_grad(set_to_none=True)
    for i, shard in enumerate(shards):
        guard = NonFiniteCheck(run.workers, where, step)
        with run.workers.no_sync(run.model, skip=i < len(shards) - 1):
            loss, metrics = _forward_and_loss(run, shard, normalizer, guard, stats)
            guard.agree()   # before the backward's all-reduce
            # DDP averages the processes' gradients: scaled by their number, they add up instead.
            (loss * run.workers.world if run.workers.distributed else loss).backward()
        stats.flops["train"] += 2 * _student_flops(run, shard)                 # the backward
        stats.add_loss(loss, metrics)
        if first_pass:
            packed = shard.packed
            stats.add_trained(shard, run.objective.scores_with_teachers,
                              None if packed is None else packed.rows * packed.length)
    stats.add_update(_update(run, step, where))                                 # clip and update


def _normalizer(run: Run, shards: list[Shard]) -> float | None:
    """The whole update's token (or sequence) count (its mini-batch over every process), so the micro-batches'
    losses add up to the loss of one big batch whatever their grouping; None when the update is one shard trained
    as it was sampled (its own count is the same)."""
    if run.shape.one_pass_per_shard:
        return None
    local = sum(aggregation_count(shard.mask, run.objective.aggregation) for shard in shards)
    return run.workers.sum([local])[0]


def _student_flops(run: Run, shard: Shard) -> float:
    """FLOPs of one student forward over the shard as it runs: packed (train.packed_row_tokens) or padded."""
    if shard.packed is not None:
        return packed_flops(run.student.config, shard.packed)
    return flop_formulas.forward_flops(run.student.config, *shard.sequences.shape, logits_positions=shard.new_tokens + 1)


def _student_layout(run: Run, shard: Shard, budget: int) -> PackedRows | None:
    """The micro-batch's rows laid end to end under ``budget`` tokens per packed row for the student's passes, or
    None (padded): packing no cheaper than the padded forward, or response logits too large for one
    ``train.logit_chunk_tokens`` chunk (then the padded, chunked path runs: :mod:`opdgrpo.train.packed_rows`)."""
    if not _one_chunk(run, shard):
        warn_chunked(shard.sequences.shape[0] * shard.new_tokens, run.shape.logit_chunk_tokens)
        return None
    packed = pack(shard.sequences, shard.attention_mask, shard.scored.rollouts.prompt_len, budget)
    return packed if worth_packing(run.student.config, packed, tuple(shard.sequences.shape)) else None


def _forward_and_loss(run: Run, shard: Shard, normalizer: float | None, guard: NonFiniteCheck,
                      stats: StepStats) -> tuple[torch.Tensor, dict[str, float]]:
    """The student's training forward over the shard's sequences and the objective's loss on its response logits."""
    attn, packed = shard.attention_mask, shard.packed
    if packed is not None:   # rows laid end to end (train.packed_row_tokens), logits back in the shard's layout
        with autocast(run.shape.precision, run.workers.device.type):
            logits = packed_logits(run.model, packed)
        stats.flops["train"] += _student_flops(run, shard)   # the forward; its backward is counted after it
        logits = guard.check(logits, "student_logits")
        loss, metrics = run.objective.loss(logits, shard, normalizer, guard.check, stats.flops, stats.teachers)
    elif _one_chunk(run, shard):   # the shard's logits fit in one chunk: the full logits, as before
        with autocast(run.shape.precision, run.workers.device.type):
            logits = run.model(input_ids=shard.sequences, attention_mask=attn, position_ids=position_ids(attn),
                               logits_to_keep=shard.new_tokens + 1).logits[:, :-1]
        stats.flops["train"] += _student_flops(run, shard)   # the forward; its backward is counted after it
        logits = guard.check(logits, "student_logits")
        loss, metrics = run.objective.loss(logits, shard, normalizer, guard.check, stats.flops, stats.teachers)
    else:   # the LM head and the loss's reduction a chunk of positions at a time (opdgrpo.train.logit_chunks)
        reduce, extras = run.objective.student_reduce(shard, guard.check)
        reduced = _chunked_forward(run, run.model, shard, reduce, extras)
        stats.flops["train"] += _student_flops(run, shard)
        loss, metrics = run.objective.loss_from(reduced, shard, normalizer, guard.check, stats.flops,
                                                int(run.student.config.vocab_size), stats.teachers)
    loss = guard.check(loss, "loss", f"{run.objective.name} loss")
    return loss, metrics


def _one_chunk(run: Run, shard: Shard) -> bool:
    """Whether the shard's response logits fit in one ``train.logit_chunk_tokens`` chunk."""
    return shard.sequences.shape[0] * shard.new_tokens <= run.shape.logit_chunk_tokens


def _chunked_forward(run: Run, model: torch.nn.Module, shard: Shard, reduce, extras) -> tuple[torch.Tensor, ...]:
    """``reduce`` over the student's response logits, ``train.logit_chunk_tokens`` positions at a time, inside the
    (DDP- or FSDP-wrapped) model's own forward; recomputed chunk by chunk in the backward when gradients flow."""
    attn = shard.attention_mask
    with autocast(run.shape.precision, run.workers.device.type):
        return reduced_forward(model, reduce, extras, run.shape.logit_chunk_tokens, run.workers.unwrap(model),
                               input_ids=shard.sequences, attention_mask=attn, position_ids=position_ids(attn),
                               logits_to_keep=shard.new_tokens + 1)


def _update(run: Run, step: int, where: str) -> torch.Tensor:
    """Clip to ``method.grad_clip`` by the global gradient norm and step (skipped if the gradients are not finite;
    the norm is the same on every process, sharded or not)."""
    grad_norm = run.workers.clip_grad_norm(run.model, float(run.cfg["method"]["grad_clip"]))
    check_finite(grad_norm, "gradients", where, label="gradient norm")
    run.optimizer.step()
    faults.kill_point("update", step)
    return grad_norm


def _skip_or_stop(run: Run, err: NonFinite) -> str:
    """``train.nonfinite``: raise (stop), or drop the step without an update and return the culprit (skip)."""
    run.optimizer.zero_grad(set_to_none=True)
    kept = f"the last good checkpoint is kept in {run.run_dir} and a rerun resumes from it"
    policy, max_skips = run.shape.nonfinite, run.shape.max_skips
    if policy == "stop":
        raise NonFinite(f"{err}; run stopped (train.nonfinite: stop), {kept}", err.component) from None
    if run.streak >= max_skips:
        raise NonFinite(f"{err}; run stopped after {run.streak} non-finite steps skipped in a row "
                        f"(train.max_nonfinite_skips: {max_skips}), {kept}", err.component) from None
    run.streak += 1
    if run.main:
        log.warning("%s; step skipped without an update (%d in a row, at most %d)", err, run.streak, max_skips)
    return err.component


# --------------------------------------------------------------------------------------------------------------------
# Evaluation, checkpoints, signals, the summary


def _evaluate(run: Run, step: int) -> dict[str, Any]:
    """Held-out avg@k of the current policy; one line of ``evals.jsonl`` (its FLOPs are never training FLOPs)."""
    ev = run.shape.evaluation
    t0 = time.time()
    with run.workers.full_params(run.model) as policy, autocast(run.shape.precision, run.workers.device.type), \
            _engine_awake(run):
        if run.engine:
            run.engine.sync(policy, version=step)
        results, eval_flops = evaluate(policy, run.tokenizer, run.domains, run.heldout, k=ev.k,
                                       temperature=ev.temperature, max_new_tokens=ev.max_new_tokens,
                                       batch_size=ev.batch_size, seed=eval_seed(int(run.cfg["seed"]), step),
                                       fmt=run.fmt, top_p=ev.top_p, top_k=ev.top_k, workers=run.workers,
                                       max_batch_tokens=ev.max_batch_tokens, engine=run.engine)
    faults.kill_point("eval", step)
    faults.signal_point("term_eval", step)
    run.durations.evaluation(time.time() - t0)
    record = {"step": step, "cumulative_flops": run.cumulative, "eval_flops": eval_flops, "results": results}
    if run.main:
        append_jsonl(run.evals, record)
        run.tracker.evaluation(record)
        accuracy = {f"{r['eval_domain']}/{r['eval_set']}": round(r["accuracy"], 4) for r in results}
        run.progress.event("eval", {"step": step, **accuracy, "seconds": round(time.time() - t0, 1)})
    return record


def _checkpoint(run: Run, done_steps: int) -> None:
    """Collectives under FSDP (every process takes part: the full model and optimizer state are gathered onto the
    main process's CPU); the main process writes."""
    workers, t0 = run.workers, time.time()
    state_dict = workers.state_dict(run.model) if workers.distributed or workers.sharded else None   # FSDP2: gathered
    optimizer_state = workers.optimizer_state(run.model, run.optimizer)
    if run.main:
        save_checkpoint(run.run_dir, workers.unwrap(run.model), run.tokenizer, run.optimizer, done_steps, run.cumulative,
                        run.identity, state_dict=state_dict, optimizer_state=optimizer_state, nonfinite_streak=run.streak,
                        precision=run.shape.precision)
        run.progress.event("checkpoint", {"step": done_steps, "seconds": round(time.time() - t0, 1)})
    workers.barrier()
    run.durations.save(time.time() - t0)


@contextlib.contextmanager
def _stop_requests() -> Iterator[dict[str, Any]]:
    """SIGTERM, SIGINT (a Ctrl-C, a `kill`) and SLURM's warning (SIGURG: :data:`opdgrpo.train.time_limit.WARNING_SIGNAL`)
    only note the signal; the loop checkpoints and stops after the step."""
    stop: dict[str, Any] = {"signal": None}

    def request_stop(signum, _frame):
        stop["signal"] = signum

    warning = getattr(signal, f"SIG{WARNING_SIGNAL}")
    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT, warning)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _finish(run: Run, final: dict[str, Any], started: float) -> dict[str, Any]:
    """``done.json``: the run's totals, FLOPs by component, MFU, and the machine's numerics."""
    summary = {"run": run.cfg["run_id"], "method": run.objective.name, "steps": run.shape.steps,
               "cumulative_flops": run.cumulative, "final_eval": final["results"], "parameters": parameter_count(run.student),
               "processes": run.workers.world, "collective_timeout_s": run.workers.collective_timeout_s(),
               "wall_s": round(time.time() - started, 1), "counted": True,
               "numerics": numerics.report()}   # the machine's fingerprint and which exact fast paths ran
    if run.workers.device.type == "cuda":   # torch's allocator on the main process (vLLM's own pool may add to it)
        summary["cuda_max_memory_reserved_bytes"] = torch.cuda.max_memory_reserved(run.workers.device)
    placement = getattr(run.engine, "placement", None)
    if placement is not None:   # where each rank's vLLM engine ran, as vLLM reports it (a collective: every rank)
        summary["engines"] = run.workers.gather(placement)
    gpu_slots.record_into(summary)   # on a machine: the GPU slots the job ran on (opdgrpo.launch)
    if run.main:
        totals: dict[str, float] = {}
        ledger = read_jsonl(run.ledger)
        for record in ledger:
            for component, value in record["flops"].items():
                totals[component] = totals.get(component, 0.0) + value
        # Mean achieved training FLOP/s over the steps' wall time (evaluation excluded) and MFU against the peak.
        summary = {**summary, "flops_by_component": totals, **mfu_summary(ledger, run.peak, run.workers.world)}
        if run.subset:
            summary["train_subset"] = run.subset
        # the final checkpoint as downstream runs will check and identify it (opdgrpo.train.finished)
        summary["checkpoint"] = checkpoint_record(run.run_dir / "checkpoint", hash_contents=False)
        summary["history"] = history_record(run.run_dir)   # what the report checks it reads (evals, ledger)
        write_json(run.run_dir / "done.json", summary)
        run.progress.event("done", {"steps": run.shape.steps, "wall": clock(summary["wall_s"]),
                                    "flops": run.cumulative, "mfu": summary.get("mfu")})
    run.workers.barrier()
    return summary


# --------------------------------------------------------------------------------------------------------------------
# Setting a run up: settings, data, resume point, models


def _setup(cfg: dict[str, Any], run_dir: Path, workers: Workers) -> Run:
    torch.set_num_threads(int(cfg["threads"]))
    # The tokenizer's batch calls (Rust, rayon) would otherwise use every core of a machine Snakemake already fills
    # with one-thread jobs; a value set by the user wins.
    os.environ.setdefault("RAYON_NUM_THREADS", str(int(cfg["threads"])))
    configured = RunShape.of(cfg, workers.world)
    # The job's one resolution of `precision` (auto: per device, once per DAG on a CPU): every autocast, the FSDP
    # policy, the teachers' forwards and MFU's peak read `shape.precision` from here on. With several processes the
    # main process's decision is every process's: outside the workflow (no DAG record) each one measures `auto` for
    # itself, and two measurements on a loaded machine can disagree (then one refuses a bf16 checkpoint while the
    # others wait for it in a collective, or two shards of one model compute in different arithmetic).
    shape = configured.resolved(workers.gather(resolve_precision(configured.precision, workers.device))[0])
    workers.policy = fsdp.Policy.from_config(shape.settings["fsdp"], shape.precision)
    shared = shape.settings
    tokenizer = load_tokenizer(Path(cfg["tokenizer"]))
    domains = {name: build_domain(d) for name, d in cfg["domains"].items()}
    pools = {d: domains[d].training_pool() for d in cfg["train_domains"]}
    heldout = heldout_for(domains, cfg["eval_domains"])
    subset = restrict_to_subset(pools, heldout, cfg["train_subset"]) if cfg.get("train_subset") else None
    counts = domain_counts(pools, shape.prompts_per_step, shape.mix)

    identity, checkpoint, state = _resume_point(cfg, run_dir, workers, shape.eval_every)
    if state:
        check_precision(state, shape.precision, configured.precision, cfg["run_id"], run_dir)
    param_dtype = getattr(torch, str(shared["param_dtype"]))
    attention = str(shared["attn_implementation"])
    student = load_model(checkpoint if state else cfg["student"]["path"], dtype=param_dtype,
                         attn_implementation=attention, device=workers.device)
    if shared["activation_checkpointing"]:
        enable_activation_checkpointing(student)
    objective = build_objective(cfg["method"], _teachers(cfg, workers, attention, shared["teacher_dtype"]),
                                shape.precision, temperature=shape.rollout.temperature,
                                chunk_tokens=shape.logit_chunk_tokens, pack_tokens=shape.packed_row_tokens)
    if state is None:
        _clear_stale(run_dir, workers)
    method = cfg["method"]
    # The denominator of MFU, measured once per process before any step (never inside a step's wall time).
    peak = run_peak(shape.precision, param_dtype, workers.device)
    # DDP replicas or FSDP shards when several processes share the run; the optimizer over what this process trains.
    model, optimizer = workers.prepare(student, lambda params: torch.optim.AdamW(
        params, lr=float(method["lr"]), betas=tuple(method["betas"]), weight_decay=float(method["weight_decay"])))
    run = Run(cfg, run_dir, workers, tokenizer, domains, pools, heldout, counts, PromptFormat.from_config(shared),
              student, model, optimizer, objective, identity, peak, subset, shape=shape,
              reference=_reference(cfg, shape, workers.device, attention, param_dtype))
    # The engine starts before a resume moves Adam's state to the device: vLLM measures the free memory as it starts
    # (gpu_memory_utilization is a share of the whole device), and the planner's `trainer_at_start` counts the
    # trainer's weights and teachers then, as on a fresh start, never the optimizer state that comes after.
    run.engine = _engine(run, int(state["step"]) if state else 0)
    if state:
        _resume(run, state)
    if run.main:
        write_yaml(run_dir / "config.yaml", cfg)
        run.progress = Progress(cfg["run_id"], shape.steps, run.start)
        run.limit = _time_limit(run)
        run.tracker = Tracker(shared["report_to"], run_dir, cfg["run_id"], cfg, run.start)
    return run


def _time_limit(run: Run) -> TimeLimit | None:
    """Under SLURM, the allocation's end, which the run stops before (:mod:`opdgrpo.train.time_limit`); its first
    save is estimated from the checkpoint's bytes until one is measured. Said in the job's log."""
    limit = TimeLimit.from_environment()
    left = limit.seconds_left() if limit is not None else None
    if left is None:
        return None
    run.durations.save_s = expected_save_seconds(parameter_count(run.student))
    run.progress.event("time_limit", {"slurm_job": limit.job_id, "seconds_left": round(left),
                                      "save_estimate_s": round(run.durations.save_s, 1),
                                      "margin_s": limit.margin_s})
    return limit


def _engine(run: Run, start: int):
    """``train.engine``: None for ``hf`` (the sampler runs on the policy itself); for ``vllm`` an engine in this
    process for the policy (its weights come with the first sync, before the first sampling), sized for the job's
    longest row (its longest training or held-out prompt + ``max_new_tokens``), seeded by the run's seed and the
    attempt's first step ``start`` (:func:`~opdgrpo.train.batching.engine_seed`), its log-probs as the rollouts'
    temperature and ``method.engine_is_cap`` ask (:func:`~opdgrpo.train.engines.vllm_engine.rollout_logprobs_mode`);
    its config and tokenizer go to the run directory's ``.engine/`` scratch folder, which :func:`_close_engine`
    removes when the job ends."""
    name = run.shape.engine
    if name == "hf":
        return None
    from opdgrpo.train.engines import build_engine, longest_row
    from opdgrpo.train.engines.vllm_engine import rollout_logprobs_mode

    tasks = [t for pool in run.pools.values() for t in pool]
    tasks += [t for sets in run.heldout.values() for s in sets.values() for t in s]
    max_len = longest_row(run.tokenizer, tasks, run.fmt, run.shape.rollout.max_new_tokens)
    scratch = run.run_dir / ".engine" / f"rank{run.workers.rank}"
    with run.workers.full_params(run.model) as policy:
        return build_engine(name, policy, run.tokenizer, scratch=scratch, settings=run.shape.settings["vllm"],
                            max_len=max_len, seed=engine_seed(int(run.cfg["seed"]), start),
                            logprobs_mode=rollout_logprobs_mode(run.shape.rollout.temperature,
                                                                run.shape.method["engine_is_cap"]))


def _engine_awake(run: Run):
    """The engine awake for a sync and the samplings after it (one wake and one sleep), or nothing under ``hf``."""
    return run.engine.awake() if run.engine is not None else contextlib.nullcontext()


def _close_engine(run: Run) -> None:
    """Shut the engine down and drop its scratch folder (no file of it outlives the job). Last in the job: vLLM's
    teardown ends the process group it shares with the trainer."""
    import shutil

    engine, run.engine = run.engine, None
    if engine is not None:
        engine.close()
    shutil.rmtree(run.run_dir / ".engine", ignore_errors=True)


def _resume_point(cfg: dict[str, Any], run_dir: Path, workers: Workers,
                  eval_every: int) -> tuple[str, Path | None, dict | None]:  # fmt: skip
    """This run's identity and the checkpoint to resume from, if one of this run exists and its history up to it is
    whole (:func:`opdgrpo.train.checkpoint.history_gaps`). The identity checks every upstream output first
    (:func:`opdgrpo.train.finished.verify_finished`): a broken one stops the job here, before anything of this run is
    touched. A checkpoint not resumed is cleared later, by :func:`_clear_stale`, once the new inputs have loaded."""
    run_dir.mkdir(parents=True, exist_ok=True)
    identity = run_identity(cfg)
    checkpoint, state = resume_point(run_dir)
    if state and state["config_hash"] != identity:
        if workers.is_main:
            log.warning("%s: config or upstream checkpoints changed since the last checkpoint; starting over", cfg["run_id"])
        state = None
    gaps = history_gaps(run_dir, int(state["step"]), eval_every) if state else None
    if gaps:
        if workers.is_main:
            log.warning("%s: the checkpoint at step %s is not resumed, its history is incomplete (%s); starting over",
                        cfg["run_id"], state["step"], gaps)
        state = None
    return identity, checkpoint, state


def _clear_stale(run_dir: Path, workers: Workers) -> None:
    """A run that starts over drops what a previous, different run left, only after its own student and teachers
    loaded: a load that fails (a file the size check cannot catch) then leaves the finished work where it was."""
    workers.barrier()  # every process has read the checkpoint before the main one may clear it
    if workers.is_main:
        clear_run(run_dir)
    workers.barrier()


def _teachers(cfg: dict[str, Any], workers: Workers, attention: str, teacher_dtype: str) -> dict[str, torch.nn.Module]:
    """OPD: domain -> frozen teacher (check_run_inputs: same tokenizer as the student); one load per checkpoint, in
    its own ``dtype`` or else ``train.teacher_dtype``.
    Under FSDP each teacher is sharded as the student is (:meth:`Workers.prepare_frozen`): 1/N of its weights per
    process instead of a replica (65 GB for Qwen3-32B in bfloat16), gathered a layer at a time in
    ``train.fsdp.param_dtype``."""
    if cfg["method"]["name"] != "opd":
        return {}
    loaded: dict[str, torch.nn.Module] = {}
    teachers = {}
    for d in cfg["train_domains"]:
        path = cfg["teachers"][d]["path"]
        dtype = getattr(torch, str(cfg["teachers"][d].get("dtype") or teacher_dtype))
        if path not in loaded:
            loaded[path] = workers.prepare_frozen(load_model(   # sharded from host memory, else built on the device
                path, dtype=dtype, trainable=False, attn_implementation=attention,
                device=None if workers.sharded else workers.device).eval())
            if workers.sharded:
                held = sum(p.to_local().numel() for p in loaded[path].parameters())
                total = sum(p.numel() for p in loaded[path].parameters())
                log.info("teacher %s: FSDP2-sharded over %d processes, %d of its %d weights on process %d, "
                         "gathered in %s", path, workers.world, held, total, workers.rank,
                         str(workers.policy.param_dtype).removeprefix("torch."))
        teachers[d] = loaded[path]
    return teachers


def _reference(cfg: dict[str, Any], shape: RunShape, device: torch.device, attention: str,
               dtype: torch.dtype) -> FrozenForward | None:
    """GRPO with ``beta > 0``: the frozen reference model, the run's initial student checkpoint (``student.path``,
    also on resume), in the student's parameter dtype; forwarded without gradients. None otherwise."""
    if not shape.reference:
        return None
    model = load_model(cfg["student"]["path"], dtype=dtype, trainable=False, attn_implementation=attention, device=device)
    return FrozenForward(model.eval())


def _resume(run: Run, state: dict[str, Any]) -> None:
    """Optimizer, RNG, step, FLOPs and skip streak from the checkpoint; ledger and eval lines after it dropped."""
    run.workers.load_optimizer_state(run.model, run.optimizer, state["optimizer"])
    restore_rng(state)
    run.start, run.cumulative = int(state["step"]), float(state["cumulative_flops"])
    run.streak = int(state.get("nonfinite_streak", 0))
    if run.main:
        keep_records(run.ledger, lambda r: r["step"] < run.start)
        keep_records(run.evals, lambda r: r["step"] < run.start)
        log.info("resuming %s at step %d (%.3g training FLOPs so far)", run.cfg["run_id"], run.start, run.cumulative)
