# Helpers shared by the rules: job lookup, resolved configs as params, upstream inputs.
import json
import re
import shlex
import sys


def job_ids(kind, method=None):
    return [
        j.id for j in PLAN.jobs.values() if j.kind == kind and (method is None or j.config["method"]["name"] == method)
    ]


def id_pattern(ids):
    """A wildcard constraint matching exactly these ids (never a prefix of another)."""
    return "|".join(re.escape(i) for i in ids) or "(?!x)x"


def job_config(job_id):
    """The job's resolved config less the keys that change no result, canonical JSON: Snakemake reruns the job
    when it changes. The others reach every job through one environment variable (opdgrpo.job_identity)."""
    return json.dumps(job_identity.identity(PLAN.jobs[job_id].config), sort_keys=True)


from opdgrpo import job_identity

# Snakemake's own prefix (bash strict mode) kept; braces doubled, as Snakemake formats the prefix like a command.
_RUNTIME = shlex.quote(json.dumps(job_identity.runtime(j.config for j in PLAN.jobs.values()), sort_keys=True))
_PREFIX = f"set -euo pipefail; export {job_identity.ENV}={_RUNTIME}; "
shell.prefix(_PREFIX.replace("{", "{{").replace("}", "}}"))


def consumed(role):
    """A rule's input: the done.json of what the job (named by its wildcard) consumes in ``role`` (Plan.inputs:
    tokenizer, student, teachers, selection, models)."""

    def inputs(w):
        job_id = w.get("run") or w.get("job") or f"base-{w.model}"
        return PLAN.inputs(job_id)[role]

    return inputs


LOGS = f"{ROOT}/logs"
THREADS = int(CFG["threads"])

# Start order: each job's estimated seconds plus the longest chain of jobs that need it (opdgrpo.cost.schedule), so
# the long runs start early and short ones fill the end instead of one core idling behind the last long run.
from opdgrpo.cost.schedule import priorities as _priorities

PRIORITY = _priorities(CFG, PLAN)

# The package's CLI, run by the interpreter that runs Snakemake (so it works without an activated venv);
# `--config opdgrpo_cmd=...` replaces it, e.g. for a cluster with its own environment.
OPDGRPO = config.get("opdgrpo_cmd", f"{shlex.quote(sys.executable)} -m opdgrpo.cli")


# Keys of a `resources.<kind>` block the planner and the rules read, not resources SLURM is asked for.
PLANNER_KEYS = ("processes", "allocations", "signal_lead_s", "collective_timeout_s")


def job_resources(kind):
    """Cluster resources of one kind of job (conf `resources.<kind>`): runtime, mem_mb, cpus_per_task, gpu.
    gpu 0 asks for none; gpu > 0 adds the site's GPU model when the config names one (`--config gpu_model=h100`).
    A profile without a `tokenizer` block gives tokenizer jobs its `base` block's CPUs, memory and runtime, no GPU."""
    blocks = CFG.get("resources", {})
    if kind == "tokenizer" and kind not in blocks:
        res = {**blocks.get("base", {}), "gpu": 0}
    else:
        res = dict(blocks.get(kind, {}))
    for key in PLANNER_KEYS:
        res.pop(key, None)
    if not res.get("gpu"):
        res.pop("gpu", None)
    elif config.get("gpu_model"):
        res["gpu_model"] = config["gpu_model"]
    return res


def processes_per_run():
    """Processes of one training run: `resources.train.processes`, else one per GPU the job asks for, else 1."""
    res = CFG.get("resources", {}).get("train", {})
    return int(res.get("processes") or res.get("gpu") or 1)


# A training run with several processes starts them with torchrun inside its allocation (one node, a free port
# per job); they share the run through torch.distributed (opdgrpo.train.distributed). `--config launch_cmd=...` replaces it.
TRAIN_PROCS = processes_per_run()
TRAIN_CMD = (
    OPDGRPO
    if TRAIN_PROCS == 1
    else config.get(
        "launch_cmd",
        f"{shlex.quote(sys.executable)} -m torch.distributed.run --standalone --nnodes 1 "
        f"--nproc_per_node {TRAIN_PROCS} -m opdgrpo.cli",
    )
)


# Jobs that only copy files run where Snakemake runs, never as cluster jobs.
localrules:
    all,
    publish,


# A training job. `resources.attempt` is Snakemake's attempt (the SLURM profile resubmits a training job stopped at
# its time limit): the trainer refuses a retry after a real error (opdgrpo.attempts), so retries only continue
# interrupted runs. Snakemake deletes the log before each attempt; the trainer starts it with the earlier attempts.
TRAIN_SHELL = (
    "{TRAIN_CMD} train --out {params.out} --config-json {params.cfg:q} --attempt {resources.attempt} > {log} 2>&1"
)
