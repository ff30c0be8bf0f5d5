"""float32 against bfloat16 autocast on this CPU: the tiny models' pretraining step, and what `precision: auto` picks.

A pretraining step of the tiny profile (``opdgrpo.stages.pretrain``'s own batch: ``pretrain.batch_size`` rows of the four
domains' demonstrations, forward + backward + gradient clip + AdamW) for each model, in both arithmetics, interleaved
(alternating which goes first; the first round is a warm-up and is dropped). Prints the medians, their ranges, the
ratio of medians per model, the probe :func:`opdgrpo.train.precision.measure` and the choice ``auto`` makes here.

To see what a CPU without bfloat16 instructions gets on one that has them, cap the kernels first:

    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python benchmarks/precision.py

    python benchmarks/precision.py [--models student teacher_m teacher_l] [--rounds 5] [--threads 1] [--json F]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import common


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["student", "teacher_m", "teacher_l"])
    p.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up round")
    p.add_argument("--threads", type=int, default=1, help="torch threads (tiny profile: 1 per job)")
    p.add_argument("--json", type=Path)
    return p.parse_args()


def pretraining_step(cfg: dict, role: str, tokenizer, domains):
    """A closure that runs one pretraining step of ``role`` in a given precision and returns its seconds."""
    import torch

    from opdgrpo.stages.pretrain import demonstration_batch
    from opdgrpo.train.models import autocast, build_model

    model_cfg = cfg["models"][role]
    model = build_model(model_cfg, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rng = random.Random(0)
    thinking = float(model_cfg["pretrain"]["thinking_fraction"])

    def step(precision: str) -> dict[str, float]:
        batch = demonstration_batch(tokenizer, domains, thinking, int(cfg["pretrain"]["batch_size"]), rng)
        t0 = time.perf_counter()
        with autocast(precision):
            loss = model(input_ids=batch[0], attention_mask=batch[1], labels=batch[2]).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return {"seconds": time.perf_counter() - t0}

    return step


def main() -> None:
    args = parse_args()
    common.set_threads(args.threads)
    import torch

    from opdgrpo.domains import build_domain
    from opdgrpo.train import precision
    from opdgrpo.train.tokenizer import build_tokenizer

    common.quiet()
    cfg = common.tiny_config(Path(tempfile.mkdtemp()) / "results")
    tokenizer = build_tokenizer(cfg["domains"], cfg["tokenizer"]["vocab_size"], cfg["tokenizer"]["samples_per_domain"])
    domains = {name: build_domain(d) for name, d in cfg["domains"].items()}
    rows, out = [], {"machine": common.machine_line(args.threads), "models": {}}
    for role in args.models:
        step = pretraining_step(cfg, role, tokenizer, domains)
        kept = common.interleave(args.rounds, 1, {p: (lambda p=p: step(p)) for p in ("fp32", "bf16")})
        fp32 = [r["seconds"] for r in kept["fp32"]]
        bf16 = [r["seconds"] for r in kept["bf16"]]
        ratio = common.median(bf16) / common.median(fp32)
        rows.append([role, f"{1e3 * common.median(fp32):.0f}", common.spread([1e3 * s for s in fp32]),
                     f"{1e3 * common.median(bf16):.0f}", common.spread([1e3 * s for s in bf16]), f"{ratio:.2f}x"])
        out["models"][role] = {"fp32_s": fp32, "bf16_s": bf16, "bf16_over_fp32": ratio}
    probe = precision.measure(args.threads)
    chosen = precision.resolve("auto")
    out.update({"probe": probe, "auto": precision.report(), "capability": torch.backends.cpu.get_cpu_capability()})
    print(out["machine"])
    print(f"torch CPU capability {out['capability']}; bfloat16 instructions: {precision.native_bf16()}")
    print(f"pretraining step (batch {cfg['pretrain']['batch_size']}), ms, median and range of {args.rounds} rounds:\n")
    print(common.table(["model", "fp32", "range", "bf16 autocast", "range", "bf16 / fp32"], rows))
    print(f"\nprobe (linear {probe['shape']} forward + backward): fp32 {1e3 * probe['fp32_s']:.1f} ms, "
          f"bf16 {1e3 * probe['bf16_s']:.1f} ms, bf16 {probe['speedup']:.2f}x as fast")
    print(f"precision: auto -> {chosen} ({out['auto']['reason']})")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
