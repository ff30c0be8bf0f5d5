"""Batched autoregressive sampling with a KV cache, for rollouts.

Our own loop rather than ``model.generate`` so that the FLOP ledger counts exactly what was computed: the prefill
over the left-padded prompts (LM-head logits for the last position only), then one cached decode step per new
token for the rows still running. Rows that emitted EOS are dropped from the batch and the cache (compaction), so
they cost nothing afterwards; padding inside the prompt block *is* computed and counted.

By default tokens come from the model's full distribution (temperature 1, no top-k / top-p truncation), as
on-policy training needs; ``temperature=0`` is greedy decoding.

A base model's rows may also stop at their domain's stop strings (``stop_strings``, :mod:`opdgrpo.train.stops`): each new
token's row tail is decoded and checked, a row that completed one leaves the batch as at EOS, and its completion is
cut where the stop string starts (the module's token rule); the decode steps it ran are counted.

The loop never recomputes a prefix (each decode step feeds one token per running row against the cache) and stops
as soon as every row has ended. Each forward takes the fastest path that gives the model's own eager-forward bits on
this machine (:func:`~opdgrpo.train.inference.choose_path`, checked once per process): :class:`~opdgrpo.train.inference.LeanQwen3`
under bfloat16 autocast (Qwen3's own operations without the module machinery), the model's forward with a
:func:`~opdgrpo.train.inference.sampling_cache` and :func:`~opdgrpo.train.inference.fast_attention`, or the model's forward as is.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

import torch
from transformers import DynamicCache

from opdgrpo.train import flops as flop_formulas
from opdgrpo.train.inference import FAST, LEAN, LeanQwen3, cache_kwarg, choose_path, fast_attention, sampling_cache
from opdgrpo.train.stops import StopStrings


@dataclass
class Rollouts:
    """The result of :func:`sample`. ``T`` is the number of decode positions actually produced (at most
    ``max_new_tokens``; fewer when every row stopped early)."""

    sequences: torch.LongTensor  # (B, P+T): left-padded prompts then completions, pad after a row ends
    attention_mask: torch.LongTensor  # (B, P+T): 1 on prompt tokens and on completion_mask positions
    completion_mask: torch.BoolTensor  # (B, T): True on generated tokens up to and including EOS (or a stop string's kept tokens)
    prompt_len: int  # P, the padded prompt length
    completions: list[list[int]]  # generated ids per row, without EOS and pads (and without a stop string's tokens)
    finished: torch.BoolTensor  # (B,): the row ended with EOS or at a stop string
    flops: float  # FLOPs computed: prefill + every decode step (padding included)
    tokens_computed: int  # token positions pushed through the model (padding included)
    # (B, T): the sampling engine's own log-prob of each generated token (0 elsewhere), where the engine reports them
    # (vLLM: opdgrpo.train.engines); None from this module's sampler, whose log-probs the trainer recomputes anyway
    logprobs: torch.Tensor | None = None
    # per row, the characters of its decoded completion that are its text (a stop string starts there; None: all of
    # it); None when no row had stop strings (opdgrpo.train.stops)
    text_ends: list[int | None] | None = None

    def to(self, device: torch.device) -> "Rollouts":
        """The same rollouts with their tensors on ``device`` (an engine that samples elsewhere: vLLM)."""
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.__dict__.items()}
        return Rollouts(**moved)


def _choose(
    logits: torch.Tensor, temperature: float, top_p: float, top_k: int, generator: torch.Generator | None
) -> torch.LongTensor:
    """Pick one token per row from ``logits`` (rows x vocab)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float()
    if temperature != 1.0:  # x / 1.0 is x, bit for bit: skip the pass
        logits = logits / temperature
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p (the top token always survives).
        drop = (probs.cumsum(dim=-1) - probs) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def sample(
    model: torch.nn.Module,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    eos_token_id: int | Sequence[int],
    pad_token_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator | None = None,
    stop_strings: StopStrings | None = None,
) -> Rollouts:
    """Sample up to ``max_new_tokens`` tokens after each prompt; a row stops at its first EOS, or at the token that
    completes one of its ``stop_strings`` (:mod:`opdgrpo.train.stops`).

    Runs without gradients. Deterministic for a given ``generator`` state (and the same model, prompts and settings). The model is used
    as is: put it in eval mode if it has dropout. ``generator`` must live on the model's device. Use float32 or
    bfloat16 weights: in transformers 5.24 eager attention turns left-padded rows into NaN in float64.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("need at least one prompt, and every prompt needs at least one token")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    if temperature < 0:
        raise ValueError("temperature must be >= 0")

    device = next(model.parameters()).device
    stop_ids = [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]
    if not stop_ids:
        raise ValueError("need at least one stop token id (eos_token_id)")
    stops = torch.tensor(stop_ids, dtype=torch.long, device=device)
    prompt_len = max(len(p) for p in prompts)

    # Left padding, built as one list: one tensor per row cost a call per prompt.
    input_ids = torch.tensor([[pad_token_id] * (prompt_len - len(p)) + list(p) for p in prompts], dtype=torch.long, device=device)
    prompt_mask = torch.tensor([[0] * (prompt_len - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long, device=device)

    with torch.no_grad():
        path = choose_path(model)
        with fast_attention(model) if path == FAST else contextlib.nullcontext():
            return _sample_loop(path, model, input_ids, prompt_mask, stops, max_new_tokens=max_new_tokens, pad_token_id=pad_token_id,
                                temperature=temperature, top_p=top_p, top_k=top_k, generator=generator, strings=stop_strings)


class _Stepper:
    """One forward per call against a KV cache, by the path :func:`~opdgrpo.train.inference.choose_path` found exact:
    :class:`~opdgrpo.train.inference.LeanQwen3` (the tiny profile's rollouts), the model with a :func:`sampling_cache`
    (under :func:`fast_attention`), or the model with a plain ``DynamicCache``."""

    def __init__(self, model: torch.nn.Module, path: str):
        self.model = model
        self.lean = LeanQwen3(model) if path == LEAN else None
        self.cache = None if self.lean else (sampling_cache(model.config) if path == FAST else DynamicCache(config=model.config))
        self.cache_kw = None if self.lean else cache_kwarg(model)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Logits (rows x 1 x vocab) of the last position; ``attention_mask`` covers the cache and ``input_ids``."""
        if self.lean:
            return self.lean.forward(input_ids, position_ids, LeanQwen3.mask_bias(attention_mask, input_ids.shape[1]))
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                          logits_to_keep=1, **{self.cache_kw: self.cache}).logits

    def select(self, rows: torch.Tensor) -> None:
        if self.lean:
            self.lean.select(rows)
        else:
            self.cache.batch_select_indices(rows)


def _sample_loop(path: str, model, input_ids: torch.Tensor, prompt_mask: torch.Tensor, stops: torch.Tensor, *, max_new_tokens: int,
                 pad_token_id: int, temperature: float, top_p: float, top_k: int, generator,
                 strings: StopStrings | None = None) -> Rollouts:
    config = model.config
    batch, prompt_len = input_ids.shape
    device = input_ids.device
    position_ids = (prompt_mask.cumsum(dim=-1) - 1).clamp(min=0)
    step_model = _Stepper(model, path)
    logits = step_model(input_ids, prompt_mask, position_ids)
    total_flops = flop_formulas.prefill_flops(config, batch, prompt_len, logits_positions=1)
    tokens_computed = batch * prompt_len

    generated = torch.full((batch, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    active = torch.arange(batch, device=device)  # original row index of each row still in the batch
    mask = prompt_mask  # attention mask of the active rows over everything cached so far
    next_pos = position_ids[:, -1] + 1  # position of the token each active row feeds next
    steps = 0
    history: list[list[int]] = [[] for _ in range(batch)]   # each row's tokens on the host, for its stop strings
    hit_rows: list[int] = []
    for step in range(max_new_tokens):
        tokens = _choose(logits[:, -1, :], temperature, top_p, top_k, generator)
        generated[active, step] = tokens
        steps = step + 1
        is_eos = torch.isin(tokens, stops)
        if strings is not None:
            is_eos = is_eos | _string_hits(strings, active, tokens, history, hit_rows)
        finished[active[is_eos]] = True
        if step == max_new_tokens - 1 or bool(is_eos.all()):
            break
        if bool(is_eos.any()):  # compaction: drop finished rows from the batch and the cache
            keep = (~is_eos).nonzero().squeeze(-1)
            step_model.select(keep)
            active, tokens, mask, next_pos = active[keep], tokens[keep], mask[keep], next_pos[keep]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
        logits = step_model(tokens[:, None], mask, next_pos[:, None])
        next_pos = next_pos + 1
        total_flops += flop_formulas.decode_step_flops(config, len(active), context_len=mask.shape[1])
        tokens_computed += len(active)

    generated = generated[:, :steps]
    is_eos = torch.isin(generated, stops)
    # True up to and including the first EOS: no EOS strictly before this position.
    completion_mask = (is_eos.long().cumsum(dim=-1) - is_eos.long()) == 0
    generated = generated.masked_fill(~completion_mask, pad_token_id)
    # A row's completion is everything before its first stop token: the masked positions, less the stop if it ended.
    lengths = (completion_mask.sum(dim=-1) - (completion_mask & is_eos).sum(dim=-1)).tolist()
    completions = [row[:n] for row, n in zip(generated.tolist(), lengths)]
    text_ends = None if strings is None else _cut_rows(strings, hit_rows, completions, completion_mask, generated, pad_token_id)
    return Rollouts(
        sequences=torch.cat([input_ids, generated], dim=-1),
        attention_mask=torch.cat([prompt_mask, completion_mask.long()], dim=-1),
        completion_mask=completion_mask,
        prompt_len=prompt_len,
        completions=completions,
        finished=finished,
        flops=total_flops,
        tokens_computed=tokens_computed,
        text_ends=text_ends,
    )


def _string_hits(strings: StopStrings, active: torch.Tensor, tokens: torch.Tensor, history: list[list[int]],
                 hit_rows: list[int]) -> torch.Tensor:
    """Append this step's tokens to the active rows' ``history`` and say which rows just completed a stop string
    (noted in ``hit_rows``): those leave the batch as at EOS."""
    rows = active.tolist()
    for r, t in zip(rows, tokens.tolist()):
        history[r].append(t)
    hits = strings.hits(rows, [history[r] for r in rows])
    hit_rows.extend(r for r, h in zip(rows, hits) if h)
    return torch.tensor(hits, dtype=torch.bool, device=tokens.device)


def _cut_rows(strings: StopStrings, hit_rows: list[int], completions: list[list[int]], completion_mask: torch.Tensor,
              generated: torch.Tensor, pad_token_id: int) -> list[int | None]:
    """Cut each row that stopped at a stop string to its kept tokens (in place: its completion, mask and ids); the
    rows' text ends (:mod:`opdgrpo.train.stops`)."""
    ends: list[int | None] = [None] * len(completions)
    for r in hit_rows:
        found = strings.cut(r, completions[r])
        if found is None:   # the tail saw it, the whole text must too; keep the row as generated if not
            continue
        kept, ends[r] = found
        completions[r] = completions[r][:kept]
        completion_mask[r, kept:] = False
        generated[r, kept:] = pad_token_id
    return ends
