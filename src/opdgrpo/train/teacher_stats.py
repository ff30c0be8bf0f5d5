"""Per-teacher diagnostics of OPD: each teacher's share of a step's trained tokens, the reverse KL to it, and the
accuracy of the rollouts routed to it (the ledger's ``teachers``, docs/method.md "The FLOP ledger").

Why they exist: a multi-teacher distillation (S4, S5) routes every prompt to its domain's teacher, and its one loss
and one ``metrics.kl`` mix the teachers by how many tokens each got. Whether a consolidation reaches its experts is a
question per teacher: which teacher's KL stays high, and which one gets few tokens (long math answers can crowd out
short knowledge ones). TRL's and NeMo-RL's distillation trainers log comparable numbers.

Why sums and counts: a step's rows are spread over shards, repacked micro-batches, updates and processes. Each of
them adds sums and counts here, :meth:`opdgrpo.train.step_stats.StepStats.all_reduce` adds them over processes, and
:meth:`TeacherTotals.ledger` divides once: the exact token mean, whatever the grouping (a mean of per-micro-batch
means would weigh a micro-batch of 3 tokens as much as one of 300).

How a step with several updates counts (``method.updates_per_batch`` passes over the batch, each in
``method.minibatches`` updates; GRPO's keys, which OPD's schema does not have today, so an OPD step is one update,
but the trainer's loop is the same for both): ``tokens`` and ``token_share`` count each trained response token once
per step (the first pass, as the ledger's ``tokens``); ``reverse_kl`` is the mean over every update's tokens (a token
trained in two passes is in it twice, at the two policies it was trained at), as the step's ``metrics`` are means over
every update's losses; ``accuracy`` and ``rollouts`` count each sampled rollout once (as ``reward``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from opdgrpo.domains import Task

#: What each teacher sums, in the order of :meth:`TeacherTotals.flat`: trained response tokens routed to it (first
#: pass), the per-token reverse KL summed over every update's tokens and the number of those tokens, the rewards of
#: its rollouts (scored steps only) and the number of its rollouts.
FIELDS = ("tokens", "kl_sum", "kl_tokens", "reward_sum", "rollouts")


@dataclass
class TeacherTotals:
    """One step's per-teacher sums on this process (after ``StepStats.all_reduce``: over every process), by domain in
    the objective's order (the same on every process, so the sums line up in one collective)."""

    sums: dict[str, dict[str, float]]

    @classmethod
    def of(cls, domains: Iterable[str]) -> "TeacherTotals":
        domains = list(domains)
        if not domains:
            raise ValueError("per-teacher totals need at least one domain with a teacher (config key `teachers`)")
        return cls({d: dict.fromkeys(FIELDS, 0.0) for d in domains})

    @property
    def domains(self) -> tuple[str, ...]:
        return tuple(self.sums)

    def _rows(self, tasks: Sequence[Task], rows: int) -> list[str]:
        """Each row's teacher (its task's domain); a domain without one is named with its config key."""
        if len(tasks) != rows:
            raise ValueError(f"per-teacher totals: {len(tasks)} tasks for {rows} rows")
        unknown = sorted({t.domain for t in tasks} - set(self.sums))
        if unknown:
            raise ValueError(f"rows of domain(s) {unknown} have no teacher (config key `teachers` has "
                             f"{sorted(self.sums)})")
        return [t.domain for t in tasks]

    def _add(self, field: str, domains: list[str], values: list[float]) -> None:
        for domain, value in zip(domains, values, strict=True):
            self.sums[domain][field] += float(value)

    def add_rollouts(self, tasks: Sequence[Task], rewards: torch.Tensor | None) -> None:
        """A sampled shard's rollouts (once per step); ``rewards``: ``(B,)``, or None where the step's rollouts were not
        scored (OPD with ``methods.opd.score_rollouts: false``): then ``accuracy`` stays null."""
        domains = self._rows(tasks, len(tasks))
        self._add("rollouts", domains, [1.0] * len(domains))
        if rewards is not None:
            self._add("reward_sum", domains, rewards.detach().double().reshape(-1).tolist())

    def add_tokens(self, tasks: Sequence[Task], mask: torch.Tensor) -> None:
        """A training micro-batch's response tokens (``mask``: ``(B, T)``, nonzero where trained), on the step's first
        pass only."""
        domains = self._rows(tasks, mask.shape[0])
        self._add("tokens", domains, mask.detach().to(torch.float64).sum(dim=-1).tolist())

    def add_kl(self, tasks: Sequence[Task], per_token: torch.Tensor, mask: torch.Tensor) -> None:
        """A micro-batch loss's per-token reverse KL ``(B, T)`` (:func:`opdgrpo.train.losses.topk_reverse_kl_per_token`,
        the values the loss sums) over its trained tokens ``mask``, on every update. One host sync per call, summed
        in float64."""
        if per_token.shape != mask.shape:
            raise ValueError(f"per-token KL of shape {tuple(per_token.shape)} and mask of shape {tuple(mask.shape)}")
        domains = self._rows(tasks, mask.shape[0])
        m = mask.detach().to(device=per_token.device, dtype=torch.float64)
        kl = (per_token.detach().double() * m).sum(dim=-1)
        rows = torch.stack([kl, m.sum(dim=-1)]).tolist()
        self._add("kl_sum", domains, rows[0])
        self._add("kl_tokens", domains, rows[1])

    def flat(self) -> list[float]:
        """Every sum, domain by domain, field by field (:data:`FIELDS`): what ``all_reduce`` adds over processes."""
        return [self.sums[d][f] for d in self.sums for f in FIELDS]

    def with_flat(self, values: Sequence[float]) -> "TeacherTotals":
        """The same domains holding ``values`` (as :meth:`flat` orders them)."""
        if len(values) != len(FIELDS) * len(self.sums):
            raise ValueError(f"{len(values)} values for {len(self.sums)} teachers x {len(FIELDS)} sums")
        it = iter(values)
        return TeacherTotals({d: {f: float(next(it)) for f in FIELDS} for d in self.sums})

    def ledger(self, scored: bool) -> dict[str, dict[str, Any]]:
        """The ledger's ``teachers``: per domain ``token_share`` (its tokens over all teachers' tokens), ``reverse_kl``
        (mean per-token top-k reverse KL), ``accuracy`` (mean reward of its rollouts; null where ``scored`` is false),
        ``tokens`` and ``rollouts``. A value with nothing to average (no token, no rollout of that domain this step)
        is null, never 0."""
        total = sum(s["tokens"] for s in self.sums.values())
        return {d: {"token_share": s["tokens"] / total if total else None,
                    "reverse_kl": s["kl_sum"] / s["kl_tokens"] if s["kl_tokens"] else None,
                    "accuracy": s["reward_sum"] / s["rollouts"] if scored and s["rollouts"] else None,
                    "tokens": int(s["tokens"]), "rollouts": int(s["rollouts"])}
                for d, s in self.sums.items()}
