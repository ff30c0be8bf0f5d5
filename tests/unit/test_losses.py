"""Tests for the GRPO and OPD objectives against hand-computed values and direct (loop) computations."""

from __future__ import annotations

import math

import pytest
import torch

from opdgrpo.train.losses import group_advantages, grpo_loss, token_logprobs, topk_reverse_kl

# --------------------------------------------------------------------------------------------------------------------
# group_advantages


def test_group_advantages_hand_computed_two_groups() -> None:
    # group 0: rewards 0, 1, 3 -> mean 4/3, deviations -4/3, -1/3, 5/3, unbiased var (16/9 + 1/9 + 25/9) / 2 = 7/3
    # group 1: all identical; three float32 0.9s have a mean that is off by one ulp, so without the explicit
    # identical-group rule the advantages would be rounding error / eps (about 6e-4), not 0
    rewards = torch.tensor([0.0, 1.0, 3.0, 0.9, 0.9, 0.9])
    std = math.sqrt(7.0 / 3.0)
    expected = torch.tensor([(-4 / 3) / (std + 1e-4), (-1 / 3) / (std + 1e-4), (5 / 3) / (std + 1e-4), 0.0, 0.0, 0.0])
    adv = group_advantages(rewards, group_size=3)
    assert adv.shape == (6,)
    torch.testing.assert_close(adv, expected)
    assert torch.all(adv[3:] == 0)


def test_group_advantages_without_std_scaling() -> None:
    rewards = torch.tensor([0.0, 1.0, 2.0, 3.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_advantages(rewards, group_size=4, scale_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([-1.5, -0.5, 0.5, 1.5, 0.0, 0.0, 0.0, 0.0]))


def test_group_advantages_binary_rewards_and_eps() -> None:
    # group of 2: mean 0.5, unbiased std sqrt(0.5), advantage +-0.5 / (sqrt(0.5) + eps)
    adv = group_advantages(torch.tensor([1.0, 0.0]), group_size=2, eps=0.01)
    a = 0.5 / (math.sqrt(0.5) + 0.01)
    torch.testing.assert_close(adv, torch.tensor([a, -a]))


def test_group_advantages_integer_rewards_and_group_of_one() -> None:
    adv = group_advantages(torch.tensor([1, 0, 1, 1]), group_size=2)
    assert adv.dtype == torch.float32
    assert adv[2:].eq(0).all() and adv[0] > 0 > adv[1]
    assert group_advantages(torch.tensor([1.0, 0.0, 1.0]), group_size=1).eq(0).all()


def test_group_advantages_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="divisible"):
        group_advantages(torch.zeros(7), group_size=4)
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(4), group_size=0)


# --------------------------------------------------------------------------------------------------------------------
# token_logprobs


def test_token_logprobs_matches_log_softmax_and_is_differentiable() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (2, 5))
    got = token_logprobs(logits, targets)
    expected = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(got, expected)
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, targets), (logits,))


def test_token_logprobs_bf16_is_computed_in_float32() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 50) * 5
    targets = torch.randint(0, 50, (2, 4))
    got = token_logprobs(logits.bfloat16(), targets)
    assert got.dtype == torch.float32
    expected = torch.log_softmax(logits.bfloat16().float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(got, expected)


# --------------------------------------------------------------------------------------------------------------------
# grpo_loss


def _from_ratios(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A leaf ``logprobs`` tensor and ``old_logprobs`` whose exp-difference is ``ratios``."""
    r = torch.tensor(ratios, dtype=torch.float64)
    old = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.4, 0.25, 0.1]], dtype=torch.float64))
    logprobs = (old + torch.log(r)).detach().requires_grad_(True)
    return logprobs, old


# Sequence 0 has A = +1, sequence 1 has A = -1; clip range [0.8, 1.2].
#  seq 0: ratio 1.5 is clipped high (-> 1.2, no gradient); 1.1 inside; 0.5 below the range but A > 0 so min keeps
#         0.5 (unclipped, gradient flows). Per-token losses -1.2, -1.1, -0.5.
#  seq 1: ratio 0.5 is clipped low (-> 0.8, no gradient); 0.9 inside; the third token (ratio 3.0) is masked out.
#         Per-token losses 0.8, 0.9.
RATIOS = [[1.5, 1.1, 0.5], [0.5, 0.9, 3.0]]
ADV = torch.tensor([1.0, -1.0], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)


def test_grpo_loss_token_mean_hand_computed() -> None:
    logprobs, old = _from_ratios(RATIOS)
    loss, metrics = grpo_loss(logprobs, old, ADV, MASK, clip_eps=0.2, aggregation="token-mean")
    # (-1.2 - 1.1 - 0.5 + 0.8 + 0.9) / 5 valid tokens
    assert loss.item() == pytest.approx(-0.22, abs=1e-12)
    loss.backward()
    # d(-ratio * A)/d logp = -A * ratio where unclipped, 0 where clipped or masked; / 5 tokens
    expected_grad = torch.tensor([[0.0, -1.1 / 5, -0.5 / 5], [0.0, 0.9 / 5, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logprobs.grad, expected_grad)
    assert metrics["clip_frac"] == pytest.approx(2 / 5)
    assert metrics["clip_frac_low"] == pytest.approx(1 / 5)
    assert metrics["clip_frac_high"] == pytest.approx(1 / 5)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 1.1 + 0.5 + 0.5 + 0.9) / 5)
    assert "kl" not in metrics


def test_grpo_loss_sequence_mean_hand_computed() -> None:
    logprobs, old = _from_ratios(RATIOS)
    loss, _ = grpo_loss(logprobs, old, ADV, MASK, clip_eps=0.2, aggregation="sequence-mean")
    # seq 0: -2.8 / 3, seq 1: 1.7 / 2, mean of the two
    assert loss.item() == pytest.approx((-2.8 / 3 + 1.7 / 2) / 2, abs=1e-12)
    loss.backward()
    expected_grad = torch.tensor([[0.0, -1.1 / 6, -0.5 / 6], [0.0, 0.9 / 4, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logprobs.grad, expected_grad)


def test_grpo_loss_asymmetric_clip() -> None:
    # Range [0.8, 1.28] against the symmetric [0.8, 1.2]. All tokens valid.
    ratios = [[1.25, 1.5, 0.75], [0.75, 1.25, 1.1]]
    mask = torch.ones(2, 3, dtype=torch.bool)
    logprobs, old = _from_ratios(ratios)
    loss, metrics = grpo_loss(logprobs, old, ADV, mask, clip_eps=0.2, clip_eps_high=0.28)
    # seq 0 (A=+1): 1.25 unclipped, 1.5 -> 1.28, 0.75 kept; seq 1 (A=-1): 0.75 -> 0.8, 1.25 and 1.1 unclipped
    assert loss.item() == pytest.approx((-1.25 - 1.28 - 0.75 + 0.8 + 1.25 + 1.1) / 6, abs=1e-12)
    loss.backward()
    expected_grad = torch.tensor([[-1.25, 0.0, -0.75], [0.0, 1.25, 1.1]], dtype=torch.float64) / 6
    torch.testing.assert_close(logprobs.grad, expected_grad)
    assert metrics["clip_frac_high"] == pytest.approx(1 / 6)

    logprobs, old = _from_ratios(ratios)
    loss, metrics = grpo_loss(logprobs, old, ADV, mask, clip_eps=0.2)  # symmetric: 1.25 with A>0 is clipped
    assert loss.item() == pytest.approx((-1.2 - 1.2 - 0.75 + 0.8 + 1.25 + 1.1) / 6, abs=1e-12)
    loss.backward()
    assert logprobs.grad[0, 0] == 0
    assert metrics["clip_frac_high"] == pytest.approx(2 / 6)


def test_grpo_loss_on_policy_gradient_is_policy_gradient() -> None:
    # old == current: ratio 1, loss = -mean(A), gradient = -A / num_tokens on every valid token.
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    adv = torch.tensor([2.0, -0.5])
    loss, metrics = grpo_loss(logprobs, logprobs.detach(), adv, torch.ones(2, 2))
    assert loss.item() == pytest.approx(-(2.0 * 2 - 0.5 * 2) / 4)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.5, -0.5], [0.125, 0.125]]))
    assert metrics["clip_frac"] == 0 and metrics["ratio_mean"] == pytest.approx(1.0)


def test_grpo_loss_k3_kl_term() -> None:
    logprobs, old = _from_ratios(RATIOS)
    ref = old + 0.3
    base, _ = grpo_loss(logprobs, old, ADV, MASK)
    with_kl, metrics = grpo_loss(logprobs, old, ADV, MASK, ref_logprobs=ref, beta=0.1)
    delta = (ref - logprobs).detach()
    k3 = torch.exp(delta) - delta - 1
    mean_k3 = k3[MASK].mean().item()
    assert metrics["kl"] == pytest.approx(mean_k3)
    assert with_kl.item() == pytest.approx(base.item() + 0.1 * mean_k3, abs=1e-12)
    # beta = 0 with a reference: KL is reported, not added
    no_kl, metrics0 = grpo_loss(logprobs, old, ADV, MASK, ref_logprobs=ref, beta=0.0)
    assert no_kl.item() == pytest.approx(base.item()) and metrics0["kl"] == pytest.approx(mean_k3)


def test_grpo_loss_validation() -> None:
    logprobs, old = _from_ratios(RATIOS)
    with pytest.raises(ValueError, match="aggregation 'sum'"):
        grpo_loss(logprobs, old, ADV, MASK, aggregation="sum")
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logprobs, old, ADV, MASK, beta=0.1)


def test_grpo_loss_empty_mask_is_zero_and_bf16_inputs_work() -> None:
    logprobs, old = _from_ratios(RATIOS)
    loss, _ = grpo_loss(logprobs, old, ADV, torch.zeros(2, 3), aggregation="sequence-mean")
    assert loss.item() == 0.0
    loss.backward()  # still connected to the graph
    loss16, _ = grpo_loss(logprobs.detach().bfloat16(), old.bfloat16(), ADV.bfloat16(), MASK)
    assert loss16.dtype == torch.float32
    assert loss16.item() == pytest.approx(-0.22, abs=0.02)


# --------------------------------------------------------------------------------------------------------------------
# topk_reverse_kl


def _direct_topk_kl(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, k: int) -> tuple[float, float]:
    """Per-position loops in float64: (token-mean loss, sequence-mean loss)."""
    B, T, V = student.shape
    per_seq = []
    total, count = 0.0, 0
    for b in range(B):
        seq_total, seq_count = 0.0, 0
        for t in range(T):
            if not mask[b, t]:
                continue
            s = [float(x) for x in student[b, t]]
            q = [float(x) for x in teacher[b, t]]
            ids = sorted(range(V), key=lambda i: -s[i])[:k]
            zs = math.log(sum(math.exp(s[i]) for i in ids))
            zt = math.log(sum(math.exp(q[i]) for i in ids))
            kl = 0.0
            for i in ids:
                log_ps, log_pt = s[i] - zs, q[i] - zt
                kl += math.exp(log_ps) * (log_ps - log_pt)
            seq_total, seq_count = seq_total + kl, seq_count + 1
        total, count = total + seq_total, count + seq_count
        if seq_count:
            per_seq.append(seq_total / seq_count)
    return total / count, sum(per_seq) / len(per_seq)


def _logits(seed: int, shape: tuple[int, int, int]) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * 2


def test_topk_kl_matches_direct_computation() -> None:
    student, teacher = _logits(0, (2, 4, 10)), _logits(1, (2, 4, 10))
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    token_mean, seq_mean = _direct_topk_kl(student, teacher, mask, k=3)
    loss, metrics = topk_reverse_kl(student, teacher, mask, k=3)
    assert loss.item() == pytest.approx(token_mean, abs=1e-12)
    assert metrics["kl"] == pytest.approx(token_mean, abs=1e-12)
    loss_seq, _ = topk_reverse_kl(student, teacher, mask, k=3, aggregation="sequence-mean")
    assert loss_seq.item() == pytest.approx(seq_mean, abs=1e-12)
    assert token_mean != pytest.approx(seq_mean)  # the example does tell the two aggregations apart

    # top-k mass under the student's full softmax, averaged over valid positions
    p = torch.softmax(student, -1)
    mass = p.topk(3, -1).values.sum(-1)[mask].mean().item()
    assert metrics["topk_mass"] == pytest.approx(mass, abs=1e-12)


def test_topk_kl_with_k_equal_vocab_is_full_reverse_kl() -> None:
    student, teacher = _logits(2, (2, 3, 7)), _logits(3, (2, 3, 7))
    mask = torch.ones(2, 3)
    log_ps, log_pt = torch.log_softmax(student, -1), torch.log_softmax(teacher, -1)
    full = (log_ps.exp() * (log_ps - log_pt)).sum(-1).mean()
    loss, metrics = topk_reverse_kl(student, teacher, mask, k=7)
    torch.testing.assert_close(loss, full)
    assert metrics["topk_mass"] == pytest.approx(1.0)


def test_topk_kl_zero_when_teacher_equals_student_on_the_support() -> None:
    student = _logits(4, (1, 3, 9))
    teacher = student + 5.0  # a constant shift leaves both distributions unchanged
    loss, _ = topk_reverse_kl(student, teacher, torch.ones(1, 3), k=4)
    assert loss.item() == pytest.approx(0.0, abs=1e-12)


def _separated_logits(seed: int, shape: tuple[int, int, int]) -> torch.Tensor:
    """Logits whose sorted values are at least 0.5 apart, so a 1e-6 perturbation cannot change the top-k set."""
    g = torch.Generator().manual_seed(seed)
    B, T, V = shape
    base = torch.arange(V, dtype=torch.float64) * 0.5
    perm = torch.stack([torch.randperm(V, generator=g) for _ in range(B * T)]).reshape(B, T, V)
    noise = torch.rand(B, T, V, generator=g, dtype=torch.float64) * 0.1
    return base[perm] + noise


def test_topk_kl_gradcheck() -> None:
    student = _separated_logits(5, (2, 3, 8)).requires_grad_(True)
    teacher = _logits(6, (2, 3, 8))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    for aggregation in ("token-mean", "sequence-mean"):
        assert torch.autograd.gradcheck(
            lambda s: topk_reverse_kl(s, teacher, mask, k=4, aggregation=aggregation)[0], (student,)
        )


def test_topk_kl_teacher_gets_no_gradient_and_masked_positions_are_excluded() -> None:
    student = _logits(7, (2, 3, 6)).requires_grad_(True)
    teacher = _logits(8, (2, 3, 6)).requires_grad_(True)
    mask = torch.tensor([[1, 0, 1], [0, 1, 1]])
    loss, _ = topk_reverse_kl(student, teacher, mask, k=3)
    loss.backward()
    assert teacher.grad is None
    assert student.grad is not None
    assert torch.all(student.grad[0, 1] == 0) and torch.all(student.grad[1, 0] == 0)
    assert student.grad[0, 0].abs().sum() > 0

    # changing anything at masked positions leaves the loss unchanged
    s2, t2 = student.detach().clone(), teacher.detach().clone()
    s2[0, 1], t2[1, 0] = 100.0 * torch.randn(6, dtype=torch.float64), -50.0
    loss2, _ = topk_reverse_kl(s2, t2, mask, k=3)
    assert loss2.item() == pytest.approx(loss.item(), abs=1e-12)


def test_topk_kl_bf16_inputs_computed_in_float32() -> None:
    student, teacher = _logits(9, (2, 3, 20)).float(), _logits(10, (2, 3, 20)).float()
    mask = torch.ones(2, 3)
    s16 = student.bfloat16().requires_grad_(True)
    loss, _ = topk_reverse_kl(s16, teacher.bfloat16(), mask, k=5)
    assert loss.dtype == torch.float32
    ref, _ = topk_reverse_kl(s16.detach().float(), teacher.bfloat16().float(), mask, k=5)
    torch.testing.assert_close(loss, ref)
    loss.backward()
    assert s16.grad is not None and s16.grad.dtype == torch.bfloat16


def test_topk_kl_teacher_with_padded_vocab() -> None:
    student, teacher = _logits(11, (1, 2, 6)), _logits(12, (1, 2, 9))
    loss, _ = topk_reverse_kl(student, teacher, torch.ones(1, 2), k=3)
    ref, _ = topk_reverse_kl(student, teacher[..., :6], torch.ones(1, 2), k=3)
    assert loss.item() == pytest.approx(ref.item())
    with pytest.raises(ValueError, match="teacher vocabulary"):
        topk_reverse_kl(teacher, student, torch.ones(1, 2), k=3)


def test_topk_kl_validation() -> None:
    student, teacher = _logits(13, (1, 2, 5)), _logits(14, (1, 2, 5))
    with pytest.raises(ValueError, match=r"k=6.*V=5"):
        topk_reverse_kl(student, teacher, torch.ones(1, 2), k=6)
    with pytest.raises(ValueError, match="aggregation"):
        topk_reverse_kl(student, teacher, torch.ones(1, 2), k=2, aggregation="mean")
    with pytest.raises(ValueError, match="mask"):
        topk_reverse_kl(student, teacher, torch.ones(2, 2), k=2)
