"""What each method trains on a shard of rollouts: GRPO's clipped policy gradient or OPD's top-k reverse KL.

Our own code, because the two objectives are the paper's subject (the loss arithmetic is in :mod:`opdgrpo.train.losses`).
The trainer picks one objective per run (:func:`build_objective`) and calls the same methods every shard, so
the training loop has no branch on the method: ``loss(logits, shard, normalizer, check, flops, teachers)`` returns
the loss and its metrics, adds what it computed beyond the student's passes to the step's ``flops`` (OPD's teacher
forwards) and, where the trainer passes the step's per-teacher totals (:class:`~opdgrpo.train.teacher_stats.TeacherTotals`),
each teacher's reverse KL sums to them (OPD; GRPO has no teacher), :attr:`Objective.scores_with_teachers` says
whether teachers ran over the shard's tokens, :attr:`Objective.teacher_domains` which domains have one, and
``logprobs(logits, shard)`` turns logits of the shard's tokens into the log-probs the objective reads (the trainer
calls it on the forwards it runs before the first update: the sampling policy's and the reference's, stored on the
shard as :attr:`Shard.old_logprobs` and :attr:`Shard.ref_logprobs`).

``check(tensor, component, label)`` is the trainer's non-finite guard (fault injection and the NaN/inf check): an
objective passes each intermediate it produces through it at the point it exists, and never decides itself what a
non-finite value means.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from opdgrpo.domains import Task
from opdgrpo.run_shape import DEFAULT_CHUNK_TOKENS, method_settings
from opdgrpo.train import flops as flop_formulas
from opdgrpo.train.inference import FrozenForward
from opdgrpo.train.logit_chunks import Reduce
from opdgrpo.train.losses import group_advantages, grpo_loss, reverse_kl_loss, student_topk, token_logprobs, topk_reverse_kl_per_token
from opdgrpo.train.models import autocast
from opdgrpo.train.packed_rows import PackedRows, pack, packed_flops, worth_packing
from opdgrpo.train.rollout import ScoredRollouts
from opdgrpo.train.teacher_stats import TeacherTotals

#: ``check(tensor, component, label) -> tensor``: the trainer's guard (see the module docstring).
Check = Callable[[torch.Tensor, str, str], torch.Tensor]


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions of left-padded rows: 0 at each row's first real token."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


@dataclass
class Shard:
    """One shard of a step: its prompts (each repeated per rollout) and their scored rollouts; the log-probs of its
    tokens that stay fixed over the step's updates, where the trainer computed them (``None`` otherwise)."""

    tasks: list[Task]
    scored: ScoredRollouts
    old_logprobs: torch.Tensor | None = field(default=None, repr=False)   # the sampling policy's (B, T)
    ref_logprobs: torch.Tensor | None = field(default=None, repr=False)   # the reference model's (B, T)
    #: GRPO's per-row advantages, when the rows were repacked from the sampled shards that held their groups
    #: (train.max_tokens_per_microbatch, :mod:`opdgrpo.train.microbatch`); None: computed from this shard's own groups
    advantages: torch.Tensor | None = field(default=None, repr=False)
    #: the rows laid end to end for the student's passes (train.packed_row_tokens, :mod:`opdgrpo.train.packed_rows`),
    #: decided once per micro-batch before its first forward; None: padded
    packed: PackedRows | None = field(default=None, repr=False)
    #: the positions OPD's teachers' forwards computed over the shard (padded, or packed rows), set by the objective
    teacher_positions: int | None = field(default=None, repr=False)

    @property
    def sequences(self) -> torch.Tensor:
        return self.scored.rollouts.sequences

    @property
    def attention_mask(self) -> torch.Tensor:
        return self.scored.rollouts.attention_mask

    @property
    def new_tokens(self) -> int:
        """Decode positions after the padded prompt block (the logits the loss reads, plus one)."""
        return self.sequences.shape[1] - self.scored.rollouts.prompt_len

    @property
    def targets(self) -> torch.Tensor:
        return self.sequences[:, self.scored.rollouts.prompt_len:]

    @property
    def mask(self) -> torch.Tensor:
        return self.scored.rollouts.completion_mask


class Objective(Protocol):
    name: str
    rollouts_per_prompt: int
    aggregation: str
    scores_with_teachers: bool
    needs_rewards: bool   # the loss reads the verifiers' rewards (GRPO); OPD scores its rollouts only for the ledger
    #: the domains whose rows a teacher scores, in the run's order (OPD: every training domain); () without teachers
    teacher_domains: tuple[str, ...]

    def loss(self, logits: torch.Tensor, shard: Shard, normalizer: float | None, check: Check,
             flops: dict[str, float], teachers: TeacherTotals | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """(loss, metrics) of one shard, given the student's logits over its response; ``teachers``: the step's
        per-teacher totals, which an objective with teachers adds this shard's per-teacher sums to."""

    def logprobs(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` log-probs of the response tokens ``targets`` (a shard's, or a chunk of them) under ``logits``,
        as the objective reads them."""

    def advantages(self, shard: Shard) -> torch.Tensor | None:
        """Per-row values computed over a row's group of a sampled shard (GRPO's advantages), carried when rows are
        repacked into other micro-batches; None where the objective has none."""

    def student_reduce(self, shard: Shard, check: Check) -> tuple[Reduce, tuple[torch.Tensor, ...]]:
        """What the loss reads of the student's logits, per position (``reduce(logits, *extras)``, with the shard's
        per-position ``extras``), for :func:`opdgrpo.train.logit_chunks.reduce_response`; ``check`` sees every chunk's
        logits (component ``student_logits``)."""

    def loss_from(self, reduced: tuple[torch.Tensor, ...], shard: Shard, normalizer: float | None, check: Check,
                  flops: dict[str, float], vocab: int,
                  teachers: TeacherTotals | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """:meth:`loss` from :meth:`student_reduce`'s per-position values over the whole response; ``vocab`` is the
        student's logits' last dimension."""


class GRPOObjective:
    """Group-relative advantages of verifiable rewards, PPO-clipped surrogate (:func:`~opdgrpo.train.losses.grpo_loss`).

    Log-probs are those of the sampling distribution: logits divided by ``temperature`` (``train.temperature``)
    before the log-softmax, for the current policy, the old policy and the reference alike. The old policy's are
    :attr:`Shard.old_logprobs` when the trainer computed them (several updates per batch), else the current ones
    detached (one update per batch: the ratio is 1). ``beta > 0`` adds ``beta`` times the k3 estimate of
    KL(policy || reference) per token, the reference's log-probs being :attr:`Shard.ref_logprobs`.
    """

    name, scores_with_teachers, needs_rewards = "grpo", False, True
    teacher_domains: tuple[str, ...] = ()

    def __init__(self, method: dict[str, Any], temperature: float = 1.0):
        method = method_settings({**method, "name": "grpo"})
        self.rollouts_per_prompt = int(method["group_size"])
        self.aggregation = str(method["aggregation"])
        self.scale_by_std = bool(method["scale_by_std"])
        self.clip_eps, self.clip_eps_high = float(method["clip_eps"]), method["clip_eps_high"]
        self.beta = float(method["beta"])
        self.temperature = float(temperature)
        self.engine_is_cap = method["engine_is_cap"]

    def logprobs(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return token_logprobs(logits, targets, temperature=self.temperature)

    def advantages(self, shard: Shard) -> torch.Tensor:
        """Each row's group-relative advantage (its group: the ``group_size`` consecutive rows of its prompt)."""
        if shard.advantages is not None:
            return shard.advantages
        return group_advantages(shard.scored.rewards, self.rollouts_per_prompt, scale_by_std=self.scale_by_std)

    def student_reduce(self, shard: Shard, check: Check) -> tuple[Reduce, tuple[torch.Tensor, ...]]:
        def reduce(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor]:
            return (token_logprobs(check(logits, "student_logits"), targets, temperature=self.temperature),)
        return reduce, (shard.targets,)

    def loss(self, logits: torch.Tensor, shard: Shard, normalizer: float | None, check: Check,
             flops: dict[str, float], teachers: TeacherTotals | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        return self.loss_from((self.logprobs(logits, shard.targets),), shard, normalizer, check, flops, logits.shape[-1])

    def loss_from(self, reduced: tuple[torch.Tensor, ...], shard: Shard, normalizer: float | None, check: Check,
                  flops: dict[str, float], vocab: int,
                  teachers: TeacherTotals | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """``teachers`` is never touched: GRPO has none (the trainer passes None, :attr:`teacher_domains` being ())."""
        (logprobs,) = reduced
        advantages = self.advantages(shard).to(logprobs.device)
        # One optimiser step per batch: the sampling policy is the current one, so the old log-probabilities are
        # these, detached (no extra forward, none counted). Several: the sampling policy's, computed before the
        # first update (the ledger's ``old_policy``).
        old = logprobs.detach() if shard.old_logprobs is None else shard.old_logprobs
        if self.beta > 0 and shard.ref_logprobs is None:
            raise ValueError("GRPO with beta > 0: the trainer computed no reference log-probs for this shard")
        weights, engine_metrics = engine_correction(old, shard, self.engine_is_cap)
        loss, metrics = grpo_loss(logprobs, old, advantages, shard.mask, clip_eps=self.clip_eps,
                                  clip_eps_high=self.clip_eps_high, aggregation=self.aggregation, normalizer=normalizer,
                                  ref_logprobs=shard.ref_logprobs if self.beta > 0 else None, beta=self.beta,
                                  weights=weights)
        return loss, {**metrics, **engine_metrics}


class OPDObjective:
    """Each prompt's domain teacher scores every token the student wrote; top-k reverse KL to it
    (:func:`~opdgrpo.train.losses.topk_reverse_kl`). Teachers are frozen and forwarded without gradients.

    Only the teacher's logits at the student's top-k ids are kept: its decoder runs over the shard's rows of its
    domain, and its LM head over ``chunk_tokens`` positions at a time (:mod:`opdgrpo.train.logit_chunks`), so no
    full-vocabulary teacher tensor of a whole shard exists (it was ``B x T x V`` in float32, plus the bfloat16 one).
    Under FSDP (:meth:`opdgrpo.train.distributed.Workers.prepare_frozen`) a teacher is sharded like the student, and its
    forward is a collective: every process forwards every teacher for every shard, a one-row stand-in where its
    shard has no row of that domain."""

    name, scores_with_teachers, needs_rewards = "opd", True, False

    def __init__(self, method: dict[str, Any], teachers: dict[str, torch.nn.Module], precision: str,
                 chunk_tokens: int = DEFAULT_CHUNK_TOKENS, temperature: float = 1.0, pack_tokens: int | None = None):
        self.temperature = float(temperature)   # the rollouts': the engine comparison's log-probs only
        self.pack_tokens = pack_tokens          # train.packed_row_tokens: teachers' forwards over packed rows
        if method.get("engine_is_cap") is not None:   # a job config written by hand: compose refuses it too
            raise ValueError("config key `method.engine_is_cap` does nothing under OPD (docs/method.md, 'Off-policy "
                             "correction'); remove it")
        self.rollouts_per_prompt = int(method["rollouts_per_prompt"])
        self.aggregation = str(method["aggregation"])
        self.kl_top_k = int(method["kl_top_k"])
        self.teachers = teachers                                   # domain -> model (one model may serve several)
        self.teacher_domains = tuple(teachers)
        self.forwards = {id(t): FrozenForward(t) for t in teachers.values()}
        self.precision = precision
        self.chunk_tokens = int(chunk_tokens)

    def logprobs(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Untempered: OPD's loss compares the student's and the teachers' own distributions (docs/method.md, "OPD"),
        whatever temperature sampled the states it is computed on."""
        return token_logprobs(logits, targets)

    def advantages(self, shard: Shard) -> None:
        """None: OPD's loss reads no value of a row's group."""
        return None

    def student_reduce(self, shard: Shard, check: Check) -> tuple[Reduce, tuple[torch.Tensor, ...]]:
        """:func:`student_topk`'s values; with an engine's log-probs on the shard, also the sampled tokens'
        log-probs at the rollouts' temperature, detached (for :func:`engine_correction`)."""
        if shard.scored.rollouts.logprobs is None:
            def reduce(logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
                return student_topk(check(logits, "student_logits"), self.kl_top_k)
            return reduce, ()

        def reduce_with_tokens(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
            logits = check(logits, "student_logits")
            with torch.no_grad():
                sampled = token_logprobs(logits, targets, temperature=self.temperature)
            return (*student_topk(logits, self.kl_top_k), sampled)
        return reduce_with_tokens, (shard.targets,)

    def teacher_topk(self, top_ids: torch.Tensor, vocab: int, shard: Shard, check: Check,
                     flops: dict[str, float]) -> torch.Tensor:
        """Every row's teacher logits at the student's top-k ids ``(B, T, k)``, float32, under its domain's teacher
        (FLOPs counted as each teacher forward ends, so a step stopped by a non-finite value still counts what it
        computed). ``check`` sees each chunk's logits over the student's ``vocab`` (a teacher's padded entries are
        never read)."""
        out_all = torch.empty(top_ids.shape, dtype=torch.float32, device=top_ids.device)
        seqs, attn, keep = shard.sequences, shard.attention_mask, shard.new_tokens + 1
        shard.teacher_positions = 0
        with torch.no_grad(), autocast(self.precision, top_ids.device.type):
            for domain, teacher in self.teachers.items():
                forward = self.forwards[id(teacher)]
                rows = torch.tensor([r for r, t in enumerate(shard.tasks) if t.domain == domain], dtype=torch.long,
                                    device=top_ids.device)
                if len(rows) == 0:
                    if forward.sharded:
                        # The other processes' forwards gather this teacher's shards layer by layer, a collective this
                        # process must join: a one-token stand-in (its FLOPs, a one-token forward, are not in the
                        # ledger, which counts the same work whatever the number of processes).
                        one = torch.ones(1, 1, dtype=attn.dtype, device=attn.device)
                        forward.reduced(seqs[:1, :1], one, torch.zeros_like(one, dtype=torch.long), 1, _first_logit,
                                        (), self.chunk_tokens)
                    continue
                label = f"teacher logits ({domain} teacher)"

                def reduce(logits: torch.Tensor, ids: torch.Tensor, label: str = label) -> tuple[torch.Tensor]:
                    return (check(logits[..., :vocab], "teacher_logits", label).gather(-1, ids),)

                packed = self._packed(teacher, seqs[rows], attn[rows], shard.scored.rollouts.prompt_len)
                if packed is not None:   # rows laid end to end (train.packed_row_tokens), where that costs less
                    (picked,) = forward.reduced_packed(packed, reduce, (top_ids[rows],), self.chunk_tokens)
                    flops["teacher"] += packed_flops(teacher.config, packed, head_positions=len(rows) * keep)
                    shard.teacher_positions += packed.rows * packed.length
                else:   # bit for bit the teacher's own eager forward, fewer copies and casts (opdgrpo.train.inference)
                    (picked,) = forward.reduced(seqs[rows], attn[rows], position_ids(attn[rows]), keep, reduce,
                                                (top_ids[rows],), self.chunk_tokens)
                    flops["teacher"] += flop_formulas.forward_flops(teacher.config, len(rows), seqs.shape[1],
                                                                    logits_positions=keep)
                    shard.teacher_positions += len(rows) * seqs.shape[1]
                out_all[rows] = picked.float()
        return out_all

    def _packed(self, teacher: torch.nn.Module, seqs: torch.Tensor, attn: torch.Tensor,
                prompt_len: int) -> PackedRows | None:
        """A domain's rows laid end to end for its teacher's forward, where ``train.packed_row_tokens`` is set and
        that computes fewer of the teacher's FLOPs than the padded rows; else None."""
        if self.pack_tokens is None:
            return None
        packed = pack(seqs, attn, prompt_len, self.pack_tokens)
        return packed if worth_packing(teacher.config, packed, tuple(seqs.shape)) else None

    def loss(self, logits: torch.Tensor, shard: Shard, normalizer: float | None, check: Check,
             flops: dict[str, float], teachers: TeacherTotals | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        reduce, extras = self.student_reduce(shard, lambda tensor, *_: tensor)   # the trainer checked these logits
        return self.loss_from(reduce(logits, *extras), shard, normalizer, check, flops, logits.shape[-1], teachers)

    def loss_from(self, reduced: tuple[torch.Tensor, ...], shard: Shard, normalizer: float | None, check: Check,
                  flops: dict[str, float], vocab: int,
                  teachers: TeacherTotals | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """``vocab``: the student's logits' last dimension (a teacher's further padded entries are never read).
        ``teachers``: each row's per-token KL is added to its domain's teacher there, the same values the loss sums
        (:func:`~opdgrpo.train.losses.topk_reverse_kl_per_token`), so the per-teacher means are the loss's own KL."""
        s_top, top_ids, lse, *sampled = reduced
        teacher = self.teacher_topk(top_ids, vocab, shard, check, flops)
        # the mismatch is logged; no weight: the top-k KL at a position does not depend on the token sampled there
        # (docs/method.md, "Off-policy correction"), so ``method.engine_is_cap`` is refused for OPD in config
        _, engine_metrics = engine_correction(sampled[0], shard, None) if sampled else (None, {})
        per_token = topk_reverse_kl_per_token(s_top, teacher)
        loss, metrics = reverse_kl_loss(per_token, s_top, lse, shard.mask, self.aggregation, normalizer)
        if teachers is not None:
            teachers.add_kl(shard.tasks, per_token, shard.mask)
        return loss, {**metrics, **engine_metrics}


def engine_correction(trainer: torch.Tensor, shard: Shard, cap: float | None) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The sampling engine against the trainer, where the engine reported log-probs (``train.engine: vllm``).

    ``trainer``: ``(B, T)`` the trainer's log-probs of the sampled tokens under the sampling policy (at the rollouts'
    temperature), detached. Metrics over the valid tokens: ``engine_logprob_diff_mean`` and ``_max``,
    ``|logp_engine - logp_trainer|`` (kernels and precision differ between the two; a large value means the
    rollouts are off-policy). With ``cap`` (``method.engine_is_cap``), the truncated importance weights
    ``min(exp(logp_trainer - logp_engine), cap)`` that correct for it (verl's TIS, TRL's vLLM IS correction), and
    their mean as ``engine_is_weight_mean``; without, None (no correction, the default)."""
    engine = shard.scored.rollouts.logprobs
    if engine is None:
        return None, {}
    trainer = trainer.detach().float()
    engine = engine.to(trainer.device)
    mask = shard.mask.to(trainer.device)
    diff = (trainer - engine).abs()[mask]
    metrics = {"engine_logprob_diff_mean": float(diff.mean()) if diff.numel() else 0.0,
               "engine_logprob_diff_max": float(diff.max()) if diff.numel() else 0.0}
    if cap is None:
        return None, metrics
    weights = torch.exp(trainer - engine).clamp(max=float(cap)) * mask
    metrics["engine_is_weight_mean"] = float(weights[mask].mean()) if bool(mask.any()) else 1.0
    return weights, metrics


def _first_logit(logits: torch.Tensor) -> tuple[torch.Tensor]:
    return (logits[..., 0],)


def build_objective(method: dict[str, Any], teachers: dict[str, torch.nn.Module], precision: str,
                    temperature: float = 1.0, chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                    pack_tokens: int | None = None) -> Objective:
    """The run's objective; ``temperature`` is the rollouts' (``train.temperature``), which GRPO's log-probs use;
    ``chunk_tokens`` (``train.logit_chunk_tokens``) the positions whose teacher logits exist at once;
    ``pack_tokens`` (``train.packed_row_tokens``) the packed rows of OPD's teachers' forwards (None: padded)."""
    if method["name"] == "grpo":
        return GRPOObjective(method, temperature)
    return OPDObjective(method, teachers, precision, chunk_tokens, temperature, pack_tokens)
