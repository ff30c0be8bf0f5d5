"""A DAG's wall time on one machine of ``gpus`` GPUs, and the GPU count per job that makes it shortest.

Why: on one 8-GPU machine the GPU-hours of a job barely depend on its count (a run on 8 GPUs takes about an eighth of
its time on one), but the DAG's wall time does: a long chain of runs wants many GPUs per run, while jobs that share
nothing and scale poorly (evaluation split in shares, code scoring on CPUs, start-ups) are best packed side by side on
one or two GPUs each. Which mix is shortest depends on the whole DAG, so it is found by simulating it.

**The simulation** (:func:`simulate`) is list scheduling, as Snakemake's local executor runs a DAG under a GPU
bound: at the start and whenever a job ends, the ready jobs (every upstream job ended) are taken in priority order,
and each starts if its GPUs are free; a job that does not fit is passed over for a later one that does (backfilling).
The priority is each job's bottom level: its own hours plus the longest chain of hours below it (critical path
first), from the hours at the counts under test; the rules give Snakemake the same order
(:func:`opdgrpo.cost.schedule.priorities` with the machine's hours). A job with no GPU (a tokenizer, the report)
starts as soon as it is ready.

**The choice** (:func:`choose`) is a local search over counts, each job's candidates being the counts at which it
fits (its ``hours`` keys): from each of three assignments (every job at its fewest GPUs, every job at its fastest
count, every job at the count with the fewest GPU-hours), repeatedly apply the single change of one job's count that
shortens the simulated makespan most (ties: fewer GPU-hours); where no single change does, the best change of the
counts of two linked jobs (one needs the other), until no change does; the best of the three ends wins.
Three starts, because single changes stall on plateaus: from every job at 8 GPUs, moving one of several short jobs
to 1 GPU only makes the others wait for it, while from every job at 1 GPU the long chain's jobs climb one at a time;
pairs, because a chain's jobs trade GPUs (its head on fewer beside other work, its tail on all of them once alone),
and neither change alone may pay.
Counts fixed by hand are never changed. A move is one simulation, so a step costs (jobs x alternative counts)
simulations of the DAG: 123 for the paper's 41 GPU jobs at 4 counts, about a millisecond each. Local search finds no guaranteed optimum (list
scheduling with moldable jobs is NP-hard); tests/unit/test_makespan.py holds it to the exhaustive optimum on a
constructed DAG whose best assignment is known.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Iterable, Mapping

#: Makespans within this many hours of each other are equal (the tie goes to fewer GPU-hours).
EPS_H = 1e-9


@dataclass(frozen=True)
class Task:
    """One job: the jobs it needs, and its hours at each GPU count it may take (``{0: h}``: a job with no GPU)."""

    id: str
    upstream: tuple[str, ...]
    hours: Mapping[int, float]


@dataclass(frozen=True)
class Schedule:
    """A simulated run: when each job starts and ends (hours from the start), and the last end."""

    counts: Mapping[str, int]
    starts: Mapping[str, float]
    ends: Mapping[str, float]
    makespan: float
    gpu_hours: float = field(default=0.0)


def _check(tasks: Mapping[str, Task], gpus: int, counts: Mapping[str, int]) -> None:
    if gpus < 1:
        raise ValueError(f"a machine needs at least one GPU, got {gpus}")
    for t in tasks.values():
        if counts[t.id] not in t.hours:
            raise ValueError(f"job {t.id!r}: no hours at {counts[t.id]} GPUs (it has {sorted(t.hours)})")
        if counts[t.id] > gpus:
            raise ValueError(f"job {t.id!r} asks for {counts[t.id]} GPUs of a machine of {gpus}")
        missing = [u for u in t.upstream if u not in tasks]
        if missing:
            raise ValueError(f"job {t.id!r} needs {missing}, which are not jobs of the DAG")


def bottom_levels(tasks: Mapping[str, Task], hours: Mapping[str, float]) -> dict[str, float]:
    """Each job's hours plus the longest chain of hours of the jobs below it (the critical path from it to the end)."""
    children: dict[str, list[str]] = {tid: [] for tid in tasks}
    for t in tasks.values():
        for u in t.upstream:
            children[u].append(t.id)
    level: dict[str, float] = {}
    for tid in reversed(_topological(tasks)):
        level[tid] = hours[tid] + max((level[c] for c in children[tid]), default=0.0)
    return level


def _topological(tasks: Mapping[str, Task]) -> list[str]:
    """The jobs, every one after the jobs it needs (ValueError naming a job on a cycle)."""
    order: list[str] = []
    state: dict[str, int] = {}
    for root in sorted(tasks):
        stack = [(root, False)]
        while stack:
            tid, done = stack.pop()
            if done:
                state[tid] = 2
                order.append(tid)
                continue
            if state.get(tid) == 2:
                continue
            if state.get(tid) == 1:
                raise ValueError(f"the DAG has a cycle through job {tid!r}")
            state[tid] = 1
            stack.append((tid, True))
            stack.extend((u, False) for u in sorted(tasks[tid].upstream) if state.get(u) != 2)
    return order


def simulate(tasks: Mapping[str, Task], gpus: int, counts: Mapping[str, int]) -> Schedule:
    """List scheduling of ``tasks`` on ``gpus`` GPUs at ``counts`` (module docstring)."""
    _check(tasks, gpus, counts)
    hours = {tid: float(t.hours[counts[tid]]) for tid, t in tasks.items()}
    level = bottom_levels(tasks, hours)
    waiting = {tid: len(set(t.upstream)) for tid, t in tasks.items()}
    children: dict[str, list[str]] = {tid: [] for tid in tasks}
    for t in tasks.values():
        for u in set(t.upstream):
            children[u].append(t.id)
    ready = sorted((tid for tid, n in waiting.items() if n == 0), key=lambda x: (-level[x], x))
    running: list[tuple[float, str]] = []
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    now, free = 0.0, gpus
    while ready or running:
        for tid in list(ready):
            if counts[tid] <= free:
                free -= counts[tid]
                starts[tid] = now
                heapq.heappush(running, (now + hours[tid], tid))
                ready.remove(tid)
        now, tid = heapq.heappop(running)
        finished = [tid]
        while running and running[0][0] <= now + EPS_H:
            finished.append(heapq.heappop(running)[1])
        for tid in finished:
            ends[tid] = now
            free += counts[tid]
            for c in children[tid]:
                waiting[c] -= 1
                if waiting[c] == 0:
                    ready.append(c)
        ready.sort(key=lambda x: (-level[x], x))
    return Schedule(dict(counts), starts, ends, max(ends.values(), default=0.0),
                    sum(hours[tid] * counts[tid] for tid in tasks))


def _better(a: Schedule, b: Schedule | None) -> bool:
    """``a`` ends sooner than ``b``, or as soon with fewer GPU-hours."""
    if b is None:
        return True
    if a.makespan < b.makespan - EPS_H:
        return True
    return abs(a.makespan - b.makespan) <= EPS_H and a.gpu_hours < b.gpu_hours - EPS_H


def _starts(tasks: Mapping[str, Task], fixed: Mapping[str, int]) -> Iterable[dict[str, int]]:
    """The three starting assignments: fewest GPUs, fastest, fewest GPU-hours (counts fixed by hand kept)."""
    rules = (lambda t: min(t.hours),
             lambda t: min(t.hours, key=lambda g: (t.hours[g], g)),
             lambda t: min(t.hours, key=lambda g: (t.hours[g] * max(g, 1), g)))
    for rule in rules:
        yield {tid: fixed.get(tid, rule(t)) for tid, t in tasks.items()}


def choose(tasks: Mapping[str, Task], gpus: int, fixed: Mapping[str, int] | None = None,
           max_rounds: int = 200) -> Schedule:
    """The counts (within each job's ``hours`` keys, ``fixed`` ones kept) whose simulated makespan is shortest by
    local search (module docstring), and their schedule."""
    fixed = dict(fixed or {})
    tasks = {tid: (t if tid not in fixed else Task(t.id, t.upstream, {fixed[tid]: t.hours[fixed[tid]]}))
             for tid, t in tasks.items()}
    tasks = {tid: Task(t.id, t.upstream, {g: h for g, h in t.hours.items() if g <= gpus} or dict(t.hours))
             for tid, t in tasks.items()}
    best: Schedule | None = None
    for start in _starts(tasks, fixed):
        found = _descend(tasks, gpus, simulate(tasks, gpus, start), max_rounds)
        if _better(found, best):
            best = found
    assert best is not None
    return best


def _moves(tasks: Mapping[str, Task], counts: Mapping[str, int], pairs: bool) -> Iterable[dict[str, int]]:
    """Every assignment one change away from ``counts``: one job's count, or (``pairs``) the counts of a job and a
    job it needs together (a chain's jobs trade GPUs: the upstream job on fewer beside other work, the downstream
    one on more once it is alone)."""
    if not pairs:
        for tid, t in sorted(tasks.items()):
            for g in sorted(t.hours):
                if g != counts[tid]:
                    yield {**counts, tid: g}
        return
    for tid, t in sorted(tasks.items()):
        for up in sorted(set(t.upstream)):
            if len(t.hours) < 2 or len(tasks[up].hours) < 2:
                continue
            for g, h in itertools.product(sorted(tasks[up].hours), sorted(t.hours)):
                if g != counts[up] and h != counts[tid]:
                    yield {**counts, up: g, tid: h}


def _descend(tasks: Mapping[str, Task], gpus: int, best: Schedule, max_rounds: int) -> Schedule:
    """From ``best``, apply the best single change (:func:`_moves`) while one shortens the makespan; where none does,
    the best change of a pair of linked jobs."""
    for _ in range(max_rounds):
        step: Schedule | None = None
        for pairs in (False, True):
            for counts in _moves(tasks, best.counts, pairs):
                trial = simulate(tasks, gpus, counts)
                if _better(trial, best) and _better(trial, step):
                    step = trial
            if step is not None:
                break
        if step is None:
            break
        best = step
    return best
