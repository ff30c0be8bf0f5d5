"""Full-vocabulary logits a chunk of positions at a time (``train.logit_chunk_tokens``), reduced to what a loss reads.

Why: a shard's logits are ``rows x positions x vocabulary`` values. At paper scale (8 rows x 9.7k positions x
151,936 entries) that is 24 GB in bfloat16 and 47 GB in float32, for the student (with its gradient) and again for
each teacher. No loss reads them all: GRPO reads one log-prob per position (``logit[target] - logsumexp``), OPD the
student's top-k logits, its logsumexp (the ``topk_mass`` metric) and the teacher's logits at the student's top-k ids.
So the model's decoder runs on the whole shard (its hidden states are ``positions x hidden``, 40x smaller than the
logits for Qwen3), and its LM head runs on ``chunk_tokens`` positions at a time; each chunk's logits are reduced to
those per-position values and freed before the next chunk's exist.

With gradients, each chunk is a :func:`torch.utils.checkpoint.checkpoint` region: the backward recomputes that
chunk's logits from its hidden states, so it never holds more than one chunk's logits either (the price: the LM
head's forward runs twice, the same trade as activation checkpointing, and not counted in the ledger).

Exactness: a shard whose response positions fit in one chunk takes the old path (the LM head over the kept positions,
as the model's own forward computes it, then the loss's reduction over the whole ``(B, T, V)`` tensor): bit for bit
what it was (the tiny and smoke profiles' shards fit the default, so their pins hold). With several chunks the
forward's values are the same on this machine (a bfloat16 GEMM over a slice of the rows gives the same bits,
checked in ``tests/unit/test_logit_chunks.py``), but the LM head's weight gradient is summed chunk by chunk instead
of in one GEMM: float32 rounding differences of a few ulps (measured there).

The head is swapped in for the model's ``lm_head`` during one forward (:func:`reducing_head`), so the chunks run
inside the model's own ``forward``: under FSDP2 the root unit's gathered weights (embedding, LM head) are in place,
and DDP and FSDP see one forward and one backward as before.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence

import torch
from torch.utils.checkpoint import checkpoint

# ``train.logit_chunk_tokens``' default (:data:`opdgrpo.run_shape.DEFAULT_CHUNK_TOKENS`, 4096 positions): 4096 x
# 151,936 float32 values is 2.5 GB (Qwen3's vocabulary); the tiny profile's shards (128 rows x 32 new tokens) fit in
# one chunk, so its numbers do not move.

#: ``reduce(logits, *extras) -> tuple of tensors``: per-position values of ``logits`` ``(b, t, V)``; every output and
#: extra has ``(b, t)`` as its leading dimensions.
Reduce = Callable[..., tuple[torch.Tensor, ...]]
#: ``head(hidden) -> logits``: the model's LM head.
Head = Callable[[torch.Tensor], torch.Tensor]


def _apply(head: Head, reduce: Reduce, hidden: torch.Tensor, *extras: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(reduce(head(hidden), *extras))


def reduce_response(hidden: torch.Tensor, head: Head, reduce: Reduce, extras: Sequence[torch.Tensor],
                    chunk: int) -> tuple[torch.Tensor, ...]:
    """``reduce`` over the logits of the response positions of ``hidden`` ``(B, keep, H)``: all but the last kept
    position (the trainer's ``logits[:, :-1]``), ``chunk`` positions at a time; outputs ``(B, keep - 1, ...)``.

    One chunk: ``reduce(head(hidden)[:, :-1])``, the old arithmetic. Several: the positions flattened row by row, and
    each chunk's logits made, reduced and freed (recomputed in the backward when gradients flow)."""
    rows, keep = hidden.shape[:2]
    positions = rows * (keep - 1)
    if positions <= chunk:
        return tuple(reduce(head(hidden)[:, :-1], *extras))
    flat = hidden[:, :-1].reshape(1, positions, hidden.shape[-1])
    flat_extras = [e.reshape(1, positions, *e.shape[2:]) for e in extras]
    pieces = []
    for start in range(0, positions, chunk):
        part = slice(start, start + chunk)
        args = (flat[:, part], *(e[:, part] for e in flat_extras))
        if torch.is_grad_enabled() and flat.requires_grad:
            pieces.append(checkpoint(_apply, head, reduce, *args, use_reentrant=False))
        else:
            pieces.append(_apply(head, reduce, *args))
    return tuple(torch.cat(p, dim=1).reshape(rows, keep - 1, *p[0].shape[2:]) for p in zip(*pieces))


class _ReducingHead(torch.nn.Module):
    """Stands in for a causal LM's ``lm_head`` for one forward: gets the hidden states of the kept positions and
    returns :func:`reduce_response`'s tuple as the output's ``logits``. The real head is not registered as a child,
    so the model's parameter names do not change while it stands in."""

    def __init__(self, head: torch.nn.Module, run: Callable[[torch.Tensor, Head], tuple[torch.Tensor, ...]]):
        super().__init__()
        self.__dict__["_head"] = head
        self.__dict__["_run"] = run

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self._run(hidden, self._head)


def _head_name(model: torch.nn.Module) -> str:
    head = model.get_output_embeddings()
    for name, child in model.named_children():
        if child is head:
            return name
    raise ValueError(f"{type(model).__name__}: its output embedding is not a direct child; cannot chunk its logits")


@contextlib.contextmanager
def reducing_head(model: torch.nn.Module, run: Callable[[torch.Tensor, Head], tuple[torch.Tensor, ...]]) -> Iterator[None]:
    """Inside the block, ``model(...).logits`` is ``run(hidden_of_kept_positions, lm_head)`` (``model`` unwrapped:
    the Hugging Face module, FSDP2-sharded or not)."""
    name = _head_name(model)
    head = getattr(model, name)
    setattr(model, name, _ReducingHead(head, run))
    try:
        yield
    finally:
        setattr(model, name, head)


def reduced_forward(model: torch.nn.Module, reduce: Reduce, extras: Sequence[torch.Tensor], chunk: int,
                    unwrapped: torch.nn.Module | None = None, **inputs) -> tuple[torch.Tensor, ...]:
    """``model(**inputs)`` (``logits_to_keep`` among them) with its LM head replaced by :func:`reduce_response`
    over the response positions; ``unwrapped`` is the Hugging Face module inside a DDP wrapper (default ``model``)."""
    def run(hidden: torch.Tensor, head: Head) -> tuple[torch.Tensor, ...]:
        return reduce_response(hidden, head, reduce, extras, chunk)

    with reducing_head(model if unwrapped is None else unwrapped, run):
        return model(**inputs).logits
