"""Steps of the tiny profile's runs with the student's passes padded against packed (``train.packed_row_tokens``).

Each contender is our trainer (``opdgrpo.train.loop.train``, what the DAG runs) from the same base student on the
same prompts, differing only in ``train.packed_row_tokens``; blocks of steps alternate between them (the machine is
shared and noisy) and the first step of every block is a warm-up. Printed per run kind: the median step, its
training phase (forward, loss, backward, update: what packing changes), the student positions the ledger counts,
and the ratios padded / packed. Sampling is the same work in both; OPD's teacher forwards pack too.

    python benchmarks/packed_rows.py [--world results/tiny/base] [--runs grpo:math grpo:math+code+ifeval+knowledge opd:math]
        [--budget 64] [--precision fp32|bf16|auto] [--rounds 3] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from statistics import median

import common


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", help="pretrained tiny world (default: results/tiny/base if present) or `random`")
    p.add_argument("--runs", nargs="+", default=["grpo:math", "grpo:code", "grpo:math+code+ifeval+knowledge", "opd:math"],
                   help="kind:domains of the tiny plan's seed-0 runs (opd: from teacher_l)")
    p.add_argument("--budget", type=int, default=64, help="train.packed_row_tokens of the packed contender")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    p.add_argument("--threads", type=int, default=1, help="torch threads (tiny profile: 1 per job)")
    p.add_argument("--rounds", type=int, default=3, help="blocks per contender")
    p.add_argument("--steps", type=int, default=5, help="steps per block; the first of each is a warm-up")
    p.add_argument("--json", type=Path, help="also write the measurements here")
    return p.parse_args()


def block(cfg: dict, steps: int, scratch: Path) -> list[dict]:
    """One block of our trainer; per timed step: wall, training phase and the ledger's student positions."""
    import copy

    from opdgrpo.train.loop import train

    cfg = copy.deepcopy(cfg)
    cfg["method"]["steps"] = steps
    run_dir = common.fresh_dir(scratch, "packed-")
    try:
        train(cfg, run_dir)
        lines = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return [{"seconds": r["wall_s"], "train_s": r["phase_s"]["train"], "positions": r["tokens"]["train"],
             "flops": r["step_flops"]} for r in lines[1:]]


def main() -> None:
    args = parse_args()
    common.quiet()
    common.set_threads(args.threads)
    from opdgrpo.train.precision import resolve

    args.precision = resolve(args.precision)
    scratch = Path(tempfile.mkdtemp(prefix="bench-packed-"))
    kinds = [run.split(":", 1) for run in args.runs]
    roles = ["student"] + (["teacher_l"] if any(kind == "opd" for kind, _ in kinds) else [])
    world = common.load_world(args.world, roles, scratch)
    rows, raw = [], {}
    for kind, domains in kinds:
        cfg = common.run_config(kind, world, scratch, domain=domains, overrides={
            "threads": args.threads, "train.precision": args.precision, "train.eval_every": 10**6,
            "train.checkpoint_every": 10**6})
        contenders = {}
        for name, budget in (("padded", None), ("packed", args.budget)):
            variant = json.loads(json.dumps(cfg))
            variant["train"]["packed_row_tokens"] = budget
            contenders[name] = (lambda v=variant: block(v, args.steps, scratch))
        results: dict[str, list[dict]] = {"padded": [], "packed": []}
        for r in range(args.rounds):
            for name in (("padded", "packed") if r % 2 == 0 else ("packed", "padded")):
                results[name].extend(contenders[name]())
        raw[f"{kind}:{domains}"] = results
        m = {name: {key: median(x[key] for x in results[name]) for key in ("seconds", "train_s", "positions")}
             for name in results}
        rows.append([f"{kind} {domains}", f"{m['padded']['seconds']:.3f}", f"{m['packed']['seconds']:.3f}",
                     f"{m['padded']['seconds'] / m['packed']['seconds']:.2f}x",
                     f"{m['padded']['train_s']:.3f}", f"{m['packed']['train_s']:.3f}",
                     f"{m['padded']['train_s'] / m['packed']['train_s']:.2f}x",
                     f"{m['padded']['positions']:.0f}", f"{m['packed']['positions']:.0f}"])
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"### Padded vs packed student passes ({common.machine_line(args.threads)})\n")
    print(f"student: {world.source}; train.packed_row_tokens {args.budget}; {args.precision}; medians of "
          f"{args.rounds} interleaved blocks x {args.steps - 1} timed steps\n")
    print(common.table(["run", "step padded (s)", "step packed (s)", "step ratio", "train phase padded (s)",
                        "train phase packed (s)", "train ratio", "student positions padded", "packed"], rows))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "raw": raw}, indent=1,
                                        default=str))


if __name__ == "__main__":
    main()
