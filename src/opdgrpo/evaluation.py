"""Held-out evaluation as avg@k: k sampled answers per prompt, accuracy averaged over all of them.

Evaluation FLOPs are returned so the ledger can log them apart from training FLOPs (they never
count towards a run's cumulative training FLOPs).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .domains import Domain, Task
from .rollout import sample_and_score


@torch.no_grad()
def evaluate(model, tokenizer, domains: Mapping[str, Domain], heldout: Mapping[str, Mapping[str, list[Task]]], *,
             k: int, temperature: float, max_new_tokens: int, batch_size: int, seed: int) -> tuple[list[dict[str, Any]], float]:
    """Per held-out set: accuracy (avg@k), mean response length in tokens (and, where the domain has constraint
    kinds, the pass rate of each); plus the FLOPs spent."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    results, flops = [], 0.0
    for domain, sets in heldout.items():
        for set_name, tasks in sets.items():
            repeated = [t for t in tasks for _ in range(k)]
            rewards, lengths, texts = [], [], []
            for start in range(0, len(repeated), batch_size):
                chunk = sample_and_score(model, tokenizer, domains, repeated[start : start + batch_size],
                                         max_new_tokens=max_new_tokens, temperature=temperature, generator=generator)
                rewards.append(chunk.rewards)
                lengths += chunk.response_lengths
                texts += chunk.texts
                flops += chunk.rollouts.flops
            rewards_all = torch.cat(rewards)
            result = {
                "eval_domain": domain,
                "eval_set": set_name,
                "accuracy": float(rewards_all.mean()),
                "mean_response_length": sum(lengths) / len(lengths),
                "k": k,
                "n_prompts": len(tasks),
            }
            per_constraint = getattr(domains[domain], "constraint_rates", None)
            if per_constraint is not None:  # instruction following: IFEval's instruction-level pass rates too
                result["constraint_rates"] = per_constraint(repeated, texts)
            results.append(result)
    model.train(was_training)
    return results, flops


def heldout_for(domains: Mapping[str, Domain], names: list[str], max_prompts: int | None = None) -> dict[str, dict[str, list[Task]]]:
    sets = {d: domains[d].heldout_sets() for d in names}
    if max_prompts:
        sets = {d: {s: tasks[:max_prompts] for s, tasks in v.items()} for d, v in sets.items()}
    return sets
