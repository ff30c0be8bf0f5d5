"""Training micro-batches under ``train.max_tokens_per_microbatch``: a process's rows of one update, sorted by length
and repacked into :class:`~opdgrpo.train.objectives.Shard` objects whose padded tensors stay within the cap.

Why a repack and not a re-slice: a sampled shard is one rollout batch, left-padded to its longest prompt and padded
to its longest response; rows of other lengths from other shards need new tensors. Each packed row keeps its exact
tokens, positions (``cumsum(mask) - 1``) and attention mask, so its log-probs are those of the unpacked row up to
float reordering, and what a row contributes to the update's objective does not depend on its micro-batch:

* the loss's normaliser is the whole update's token (or sequence) count over every process
  (``train._normalizer``), so the micro-batches' losses add up to the one-batch loss whatever the grouping;
* GRPO's group advantages are computed on the sampled shards (a group never straddles two) before the repack and
  carried per row (:attr:`Shard.advantages`); OPD needs no per-group value;
* the fixed log-probs (old policy, reference) are computed on the packed micro-batches themselves.

Every process runs the same number of micro-batches per update (the largest any process packed, agreed with one
all-reduce; a process with fewer halves its largest ones, :func:`opdgrpo.train.packing.split_to`), so the collectives of
each micro-batch (FSDP's gathers and reduce-scatters, OPD's sharded teacher forwards, the non-finite checks) stay
matched, and DDP's one synchronised backward per update stays the last one on every process.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from opdgrpo.train.objectives import Shard
from opdgrpo.train.packing import pack_rows, split_to
from opdgrpo.train.rollout import ScoredRollouts
from opdgrpo.train.sampling import Rollouts

log = logging.getLogger("opdgrpo.train.microbatch")

#: ``(shard index, row)`` of one row of a process's update.
Row = tuple[int, int]
_told = False


def row_lengths(shard: Shard) -> tuple[list[int], list[int]]:
    """Real prompt tokens and response tokens (EOS included) of each row of a sampled shard."""
    prompt = shard.attention_mask[:, : shard.scored.rollouts.prompt_len].sum(dim=1)
    return prompt.tolist(), shard.mask.sum(dim=1).tolist()


def repack(shards: list[Shard], cap: int, agree: Callable[[int], int], pad_id: int,
           advantages: Callable[[Shard], torch.Tensor | None]) -> list[Shard]:
    """One process's shards of one update, as micro-batches of at most ``cap`` padded tokens each (a longer row
    alone). ``agree(count)``: the number of micro-batches every process will run (the maximum over processes);
    ``advantages(shard)``: the objective's per-row values that depend on a row's group (GRPO), or None."""
    rows: list[Row] = []
    prompt_lens: list[int] = []
    response_lens: list[int] = []
    for s, shard in enumerate(shards):
        p, n = row_lengths(shard)
        rows += [(s, r) for r in range(len(p))]
        prompt_lens += p
        response_lens += n
    groups = pack_rows(prompt_lens, response_lens, cap)
    count = agree(len(groups))
    if count > len(groups):
        _tell_once(len(groups), count)
    groups = split_to(groups, count)
    values = [advantages(shard) for shard in shards]
    return [_build(shards, [rows[i] for i in group], [prompt_lens[i] for i in group], [response_lens[i] for i in group],
                   pad_id, values) for group in groups]


def _tell_once(packed: int, count: int) -> None:
    """One line per process, the first time it splits micro-batches to run as many as another process packed."""
    global _told
    if not _told:
        _told = True
        log.info("this process packed %d micro-batches for an update and runs %d, as many as another process packed "
                 "(said once per process)", packed, count)


def _build(shards: list[Shard], rows: list[Row], prompt_lens: list[int], response_lens: list[int], pad_id: int,
           values: list[torch.Tensor | None]) -> Shard:
    """A shard of ``rows``: left-padded to their longest prompt, then their responses padded to the longest one."""
    width_p, width_r = max(prompt_lens), max(response_lens)
    device = shards[0].sequences.device
    seqs = torch.full((len(rows), width_p + width_r), pad_id, dtype=shards[0].sequences.dtype, device=device)
    attn = torch.zeros_like(seqs, dtype=shards[0].attention_mask.dtype)
    mask = torch.zeros((len(rows), width_r), dtype=shards[0].mask.dtype, device=device)
    # the sampling engine's log-probs (train.engine vllm), moved with their tokens
    engine = None if shards[0].scored.rollouts.logprobs is None else torch.zeros((len(rows), width_r), device=device)
    for i, ((s, r), p, n) in enumerate(zip(rows, prompt_lens, response_lens)):
        src, start = shards[s].sequences[r], shards[s].scored.rollouts.prompt_len
        seqs[i, width_p - p: width_p + n] = src[start - p: start + n]
        attn[i, width_p - p: width_p + n] = 1
        mask[i, :n] = True
        if engine is not None:
            engine[i, :n] = shards[s].scored.rollouts.logprobs[r, :n]
    olds = [shards[s] for s, _ in rows]
    rollouts = Rollouts(seqs, attn, mask, width_p, [o.scored.rollouts.completions[r] for o, (_, r) in zip(olds, rows)],
                        torch.stack([o.scored.rollouts.finished[r] for o, (_, r) in zip(olds, rows)]), 0.0, 0,
                        logprobs=engine)
    rewards = torch.stack([o.scored.rewards[r] for o, (_, r) in zip(olds, rows)])
    tasks = [o.tasks[r] for o, (_, r) in zip(olds, rows)]
    scored = ScoredRollouts(tasks, rollouts, [o.scored.texts[r] for o, (_, r) in zip(olds, rows)], rewards)
    advantages = None
    if values[0] is not None:
        advantages = torch.stack([values[s][r] for s, r in rows])
    return Shard(tasks, scored, advantages=advantages)
