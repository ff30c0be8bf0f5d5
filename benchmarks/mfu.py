"""Model FLOP utilisation: achieved FLOP/s of training and rollouts against this machine's matmul peak.

* peak: the median FLOP/s of a square ``--peak-size``^3 matrix multiply (2 n^3 FLOPs), fp32 and bf16, at the same
  thread count as the workloads;
* training pass: forward + backward + AdamW step of the tiny student and the largest tiny teacher on a
  GRPO-shaped batch (``--batch`` rows of ``--length`` tokens, logits for every position); FLOPs from
  ``opdgrpo.train.flops.train_flops``;
* rollout: our sampler on ``--batch`` x 2 sequences (a GRPO step's 32 x 8 = 256 rows doubled, 512), FLOPs as the
  sampler reports them (the ledger's prefill + decode count);
* a whole GRPO and OPD step of our trainer (``opdgrpo.train.loop.train`` on the tiny profile's settings): the ledger's
  step FLOPs over its ``wall_s``, which is what the run reports as its MFU.

MFU = achieved / peak of the precision the workload computes in (bf16 autocast: the bf16 peak).

    python benchmarks/mfu.py [--world results/tiny/base|random] [--threads 1] [--precisions fp32 bf16]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import common


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", help="pretrained tiny world (default: results/tiny/base if present) or `random`")
    p.add_argument("--models", nargs="+", default=["student", "teacher_l"])
    p.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    p.add_argument("--threads", type=int, default=1, help="torch threads (tiny profile: 1 per job)")
    p.add_argument("--peak-size", type=int, default=2048)
    p.add_argument("--batch", type=int, default=128, help="training rows (a tiny GRPO step: 16 prompts x 8)")
    p.add_argument("--length", type=int, default=32, help="training row length (prompt + completion tokens)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=5, help="timed repetitions after one warm-up")
    p.add_argument("--trainer-steps", type=int, default=4, help="steps of our trainer per method (first is a warm-up); 0: skip")
    p.add_argument("--json", type=Path)
    return p.parse_args()


def timed(fn, reps: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    args = parse_args()
    import torch

    from opdgrpo.domains import build_domain
    from opdgrpo.train import flops as F
    from opdgrpo.train.models import autocast, load_model
    from opdgrpo.train.rollout import encode_prompts
    from opdgrpo.train.sampling import sample
    from opdgrpo.train.tokenizer import load_tokenizer

    common.quiet()
    common.set_threads(args.threads)
    scratch = Path(tempfile.mkdtemp(prefix="bench-mfu-"))

    n = args.peak_size
    mats = {p: (torch.randn(n, n, dtype=d), torch.randn(n, n, dtype=d))
            for p, d in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    peak_log: dict[str, list[float]] = {"fp32": [], "bf16": []}

    def peak(precision: str) -> float:
        """The matmul FLOP/s now: the median of ``--reps`` multiplies (the machine is shared, so it moves)."""
        a, b = mats[precision]
        value = 2 * n**3 / common.median(timed(lambda: torch.mm(a, b), args.reps))
        peak_log[precision].append(value)
        return value

    world = common.load_world(args.world, sorted(set(args.models) | {"student", "teacher_l"}), scratch)
    tokenizer = load_tokenizer(world.tokenizer)
    cfg = common.tiny_config(scratch / "results")
    pool = build_domain(cfg["domains"]["math"]).training_pool()
    prompts = encode_prompts(tokenizer, pool[: args.batch * 2 // 8])
    prompts = [p for p in prompts for _ in range(8)]
    rows, records = [], []

    def add(workload: str, model: str, precision: str, measure) -> None:
        """Run ``measure`` (returns FLOPs and seconds) between two peak measurements of its precision: the MFU
        divides by their mean, so workload and peak saw the same load on the shared machine."""
        before = peak(precision)
        flops, s = measure()
        ceiling = (before + peak(precision)) / 2
        achieved = flops / s
        records.append({"workload": workload, "model": model, "precision": precision, "flops": flops, "seconds": s,
                        "achieved": achieved, "peak": ceiling, "mfu": achieved / ceiling})
        rows.append([workload, model, precision, f"{flops:.3g}", f"{s:.3f}", f"{achieved / 1e9:.1f}",
                     f"{ceiling / 1e9:.1f}", f"{100 * achieved / ceiling:.1f}%"])

    for role in args.models:
        for precision in args.precisions:
            model = load_model(world.models[role])
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            ids = torch.randint(3, model.config.vocab_size, (args.batch, args.length), generator=torch.Generator().manual_seed(0))

            def train_pass():
                optimizer.zero_grad(set_to_none=True)
                with autocast(precision):
                    logits = model(input_ids=ids).logits
                logits.float().logsumexp(-1).mean().backward()
                optimizer.step()

            add("train pass (fwd+bwd+AdamW)", role, precision,
                lambda: (F.train_flops(model.config, args.batch, args.length), common.median(timed(train_pass, args.reps))))
            model.eval()
            reported = {}

            def rollout():
                with autocast(precision):
                    out = sample(model, prompts, max_new_tokens=args.max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(0))
                reported["flops"] = out.flops

            def rollouts() -> tuple[float, float]:
                seconds = common.median(timed(rollout, args.reps))
                return reported["flops"], seconds  # the same seed every time: the same tokens, the same FLOPs

            add(f"rollout ({len(prompts)} seqs, sampler)", role, precision, rollouts)

    if args.trainer_steps > 1:
        for kind in ("grpo", "opd"):
            run_cfg = common.run_config(kind, world, scratch, overrides={
                "threads": args.threads, "train.eval_every": 10**6, "train.checkpoint_every": 10**6,
                "train.eval": {"k": 1, "temperature": 1.0, "batch_size": 64},
                "domains.math.heldout.amc.size": 4, "domains.math.heldout.aime.size": 4})

            def trainer_steps() -> tuple[float, float]:
                # The timed steps together: their FLOPs over their time (steps differ in length, so no median).
                steps = common.ours_block(run_cfg, args.trainer_steps, scratch)[1:]
                return sum(r["flops"] for r in steps) / len(steps), sum(r["seconds"] for r in steps) / len(steps)

            label = (f"{kind.upper()} step, our trainer ({run_cfg['train']['prompts_per_step']} prompts x "
                     f"{run_cfg['method'].get('group_size') or run_cfg['method'].get('rollouts_per_prompt')})")
            who = "student" + (" + teacher_l" if kind == "opd" else "")
            add(label, who, run_cfg["train"]["precision"], trainer_steps)

    shutil.rmtree(scratch, ignore_errors=True)
    print(f"### MFU ({common.machine_line(args.threads)})\n")
    print(f"models: {world.source}; peak: median of {args.reps} {n}^3 matmuls right before and after each workload "
          f"(their mean is the row's peak); workloads: median of {args.reps} repetitions after a warm-up (trainer "
          f"steps: the FLOPs of {max(args.trainer_steps - 1, 0)} steps after a warm-up over their ledger `wall_s`)\n")
    print(common.table(["matmul peak", "measurements", "median GFLOP/s", "range"],
                       [[p, len(v), f"{common.median(v) / 1e9:.1f}", f"{min(v) / 1e9:.1f}-{max(v) / 1e9:.1f}"]
                        for p, v in peak_log.items() if v]))
    print()
    print(common.table(["workload", "model", "precision", "FLOPs", "s (median)", "achieved GFLOP/s", "peak GFLOP/s", "MFU"], rows))
    if args.json:
        args.json.write_text(json.dumps({"peaks": peak_log, "workloads": records}, indent=1))


if __name__ == "__main__":
    main()
