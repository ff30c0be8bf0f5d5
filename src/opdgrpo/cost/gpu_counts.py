"""How many GPUs each job takes on one machine (the ``machine`` block), chosen so the DAG ends soonest there.

Under SLURM every job asks for its kind's ``resources.<kind>.gpu`` and the cluster finds room; on one machine of
``machine.gpus`` GPUs the jobs share a fixed pool, and the count per job decides the DAG's wall time: a long chain of
runs wants many GPUs per run, independent jobs that scale poorly are best packed side by side. So where a profile has
a ``machine`` block and leaves ``resources.<kind>.gpu`` unset (null), the planner estimates each such job at 1, 2, 4
and 8 GPUs (:data:`CANDIDATES`, at most ``machine.gpus``), keeps the counts at which it fits (GPU memory: FSDP's
shards shrink with more GPUs; vLLM's start; host memory; the job's runtime where the profile sets one) and chooses
each job's count by simulating the DAG on the machine (:mod:`opdgrpo.cost.makespan`: list scheduling by critical
path, local search over counts). A count set by hand (``resources.<kind>.gpu``, or ``processes``) wins for every job of
its kind and is checked against the machine. The rules give each job its count: as its Snakemake resources
(``gpu``, and ``gpu_slots`` which the local executor bounds by ``machine.gpus``), as its torchrun process count
(:mod:`opdgrpo.launch`) and as the GPU slots it claims (:mod:`opdgrpo.gpu_slots`).

A job that runs on CPUs (``resources.<kind>.gpu: 0``, the rehearsal's) takes one slot per process: the slots then
stand for the GPUs the same DAG takes on a GPU machine, so the assignment is rehearsed on CPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Callable, Mapping, Sequence

from opdgrpo.cost import makespan
from opdgrpo.cost.job_estimate import JobEstimate
from opdgrpo.errors import ConfigError

#: The GPU counts the planner considers per job: the evaluation's shares and FSDP's shards split evenly over powers
#: of two, and 8 is a node.
CANDIDATES = (1, 2, 4, 8)
#: The kinds of job that run on GPUs (the tokenizer and report jobs run on CPUs).
GPU_KINDS = ("base", "train", "difficulty")


@dataclass(frozen=True)
class Machine:
    """The ``machine`` block: one machine with ``gpus`` GPUs and no SLURM; ``slots_dir``: where its GPU slots' lock
    files are (None: ``<results_dir>/gpu-slots``)."""

    gpus: int
    slots_dir: str | None = None

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> Machine | None:
        block = cfg.get("machine")
        if not block:
            return None
        return cls(int(block["gpus"]), block.get("slots_dir") or None)

    def directory(self, cfg: Mapping[str, Any]) -> str:
        """The GPU slots' lock directory: ``machine.slots_dir``, else ``<results_dir>/gpu-slots`` (every profile of
        one results directory shares it, so their DAGs share the machine's GPUs)."""
        return str(self.slots_dir or PurePath(str(cfg["results_dir"]), "gpu-slots"))


def hand_count(cfg: Mapping[str, Any], kind: str) -> int | None:
    """The count of every job of ``kind`` where conf sets it: ``resources.<kind>.processes``, else ``gpu`` (a job on
    CPUs, ``gpu: 0``, takes one slot per process); None where the planner chooses (``gpu`` null or unset)."""
    res = (cfg.get("resources") or {}).get(kind) or {}
    if res.get("processes"):
        return int(res["processes"])
    if res.get("gpu") is None:
        return None
    return int(res["gpu"]) or 1


def check(cfg: Mapping[str, Any]) -> Machine | None:
    """The machine block and the counts set by hand, checked against each other (ConfigError naming the key)."""
    machine = Machine.of(cfg)
    blocks = cfg.get("resources") or {}
    for kind in GPU_KINDS:
        res = blocks.get(kind) or {}
        unset = "gpu" in res and res["gpu"] is None
        if unset and machine is None:
            raise ConfigError(f"config key `resources.{kind}.gpu` is null, which lets the planner choose each job's GPU "
                              "count on one machine: add a `machine` block (machine.gpus) or set the count")
        if machine is None:
            continue
        if unset and res.get("processes"):
            raise ConfigError(f"config key `resources.{kind}.processes` is set while `resources.{kind}.gpu` is null: on a "
                              "machine each process has a GPU; set both, or neither (the planner chooses)")
        if unset and not cfg.get("hardware"):
            raise ConfigError(f"config key `resources.{kind}.gpu` is null, but the profile has no `hardware` block to "
                              "estimate each count on: add one, or set the count")
        count = hand_count(cfg, kind)
        if count is not None and count > machine.gpus:
            key = "processes" if res.get("processes") else "gpu"
            raise ConfigError(f"config key `resources.{kind}.{key}` ({count}) is more than the machine's GPUs "
                              f"(machine.gpus = {machine.gpus})")
    return machine


@dataclass(frozen=True)
class MachinePlan:
    """Each GPU job's estimate at its count, and the DAG's simulated schedules on the machine at both ends."""

    machine: Machine
    estimates: list[JobEstimate]
    high: makespan.Schedule
    low: makespan.Schedule


def _hours(e: JobEstimate | None, high: bool) -> float:
    if e is None or e.hours is None:
        return 0.0
    return float(e.hours_high if high else e.hours)


def tasks_of(plan: Any, estimates: Mapping[str, Mapping[int, JobEstimate]], high: bool) -> dict[str, makespan.Task]:
    """The plan's jobs as tasks: each GPU job's hours at each of its counts (``estimates``: job -> count ->
    estimate); every other job (a tokenizer, the report, a model pretrained on CPUs) takes no GPU and no time."""
    out = {}
    for jid, job in plan.jobs.items():
        by_count = estimates.get(jid)
        hours = {g: _hours(e, high) for g, e in by_count.items()} if by_count else {0: 0.0}
        out[jid] = makespan.Task(jid, tuple(u for u in job.upstream if u in plan.jobs), hours)
    return out


def _candidates(cfg: Mapping[str, Any], kind: str, machine: Machine) -> tuple[tuple[int, ...], bool]:
    """The counts to estimate a job of ``kind`` at, and whether they are set by hand. S2's difficulty job is one
    process on one GPU (each engine alone on it, one model after the other)."""
    count = hand_count(cfg, kind)
    if count is not None:
        return (count,), True
    if kind == "difficulty":
        return (1,), False
    return tuple(g for g in CANDIDATES if g <= machine.gpus), False


def choose_counts(cfg: Mapping[str, Any], plan: Any, machine: Machine,
                  estimate: Callable[[Any, int], JobEstimate | None],
                  fits: Callable[[JobEstimate], bool]) -> MachinePlan:
    """Every GPU job's count and estimate on ``machine``: ``estimate(job, gpus)`` prices a job (None: not a GPU job;
    ValueError: a count the job cannot run on, e.g. shards that do not split over it) and ``fits(estimate)`` says
    whether it fits. A job that fits at no count keeps its largest (the refusal, :func:`opdgrpo.cost.resources.unfit`,
    then names it)."""
    priced: dict[str, dict[int, JobEstimate]] = {}
    fixed: dict[str, int] = {}
    for jid, job in plan.jobs.items():
        if job.kind not in GPU_KINDS:
            continue
        counts, by_hand = _candidates(cfg, job.kind, machine)
        found = {}
        for g in counts:
            try:
                e = estimate(job, g)
            except ValueError:
                if by_hand:
                    raise
                continue
            if e is not None:
                e.gpus_from = "set" if by_hand else "plan"
                found[g] = e
        if not found:
            continue
        fitting = {g: e for g, e in found.items() if fits(e)}
        priced[jid] = fitting or {max(found): found[max(found)]}
        if by_hand or len(priced[jid]) == 1:
            fixed[jid] = next(iter(priced[jid]))
    high = makespan.choose(tasks_of(plan, priced, high=True), machine.gpus, fixed)
    chosen = {jid: priced[jid][high.counts[jid]] for jid in priced}
    low = makespan.simulate(tasks_of(plan, {j: {e.gpus: e} for j, e in chosen.items()}, high=False), machine.gpus,
                            {**high.counts})
    return MachinePlan(machine, [chosen[jid] for jid in plan.jobs if jid in chosen], high, low)


def schedules(plan: Any, machine: Machine, estimates: Sequence[JobEstimate]) -> tuple[makespan.Schedule,
                                                                                     makespan.Schedule]:
    """The DAG's (low, high) schedules on ``machine`` at the estimates' counts (what ``opdgrpo resources`` prints)."""
    by_job = {e.job: {e.gpus: e} for e in estimates}
    counts = {jid: (next(iter(by_job[jid])) if jid in by_job else 0) for jid in plan.jobs}
    return tuple(makespan.simulate(tasks_of(plan, by_job, high), machine.gpus, counts)   # type: ignore[return-value]
                 for high in (False, True))


def on_gpus(cfg: Mapping[str, Any]) -> bool:
    """Whether the profile's GPU jobs run on GPUs: none of its GPU kinds sets ``resources.<kind>.gpu: 0`` (the
    rehearsal runs them on CPUs, where the GPU hours would order its jobs wrongly)."""
    return all(((cfg.get("resources") or {}).get(k) or {}).get("gpu", None) != 0 for k in GPU_KINDS)


def machine_hours(plan: Any, estimates: Sequence[JobEstimate]) -> dict[str, float]:
    """Each job's hours at its count, high end (0 for a job with no estimate): the rules' start priorities on a
    machine (:func:`opdgrpo.cost.schedule.priorities`), the same critical path the simulation orders by."""
    hours = {e.job: _hours(e, True) for e in estimates}
    return {jid: hours.get(jid, 0.0) for jid in plan.jobs}


def job_slots(cfg: Mapping[str, Any], plan: Any, estimates: Sequence[JobEstimate]) -> dict[str, int]:
    """The GPU slots each job takes on the machine: its estimate's count; a GPU kind's job without an estimate (a
    model pretrained from scratch) its kind's count set by hand, else 1; a tokenizer or report job none."""
    counts = {e.job: e.gpus for e in estimates}
    out = {}
    for jid, job in plan.jobs.items():
        if jid in counts:
            out[jid] = int(counts[jid])
        elif job.kind in GPU_KINDS:
            out[jid] = hand_count(cfg, job.kind) or 1
        else:
            out[jid] = 0
    return out
