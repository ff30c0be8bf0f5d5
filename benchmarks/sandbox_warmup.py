"""What the code harness's warm-up saves: CPU per scored program with and without it (``opdgrpo.sandbox.execution``).

The harness forks one process per program. Without the warm-up every child pays the first ``compile()`` and
``json.dumps()`` of a fresh interpreter again; with it the harness pays them once, before the first fork. Both
variants score the same batch (the tiny code domain's programs as a GRPO step writes them, unique ones only, the
outcome memo cleared), interleaved in rounds under the machine's sandbox mechanism; the outcomes must be identical
(exit 1 otherwise). Reported: CPU of the sandboxed processes per program (user + system, ``RUSAGE_CHILDREN``),
page faults per program, wall time, and the ratio with/without in each round.

    python benchmarks/sandbox_warmup.py [--rounds 5] [--prompts 64] [--group 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

import common
from sandbox_overhead import code_batch

from opdgrpo.sandbox import execution  # noqa: E402  (common puts src/ on the path)
from opdgrpo.sandbox import isolation as sandbox

_CALL = "    _warm_up()\n"


def _children() -> tuple[float, int]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime, usage.ru_minflt


def score_once(checks: list[execution.ProgramCheck], harness: str) -> tuple[list, float, int, float]:
    """(outcomes, child CPU s, child page faults, wall s) of one scoring of ``checks`` with this harness source."""
    saved = execution._HARNESS
    execution._HARNESS = harness
    execution._memo.clear()
    try:
        cpu0, faults0 = _children()
        start = time.perf_counter()
        outcomes = execution.check_programs(checks, workers=1)
        wall = time.perf_counter() - start
        cpu1, faults1 = _children()
    finally:
        execution._HARNESS = saved
    return outcomes, cpu1 - cpu0, faults1 - faults0, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="also print the raw measurements as JSON")
    args = parser.parse_args(argv)

    if execution._HARNESS.count(_CALL) != 1:
        sys.exit("the harness no longer calls _warm_up() once in main(): update this benchmark")
    variants = {"with warm-up": execution._HARNESS, "without": execution._HARNESS.replace(_CALL, "")}
    domain, tasks, completions = code_batch(args.prompts, args.group)
    checks = list({c: execution.ProgramCheck(domain.program(c), "f", t.answer)
                   for t, c in zip(tasks, completions)}.values())  # fmt: skip
    n = len(checks)
    rows: dict[str, list[tuple[float, int, float]]] = {name: [] for name in variants}
    ratios: list[float] = []
    reference = None
    for r in range(args.rounds + 1):  # round 0 warms the machine (bwrap set-up, page cache) and is dropped
        names = list(variants) if r % 2 == 0 else list(variants)[::-1]
        cpu: dict[str, float] = {}
        for name in names:
            outcomes, cpu_s, faults, wall = score_once(checks, variants[name])
            if reference is None:
                reference = outcomes
            elif outcomes != reference:
                print(f"outcomes differ ({name}, round {r})", file=sys.stderr)
                return 1
            if r:
                rows[name].append((cpu_s, faults, wall))
                cpu[name] = cpu_s
        if r:
            ratios.append(cpu["with warm-up"] / cpu["without"])

    print(common.machine_line(threads=1))
    print(f"sandbox mechanism: {sandbox.mechanism()}; {n} unique programs per scoring, {args.rounds} rounds")
    print()
    print("| harness | CPU ms / program | page faults / program | wall s / scoring |")
    print("|---|---|---|---|")
    for name, got in rows.items():
        print(f"| {name} | {1000 * statistics.median(g[0] for g in got) / n:.2f} "
              f"| {statistics.median(g[1] for g in got) / n:.0f} | {statistics.median(g[2] for g in got):.2f} |")  # fmt: skip
    print()
    print(f"CPU with / without, per round: {', '.join(f'{x:.2f}' for x in ratios)} "
          f"(median {statistics.median(ratios):.2f}); outcomes identical")  # fmt: skip
    if args.json:
        print(json.dumps({"programs": n, "rounds": rows, "ratios": ratios}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
