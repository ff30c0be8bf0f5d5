"""Held-out evaluation as avg@k: k sampled answers per prompt, accuracy averaged over all of them.

Evaluation FLOPs are returned so the ledger can log them apart from training FLOPs (they never
count towards a run's cumulative training FLOPs).

With several processes the sampling batches are dealt round-robin, each batch with its own generator seeded by
(seed, batch index), and the results gathered: every process returns the same numbers. One process keeps one
generator across batches, as it always did.

Batches are ``batch_size`` rows, or (``max_batch_tokens``, :func:`opdgrpo.train.packing.token_batches`) as many
consecutive rows as keep ``rows x (longest prompt + max_new_tokens)`` KV-cache positions within the budget. Greedy
results (temperature 0) do not depend on the batching; sampled ones do, as a generator's draws depend on the batch
shapes it samples: a given batching is reproducible, and another one samples other (equally distributed) answers.
Under ``train.engine: vllm`` a set's rows go to the engine in one call (one per process), which schedules its own
batches by its KV-cache budget; on CPUs each row's seed comes from the one generator draw of that call, on GPUs rows
carry no seed (the engine's own stream: docs/design-notes.md, "The vLLM engine"), and no row asks for log-probs.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from opdgrpo.domains import Domain, Task
from opdgrpo.train.packing import token_batches
from opdgrpo.train.rollout import PromptFormat, encode_prompts, sample_and_score


def batch_bounds(tokenizer, repeated: list[Task], *, batch_size: int, max_batch_tokens: int | None,
                 max_new_tokens: int, fmt: PromptFormat, key: str, engine=None, shards: int = 1) -> list[tuple[int, int]]:
    """``[start, end)`` of each sampling batch over ``repeated``: ``batch_size`` rows, and within ``max_batch_tokens``
    KV-cache positions where it is set (the prompts are tokenized once more to know their lengths). An ``engine``
    that schedules its own batches (vLLM, by its KV-cache budget: ``schedules_batches``) gets every row in one call,
    or with ``shards`` processes one contiguous share per process; ``batch_size`` and ``max_batch_tokens`` then
    bound nothing."""
    if getattr(engine, "schedules_batches", False):
        n, parts = len(repeated), max(1, min(int(shards), len(repeated)))
        return [(n * i // parts, n * (i + 1) // parts) for i in range(parts)] if n else []
    if max_batch_tokens is None:
        return token_batches([0] * len(repeated), max_new_tokens, batch_size, None)
    lengths = [len(ids) for ids in encode_prompts(tokenizer, repeated, fmt)]
    return token_batches(lengths, max_new_tokens, batch_size, max_batch_tokens, key)


def _sample_all(model, tokenizer, domains, repeated: list[Task], *, batch_size: int, seed: int, workers,
                max_batch_tokens: int | None = None, budget_key: str = "train.eval.max_batch_tokens", **kwargs):
    """(rewards, lengths, texts, flops) of every task in ``repeated``, in order."""
    engine = kwargs.get("engine")   # where an engine samples, the model may have no weights (a meta model)
    device = getattr(engine, "device", None) or next(model.parameters()).device
    distributed = workers is not None and workers.distributed
    starts = batch_bounds(tokenizer, repeated, batch_size=batch_size, max_batch_tokens=max_batch_tokens,
                          max_new_tokens=kwargs["max_new_tokens"], fmt=kwargs.get("fmt", PromptFormat()), key=budget_key,
                          engine=kwargs.get("engine"), shards=workers.world if distributed else 1)
    generator = torch.Generator(device=device).manual_seed(seed)
    done: dict[int, tuple[list[float], list[int], list[str]]] = {}
    flops = 0.0
    for index, (start, end) in enumerate(starts):
        if distributed:
            if index % workers.world != workers.rank:
                continue
            generator = torch.Generator(device=device).manual_seed(seed * 7_919 + index)
        chunk = sample_and_score(model, tokenizer, domains, repeated[start:end], generator=generator, **kwargs)
        done[index] = (chunk.rewards.tolist(), chunk.response_lengths, chunk.texts)
        flops += chunk.rollouts.flops
    if distributed:
        merged: dict[int, tuple[list[float], list[int], list[str]]] = {}
        for part in workers.gather(done):
            merged.update(part)
        done = merged
        flops = workers.sum([flops])[0]
    rewards = [r for i in range(len(starts)) for r in done[i][0]]
    lengths = [n for i in range(len(starts)) for n in done[i][1]]
    texts = [t for i in range(len(starts)) for t in done[i][2]]
    return rewards, lengths, texts, flops


@torch.no_grad()
def evaluate(model, tokenizer, domains: Mapping[str, Domain], heldout: Mapping[str, Mapping[str, list[Task]]], *,
             k: int, temperature: float, max_new_tokens: int, batch_size: int, seed: int,
             fmt: PromptFormat = PromptFormat(), top_p: float = 1.0, top_k: int = 0, workers=None,
             max_batch_tokens: int | None = None, budget_key: str = "train.eval.max_batch_tokens",
             engine=None) -> tuple[list[dict[str, Any]], float]:
    """Per held-out set: accuracy (avg@k), pass@k where k > 1, mean response length in tokens, and what the domain
    reports beyond accuracy (IFEval's constraint rates); plus the FLOPs spent. A domain may ask for its own k per
    set (``heldout.<set>.k``, e.g. 16 samples for AIME; :func:`opdgrpo.domains.base.heldout_k`).
    ``max_batch_tokens``: the KV-cache budget of a sampling batch (``budget_key`` names its config key in
    messages); None: ``batch_size`` rows per batch. ``engine`` samples
    (:mod:`opdgrpo.train.engines`; it holds ``model``'s weights); None: the project's own sampler on ``model``."""
    from opdgrpo.domains.base import heldout_k
    from opdgrpo.train.metrics import summarise

    was_training = model.training
    model.eval()
    results, flops = [], 0.0
    for domain, sets in heldout.items():
        for set_name, tasks in sets.items():
            set_k = heldout_k(getattr(domains[domain], "cfg", {}), set_name) or k
            repeated = [t for t in tasks for _ in range(set_k)]
            rewards, lengths, texts, set_flops = _sample_all(
                model, tokenizer, domains, repeated, batch_size=batch_size, seed=seed, workers=workers,
                max_batch_tokens=max_batch_tokens, budget_key=budget_key,
                max_new_tokens=max_new_tokens, temperature=temperature, fmt=fmt, top_p=top_p, top_k=top_k, engine=engine)
            flops += set_flops
            result = {
                "eval_domain": domain,
                "eval_set": set_name,
                "accuracy": float(torch.tensor(rewards).mean()),
                "mean_response_length": sum(lengths) / len(lengths),
                "k": set_k,
                "n_prompts": len(tasks),
            }
            if set_k > 1:  # unbiased pass@k from the k samples of each prompt (solved = full reward), k = 1, 2, 4, ..., set_k
                per_prompt = [rewards[i * set_k:(i + 1) * set_k] for i in range(len(tasks))]
                ks = sorted({2 ** p for p in range(set_k.bit_length()) if 2 ** p <= set_k} | {set_k})
                result["pass_at_k"] = {key: value for key, value in summarise(per_prompt, ks).items() if key.startswith("pass@")}
            per_constraint = getattr(domains[domain], "constraint_rates", None)
            if per_constraint is not None:  # instruction following: IFEval's instruction-level pass rates too
                result["constraint_rates"] = per_constraint(repeated, texts)
            extra = getattr(domains[domain], "extra_metrics", None)
            if extra is not None:  # e.g. IFEval's prompt/instruction-level strict and loose accuracy
                result["metrics"] = extra(repeated, texts)
            results.append(result)
    model.train(was_training)
    return results, flops


def heldout_for(domains: Mapping[str, Domain], names: list[str], max_prompts: int | None = None) -> dict[str, dict[str, list[Task]]]:
    sets = {d: domains[d].heldout_sets() for d in names}
    if max_prompts:
        sets = {d: {s: tasks[:max_prompts] for s, tasks in v.items()} for d, v in sets.items()}
    return sets
