"""What ``opdgrpo resources`` prints: the per-job table, the GPU-hours by cost, the evaluations' rows per benchmark,
and each job's stop settings."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from opdgrpo.cost.heldout import EvalSet
from opdgrpo.cost.job_estimate import COSTS, Hardware, JobEstimate
from opdgrpo.cost.makespan import Schedule
from opdgrpo.cost.memory_model import GIB
from opdgrpo.cost.stops import StopSettings


def table(cfg: Mapping[str, Any], estimates: Sequence[JobEstimate]) -> str:
    hw = Hardware.of(cfg)
    comps = ["weights", "gradients", "optimizer", "teachers"]
    head = ("| job | GPUs | " + " | ".join(comps) + " | peak phase (GiB) | peak GiB / GPU | fits | host GiB / node | hours "
            "| GPU-hours | allocations | vLLM share | vLLM max_num_seqs | vLLM rows at once |\n|---|---|"
            + "---|" * (len(comps) + 10))
    lines = [head]
    for e in estimates:
        cells = [f"{e.static.get(c, 0.0) / GIB:.1f}" for c in comps]
        fits = "-" if hw is None else ("yes" if e.peak <= hw.budget else "**no**")
        hours = "-" if e.hours is None else _span(e.hours, e.hours_high, ".1f")
        gpu_hours = "-" if e.hours is None else _span(e.hours * e.gpus, (e.hours_high or 0) * e.gpus, ".0f")
        allocations = "-" if e.hours is None else str(e.attempts)
        gpus = f"{e.gpus} ({e.gpus_from})" if e.gpus_from else str(e.gpus)
        lines.append(f"| {e.job} | {gpus} | " + " | ".join(cells) + f" | {e.peak_phase} "
                     f"({e.phases.get(e.peak_phase, 0.0) / GIB:.1f}) | {e.peak / GIB:.1f} | {fits} | {_host(e)} | {hours} "
                     f"| {gpu_hours} | {allocations} | {_engine_setting(e, 'gpu_memory_utilization')} "
                     f"| {_engine_setting(e, 'max_num_seqs')} | {_rows_at_once(e)} |")
    return "\n".join(lines)


def _host(e: JobEstimate) -> str:
    """Loading, then on resume where more, then running where more than loading (a sleeping engine's pinned copy)."""
    return (f"{e.host / GIB:.0f}" + (f", {e.host_resume / GIB:.0f}" if e.host_resume > e.host else "")
            + (f", {e.host_steady / GIB:.0f} running" if e.host_steady > e.host else ""))


def _span(low: float, high: float | None, fmt: str) -> str:
    """``low``, or ``low-high`` where the high end is higher."""
    return format(low, fmt) if high is None or format(high, fmt) == format(low, fmt) else f"{low:{fmt}}-{high:{fmt}}"


def _engine_setting(e: JobEstimate, name: str) -> str:
    """The engine's ``gpu_memory_utilization`` or ``max_num_seqs`` and where it comes from: ``(plan)`` chosen per job
    (:mod:`opdgrpo.cost.engine_share`), ``(set)`` by hand in conf or on the command line."""
    return "-" if e.engine_choice is None else e.engine_choice.label(name)


def _rows_at_once(e: JobEstimate) -> str:
    """Rows of the engine's ``max_model_len`` its KV pool holds at once (more in one call wait or are preempted)."""
    if e.engine is None:
        return "-"
    return f"{e.engine.rows_at_once} of {e.engine.max_model_len}"


#: What each cost line counts, where its name does not say it all.
LABELS = {"evaluation": "evaluation (held-out sets, base models' and training runs')",
          "solve rates": "solve rates (S2's difficulty job)",
          "code scoring": "code scoring (sandboxed tests, GPUs waiting)",
          "checkpoints": "checkpoints (write and sha256)",
          "start-ups": "start-ups (models read, vLLM engine starts, resumes' checkpoint reads; per attempt)"}


def cost_lines(estimates: Sequence[JobEstimate]) -> str:
    """GPU-hours by cost over every job (a job's wall hours times its GPUs: GPUs idle while CPUs score code or a
    checkpoint is written count too)."""
    lines = []
    for cost in COSTS:
        low = sum(e.costs[cost][0] * e.gpus for e in estimates if cost in e.costs)
        high = sum(e.costs[cost][1] * e.gpus for e in estimates if cost in e.costs)
        if high > 0:
            lines.append(f"- {LABELS.get(cost, cost)}: {_span(low, high, ',.0f')} GPU-hours")
    return "\n".join(lines)


def sets_table(sets_by_column: Mapping[str, Sequence[EvalSet]]) -> str:
    """Per held-out set: prompts, k, rows, and the mean response assumed under each column's sampler."""
    first = next(iter(sets_by_column.values()))
    head = ("| set | prompts | k | rows | " + " | ".join(f"mean response tokens ({c})" for c in sets_by_column)
            + " |\n|---|---|---|---|" + "---|" * len(sets_by_column))
    lines = [head]
    for i, s in enumerate(first):
        lengths = " | ".join(f"{list(v)[i].response:,.0f}" for v in sets_by_column.values())
        lines.append(f"| {s.label} | {s.prompts:,} | {s.k} | {s.rows:,} | {lengths} |")
    lines.append(f"| total | | | {sum(s.rows for s in first):,} | |" + " |" * (len(sets_by_column) - 1))
    return "\n".join(lines)


def _eval_tables(cfg: Mapping[str, Any], estimates: Sequence[JobEstimate]) -> str:
    out = []
    base = [e for e in estimates if e.kind == "base" and e.sets]
    if base:
        by_length = {}
        for e in base:   # a base student's lengths and a thinking model's, where both are planned
            key = tuple(s.response for s in e.sets)
            by_length.setdefault(key, e)
        columns = {("thinking" if _thinks(cfg, e) else "base students"): e.sets for e in by_length.values()}
        out.append(f"Base evaluation (each model, pretrain.eval.max_prompts = "
                   f"{(cfg.get('pretrain') or {}).get('eval', {}).get('max_prompts')} per set):\n\n" + sets_table(columns))
    train = [e for e in estimates if e.kind == "train" and e.sets]
    if train:
        widest = max(train, key=lambda e: (len(e.sets), sum(s.rows for s in e.sets)))
        out.append(f"Held-out evaluation of a training run (every set in full; `{widest.job}`):\n\n"
                   + sets_table({"its student": widest.sets}))
    return "\n\n".join(out)


def _thinks(cfg: Mapping[str, Any], e: JobEstimate) -> bool:
    from opdgrpo.cost.heldout import thinks

    return thinks(cfg, e.job.removeprefix("base-"))


def stop_lines(estimates: Sequence[JobEstimate], stops: Mapping[str, StopSettings]) -> str:
    """One row per training job (and per sampling job whose timeout is not the default): what the rules pass on."""
    rows = ["| job | SLURM warning lead | collective timeout | why |", "|---|---|---|---|"]
    for e in estimates:
        s = stops.get(e.job)
        if s is not None:
            rows.append(f"| {e.job} | {s.signal_lead_s / 60:.0f} min | {s.collective_timeout_s / 60:.0f} min | {s.why} |")
    return "\n".join(rows)


def _where(cfg: Mapping[str, Any], hw: Hardware | None) -> str:
    if hw is None:
        return "no `hardware` block in this profile: memory is estimated, not checked, and no wall time is given"
    where = (f"{hw.name}: {hw.device_bytes / GIB:g} GiB as CUDA reports it x {hw.usable_fraction:g} usable; wall time "
             f"at {hw.bf16_tflops:g} TFLOP/s x MFU {hw.train_mfu:g} (training passes, teachers) and "
             f"{hw.sampling_mfu:g} (sampling)"
             + (f"; the high end bounds sampling by decode waves at {hw.memory_tbps:g} TB/s x "
                f"{hw.decode_efficiency:g} (continuous batching of 'vLLM rows at once' rows; a step reads the weights "
                "and their KV cache; at least the longest row's steps)" if hw.memory_tbps else "")
             + "; hours include held-out evaluations, code scoring, checkpoints and every attempt's start-up. 'vLLM "
               "rows at once': rows of the engine's max_model_len its KV pool holds after vLLM's start-up (its share "
               "less its weights, profiling peak and CUDA graphs; a pool short of one row is refused here, as vLLM "
               "would refuse it). 'vLLM share' and 'vLLM max_num_seqs': the engine's gpu_memory_utilization and "
               "max_num_seqs, '(plan)' where the plan chose them (the most rows of max_model_len that fit beside the "
               "trainer's static memory, or alone on the GPU), '(set)' where conf or the command line sets them. "
               "'allocations': what a job needs of resources.<kind>.runtime at the high end")
    on_cpus = sorted(kind for kind, block in (cfg.get("resources") or {}).items()
                     if isinstance(block, Mapping) and block.get("gpu", None) == 0 and kind != "tokenizer")
    if on_cpus:   # e.g. the rehearsal: the paper's plan, run on CPUs
        where += (f"\n\nThis profile runs its {', '.join(on_cpus)} jobs on CPUs (resources.<kind>.gpu: 0): the figures "
                  f"below are what its plan would need on the {hw.name} of its `hardware` block, not what it uses here "
                  "(the rules pass those jobs no planned engine share or max_num_seqs).")
    return where


def machine_lines(gpus: int, schedules: tuple[Schedule, Schedule]) -> str:
    """The DAG's wall time on the profile's machine at both ends, and how busy its GPUs are (the high end)."""
    low, high = schedules
    busy = high.gpu_hours / (gpus * high.makespan) if high.makespan else 0.0
    return (f"On one machine of {gpus} GPUs (machine.gpus), each job on the GPUs of its row ('plan': chosen per job so "
            "the DAG ends soonest, by simulating it; 'set': resources.<kind>.gpu), jobs side by side as the rules start "
            f"them (critical path first, a job waiting for its GPUs): **{_span(low.makespan, high.makespan, ',.0f')} "
            f"hours of wall time**, the GPUs busy {100 * busy:.0f}% of it at the high end (docs/one-machine.md).")


def summary(cfg: Mapping[str, Any], estimates: Sequence[JobEstimate],
            stops: Mapping[str, StopSettings] | None = None,
            machine: tuple[int, tuple[Schedule, Schedule]] | None = None) -> str:
    """The printout; ``machine``: the machine's GPUs and the DAG's (low, high) schedules on it, where the profile
    has a ``machine`` block (:func:`opdgrpo.cost.gpu_counts.schedules`)."""
    hw = Hardware.of(cfg)
    low = sum((e.hours or 0.0) * e.gpus for e in estimates)
    high = sum((e.hours_high or e.hours or 0.0) * e.gpus for e in estimates)
    text = (f"# Estimated peak GPU memory per device and wall time: profile `{cfg.get('profile')}`, "
            f"{len(estimates)} GPU jobs\n\n{_where(cfg, hw)}\n\n{table(cfg, estimates)}\n\n")
    if hw:
        text += f"Total: {_span(low, high, ',.0f')} GPU-hours ({_span(low / 8, high / 8, ',.0f')} hours of one 8-GPU node)"
        text += f". {machine_lines(*machine)}\n\nBy cost:" if machine else ", by cost:"
        text += f"\n{cost_lines(estimates)}\n\n{_eval_tables(cfg, estimates)}\n\n"
        if stops:
            text += ("Stop settings the rules pass on (a training job's SLURM warning --signal=URG@<lead>, torchrun's "
                     "--shutdown-timeout, the process group's timeout; "
                     "resources.<kind>.signal_lead_s / collective_timeout_s override them):\n\n"
                     + stop_lines(estimates, stops) + "\n\n")
    return text + "".join(f"note: job `{e.job}`: {line}\n" for e in estimates for line in e.notes)
