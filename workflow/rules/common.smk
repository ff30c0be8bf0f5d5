# Helpers shared by the rules: job lookup, resolved configs as params, upstream inputs.
import json
import os
import re
import shlex
import sys

from opdgrpo import gpu_slots, job_identity
from opdgrpo.cost import gpu_counts
from opdgrpo.cost.engine_share import engine_plan, engine_env
from opdgrpo.cost.schedule import priorities as _priorities
from opdgrpo.cost.site import site_settings_problems
from opdgrpo.train.time_limit import WARNING_SIGNAL
from snakemake.exceptions import WorkflowError


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


# Snakemake's own prefix (bash strict mode) kept; braces doubled, as Snakemake formats the prefix like a command.
_RUNTIME = shlex.quote(json.dumps(job_identity.runtime(j.config for j in PLAN.jobs.values()), sort_keys=True))
_PREFIX = f"set -euo pipefail; export {job_identity.ENV}={_RUNTIME}; "
# `precision: auto` is decided once per DAG on a CPU: the first job measures and writes this record, every later job
# (and every resume) reads it (opdgrpo.train.precision); delete it to decide again.
_PREFIX += f"export {job_identity.PRECISION_RECORD_ENV}={shlex.quote(str(Path(ROOT).absolute() / 'precision.json'))}; "
# `hub_offline: true` (the paper profile): jobs read the Hugging Face caches only, so a compute node without network
# fails a job at its start, naming each missing model or data set and `opdgrpo fetch`, instead of after timeouts.
if CFG.get("hub_offline"):
    _PREFIX += "export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1; "
# Each job's vLLM engine settings (opdgrpo.cost.engine_share, printed by `opdgrpo resources`): its share of the GPU and
# its max_num_seqs, the plan's choice or a value set by hand, by job directory. They change how the engine runs, not
# what a job computes, so they leave the jobs' params (opdgrpo.job_identity.ENGINE_RUNTIME_KEYS), and they travel in
# the prefix, not in a rule's shell text, whose change Snakemake counts as a code change: a changed estimate reruns
# no job. ESTIMATES: the Snakefile's refuse_unfit.
_ENGINE = shlex.quote(engine_env(engine_plan(CFG, PLAN, ESTIMATES), PLAN))
_PREFIX += f"export {job_identity.ENGINE_ENV}={_ENGINE}; "
# `sandbox.allow_unconfined_reads: true`: a job scoring code on hub data runs even where the code sandbox confines no
# reads (opdgrpo.sandbox.guard); it is not part of any job's config, so turning it on reruns nothing.
if (CFG.get("sandbox") or {}).get("allow_unconfined_reads"):
    _PREFIX += "export OPDGRPO_SANDBOX_ALLOW_UNCONFINED_READS=1; "

# One machine, no SLURM (the `machine` block; docs/one-machine.md): each GPU job's count, the planner's or conf's
# (opdgrpo.cost.gpu_counts; `opdgrpo resources` prints it), by job id. It reaches a job three ways, none of them its
# rule's shell text: its resources (`gpu_slots`, which the local executor bounds by machine.gpus, and `gpu`, which a
# cluster allocates), torchrun's process count and its GPU slots (opdgrpo.launch, from the variable below). The slots
# are filled in at `onstart` under Snakemake's local executor only (start_machine): under SLURM, SLURM assigns the
# devices and the slots step aside.
MACHINE = gpu_counts.Machine.of(CFG)
SLOTS = gpu_counts.job_slots(CFG, PLAN, ESTIMATES) if MACHINE else {}


def machine_env(slots=None):
    """What the rules export as opdgrpo.gpu_slots.MACHINE_ENV: each job's count by its directory (the `--out` its rule
    passes), and the slots (lock directory and device ids) where Snakemake runs the jobs itself, else None."""
    jobs = {job_identity.job_key(PLAN.jobs[j].out_dir): n for j, n in sorted(SLOTS.items()) if n}
    return json.dumps({"jobs": jobs, "slots": slots}, sort_keys=True)


def set_prefix(slots=None):
    machine = f"export {gpu_slots.MACHINE_ENV}={shlex.quote(machine_env(slots))}; " if MACHINE else ""
    shell.prefix((_PREFIX + machine).replace("{", "{{").replace("}", "}}"))


set_prefix()


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

PRIORITY = _priorities(
    CFG, PLAN, gpu_counts.machine_hours(PLAN, ESTIMATES) if MACHINE and gpu_counts.on_gpus(CFG) else None
)

# How a job is started never reruns it. Snakemake reruns a job whose rule's shell text changed ("Code has changed
# since last execution"), so a rule's shell text names the interpreter and the launchers by these variables, which
# Snakemake fills in when it runs the job, and never spells their values: a second checkout of the same repository, a
# venv at another path, `python` for `python3` or a new `opdgrpo_cmd` leaves finished jobs finished.
#
# Each of them begins with `exec`: the shell Snakemake runs a rule's command in becomes the launcher (torchrun, or the
# CLI itself), so nothing stands between Snakemake and the launcher. Where a stop signal reaches every process of a
# job (SLURM's proctrack/linuxproc or pgid, a Ctrl-C, a `kill` of the job's process group) a shell in between would
# die at once (bash exits on SIGTERM; it does not exec the last command of a `set -euo pipefail; ...` string),
# Snakemake would see the job fail and exit, and the end of the job step would kill the launcher and its workers in
# the middle of their checkpoint save. Under proctrack/cgroup the signal reaches Snakemake alone and the trainer stops
# itself before the time limit (opdgrpo.train.time_limit; docs/paper-profile.md, "Stopping before the time limit").
_INTERPRETER = shlex.quote(sys.executable)  # the interpreter that runs Snakemake (jobs run without an activated venv)
# On a machine every launcher is started through opdgrpo.launch, which sets the job's torchrun process count and
# claims its GPU slots, then execs the launcher (so the shell still becomes the launcher; the slots' locks go with it).
_VIA = f"{_INTERPRETER} -m opdgrpo.launch -- " if MACHINE else ""
PYTHON = f"exec {_VIA}{_INTERPRETER}"


def _one_command(key, default):
    """`--config <key>=...`: one command, which the rule's shell `exec`s; a list of commands (`;`, `&&`, a pipe)
    would exec its first part only, so it is refused here, naming the key."""
    value = str(config.get(key, default) or "")
    lexer = shlex.shlex(value, posix=True, punctuation_chars=True)
    if any(token and set(token) <= set(";&|") for token in lexer) or "\n" in value:
        raise WorkflowError(
            f"--config {key}={value!r}: give one command (it is exec'd in the rule's shell); put "
            "set-up such as `source env.sh && ...` into a script of its own, or use `env VAR=...`"
        )
    return f"exec {_VIA}{value}" if value else None


# The package's CLI; `--config opdgrpo_cmd=...` replaces it, e.g. for a cluster with its own environment.
OPDGRPO = _one_command("opdgrpo_cmd", f"{_INTERPRETER} -m opdgrpo.cli")
# A multi-process job's launcher when `--config launch_cmd=...` replaces torchrun.
LAUNCH_CMD = _one_command("launch_cmd", None)


# Keys of a `resources.<kind>` block the planner and the rules read, not resources SLURM is asked for.
PLANNER_KEYS = ("processes", "allocations", "signal_lead_s", "collective_timeout_s")


def job_resources(kind, job_of=None):
    """Cluster resources of one kind of job (conf `resources.<kind>`): runtime, mem_mb, cpus_per_task, gpu.
    gpu 0 asks for none; gpu > 0 adds the site's GPU model when the config names one (`--config gpu_model=h100`).
    A profile without a `tokenizer` block gives tokenizer jobs its `base` block's CPUs, memory and runtime, no GPU.
    On a machine, each job of a GPU kind (named by `job_of(wildcards)`) also asks for its GPU slots (`gpu_slots`,
    bounded by machine.gpus under the local executor), and for its count of GPUs where the planner chose it."""
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
    if MACHINE and job_of is not None and kind in gpu_counts.GPU_KINDS:
        res["gpu_slots"] = lambda w: SLOTS[job_of(w)]
        if gpu_counts.hand_count(CFG, kind) is None:
            res["gpu"] = lambda w: SLOTS[job_of(w)]
            if config.get("gpu_model"):
                res["gpu_model"] = config["gpu_model"]
    return res


def processes(kind):
    """Processes of one job of `kind`: `resources.<kind>.processes`, else one per GPU the job asks for, else 1. On a
    machine, where the planner chooses each job's count, the machine's GPUs: the rule's text names torchrun with that
    many and opdgrpo.launch gives each job its own count, so the text does not change with the plan's counts (a
    changed text reruns every finished job of the rule); on an 8-GPU machine it is the SLURM profile's text."""
    res = CFG.get("resources", {}).get(kind, {})
    if MACHINE and kind in gpu_counts.GPU_KINDS and gpu_counts.hand_count(CFG, kind) is None:
        return MACHINE.gpus
    return int(res.get("processes") or res.get("gpu") or 1)


# Each job's stop settings (opdgrpo.cost.resources.stop_settings, printed by `opdgrpo resources`): the SLURM warning
# lead (a step or an evaluation under way, then a checkpoint save) and the process group's timeout (the longest
# phase in which one process waits for another). Rule resources, not params: a changed estimate reruns no job.
STOP = stop_settings(CFG, PLAN, ESTIMATES)


def stop_resources(job_of):
    """`signal_lead_s`, `collective_timeout_s` and `slurm_extra` (a training job's warning, `--signal=URG@<lead>`,
    then the user's own `--config slurm_extra=...`) of the job a rule's wildcards name (`job_of(wildcards)`). The
    trainer stops itself before its time limit (opdgrpo.train.time_limit); the warning is its backstop, and SIGURG
    is one that the processes which do not handle it ignore (the step's Snakemake fails a job that then finishes
    well once it has had a SIGTERM). Jobs that do not resume get no warning: it could only end them."""
    extra = config.get("slurm_extra", "")

    def slurm_extra(w):
        job = job_of(w)
        warning = f"--signal={WARNING_SIGNAL}@{STOP[job].signal_lead_s}" if PLAN.jobs[job].kind == "train" else ""
        return f"{warning} {extra}".strip()

    return dict(
        signal_lead_s=lambda w: STOP[job_of(w)].signal_lead_s,
        collective_timeout_s=lambda w: STOP[job_of(w)].collective_timeout_s,
        slurm_extra=slurm_extra,
    )


def launcher(procs, override=None):
    """What starts a job's processes, as shell text with placeholders (see PYTHON above): the package's CLI for one;
    for several, torchrun on one node with a free port per job, which passes SLURM's warning on to its processes and
    waits the job's signal lead for them (`--shutdown-timeout`; its own default, 30 s, would kill a checkpoint save of
    a large model half-way). `override` (`--config launch_cmd=...`) replaces the torchrun command."""
    if procs == 1:
        return "{OPDGRPO}"
    if override:
        return "{LAUNCH_CMD}"
    return (
        f"{{PYTHON}} -m torch.distributed.run --standalone --nnodes 1 --nproc_per_node {procs} "
        "--shutdown-timeout {resources.signal_lead_s} -m opdgrpo.cli"
    )


# A training run with several processes starts them with torchrun inside its allocation; they share the run through
# torch.distributed (opdgrpo.train.distributed). A base evaluation of a hub or random model with several GPUs splits
# every held-out set over them, one vLLM engine each (opdgrpo.stages.hub_models.fetch_base).
TRAIN_PROCS = processes("train")
TRAIN_CMD = launcher(TRAIN_PROCS, LAUNCH_CMD)
BASE_CMD = launcher(processes("base"))


# Jobs that only copy files run where Snakemake runs, never as cluster jobs.
localrules:
    all,
    publish,


# A training job. `resources.attempt` is Snakemake's attempt (the SLURM profile resubmits a training job stopped at
# its time limit): the trainer refuses a retry after a real error (opdgrpo.attempts), so retries only continue
# interrupted runs. Snakemake deletes the log before each attempt; the trainer starts it with the earlier attempts.
TRAIN_SHELL = (
    TRAIN_CMD + " train --out {params.out} --config-json {params.cfg:q} --attempt {resources.attempt} "
    "--collective-timeout {resources.collective_timeout_s} > {log} 2>&1"
)


def slurm_settings():
    """This call's SLURM settings, the workflow profile and the command line together, as opdgrpo.cost.site reads
    them; None under another executor (a local run, a dry run, or a job already on its node)."""
    if getattr(workflow.executor_plugin, "name", None) != "slurm":
        return None
    defaults = workflow.resource_settings.default_resources or {}
    # a command line's `--default-resources k=v` is an expression evaluated per rule: its text is what it names
    resources = {k: (v.raw if v.is_evaluable() else v.value) for k, v in defaults.items()}
    if getattr(workflow.executor_settings, "no_account", False):
        resources["slurm_account"] = "none (--slurm-no-account)"
    remote = workflow.remote_execution_settings
    preemptible = remote.preemptible_rules
    return {
        "executor": "slurm",
        "default-resources": resources,
        "preemptible-retries": remote.preemptible_retries or 0,
        "preemptible-rules": ["grpo", "opd"] if preemptible.all else sorted(preemptible.rules),
    }


def refuse_site_settings():
    """Before the first submission: a SLURM run with the profile's placeholders (partition, account) or fewer
    training resubmissions than the plan counts on stops here, naming each setting, instead of job by job later."""
    settings = slurm_settings()
    problems = site_settings_problems(settings, CFG) if settings is not None else []
    if problems:
        raise WorkflowError("SLURM site settings to set before submitting:\n  " + "\n  ".join(problems))


def start_machine():
    """At the start, under Snakemake's local executor on a profile with a `machine` block: bound the GPU slots the
    running jobs take together by machine.gpus (a global resource, as `--resources gpu_slots=N` would; a smaller
    value given on the command line is kept), and give the jobs their slots' directory and the machine's devices.
    Under any other executor SLURM (or the cluster) assigns the devices: nothing here."""
    if MACHINE is None or getattr(workflow.executor_plugin, "name", None) != "local":
        return
    given = workflow.global_resources.get("gpu_slots")
    given = given.value if given is not None else None
    if given is not None and int(given) > MACHINE.gpus:
        raise WorkflowError(
            f"--resources gpu_slots={given} is more than machine.gpus ({MACHINE.gpus}): the machine has "
            f"{MACHINE.gpus} GPU slots; raise machine.gpus instead"
        )
    if given is None:
        workflow.register_resource("gpu_slots", MACHINE.gpus)
    try:
        import torch

        found = torch.cuda.device_count()
    except Exception:  # no usable CUDA: the slots stand for GPUs (a rehearsal on CPUs)
        found = 0
    try:
        devices = gpu_slots.machine_devices(MACHINE.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"), found)
    except ValueError as err:
        raise WorkflowError(str(err)) from err
    directory = MACHINE.directory(CFG)
    set_prefix({"dir": str(Path(directory).absolute()), "devices": devices})
    if workflow.cores < 2 * THREADS:
        print(
            f"machine: --cores {workflow.cores} runs one job of {THREADS} threads at a time (threads: "
            f"{THREADS}); pass --cores all to run the jobs side by side on the {MACHINE.gpus} GPUs",
            file=sys.stderr,
        )


onstart:
    refuse_site_settings()
    start_machine()
