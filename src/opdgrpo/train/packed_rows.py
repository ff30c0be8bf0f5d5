"""The student's training passes over rows laid end to end, without the padding a shard's tensors carry.

A sampled shard is a rectangle: every row left-padded to the longest prompt and right-padded to the longest
response. On the tiny profile the longest response of 64 rows is 20-24 tokens while the mean is 3-5, so about two
thirds of the positions a padded forward and backward compute are padding (2,048 positions for some 760 real
tokens in a tiny math GRPO step). ``train.packed_row_tokens`` lays each row's real tokens end to end in packed rows
of at most that many tokens (first fit by decreasing length; a row longer than the budget gets a packed row of its
own), each row's positions restarting at 0, so the model's causal mask becomes block-diagonal per row
(``transformers`` builds it from the restarting ``position_ids`` when no attention mask is passed, for every
attention implementation). The student's logits are gathered back into the shard's ``(rows, response)`` layout, so
the objectives, their masks and their metrics read exactly what they read on the padded forward: the same tokens at
the same positions under the same weights, equal up to floating-point reordering (the matrix multiplies have other
shapes; ``tests/unit/test_packed_rows.py`` holds the loss and gradients to the padded ones).

The LM head runs over the response positions only, as on the padded path: a pre-hook on the model's output
embedding selects them from the packed hidden states (so the root module's forward runs, under DDP and FSDP too).
What packing costs instead: a packed row's attention covers the whole row (its mask hides other rows' tokens, which
eager attention still multiplies), so a small budget wins (attention grows with the packed row's length, the linear
layers with its tokens), and the last packed row is padded to the longest. A micro-batch packs only where its packed
forward computes fewer FLOPs than its padded one (:func:`worth_packing`); the ledger counts the forward that ran
(:func:`packed_flops`). The student's passes pack (its training forward and backward and the old-policy forward),
and so do OPD's teachers' forwards, each over its own domain's rows (:meth:`opdgrpo.train.inference.FrozenForward.
reduced_packed`, decided per teacher by its own FLOPs); GRPO's reference forward stays padded. A micro-batch whose
response logits exceed ``train.logit_chunk_tokens`` runs the student padded and chunked, as before (warned once per
process); a teacher's head is chunked either way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from opdgrpo.train import flops as flop_formulas

log = logging.getLogger("opdgrpo.train.packed_rows")
_warned: set[str] = set()


@dataclass(frozen=True)
class PackedRows:
    """A shard's real tokens in packed rows: ``input_ids`` and ``position_ids`` ``(packed rows, length)`` (a packed
    row's unused tail holds token 0 at position 0, each position a one-token sequence of its own that nothing reads),
    and ``logit_index`` ``(rows, response)``: for each of the shard's response positions, the flat packed position
    whose logits predict its token (0 where the shard's row has no token there: masked by the objective)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    logit_index: torch.Tensor

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])


def first_fit(lengths: list[int], budget: int) -> list[list[int]]:
    """Row indices per packed row: rows by decreasing length (ties by index, so the packing is deterministic), each
    into the first packed row it fits within ``budget`` tokens, else into a new one (a row longer than the budget
    alone in its own)."""
    bins: list[list[int]] = []
    used: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda r: (-lengths[r], r)):
        n = lengths[row]
        for b, total in enumerate(used):
            if total + n <= budget:
                bins[b].append(row)
                used[b] += n
                break
        else:
            bins.append([row])
            used.append(n)
    return bins


def pack(sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, budget: int) -> PackedRows:
    """The packed layout of a shard (``sequences``/``attention_mask`` ``(rows, prompt_len + response)``, each row's
    real tokens contiguous: left padding, prompt, response, right padding) under a ``budget`` of tokens per packed
    row."""
    rows, width = sequences.shape
    real = attention_mask.bool()
    lengths = real.sum(-1).tolist()
    starts = real.int().argmax(-1).tolist()   # each row's first real position
    bins = first_fit(lengths, budget)
    length = max(sum(lengths[r] for r in b) for b in bins)
    device = sequences.device
    input_ids = torch.zeros(len(bins), length, dtype=sequences.dtype, device=device)
    position_ids = torch.zeros(len(bins), length, dtype=torch.long, device=device)
    flat_of = torch.zeros(rows, width, dtype=torch.long, device=device)   # padded (row, column) -> flat packed position
    for b, members in enumerate(bins):
        offset = 0
        for r in members:
            n, s = lengths[r], starts[r]
            input_ids[b, offset:offset + n] = sequences[r, s:s + n]
            position_ids[b, offset:offset + n] = torch.arange(n, device=device)
            flat_of[r, s:s + n] = torch.arange(b * length + offset, b * length + offset + n, device=device)
            offset += n
    response = width - prompt_len
    # logits[:, :-1] of a padded forward keeping response + 1 positions: columns prompt_len - 1 ... width - 2
    logit_index = flat_of[:, prompt_len - 1:prompt_len - 1 + response]
    return PackedRows(input_ids, position_ids, logit_index)


def worth_packing(config: Any, packed: PackedRows, padded_shape: tuple[int, int]) -> bool:
    """Whether the packed forward computes fewer FLOPs than the padded ``(rows, width)`` one (keeping the response
    positions' logits plus one, as the padded path does): rows of one length gain nothing, and a packed row's longer
    attention, or a last packed row padded to the longest, can cost more than the padding it removes."""
    rows, width = padded_shape
    response = int(packed.logit_index.shape[1])
    padded = flop_formulas.forward_flops(config, rows, width, logits_positions=response + 1)
    return packed_flops(config, packed) < padded


def warn_chunked(positions: int, chunk_tokens: int) -> None:
    """Once per process: a micro-batch too large for one chunk of logits ran padded and chunked, not packed."""
    if "chunk" not in _warned:
        _warned.add("chunk")
        log.warning("a micro-batch's response logits (%d positions) exceed `train.logit_chunk_tokens` (%d): it runs "
                    "padded, its logits chunked, not packed (warned once per process)", positions, chunk_tokens)


def packed_logits(model: torch.nn.Module, packed: PackedRows) -> torch.Tensor:
    """The student's logits at the shard's response positions, ``(rows, response, vocab)``, from one forward over
    the packed rows (no attention mask: the model masks by the restarting positions; no KV cache, which would keep
    it from doing so), the LM head over those positions only."""
    index = packed.logit_index.reshape(-1)

    def select(_module: torch.nn.Module, args: tuple) -> tuple:
        (hidden, *rest) = args
        return (hidden.reshape(-1, hidden.shape[-1]).index_select(0, index).unsqueeze(0), *rest)

    handle = _output_head(model).register_forward_pre_hook(select)
    try:
        logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None,
                       use_cache=False, logits_to_keep=0).logits
    finally:
        handle.remove()
    return logits.reshape(*packed.logit_index.shape, logits.shape[-1])


def _output_head(model: torch.nn.Module) -> torch.nn.Module:
    """The LM head of a causal LM, through a DDP wrapper (FSDP2 keeps the model's own class)."""
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    return inner.get_output_embeddings()


def packed_flops(config: Any, packed: PackedRows, head_positions: int | None = None) -> float:
    """FLOPs of the packed forward that ran: every packed position through the layers, the LM head over the
    response positions (``head_positions``: over that many instead)."""
    body = flop_formulas.forward_flops(config, packed.rows, packed.length, logits_positions=0)
    head = int(packed.logit_index.numel()) if head_positions is None else int(head_positions)
    return body + flop_formulas.forward_flops(config, 1, 0, logits_positions=head)


def segment_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """``(rows, 1, length, length)`` bool: where a packed position may attend, causal and within its own row (a row
    begins where its position restarts at 0; each unused tail position is a row of its own)."""
    segment = (position_ids == 0).cumsum(-1)
    length = position_ids.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    return (causal[None] & (segment[:, :, None] == segment[:, None, :]))[:, None]
