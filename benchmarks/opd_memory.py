"""Peak extra memory of OPD's loss: the old path (full-vocabulary logits of the whole shard, the teacher's upcast to
float32) against ``train.logit_chunk_tokens`` (the LM head and the loss's reduction a chunk of positions at a time).

Why: at paper scale (8 rows x 9.7k tokens x 151,936 entries) the old path's teacher logits alone were 47 GB in
float32 per shard. This prints, for random Qwen3 models with a 32,768-entry vocabulary (hidden 64, one layer: the
logits dominate, as in a real model at long rows), the peak bytes torch allocated during one OPD step (student
forward, teacher forward, loss, backward) beyond the same step with the LM head replaced by a sum of the hidden
states (the decoder's own share), and the teacher's part alone (its forward, the logits at the student's top-k ids).
Measured with :func:`opdgrpo.cost.memprobe.peak_bytes` (torch.profiler's allocator records, summed in time order).

    PYTHONPATH=src:tests python benchmarks/opd_memory.py [--vocab 32768] [--rows 2 4 8] [--length 512] [--chunks 64 256 1024] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import opd_memory_cases as cases  # noqa: E402

from opdgrpo.cost.memprobe import peak_bytes  # noqa: E402

MB = 2 ** 20


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32_768)
    parser.add_argument("--rows", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--length", type=int, default=512, help="response tokens per row")
    parser.add_argument("--chunks", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    student = cases.model(args.vocab, 0)
    teacher = cases.model(args.vocab, 1).eval().requires_grad_(False)
    print(f"vocab {args.vocab}, response length {args.length}; MB beyond the decoder's own forward and backward; "
          f"one position's float32 logits = {args.vocab * 4 / MB:.3f} MB")
    print(f"{'rows':>4} {'positions':>9} {'path':>12} {'loss extra MB':>13} {'teacher MB':>10} {'loss':>12} {'s':>5}")
    for rows in args.rows:
        s = cases.shard(rows, args.length, args.vocab)
        ids = torch.randint(0, args.vocab, (*s.mask.shape, cases.METHOD["kl_top_k"]))
        student.zero_grad(set_to_none=True)
        base, _ = peak_bytes(lambda: cases.decoder_only(student, s))
        teacher_base, _ = peak_bytes(lambda: cases.teacher_part(teacher, s, ids, 1))
        paths = [("old", None)] + [(f"chunk {c}", c) for c in args.chunks]
        for name, chunk in paths:
            student.zero_grad(set_to_none=True)
            t0 = time.time()
            if chunk is None:
                peak, (loss, _) = peak_bytes(lambda: cases.old_opd(student, teacher, s))
            else:
                peak, (loss, _) = peak_bytes(lambda: cases.new_opd(student, teacher, s, chunk))
            seconds = time.time() - t0
            t_peak, _ = peak_bytes(lambda: cases.teacher_part(teacher, s, ids, chunk))
            print(f"{rows:>4} {rows * args.length:>9} {name:>12} {(peak - base) / MB:>13.1f} "
                  f"{(t_peak - teacher_base) / MB:>10.1f} {loss.item():>12.9f} {seconds:>5.1f}")


if __name__ == "__main__":
    main()
