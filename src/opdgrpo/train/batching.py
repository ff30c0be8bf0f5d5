"""Which prompts a training step draws, and the seeds of its random streams.

Everything random in a run is seeded by (seed, step), never by how many steps ran before in this process, so a run
resumed from a checkpoint draws exactly what an uninterrupted one would have, and a step split over several
processes samples what one process would have.
"""

from __future__ import annotations

import functools
import random

from opdgrpo import schema
from opdgrpo.domains import Task

#: Shard ``s`` of step ``t`` samples with ``seed * SEED_STRIDE + t + s * SHARD_STRIDE``, so shard 0 keeps the seed a
#: one-shard step always had; large primes keep the streams of different runs, steps and shards apart.
SEED_STRIDE, SHARD_STRIDE = 1_000_003, 7_919_113
#: Offset of the evaluation streams from the rollout streams of the same step (an evaluation at step t must not
#: sample with the generator of step t's first rollout shard).
EVAL_OFFSET = 7
#: Offset of an attempt's engine stream (:func:`engine_seed`) from the rollout and evaluation streams.
ENGINE_OFFSET = 104_729


def domain_counts(pools: dict[str, list[Task]], prompts_per_step: int, mix: str) -> dict[str, int]:
    """How many prompts of each domain a step draws (``train.mix``): equal shares, or shares by training-pool size
    (the paper's "instance mix"); largest remainders round."""
    names = sorted(pools)
    if mix == "balanced":
        weights = {d: 1.0 for d in names}
    elif mix == "instance":
        weights = {d: float(len(pools[d])) for d in names}
    else:
        raise ValueError(f"config key `train.mix` must be one of {list(schema.allowed('train', 'mix'))}, got {mix!r}")
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


def shard_bounds(n_items: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges cutting ``n_items`` into ``shards`` equal parts (``n_items % shards == 0``)."""
    size = n_items // shards
    return [(s * size, (s + 1) * size) for s in range(shards)]


def rollout_seed(seed: int, step: int, shard: int) -> int:
    return seed * SEED_STRIDE + step + shard * SHARD_STRIDE


def eval_seed(seed: int, step: int) -> int:
    return seed * SEED_STRIDE + step + EVAL_OFFSET


def engine_seed(seed: int, start: int) -> int:
    """A training job's vLLM engine seed (``vllm.LLM(seed=...)``): the run's ``seed`` and the step its attempt starts
    at, so a resumed attempt does not replay the first attempt's stream. On CUDA the engine's rows draw from that
    stream (no request carries a seed of its own: docs/design-notes.md, "The vLLM engine"); on CPUs every request is
    seeded from the run's generators and the engine's seed changes no sample. Under 2**31: vLLM seeds numpy with it."""
    return (seed * SEED_STRIDE + start + ENGINE_OFFSET) % 2**31
