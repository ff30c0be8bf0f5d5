"""The two training objectives the paper compares: GRPO and on-policy distillation (OPD).

This is our own code, not a wrapper around TRL or any other trainer: the objectives *are* the paper's method, so
they live here as small, pure tensor functions that the trainers call and the tests pin down. No model code.

Shared conventions
------------------
* Per-token inputs are aligned with the response tokens: position ``t`` of ``logits``/``logprobs``/``mask`` scores
  response token ``t`` (the caller shifts logits by one against the input ids and masks out prompt and padding).
* ``mask`` is ``(B, T)``, bool or float; nonzero marks a token that is trained on.
* Everything is computed in float32 internally (float64 if the inputs are float64, so ``gradcheck`` works), because
  bf16 log-probabilities and ratios are too coarse for a clipped ratio near 1 or a KL near 0.
* Two aggregations (:data:`AGGREGATIONS`), one knob for both methods:

  - ``"token-mean"``: sum of the per-token losses over every valid token in the batch, divided by the number of
    valid tokens in the batch. Every token weighs the same, so long responses weigh more (DAPO / Dr. GRPO style).
    The normaliser is *this call's* batch unless ``normalizer`` is given: a shard of a larger batch (gradient
    accumulation, several processes) passes the whole batch's count, so the shards' losses sum to the batch's.
  - ``"sequence-mean"``: mean over the valid tokens within each sequence, then mean over the sequences that have at
    least one valid token (the original GRPO formula, 1/G sum_i 1/|o_i| sum_t); ``normalizer`` replaces the
    sequence count.

  A batch without any valid token gives a loss of exactly 0 that is still connected to the graph.
* Metrics are returned as Python floats (one host sync per call; cheap next to a training step) so they can go
  straight into ``ledger.jsonl``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from opdgrpo import schema

#: ``token-mean`` or ``sequence-mean`` (``method.aggregation``; the allowed values live in the method schema).
AGGREGATIONS: tuple[str, ...] = schema.allowed("method.schema.yaml#/$defs/common", "aggregation")


# --------------------------------------------------------------------------------------------------------------------
# helpers


def _compute_dtype(t: Tensor) -> torch.dtype:
    """float64 stays float64 (for gradcheck); everything else (bf16, fp16, fp32) is computed in float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _check_aggregation(aggregation: str) -> None:
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; expected one of {', '.join(AGGREGATIONS)}")


def _check_mask(mask: Tensor, shape: torch.Size, what: str) -> None:
    if mask.shape != shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)} but {what} has shape {tuple(shape)}; both must be (B, T)")


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over the positions where ``mask`` is set (0 if there are none)."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


def _aggregate(per_token: Tensor, mask: Tensor, aggregation: str, normalizer: float | None = None) -> Tensor:
    """Reduce a ``(B, T)`` per-token loss to a scalar; ``mask`` is already float in ``per_token``'s dtype.
    ``normalizer``: the count to divide by (the whole batch's tokens or sequences) instead of this call's."""
    if aggregation == "token-mean":
        if normalizer is None:
            return _masked_mean(per_token, mask)
        return (per_token * mask).sum() / max(float(normalizer), 1.0)
    # sequence-mean: sequences without valid tokens neither contribute nor count.
    tokens_per_seq = mask.sum(dim=-1)
    per_seq = (per_token * mask).sum(dim=-1) / tokens_per_seq.clamp(min=1)
    has_tokens = (tokens_per_seq > 0).to(per_seq.dtype)
    if normalizer is not None:
        return (per_seq * has_tokens).sum() / max(float(normalizer), 1.0)
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1)


def aggregation_count(mask: Tensor, aggregation: str) -> int:
    """What ``aggregation`` divides by for this mask: valid tokens, or sequences with at least one."""
    _check_aggregation(aggregation)
    return int(mask.sum()) if aggregation == "token-mean" else int((mask.sum(dim=-1) > 0).sum())


#: At most this many float32 values are upcast at once by :func:`_logsumexp_rows` (64 MB).
LOGSUMEXP_CHUNK_ELEMENTS = 1 << 24


def _tempered(x: Tensor, temperature: float) -> Tensor:
    """``x / temperature``, skipped at 1 (``x / 1.0`` is ``x`` bit for bit, and the pass costs a copy)."""
    return x if temperature == 1.0 else x / temperature


def _logsumexp_rows(logits: Tensor, dtype: torch.dtype, temperature: float = 1.0) -> Tensor:
    """``logsumexp`` of ``logits / temperature`` over the vocabulary, a chunk of batch rows at a time.

    Upcasting a whole ``(B, T, V)`` bf16 tensor to float32 would double its memory (V is ~152k for Qwen3): a chunk
    holds at most :data:`LOGSUMEXP_CHUNK_ELEMENTS` floats, and at least one row. On small vocabularies one call
    covers the batch instead of one call (and one backward node) per row; each value is reduced exactly as before.
    The temperature divides after the upcast (a bf16 quotient would round again).
    """
    rows = logits.shape[0]
    if rows == 0:
        return logits.new_zeros(logits.shape[:-1], dtype=dtype)
    per_chunk = max(1, LOGSUMEXP_CHUNK_ELEMENTS // max(1, logits[0].numel()))
    if per_chunk >= rows:
        return torch.logsumexp(_tempered(logits.to(dtype), temperature), dim=-1)
    return torch.cat([torch.logsumexp(_tempered(chunk.to(dtype), temperature), dim=-1)
                      for chunk in logits.split(per_chunk)])


# --------------------------------------------------------------------------------------------------------------------
# GRPO


def group_advantages(rewards: Tensor, group_size: int, scale_by_std: bool = True, eps: float = 1e-4) -> Tensor:
    """Group-relative advantages: each completion's reward against the other completions of the same prompt.

    ``rewards`` is ``(num_prompts * group_size,)`` ordered group by group (the ``group_size`` samples of prompt 0,
    then those of prompt 1, ...). Returns the same shape::

        A = (r - mean_group) / (std_group + eps)   if scale_by_std   (GRPO)
        A =  r - mean_group                         otherwise        (Dr. GRPO: no difficulty reweighting)

    The std is the **unbiased** sample std (Bessel's correction, ``torch.std``'s default), as in TRL's GRPOTrainer,
    so our numbers match the most common implementation. ``eps`` (1e-4, also TRL's) only guards the division.

    A group whose rewards are all identical carries no signal and gets advantages of exactly 0 (not
    ``rounding error / eps``, which a float mean could otherwise produce). A group of one sample is such a group.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"rewards must be 1-D with a length divisible by group_size={group_size}, got shape {tuple(rewards.shape)}"
        )
    dtype = _compute_dtype(rewards) if rewards.is_floating_point() else torch.float32
    groups = rewards.to(dtype).reshape(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if scale_by_std and group_size > 1:
        centred = centred / (groups.std(dim=1, keepdim=True) + eps)
    identical = groups.amax(dim=1, keepdim=True) == groups.amin(dim=1, keepdim=True)
    return torch.where(identical, torch.zeros_like(centred), centred).reshape(-1)


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each target token: ``log_softmax(logits / temperature)[b, t, targets[b, t]]``, ``(B, T)``.

    Computed as ``logit[target] / T - logsumexp(logits / T)`` in float32, a chunk of batch rows at a time, so a bf16
    ``(B, T, V)`` tensor is never materialised in float32 as a whole (the same trick as TRL's
    ``selective_log_softmax``). ``temperature`` is the one the tokens were sampled at (``train.temperature``), so
    the log-probs are those of the distribution that drew them (TRL and verl divide the same way); at 1 nothing is
    divided. Differentiable with respect to ``logits``.
    """
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"expected logits (B, T, V) and targets (B, T), got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    dtype = _compute_dtype(logits)
    picked = _tempered(logits.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1).to(dtype), temperature)
    return picked - _logsumexp_rows(logits, dtype, temperature)


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    aggregation: str = "token-mean",
    ref_logprobs: Tensor | None = None,
    beta: float = 0.0,
    normalizer: float | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO-clipped GRPO surrogate, to be minimised.

    Per valid token, with ``ratio = exp(logprobs - old_logprobs)`` and the sequence's advantage ``A``::

        loss_t = -min(ratio * A, clip(ratio, 1 - clip_eps, 1 + clip_eps_high) * A)  [+ beta * k3_t]

    ``clip_eps_high`` defaults to ``clip_eps`` (symmetric PPO); a larger value is DAPO's "clip-higher".
    ``old_logprobs`` are those of the policy that sampled the rollouts; with one update per batch they equal
    ``logprobs.detach()`` and the ratio is 1 (the gradient is still the policy gradient); with several updates per
    batch (``method.updates_per_batch``, ``method.minibatches``) they come from a forward before the first update
    and the ratio moves away from 1 as the policy does, which is when the clip acts.

    The reference KL is off by default (``beta = 0``, the paper's "GRPO adds nothing"). With ``beta > 0`` it is the
    k3 estimator ``exp(ref - logp) - (ref - logp) - 1`` (unbiased for KL(pi || ref), always >= 0).

    Args:
        logprobs: ``(B, T)`` current policy log-probs of the sampled tokens; carries the gradient.
        old_logprobs: ``(B, T)`` log-probs under the sampling policy; treated as constants.
        advantages: ``(B,)`` one advantage per sequence (see :func:`group_advantages`), broadcast over its tokens.
        mask: ``(B, T)`` valid response tokens.
        aggregation: ``"token-mean"`` or ``"sequence-mean"`` (see the module docstring).
        weights: ``(B, T)`` constants on each token's policy-gradient term (not the KL): ``method.engine_is_cap``.

    Returns:
        ``(loss, metrics)``; metrics over valid tokens: ``clip_frac`` (tokens where clipping binds, i.e. gets zero
        gradient: ratio below ``1 - clip_eps`` with ``A < 0``, or above ``1 + clip_eps_high`` with ``A > 0``),
        ``clip_frac_low``, ``clip_frac_high``, ``ratio_mean``, and ``kl`` (mean k3) when a reference is given.
    """
    _check_aggregation(aggregation)
    _check_mask(mask, logprobs.shape, "logprobs")
    if old_logprobs.shape != logprobs.shape:
        raise ValueError(f"old_logprobs shape {tuple(old_logprobs.shape)} != logprobs shape {tuple(logprobs.shape)}")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be (B,) = {tuple(logprobs.shape[:1])}, got {tuple(advantages.shape)}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (the reference model's log-probs of the sampled tokens)")
    eps_low = clip_eps
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high

    dtype = _compute_dtype(logprobs)
    logp = logprobs.to(dtype)
    m = mask.to(dtype)
    adv = advantages.detach().to(dtype).unsqueeze(-1)
    ratio = torch.exp(logp - old_logprobs.detach().to(dtype))
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = -torch.minimum(ratio * adv, clipped_ratio * adv) * (1.0 if weights is None else weights.detach().to(dtype))

    metrics: dict[str, float] = {}
    if ref_logprobs is not None:
        delta = ref_logprobs.detach().to(dtype) - logp
        k3 = torch.exp(delta) - delta - 1.0
        if beta > 0:
            per_token = per_token + beta * k3
        metrics["kl"] = _masked_mean(k3.detach(), m).item()

    loss = _aggregate(per_token, m, aggregation, normalizer)

    with torch.no_grad():
        low = ((ratio < 1.0 - eps_low) & (adv < 0)).to(dtype)
        high = ((ratio > 1.0 + eps_high) & (adv > 0)).to(dtype)
        metrics["clip_frac_low"] = _masked_mean(low, m).item()
        metrics["clip_frac_high"] = _masked_mean(high, m).item()
        metrics["clip_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
        metrics["ratio_mean"] = _masked_mean(ratio, m).item()
    return loss, metrics


# --------------------------------------------------------------------------------------------------------------------
# OPD


def topk_reverse_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor,
    k: int = 16,
    aggregation: str = "token-mean",
    normalizer: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """OPD's per-token reverse KL(student || teacher), closed form over the student's top-k tokens.

    At each response position the student's ``k`` most likely token ids are chosen (no gradient through the
    choice); both the student's and the teacher's logits at those ids are renormalised on that set
    (``log_softmax`` over the ``k`` gathered logits), and::

        KL_t = sum_i p_s(i) * (log p_s(i) - log p_t(i))

    This is the paper's "vanilla reverse KL over the student's top-16 tokens": an exact (not sampled) KL on the
    support where the student puts its mass, at the cost of ``k`` gathered logits per token instead of ``V``. With
    ``k == V`` it is the full reverse KL. The teacher is frozen: its logits are detached, gradient reaches the
    student logits only. The trainer calls its parts (:func:`student_topk` per logit chunk, then
    :func:`topk_reverse_kl_from_topk`'s two halves, :func:`topk_reverse_kl_per_token` and :func:`reverse_kl_loss`, the
    per-token values also going to the per-teacher diagnostics) so that no ``(B, T, V)`` tensor is kept; this one-call
    form is the loss as written, and the reference the tests hold the chunked path to.

    Args:
        student_logits: ``(B, T, V)`` aligned with the response tokens; any float dtype (computed in float32).
        teacher_logits: ``(B, T, V_t)`` over the same positions, ``V_t >= V`` (a teacher whose vocabulary is padded
            further is fine: only the student's top-k ids are read).
        mask: ``(B, T)`` valid response tokens.
        k: size of the support (16 in the paper); ``1 <= k <= V``.
        aggregation: ``"token-mean"`` or ``"sequence-mean"`` (see the module docstring).

    Returns:
        ``(loss, metrics)``; metrics over valid tokens: ``kl`` (mean per-token KL) and ``topk_mass`` (mean share of
        the student's full-softmax probability on its top-k ids: how much the truncation keeps).
    """
    _check_aggregation(aggregation)
    if student_logits.dim() != 3:
        raise ValueError(f"student_logits must be (B, T, V), got {tuple(student_logits.shape)}")
    _check_mask(mask, student_logits.shape[:2], "student_logits[:2]")
    vocab = student_logits.shape[-1]
    if teacher_logits.dim() != 3 or teacher_logits.shape[:2] != student_logits.shape[:2]:
        raise ValueError(
            f"teacher_logits {tuple(teacher_logits.shape)} must cover the same (B, T) as "
            f"student_logits {tuple(student_logits.shape)}"
        )
    if teacher_logits.shape[-1] < vocab:
        raise ValueError(f"teacher vocabulary ({teacher_logits.shape[-1]}) is smaller than the student's ({vocab})")
    if not 1 <= k <= vocab:
        raise ValueError(f"k={k} must be between 1 and the vocabulary size V={vocab}")

    s_top, top_ids, student_lse = student_topk(student_logits, k)
    t_top = teacher_logits.detach().gather(-1, top_ids)
    return topk_reverse_kl_from_topk(s_top, t_top, student_lse, mask, aggregation, normalizer)


def student_topk(student_logits: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """What :func:`topk_reverse_kl` reads of the student's logits ``(..., V)``, per position: its top-``k`` logits
    (in the compute dtype, carrying the gradient), their ids (no gradient through the choice) and the full-vocabulary
    logsumexp (no gradient; for ``topk_mass``). Per position, so a chunk of positions gives that chunk's values
    (:mod:`opdgrpo.train.logit_chunks`)."""
    dtype = _compute_dtype(student_logits)
    with torch.no_grad():
        top_ids = student_logits.topk(k, dim=-1).indices  # (B, T, k); the choice carries no gradient
    s_top = student_logits.gather(-1, top_ids).to(dtype)
    with torch.no_grad():
        lse = _logsumexp_rows(student_logits, dtype)
    return s_top, top_ids, lse


def topk_reverse_kl_from_topk(
    s_top: Tensor,
    t_top: Tensor,
    student_lse: Tensor,
    mask: Tensor,
    aggregation: str = "token-mean",
    normalizer: float | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """:func:`topk_reverse_kl` from the gathered values (:func:`student_topk`'s, and the teacher's logits at the
    student's top-k ids, any float dtype), so neither model's full-vocabulary logits need to exist at once.
    ``weights``: ``(B, T)`` constants multiplying each token's KL (the sampling engine's truncated importance weights,
    ``method.engine_is_cap``); None: 1."""
    return reverse_kl_loss(topk_reverse_kl_per_token(s_top, t_top), s_top, student_lse, mask, aggregation,
                           normalizer, weights)


def topk_reverse_kl_per_token(s_top: Tensor, t_top: Tensor) -> Tensor:
    """``(B, T)`` per-position reverse KL(student || teacher) on the student's top-k support, both renormalised on it
    (:func:`topk_reverse_kl`'s ``KL_t``, every position, padding included: the caller masks). Differentiable in
    ``s_top``; the teacher's values are detached. Its own function because the multi-teacher trainer also reads it
    per teacher (:class:`opdgrpo.train.objectives.OPDObjective`), the very values the loss sums."""
    dtype = s_top.dtype
    t_top = t_top.detach().to(dtype)
    log_ps = F.log_softmax(s_top, dim=-1)
    log_pt = F.log_softmax(t_top, dim=-1)
    return (log_ps.exp() * (log_ps - log_pt)).sum(dim=-1)  # (B, T)


def reverse_kl_loss(
    per_token: Tensor,
    s_top: Tensor,
    student_lse: Tensor,
    mask: Tensor,
    aggregation: str = "token-mean",
    normalizer: float | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """OPD's loss and metrics from :func:`topk_reverse_kl_per_token`'s ``per_token`` (and the student's top-k logits and
    full logsumexp, for ``topk_mass``): the second half of :func:`topk_reverse_kl_from_topk`."""
    _check_aggregation(aggregation)
    _check_mask(mask, per_token.shape, "per_token")
    dtype = per_token.dtype
    m = mask.to(dtype)
    weighted = per_token if weights is None else per_token * weights.detach().to(dtype)
    loss = _aggregate(weighted, m, aggregation, normalizer)

    with torch.no_grad():
        topk_mass = torch.exp(torch.logsumexp(s_top, dim=-1) - student_lse)
        metrics = {
            "kl": _masked_mean(per_token, m).item(),
            "topk_mass": _masked_mean(topk_mass, m).item(),
        }
    return loss, metrics
