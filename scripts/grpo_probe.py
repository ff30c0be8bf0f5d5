"""Probe how far GRPO experts learn in the tiny world, and how much headroom a model leaves them (docs/LOG.md,
the probes of GRPO's experts, 2026-12-03/04): the measurements behind the first measurability condition
(docs/method.md, "Measurability conditions"): every GRPO expert gains at least 4 SE on its own domain.

    python scripts/grpo_probe.py train SETTINGS [--results results] [--out /tmp/grpo_probe] [--parallel 2]
    python scripts/grpo_probe.py passk MODEL_DIR [--results results] [--k 16] [--temperature 1.0] [--prompts 60]

``train``: SETTINGS is a text file, one run per line, ``tag run_id override ...`` (e.g. ``lr1e-4
grpo-student-math-s0 methods.grpo.lr=1e-4``); each line runs ``opdgrpo train`` on that planned job's config
(profile ``tiny``, base models from a finished run in ``--results``) into ``OUT/tag-run_id``, and prints the run's
own-domain gain: best minus first point of its 3-point smoothed curve, in points and in standard errors of one
evaluation at the best (the report's rule, :mod:`opdgrpo.report.conditions`). ``passk``: unbiased pass@1..k of one
checkpoint on the first ``--prompts`` held-out prompts of math (amc) and code, and on as many training prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from opdgrpo.config import compose
from opdgrpo.plan.build import build_plan
from opdgrpo.report.matching import eval_sizes, mix_se, smooth


def _gain(run_dir: Path, domains: list[str]) -> str:
    """The run's curve on ``domains`` and its gain, as one line."""
    curve = []
    for line in (run_dir / "evals.jsonl").read_text().splitlines():
        e, accs = json.loads(line), {}
        for r in e["results"]:
            if r["eval_set"] != "in_domain":
                accs.setdefault(r["eval_domain"], []).append(r["accuracy"])
        curve.append((e["step"], sum(sum(accs[d]) / len(accs[d]) for d in domains) / len(domains)))
    smoothed = [a for a in smooth([a for _, a in curve], 3) if a == a]
    first, best = smoothed[0], max(smoothed)
    se = mix_se(best, eval_sizes(run_dir), domains)
    points = " ".join(f"{s}:{100 * a:.1f}" for s, a in curve)
    return (f"first {100 * first:5.1f} best {100 * best:5.1f} gain {100 * (best - first):+5.1f} pts = "
            f"{(best - first) / se:+.1f} SE (SE {100 * se:.2f}) | {points}")


def train_settings(args: argparse.Namespace) -> None:
    lines = [line.split() for line in Path(args.settings).read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    jobs = []   # Hydra composes in one thread at a time: every config first, then the runs side by side
    for tag, run_id, *overrides in lines:
        plan = build_plan(compose(["profile=tiny", f"results_dir={args.results}", *overrides]))
        jobs.append((tag, run_id, plan.jobs[run_id].config))

    def run(job: tuple[str, str, dict]) -> str:
        tag, run_id, cfg = job
        out = Path(args.out) / f"{tag}-{run_id}"
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.time()
        done = subprocess.run([sys.executable, "-m", "opdgrpo.cli", "train", "--out", str(out), "--config-json",
                               json.dumps(cfg)], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode:
            return f"{tag} {run_id} failed: {done.stderr[-1500:]}"
        return f"{tag:12s} {run_id:30s} {time.time() - t0:5.0f} s  {_gain(out, list(cfg['train_domains']))}"

    with ThreadPoolExecutor(args.parallel) as pool:
        for line in pool.map(run, jobs):
            print(line, flush=True)


def pass_at_k(args: argparse.Namespace) -> None:
    import torch

    from opdgrpo.domains import build_domain
    from opdgrpo.train.evaluation import evaluate
    from opdgrpo.train.models import load_model
    from opdgrpo.train.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    plan = build_plan(compose(["profile=tiny", f"results_dir={args.results}"]))
    cfg = plan.jobs["grpo-student-code-s0"].config
    domains = {d: build_domain(plan.jobs[f"grpo-student-{d}-s0"].config["domains"][d]) for d in ("math", "code")}
    sets = {}
    for name, domain in domains.items():
        heldout = domain.heldout_sets()
        held_name = "amc" if name == "math" else next(iter(heldout))
        pool = domain.training_pool()
        random.Random(1).shuffle(pool)
        sets[name] = {held_name: heldout[held_name][: args.prompts], "train": pool[: args.prompts]}
    results, _ = evaluate(load_model(args.model_dir), load_tokenizer(Path(cfg["tokenizer"])), domains, sets, k=args.k,
                          temperature=args.temperature, max_new_tokens=int(cfg["train"]["max_new_tokens"]),
                          batch_size=256, seed=0)
    for r in results:
        print(f"{r['eval_domain']:5s} {r['eval_set']:6s} {r['n_prompts']} prompts, temperature {args.temperature}: "
              + ", ".join(f"{k} {100 * v:.1f}%" for k, v in r["pass_at_k"].items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="one GRPO run per line of SETTINGS, with its gain in SEs")
    t.add_argument("settings")
    t.add_argument("--out", default="/tmp/grpo_probe")
    t.add_argument("--parallel", type=int, default=2)
    p = sub.add_parser("passk", help="pass@1..k of a checkpoint on held-out and training prompts")
    p.add_argument("model_dir")
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--prompts", type=int, default=60)
    for parser in (t, p):
        parser.add_argument("--results", default="results", help="the results_dir of a finished tiny run (base models)")
    args = ap.parse_args()
    train_settings(args) if args.command == "train" else pass_at_k(args)


if __name__ == "__main__":
    main()
