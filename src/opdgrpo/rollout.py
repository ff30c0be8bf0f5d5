"""From tasks to sampled completions and back: the glue between domains, tokenizer and sampler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from .domains import Domain, Task
from .sampling import Rollouts, sample


@dataclass
class ScoredRollouts:
    tasks: list[Task]
    rollouts: Rollouts
    texts: list[str]
    rewards: torch.Tensor          # (B,) float

    @property
    def response_lengths(self) -> list[int]:
        return [len(c) for c in self.rollouts.completions]


def encode_prompts(tokenizer, tasks: Sequence[Task]) -> list[list[int]]:
    return [tokenizer(t.prompt, add_special_tokens=False)["input_ids"] for t in tasks]


def score(domains: Mapping[str, Domain], tasks: Sequence[Task], texts: Sequence[str]) -> torch.Tensor:
    """Rewards in task order; each domain's verifier scores its own rows in one batch."""
    rewards = torch.zeros(len(tasks))
    for name in {t.domain for t in tasks}:
        rows = [i for i, t in enumerate(tasks) if t.domain == name]
        values = domains[name].score([tasks[i] for i in rows], [texts[i] for i in rows])
        rewards[rows] = torch.tensor(values, dtype=torch.float32)
    return rewards


def sample_and_score(model, tokenizer, domains: Mapping[str, Domain], tasks: Sequence[Task], *, max_new_tokens: int,
                     temperature: float, generator: torch.Generator, with_rewards: bool = True) -> ScoredRollouts:
    rollouts = sample(
        model,
        encode_prompts(tokenizer, tasks),
        max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        temperature=temperature,
        generator=generator,
    )
    texts = tokenizer.batch_decode(rollouts.completions, skip_special_tokens=True)
    rewards = score(domains, tasks, texts) if with_rewards else torch.full((len(tasks),), float("nan"))
    return ScoredRollouts(list(tasks), rollouts, texts, rewards)
