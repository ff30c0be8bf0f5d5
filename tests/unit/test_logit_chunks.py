"""``train.logit_chunk_tokens`` (:mod:`opdgrpo.train.logit_chunks`): the LM head and the loss's reduction a chunk of
response positions at a time, for the student (with its gradient, recomputed per chunk in the backward) and for OPD's
teachers (only their logits at the student's top-k ids are kept).

What is pinned:
- a shard that fits in one chunk computes what ``main`` computed, bit for bit (loss, metrics, every gradient): the
  tiny and smoke profiles' shards fit the default, so their numbers do not move;
- several chunks: the same loss and metrics bit for bit (each position's logits are the same bits whether the LM head
  runs over all rows or a slice of them: bfloat16 GEMMs on this machine), the same gradients bit for bit except the
  LM head's (tied embedding's) weight gradient, which is summed chunk by chunk: under bfloat16 autocast each chunk's
  partial sum is rounded to bfloat16 before the float32 accumulation (measured 2.8e-3 of the largest entry on the
  memory test's shapes; allowed 2 bfloat16 ulps, 2 ** -7); both paths are equally far from the float32 gradient
  (0.153 relative in norm, to 3 digits). In float32 it differs by float32 reordering only (measured 1.7e-8 relative
  in norm; allowed 1e-5);
- peak memory: tests/integration/test_opd_memory.py (and ``benchmarks/opd_memory.py``, old path against new).
"""

from __future__ import annotations

import opd_memory_cases as cases
import pytest
import torch

from opdgrpo.train.logit_chunks import reduce_response

pytestmark = pytest.mark.timeout(300)


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _run(model, fn):
    model.zero_grad(set_to_none=True)
    out = fn()
    return out, _grads(model)


@pytest.fixture(scope="module")
def small():
    vocab = 512
    return cases.model(vocab, 0, layers=2), cases.model(vocab, 1, layers=2).eval().requires_grad_(False), \
        cases.shard(6, 13, vocab)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_one_chunk_is_the_old_path_bit_for_bit(small, precision):
    student, teacher, s = small
    positions = s.sequences.shape[0] * s.new_tokens
    (old, old_metrics), old_grads = _run(student, lambda: cases.old_opd(student, teacher, s, precision))
    (new, new_metrics), new_grads = _run(student, lambda: cases.new_opd(student, teacher, s, positions, precision))
    assert torch.equal(old, new) and old_metrics == new_metrics
    assert all(torch.equal(old_grads[n], new_grads[n]) for n in old_grads)
    (old, old_metrics), old_grads = _run(student, lambda: cases.old_grpo(student, s, precision))
    (new, new_metrics), new_grads = _run(student, lambda: cases.new_grpo(student, s, positions, precision))
    assert torch.equal(old, new) and old_metrics == new_metrics
    assert all(torch.equal(old_grads[n], new_grads[n]) for n in old_grads)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("method", ["opd", "grpo"])
def test_chunks_change_only_the_lm_head_gradient_by_rounding(small, precision, method):
    student, teacher, s = small
    if method == "opd":
        old_fn, new_fn = (lambda: cases.old_opd(student, teacher, s, precision),
                          lambda: cases.new_opd(student, teacher, s, 7, precision))
    else:
        old_fn, new_fn = (lambda: cases.old_grpo(student, s, precision), lambda: cases.new_grpo(student, s, 7, precision))
    (old, old_metrics), old_grads = _run(student, old_fn)
    (new, new_metrics), new_grads = _run(student, new_fn)
    if precision == "bf16":
        assert torch.equal(old, new) and old_metrics == new_metrics
    else:   # a float32 GEMM over a slice of rows may take another kernel (one row: a GEMV)
        assert new.item() == pytest.approx(old.item(), rel=1e-6)
    head = "model.embed_tokens.weight"   # tied: the LM head's weight
    for name in old_grads:
        a, b = old_grads[name], new_grads[name]
        if precision == "fp32":
            assert float((a - b).norm() / a.norm().clamp(min=1e-30)) < 1e-5, name
        elif name == head:
            assert float((a - b).abs().max()) <= 2 ** -7 * float(a.abs().max()), name
        else:
            assert torch.equal(a, b), name


def test_teacher_logits_at_the_top_k_ids_are_the_full_logits_gathered(small):
    _, teacher, s = small
    ids = torch.randint(0, 512, (*s.mask.shape, 16), generator=torch.Generator().manual_seed(3))
    full = cases.teacher_part(teacher, s, ids, None)
    for chunk in (1, 7, 64, 10_000):
        assert torch.equal(cases.teacher_part(teacher, s, ids, chunk), full)


def test_reduce_response_chunks_positions_row_by_row():
    hidden = torch.randn(3, 6, 4, requires_grad=True)
    head = torch.nn.Linear(4, 9)
    extra = torch.arange(15).reshape(3, 5)

    def reduce(logits, e):
        return logits.sum(-1), e * 2

    whole = reduce_response(hidden, head, reduce, (extra,), 100)
    parts = reduce_response(hidden, head, reduce, (extra,), 4)
    assert torch.equal(parts[1], extra * 2)
    torch.testing.assert_close(parts[0], whole[0])
    parts[0].sum().backward()
    assert hidden.grad[:, -1].abs().sum() == 0 and hidden.grad[:, :-1].abs().sum() > 0
