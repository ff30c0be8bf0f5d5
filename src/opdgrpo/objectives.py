"""What each method trains on a shard of rollouts: GRPO's clipped policy gradient or OPD's top-k reverse KL.

Our own code, because the two objectives are the paper's subject (the loss arithmetic is in :mod:`opdgrpo.losses`).
The trainer picks one objective per run (:func:`build_objective`) and calls the same two methods every shard, so
the training loop has no branch on the method: ``loss(logits, shard, normalizer, check, flops)`` returns the loss
and its metrics and adds what it computed beyond the student's passes to the step's ``flops`` (OPD's teacher
forwards), and :attr:`Objective.scores_with_teachers` says whether teachers ran over the shard's tokens.

``check(tensor, component, label)`` is the trainer's non-finite guard (fault injection and the NaN/inf check): an
objective passes each intermediate it produces through it at the point it exists, and never decides itself what a
non-finite value means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from . import flops as flop_formulas
from .domains import Task
from .inference import FrozenForward
from .losses import group_advantages, grpo_loss, token_logprobs, topk_reverse_kl
from .models import autocast
from .rollout import ScoredRollouts

#: ``check(tensor, component, label) -> tensor``: the trainer's guard (see the module docstring).
Check = Callable[[torch.Tensor, str, str], torch.Tensor]


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions of left-padded rows: 0 at each row's first real token."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


@dataclass
class Shard:
    """One shard of a step: its prompts (each repeated per rollout) and their scored rollouts."""

    tasks: list[Task]
    scored: ScoredRollouts

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

    def loss(self, logits: torch.Tensor, shard: Shard, normalizer: float | None, check: Check,
             flops: dict[str, float]) -> tuple[torch.Tensor, dict[str, float]]:
        """(loss, metrics) of one shard, given the student's logits over its response."""


class GRPOObjective:
    """Group-relative advantages of verifiable rewards, PPO-clipped surrogate (:func:`~opdgrpo.losses.grpo_loss`)."""

    name, scores_with_teachers = "grpo", False

    def __init__(self, method: dict[str, Any]):
        self.rollouts_per_prompt = int(method["group_size"])
        self.aggregation = str(method["aggregation"])
        self.scale_by_std = bool(method["scale_by_std"])
        self.clip_eps, self.clip_eps_high = float(method["clip_eps"]), method.get("clip_eps_high")

    def loss(self, logits: torch.Tensor, shard: Shard, normalizer: float | None, check: Check,
             flops: dict[str, float]) -> tuple[torch.Tensor, dict[str, float]]:
        advantages = group_advantages(shard.scored.rewards, self.rollouts_per_prompt,
                                      scale_by_std=self.scale_by_std).to(logits.device)
        logprobs = token_logprobs(logits, shard.targets)
        # One optimiser step per batch: the sampling policy is the current one, so the old log-probabilities are
        # these, detached (no extra forward, none counted).
        return grpo_loss(logprobs, logprobs.detach(), advantages, shard.mask, clip_eps=self.clip_eps,
                         clip_eps_high=self.clip_eps_high, aggregation=self.aggregation, normalizer=normalizer)


class OPDObjective:
    """Each prompt's domain teacher scores every token the student wrote; top-k reverse KL to it
    (:func:`~opdgrpo.losses.topk_reverse_kl`). Teachers are frozen and forwarded without gradients."""

    name, scores_with_teachers = "opd", True

    def __init__(self, method: dict[str, Any], teachers: dict[str, torch.nn.Module], precision: str):
        self.rollouts_per_prompt = int(method["rollouts_per_prompt"])
        self.aggregation = str(method["aggregation"])
        self.top_k = int(method["top_k"])
        self.teachers = teachers                                   # domain -> model (one model may serve several)
        self.forwards = {id(t): FrozenForward(t) for t in teachers.values()}
        self.precision = precision

    def teacher_logits(self, logits: torch.Tensor, shard: Shard, check: Check, flops: dict[str, float]) -> torch.Tensor:
        """Every row's logits under its domain's teacher, over the positions ``logits`` covers (FLOPs counted as
        each teacher forward ends, so a step stopped by a non-finite value still counts what it computed)."""
        out_all = torch.empty_like(logits, dtype=torch.float32)
        seqs, attn, keep = shard.sequences, shard.attention_mask, shard.new_tokens + 1
        with torch.no_grad(), autocast(self.precision, logits.device.type):
            for domain, teacher in self.teachers.items():
                rows = torch.tensor([r for r, t in enumerate(shard.tasks) if t.domain == domain], dtype=torch.long,
                                    device=logits.device)
                if len(rows) == 0:
                    continue
                # bit for bit the teacher's own eager forward, fewer copies and casts (opdgrpo.inference)
                out = self.forwards[id(teacher)](seqs[rows], attn[rows], position_ids(attn[rows]), logits_to_keep=keep)
                flops["teacher"] += flop_formulas.forward_flops(teacher.config, len(rows), seqs.shape[1], logits_positions=keep)
                out = check(out[:, :-1, : logits.shape[-1]], "teacher_logits", f"teacher logits ({domain} teacher)")
                out_all[rows] = out.float()
        return out_all

    def loss(self, logits: torch.Tensor, shard: Shard, normalizer: float | None, check: Check,
             flops: dict[str, float]) -> tuple[torch.Tensor, dict[str, float]]:
        teacher = self.teacher_logits(logits, shard, check, flops)
        return topk_reverse_kl(logits, teacher, shard.mask, k=self.top_k, aggregation=self.aggregation,
                               normalizer=normalizer)


def build_objective(method: dict[str, Any], teachers: dict[str, torch.nn.Module], precision: str) -> Objective:
    if method["name"] == "grpo":
        return GRPOObjective(method)
    return OPDObjective(method, teachers, precision)
