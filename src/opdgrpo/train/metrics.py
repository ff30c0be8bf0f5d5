"""Accuracy over several samples per prompt: avg@n and the unbiased pass@k.

With n samples of a prompt of which c are correct, pass@k is the chance that k of them drawn without
replacement contain a correct one: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, "Evaluating Large Language
Models Trained on Code"). The binomials overflow floats for large n, so it is computed as the product
1 - prod_{i=n-c+1}^{n} (1 - k/i), which is the same ratio written factor by factor. avg@n is the mean reward
over all n samples (the paper's avg@16 in S3).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt: ``n`` samples, ``c`` of them correct, ``k <= n``."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def avg_at_k(rewards: Sequence[float]) -> float:
    """avg@k for one prompt: the mean reward of its k samples."""
    if not rewards:
        raise ValueError("avg_at_k: a prompt needs at least one sample")
    return math.fsum(rewards) / len(rewards)


def summarise(rewards_per_prompt: Sequence[Sequence[float]], ks: Iterable[int] = (1,),
              success: float = 1.0) -> dict[str, float]:
    """Mean over prompts of avg@n and of pass@k for each ``k`` in ``ks`` with ``k <= n``.

    Every prompt must have the same number n of samples. ``avg@n`` averages the raw rewards; pass@k counts
    a sample as correct when its reward is at least ``success`` (1.0: fully solved), so partial-credit
    rewards do not count as solved. Keys: ``n``, ``prompts``, ``avg@<n>``, ``pass@<k>``; a k above n is left out.
    """
    if not rewards_per_prompt:
        raise ValueError("summarise: no prompts")
    sizes = {len(r) for r in rewards_per_prompt}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"summarise: every prompt needs the same, non-zero number of samples; got sizes "
                         f"{sorted(sizes)}")
    n = sizes.pop()
    prompts = len(rewards_per_prompt)
    out: dict[str, float] = {"n": n, "prompts": prompts,
                             f"avg@{n}": math.fsum(avg_at_k(r) for r in rewards_per_prompt) / prompts}
    correct = [sum(1 for x in r if x >= success) for r in rewards_per_prompt]
    for k in sorted({int(k) for k in ks}):
        if k < 1:
            raise ValueError(f"summarise: k must be >= 1, got {k}")
        if k <= n:
            out[f"pass@{k}"] = math.fsum(pass_at_k(n, c, k) for c in correct) / prompts
    return out
