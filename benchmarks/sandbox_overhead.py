"""What the bwrap sandbox root costs against the unshare launcher (the fallback, and the sandbox before it).

Three workloads, each run under every mechanism this machine has (``OPDGRPO_SANDBOX``), interleaved in rounds
(alternating which goes first; the first round is a warm-up and is dropped):

* ``rewards``: the tiny code domain's ``score`` on a GRPO-sized batch (``--prompts`` x ``--group`` completions of
  the training pool: the reference solutions in both styles, wrong coefficients, syntax and runtime errors, with
  the repeats a group has), which batches the programs into one harness run per worker (``opdgrpo.sandbox.execution``).
  The rewards must come out identical under every mechanism (checked, exit 1 otherwise).
* ``stdio``: ``--stdio`` whole programs on standard input, one sandbox per program (``opdgrpo.sandbox.stdio``,
  the paper-scale code domain's path), three tests each.
* ``empty``: one sandboxed run of an empty program (``run_python("pass")``), ``--empty`` times in a row: the
  per-run start-up and tear-down alone.

Also reported: bwrap's one-time set-up per process (finding the interpreter's files and libraries with ``ldd``,
and the probe runs), which the first sandboxed run of a process pays.

    python benchmarks/sandbox_overhead.py [--rounds 5] [--prompts 64] [--group 8] [--stdio 16] [--empty 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import common

from opdgrpo.config import compose  # noqa: E402
from opdgrpo.domains import build_domain  # noqa: E402
from opdgrpo.sandbox import isolation as sandbox  # noqa: E402  (common puts src/ on the path)
from opdgrpo.sandbox.stdio import StdioRun, run_stdio_programs  # noqa: E402


def code_batch(prompts: int, group: int, seed: int = 0):
    """Tasks and completions as one GRPO step of the tiny code domain would score them."""
    cfg = compose(["profile=tiny"], common.REPO / "conf")
    domain = build_domain(cfg["domains"]["code"])
    rng = random.Random(seed)
    pool = domain.training_pool()
    tasks, completions = [], []
    for task in rng.sample(pool, min(prompts, len(pool))):
        brief, thinking = domain.demonstration(task, "brief"), domain.demonstration(task, "thinking")
        wrong = brief.replace("x*", "x*2*", 1) if "x*" in brief else brief + "+1"
        choices = [brief] * 4 + [thinking] * 2 + [wrong] * 2 + [" return x*", " return x/0", " return y"]
        for _ in range(group):
            tasks.append(task)
            completions.append(rng.choice(choices))
    return domain, tasks, completions


def stdio_runs(n: int) -> list[StdioRun]:
    runs = []
    for k in range(n):
        source = f"a, b = map(int, input().split())\nprint(a + b + {k % 3})  # {k}\n"
        inputs = tuple(f"{k} {t}\n" for t in range(3))
        runs.append(StdioRun(source, inputs, (4096,) * 3))
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--stdio", type=int, default=16)
    parser.add_argument("--empty", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="also print the raw measurements as JSON")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    setup = sandbox._bwrap_setup()
    setup_s = time.perf_counter() - start
    mechanisms = (["bwrap"] if setup is not None else []) + ["unshare"]
    domain, tasks, completions = code_batch(args.prompts, args.group)
    runs = stdio_runs(args.stdio)
    rewards_seen: dict[str, list[float]] = {}
    outputs_seen: dict[str, list] = {}

    def with_mechanism(name, work):
        def run():
            os.environ["OPDGRPO_SANDBOX"] = name
            t0 = time.perf_counter()
            result = work(name)
            return {"seconds": time.perf_counter() - t0, **result}
        return run

    def rewards(name):
        got = domain.score(tasks, completions)
        rewards_seen.setdefault(name, got)
        assert got == rewards_seen[name], f"{name}: rewards changed between rounds"
        return {"items": len(completions)}

    def stdio(name):
        got = run_stdio_programs(runs, per_test_timeout_s=2.0)
        outputs_seen.setdefault(name, got)
        return {"items": len(runs)}

    def empty(name):
        for _ in range(args.empty):
            r = sandbox.run_python("pass\n")
            assert r.ok, r
        return {"items": args.empty}

    results = {}
    for label, work in (("rewards", rewards), ("stdio", stdio), ("empty", empty)):
        contenders = {name: with_mechanism(name, work) for name in mechanisms}
        results[label] = common.interleave(args.rounds, 1, contenders)
    os.environ.pop("OPDGRPO_SANDBOX", None)

    print(f"Sandbox overhead: {common.machine_line(1)}\n")
    print(f"bwrap: {sandbox._bwrap_note()}; one-time set-up {setup_s:.2f} s per process\n" if setup else
          f"bwrap not available: {sandbox._bwrap_note()}\n")
    units = {"rewards": "rewards/s", "stdio": "programs/s", "empty": "ms per run"}
    sizes = {"rewards": f"{len(completions)} completions ({args.prompts} prompts x {args.group}), "
                        f"{len(set(zip((id(t) for t in tasks), completions)))} distinct",
             "stdio": f"{args.stdio} programs x 3 tests", "empty": f"{args.empty} runs"}
    rows, summary = [], {}
    for label, by_mech in results.items():
        base = common.median(r["seconds"] for r in by_mech["unshare"])
        for name in mechanisms:
            secs = [r["seconds"] for r in by_mech[name]]
            med = common.median(secs)
            items = by_mech[name][0]["items"]
            rate = 1000 * med / items if label == "empty" else items / med
            ratios = [r["seconds"] / u["seconds"] for r, u in zip(by_mech[name], by_mech["unshare"])]
            summary[f"{label}/{name}"] = {"seconds": med, units[label]: rate, "time_ratio_vs_unshare": common.median(ratios)}
            rows.append([label, sizes[label], name, med, common.spread(secs), f"{rate:.4g} {units[label]}",
                         f"{med / base:.3f} (per round {common.median(ratios):.3f})"])
    print(common.table(["workload", "size", "mechanism", "median s", "range s", "rate", "time / unshare"], rows))
    same = all(v == rewards_seen[mechanisms[-1]] for v in rewards_seen.values())
    same_stdio = all(v == outputs_seen[mechanisms[-1]] for v in outputs_seen.values())
    print(f"\nrewards identical under {', '.join(mechanisms)}: {same} (sum {sum(rewards_seen['unshare'])} of "
          f"{len(completions)}); stdio outcomes identical: {same_stdio}")
    if args.json:
        print(json.dumps({"setup_s": setup_s, "summary": summary, "raw": results}, indent=1))
    return 0 if same and same_stdio else 1


if __name__ == "__main__":
    sys.exit(main())
