"""GRPO's knobs at the objective: log-probs at the sampling temperature, the old policy's log-probs from the shard,
and the reference KL (``beta``), against hand-computed values on tiny examples."""

from __future__ import annotations

import math

import pytest
import torch

from opdgrpo.domains import Task
from opdgrpo.train.losses import token_logprobs
from opdgrpo.train.objectives import GRPOObjective, OPDObjective, Shard
from opdgrpo.train.rollout import ScoredRollouts
from opdgrpo.train.sampling import Rollouts

METHOD = {"name": "grpo", "group_size": 2, "aggregation": "token-mean", "scale_by_std": False, "clip_eps": 0.2,
          "clip_eps_high": None}


def _shard(targets: list[list[int]], rewards: list[float]) -> Shard:
    """A shard of one group: a one-token prompt (id 0), then ``targets`` as every row's response (all trained on)."""
    t = torch.tensor(targets)
    sequences = torch.cat([torch.zeros(len(targets), 1, dtype=torch.long), t], dim=1)
    rollouts = Rollouts(sequences=sequences, attention_mask=torch.ones_like(sequences),
                        completion_mask=torch.ones_like(t, dtype=torch.bool), prompt_len=1,
                        completions=t.tolist(), finished=torch.zeros(len(targets), dtype=torch.bool), flops=0.0,
                        tokens_computed=0)
    tasks = [Task(domain="math", prompt="p", answer="a") for _ in targets]
    return Shard(tasks, ScoredRollouts(tasks, rollouts, ["" for _ in targets], torch.tensor(rewards)))


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.7])
def test_token_logprobs_at_a_temperature_are_the_log_softmax_of_tempered_logits(temperature) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g) * 3
    targets = torch.randint(0, 11, (3, 5), generator=g)
    want = torch.log_softmax(logits.double() / temperature, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, targets, temperature=temperature), want.float(),
                               rtol=0, atol=2e-6)
    # bf16 logits: divided after the upcast, so the same as tempering the float32 copy of the bf16 values
    low = logits.bfloat16()
    want_low = torch.log_softmax(low.float() / temperature, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(token_logprobs(low, targets, temperature=temperature), want_low, rtol=0, atol=2e-6)
    # the objective's log-probs are these, at the temperature it was built with
    shard = _shard(targets.tolist(), [1.0, 0.0, 1.0])
    got = GRPOObjective(METHOD, temperature=temperature).logprobs(logits, shard.targets)
    assert torch.equal(got, token_logprobs(logits, targets, temperature=temperature))


def test_temperature_one_divides_nothing() -> None:
    logits = torch.randn(2, 4, 7, requires_grad=True)
    targets = torch.randint(0, 7, (2, 4))
    assert torch.equal(token_logprobs(logits, targets, temperature=1.0), token_logprobs(logits, targets))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, targets, temperature=0.0)


def test_opd_log_probs_are_untempered() -> None:
    logits = torch.randn(2, 3, 5)
    shard = _shard([[1, 2, 3], [4, 0, 1]], [1.0, 0.0])
    opd = OPDObjective({"name": "opd", "rollouts_per_prompt": 2, "aggregation": "token-mean", "kl_top_k": 2}, {}, "fp32")
    assert torch.equal(opd.logprobs(logits, shard.targets), token_logprobs(logits, shard.targets))


def _two_by_two() -> tuple[torch.Tensor, Shard]:
    """Two rows, two response tokens, vocabulary 2. Row 0: uniform logits, then log-odds ln 3 for token 0; it
    writes token 0 twice (p = 1/2, then 3/4). Row 1: uniform twice, writes token 1 twice (p = 1/2, 1/2)."""
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0]], [[0.0, 0.0], [0.0, 0.0]]], requires_grad=True)
    return logits, _shard([[0, 0], [1, 1]], [1.0, 0.0])


def test_beta_adds_exactly_the_hand_computed_k3_kl() -> None:
    logits, shard = _two_by_two()
    # reference log-probs of the same tokens: 1/4 where the policy has 1/2 (row 0, token 0); equal elsewhere
    shard.ref_logprobs = torch.log(torch.tensor([[0.25, 0.75], [0.5, 0.5]]))
    # k3 = exp(d) - d - 1 with d = ref - logp: d = ln(1/2) at row 0 token 0, so k3 = 1/2 + ln 2 - 1; 0 elsewhere
    k3 = 0.5 + math.log(2.0) - 1.0
    beta = 0.1
    plain, _ = GRPOObjective(METHOD).loss(logits, shard, None, lambda t, *a: t, {})
    with_kl, metrics = GRPOObjective({**METHOD, "beta": beta}).loss(logits, shard, None, lambda t, *a: t, {})
    # token-mean over the 4 response tokens
    assert with_kl.item() - plain.item() == pytest.approx(beta * k3 / 4, rel=1e-6)
    assert metrics["kl"] == pytest.approx(k3 / 4, rel=1e-6)
    # the policy-gradient part: ratio 1, A = r - mean = +1/2 and -1/2, loss = -mean(A) = 0
    assert plain.item() == pytest.approx(0.0, abs=1e-7)
    # beta > 0 without reference log-probs on the shard is an error, not a silent 0
    shard.ref_logprobs = None
    with pytest.raises(ValueError, match="reference"):
        GRPOObjective({**METHOD, "beta": beta}).loss(logits, shard, None, lambda t, *a: t, {})


def test_the_old_policys_log_probs_come_from_the_shard_and_the_clip_acts() -> None:
    logits, shard = _two_by_two()
    current = token_logprobs(logits, shard.targets).detach()
    # the sampling policy gave every token 1.5 times less probability: ratio 1.5 on every token
    shard.old_logprobs = current - math.log(1.5)
    loss, metrics = GRPOObjective(METHOD).loss(logits, shard, None, lambda t, *a: t, {})
    # row 0 (A = +1/2): min(1.5 A, 1.2 A) = 0.6; row 1 (A = -1/2): min(-0.75, -0.6) = -0.75; loss = -mean
    assert loss.item() == pytest.approx(-(2 * 0.6 - 2 * 0.75) / 4, rel=1e-6)
    assert metrics["ratio_mean"] == pytest.approx(1.5, rel=1e-6)
    assert metrics["clip_frac_high"] == 0.5 and metrics["clip_frac_low"] == 0.0 and metrics["clip_frac"] == 0.5
    # without old log-probs on the shard the ratio is 1 and nothing clips
    shard.old_logprobs = None
    _, metrics = GRPOObjective(METHOD).loss(logits, shard, None, lambda t, *a: t, {})
    assert metrics["ratio_mean"] == 1.0 and metrics["clip_frac"] == 0.0
