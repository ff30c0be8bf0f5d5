"""One training step's totals: FLOPs by component, tokens by kind, loss, rewards, lengths and metrics.

A step is one sampled batch, whatever the number of optimiser updates made on it (``method.updates_per_batch``
passes over it, each in ``method.minibatches`` updates): its FLOPs are the sum of every pass, its tokens, rewards and
lengths those of the batch (counted once), and its loss, metrics and gradient norm means over the updates. OPD's
per-teacher diagnostics (:mod:`opdgrpo.train.teacher_stats`) are sums and counts that follow the same rule: tokens
and rollouts once, the reverse KL over every update's tokens.

Each process accumulates its own shards; :meth:`StepStats.all_reduce` sums them over the processes (one collective,
float64, so FLOP counts stay exact) and :meth:`StepStats.ledger_line` writes the step's line of the FLOP ledger
(the ledger's keys are a contract, listed in docs/method.md, "The FLOP ledger").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from opdgrpo.train.objectives import Shard
from opdgrpo.train.teacher_stats import TeacherTotals

#: Components of a step's training FLOPs, in the ledger's order. ``old_policy``: the sampling policy's forward
#: before the first update, when a batch gets several updates (else 0: one update per batch reuses the training
#: forward's log-probabilities, see objectives.GRPOObjective).
COMPONENTS = ("rollout", "train", "old_policy", "teacher")
#: Components a run's ledger has only when it computes them: ``reference``, the frozen reference model's forward of
#: GRPO with ``beta > 0`` (absent, not 0, elsewhere: the ledgers of runs without one stay what they were).
OPTIONAL_COMPONENTS = ("reference",)
TOKEN_KINDS = ("prompt", "completion", "rollout_computed", "train", "teacher")


def components(reference: bool = False) -> tuple[str, ...]:
    """The FLOP components of a run's ledger lines: :data:`COMPONENTS`, and ``reference`` if it loads one."""
    return COMPONENTS + (OPTIONAL_COMPONENTS if reference else ())


#: Ledger keys that are clock readings (they differ between runs of one config; everything else is reproducible).
TIMING_KEYS = frozenset({"wall_s", "achieved_flops_per_s", "phase_s"})


@dataclass
class StepStats:
    flops: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COMPONENTS, 0.0))
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOKEN_KINDS, 0))
    loss: float = 0.0          # summed over shards and updates (each shard's loss normalised by its update's batch)
    reward: float = 0.0        # summed over sequences
    scored: bool = True        # the verifiers scored the step's rollouts (OPD with `score_rollouts: false` does not)
    length: float = 0.0        # response tokens, summed over sequences
    sequences: int = 0
    metrics: dict[str, float] = field(default_factory=dict)   # summed over shard losses; the ledger has their mean
    grad_norm: float | None = None   # summed over updates (the same on every process); the ledger has their mean
    updates: int = 0                 # optimiser updates made on the batch
    losses: int = 0                  # micro-batch losses computed (every update's); the ledger's metrics are their mean
    skipped: str | None = None   # the component that made a skipped step non-finite
    seconds: dict[str, float] = field(default_factory=dict)   # wall time of the step's phases on the main process
    #: OPD's per-teacher sums (the ledger's ``teachers``); None without teachers (GRPO: no such key in its ledger)
    teachers: TeacherTotals | None = None

    @classmethod
    def of(cls, names: tuple[str, ...], teachers: tuple[str, ...] = ()) -> "StepStats":
        """Empty totals with these FLOP components (:func:`components`) and, for the domains that have a teacher
        (:attr:`opdgrpo.train.objectives.Objective.teacher_domains`), per-teacher totals."""
        return cls(flops=dict.fromkeys(names, 0.0), teachers=TeacherTotals.of(teachers) if teachers else None)

    def add_loss(self, loss: torch.Tensor, metrics: dict[str, float]) -> None:
        """A shard's loss and metrics, after its backward (once per update the shard takes part in)."""
        self.loss += loss.item()
        self.losses += 1
        for name, value in metrics.items():
            self.metrics[name] = self.metrics.get(name, 0.0) + value

    def add_update(self, grad_norm: torch.Tensor) -> None:
        self.grad_norm = (self.grad_norm or 0.0) + float(grad_norm)
        self.updates += 1

    def add_sampled(self, shard: Shard) -> None:
        """A sampled shard's prompt, completion and rollout tokens, rewards and lengths (once per step)."""
        ro, batch = shard.scored.rollouts, shard.sequences.shape[0]
        self.tokens["prompt"] += int(shard.attention_mask[:, : ro.prompt_len].sum())
        self.tokens["completion"] += int(shard.mask.sum())
        self.tokens["rollout_computed"] += int(ro.tokens_computed)
        if self.scored:
            self.reward += float(shard.scored.rewards.sum())
        self.length += sum(shard.scored.response_lengths)
        self.sequences += batch
        if self.teachers is not None:
            self.teachers.add_rollouts(shard.tasks, shard.scored.rewards if self.scored else None)

    def add_trained(self, shard: Shard, teachers: bool, student_positions: int | None = None) -> None:
        """A training micro-batch's tokens as the student's (and teachers') forwards computed them (once per step,
        however many updates it takes part in): the padded tensor's, or ``student_positions`` where the student's
        passes ran over packed rows (train.packed_row_tokens); the teachers' as their forwards counted them
        (:attr:`Shard.teacher_positions`: padded, or packed per teacher)."""
        batch, length = shard.sequences.shape[0], shard.sequences.shape[1]
        self.tokens["train"] += batch * length if student_positions is None else student_positions
        if teachers:
            self.tokens["teacher"] += batch * length if shard.teacher_positions is None else shard.teacher_positions
        if self.teachers is not None:   # response tokens routed to each teacher
            self.teachers.add_tokens(shard.tasks, shard.mask)

    def all_reduce(self, workers) -> "StepStats":
        """The step's totals over every process (identity on one process). A skipped step sums its FLOPs only.
        Per-teacher totals ride in the same collective (every process holds the same teachers, in the same order)."""
        names = list(self.flops)
        flops = dict(zip(names, workers.sum([self.flops[n] for n in names])))
        if self.skipped:
            return dataclasses.replace(self, flops=flops)
        kinds, metric_names = list(self.tokens), sorted(self.metrics)
        teacher_sums = self.teachers.flat() if self.teachers is not None else []
        totals = workers.sum([*(self.tokens[n] for n in kinds), self.loss, self.reward, self.length, self.sequences,
                              *(self.metrics[n] for n in metric_names), self.losses, *teacher_sums])
        teacher_totals, totals = totals[len(totals) - len(teacher_sums):], totals[:len(totals) - len(teacher_sums)]
        scalars = totals[len(kinds): len(kinds) + 4]
        return dataclasses.replace(
            self, flops=flops, tokens={n: int(v) for n, v in zip(kinds, totals)},
            loss=scalars[0], reward=scalars[1], length=scalars[2], sequences=int(scalars[3]),
            metrics=dict(zip(metric_names, totals[len(kinds) + 4:-1])), losses=int(totals[-1]),
            teachers=self.teachers.with_flat(teacher_totals) if self.teachers is not None else None)

    def ledger_line(self, step: int, cumulative: float, lr: float, wall: float, losses: int | None = None) -> dict[str, Any]:
        """The step's ledger line (after :meth:`all_reduce`); ``cumulative`` includes this step; ``losses``: the
        micro-batch losses computed in the step over every process, whose metrics the line averages (default: the
        count :meth:`add_loss` kept; shards x ``updates_per_batch`` without ``train.max_tokens_per_microbatch``).
        Loss and gradient norm are means over the updates. ``teachers`` (OPD only): per teacher, the step's
        diagnostics (:meth:`opdgrpo.train.teacher_stats.TeacherTotals.ledger`)."""
        losses = self.losses if losses is None else losses
        step_flops = sum(self.flops.values())
        rate = {"lr": lr, "wall_s": round(wall, 3), "achieved_flops_per_s": step_flops / wall,
                "phase_s": {name: round(value, 3) for name, value in self.seconds.items()}}
        if self.skipped:
            return {"step": step, "skipped": self.skipped, "flops": self.flops, "step_flops": step_flops,
                    "cumulative_flops": cumulative, **rate}
        teachers = {} if self.teachers is None else {"teachers": self.teachers.ledger(self.scored)}
        return {"step": step, "tokens": self.tokens, "flops": self.flops, "step_flops": step_flops,
                "cumulative_flops": cumulative, "reward": self.reward / self.sequences if self.scored else None,
                "loss": self.loss / self.updates, "grad_norm": float(self.grad_norm) / self.updates,
                "mean_response_length": self.length / self.sequences,
                "metrics": {n: v / losses for n, v in self.metrics.items()},   # mean over shard losses
                **teachers, **rate}
