"""Peak memory of OPD's loss with ``train.logit_chunk_tokens``: it grows with the chunk, not with rows x length x
vocabulary (a 32,768-entry vocabulary, rows of 512 response tokens; 46 s on the Zen 1's 2 cores, hence not a unit
test: 100 s with 2 and 4 rows, before it was cut to 1 and 2 rows to shorten CI).

How it is measured: :func:`opdgrpo.cost.memprobe.peak_bytes`, torch.profiler with ``profile_memory``: every CPU tensor
allocation and free the allocator reports, summed in time order; the largest sum is the peak beyond what existed
before the call. The loss's extra memory is the OPD step's peak (student forward, teacher forward at the student's
top-k ids, loss, backward) less the peak of the same forward and backward with the LM head replaced by a sum of the
hidden states (:func:`opd_memory_cases.decoder_only`: weights' gradients, decoder activations, eager attention's
T x T scores: what a step holds whatever its loss).

Bounds and measured values (this machine, torch 2.13): the extra memory stays under 6 chunks of float32 logits
(a chunk's bfloat16 logits, their float32 upcast for the logsumexp, its backward's exp and the logits' gradient, and
the recompute's copy) plus 1 KB per position (top-k ids, values, logsumexp): measured 24.7 MB at 64 positions per
chunk (6 chunks: 48 MB) and 80.7 MB at 256 (192 MB), for 1,024 positions (2 rows); with half the rows, 25.6 and
81.4 MB (allowed to move by one chunk's logits). The old path's extra memory at 1,024 positions is at least the
shard's float32 logits (128 MB) and at least 4 times the new path's at 64 positions. The teacher's part (no
gradient) never exceeds its decoder's forward by more than 4 chunks of logits (measured at 2 rows: 5.0 MB over it,
17.9 -> 22.9 MB; the decoder's attention scores are most of the peak).
"""

from __future__ import annotations

import opd_memory_cases as cases
import pytest
import torch

from opdgrpo.cost.memprobe import peak_bytes

pytestmark = pytest.mark.timeout(600)

VOCAB, LENGTH = 32_768, 512


@pytest.fixture(scope="module")
def large():
    return cases.model(VOCAB, 0), cases.model(VOCAB, 1).eval().requires_grad_(False)


def test_peak_memory_of_the_loss_grows_with_the_chunk_not_with_the_shard(large):
    student, teacher = large
    chunk_bytes = VOCAB * 4   # one position's float32 logits
    extra = {}
    for rows in (1, 2):
        s = cases.shard(rows, LENGTH, VOCAB)
        student.zero_grad(set_to_none=True)
        base, _ = peak_bytes(lambda: cases.decoder_only(student, s))
        for chunk in (64, 256):
            student.zero_grad(set_to_none=True)
            peak, _ = peak_bytes(lambda: cases.new_opd(student, teacher, s, chunk))
            extra[rows, chunk] = peak - base
            positions = rows * LENGTH
            # 6 chunks of float32 logits, plus top-k ids, values and logsumexp per position (a few hundred bytes)
            assert peak - base <= 6 * chunk * chunk_bytes + 1024 * positions, (rows, chunk, peak, base)
        if rows == 2:   # the old path holds the whole shard's logits, several copies: 4 times the new one's at least
            student.zero_grad(set_to_none=True)
            old, _ = peak_bytes(lambda: cases.old_opd(student, teacher, s))
            assert old - base >= rows * LENGTH * chunk_bytes >= 4 * extra[rows, 64]
    for chunk in (64, 256):   # twice the rows: the loss's extra memory moves by less than one chunk's logits
        assert abs(extra[2, chunk] - extra[1, chunk]) <= chunk * chunk_bytes, extra
    ids = torch.randint(0, VOCAB, (2, LENGTH, 16), generator=torch.Generator().manual_seed(0))
    s = cases.shard(2, LENGTH, VOCAB)
    teacher_base, _ = peak_bytes(lambda: cases.teacher_part(teacher, s, ids, 1))
    teacher_peak, _ = peak_bytes(lambda: cases.teacher_part(teacher, s, ids, 256))
    assert teacher_peak - teacher_base <= 4 * 256 * chunk_bytes
    print({k: round(v / 2**20, 1) for k, v in extra.items()}, "teacher", teacher_base / 2**20, teacher_peak / 2**20)
