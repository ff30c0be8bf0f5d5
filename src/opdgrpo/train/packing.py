"""Token-budget batches: how many rows go through a model at once, by the tokens they occupy, not by a row count.

At paper scale a batch of rows is as costly as its longest row: eight rows padded to one 8192-token response cost
eight 8192-token rows. Two budgets, both ``null`` by default (then nothing here runs and batches are what they were):

* ``train.max_tokens_per_microbatch``: the training passes (forward, loss, backward). Each process sorts its rows of
  an update by length and packs consecutive rows while ``rows x (longest prompt + longest response)`` of the
  micro-batch -- the padded tensor the forward sees -- stays within the cap (:func:`pack_rows`).
* ``*.max_batch_tokens`` (``train.eval``, ``pretrain.eval``, ``studies.S2``): sampling for evaluation and S2's solve
  rates. A batch's KV cache grows to ``rows x (longest prompt + max_new_tokens)`` positions; consecutive rows, in
  their order, while that stays within the budget and ``batch_size`` rows (:func:`token_batches`).

A single row larger than its budget is not refused: it gets a batch of its own (what it needs whatever the budget),
with one warning per process, since the budget then no longer bounds memory.
"""

from __future__ import annotations

import logging
from typing import Sequence

from opdgrpo.run_shape import check_budget

log = logging.getLogger("opdgrpo.train.packing")
_warned: set[str] = set()




def _warn_once(key: str, tokens: int, cap: int) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning("a row of %d tokens exceeds `%s` (%d): it runs alone in a batch larger than the budget "
                    "(warned once per process)", tokens, key, cap)


def pack_rows(prompt_lens: Sequence[int], response_lens: Sequence[int], cap: int,
              key: str = "train.max_tokens_per_microbatch") -> list[list[int]]:
    """Row indices of each micro-batch: rows sorted by (response, prompt) length (ties by index, so the packing is
    deterministic), cut into consecutive runs whose ``rows x (max prompt + max response)`` is at most ``cap``; every
    row in exactly one micro-batch. Sorting puts rows of similar length together, so little of a micro-batch is
    padding; greedy cutting of a sorted order gives the fewest micro-batches for that order (a run's sub-runs fit
    whenever it does). A row over ``cap`` on its own is a micro-batch alone (warned once)."""
    cap = check_budget(cap, key)
    order = sorted(range(len(prompt_lens)), key=lambda r: (response_lens[r], prompt_lens[r], r))
    groups: list[list[int]] = []
    current: list[int] = []
    width_p = width_r = 0
    for r in order:
        p, n = max(width_p, prompt_lens[r]), max(width_r, response_lens[r])
        if current and (len(current) + 1) * (p + n) > cap:
            groups.append(current)
            current, p, n = [], prompt_lens[r], response_lens[r]
        if not current and p + n > cap:
            _warn_once(key, p + n, cap)
        current.append(r)
        width_p, width_r = p, n
    if current:
        groups.append(current)
    return groups


def split_to(groups: list[list[int]], count: int) -> list[list[int]]:
    """``groups`` cut further into exactly ``count`` micro-batches: the one with most rows (the first such) is halved
    until there are enough. Halving only lowers a micro-batch's padded size, so the cap still holds. Used so that
    every process runs as many micro-batches as the process with most (their forwards and backwards are collectives
    under FSDP, and DDP's non-finite checks are too); needs ``count <= rows``."""
    groups = [list(g) for g in groups]
    if count > sum(len(g) for g in groups):
        raise ValueError(f"cannot cut {sum(len(g) for g in groups)} rows into {count} micro-batches")
    while len(groups) < count:
        i = max(range(len(groups)), key=lambda j: (len(groups[j]), -j))
        half = len(groups[i]) // 2
        groups[i:i + 1] = [groups[i][:half], groups[i][half:]]
    return groups


def token_batches(prompt_lens: Sequence[int], max_new_tokens: int, batch_size: int, max_tokens: int | None,
                  key: str = "max_batch_tokens") -> list[tuple[int, int]]:
    """Consecutive ``[start, end)`` sampling batches over rows in their order: at most ``batch_size`` rows, and (with
    ``max_tokens``) at most ``max_tokens`` KV-cache positions, ``rows x (longest prompt + max_new_tokens)``.
    ``max_tokens`` None: ``range(0, n, batch_size)`` exactly, as before there was a budget."""
    n = len(prompt_lens)
    if max_tokens is None:
        return [(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
    max_tokens = check_budget(max_tokens, key)
    batches: list[tuple[int, int]] = []
    start, longest = 0, 0
    for r in range(n):
        grown = max(longest, prompt_lens[r])
        if r > start and (r - start >= batch_size or (r - start + 1) * (grown + max_new_tokens) > max_tokens):
            batches.append((start, r))
            start, grown = r, prompt_lens[r]
        if r == start and grown + max_new_tokens > max_tokens:
            _warn_once(key, grown + max_new_tokens, max_tokens)
        longest = grown
    if n:
        batches.append((start, n))
    return batches
