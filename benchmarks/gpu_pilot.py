"""GPU pilot: the paper profile's own jobs (and one of the node profile's) on one GPU at their shapes, with random weights;
time per phase and peak device memory beside the planner's prediction for each job.

What runs is what a cluster runs, not a copy of it. The pilot composes ``profile=pilot`` (conf/profile/pilot.yaml:
the rehearsal's fixtures and weightless ``source: random`` models at the shapes of Qwen3-4B-Base, an 8B teacher and
Qwen3-32B), plans it with the project's planner, and starts six of its jobs with the commands the Snakemake rules
run (``opdgrpo.cli``; the training job under torchrun, as the SLURM profile launches it), in this order, the paths
that fail on first GPU contact first:

1. ``tokenizer``;
2. ``base-student`` and 3. ``base-teacher_8b``: each writes its weightless model directory and evaluates it with a
   vLLM engine alone on the GPU (awake, ``train.vllm_alone``, started at the paper's row length): the OPD run's and
   the difficulty job's inputs;
4. ``difficulty-math-teacher_8b``: S2's solve rates (2 prompts x 2 answers per model): the student's engine, then
   the thinking teacher's (temperature 0.6, top-k 20, top-p 0.95: vLLM's FlashInfer sampler), each at
   ``vllm_alone``'s 0.9 of the GPU in a spawned process of its own, the second started after the first process
   exited (two engines in one process were refused: the first does not give back all its memory). The pilot checks
   the two processes in its ``done.json``;
5. ``opd-teacher_8b-code-s0``: S1's OPD run, FSDP2 on one process, the colocated vLLM engine (sleep, wake, weight
   sync from the shards), bf16, packing, logit chunks; its first act is the step-0 evaluation under vLLM, with the
   trainer's CUDA generator (the draw that crashed every training job before it named its device). Killed by SIGKILL
   in step 1's update (after step 0's checkpoint, ``OPDGRPO_FAULT=update:1``), then started again: it resumes
   (its engine starting before Adam's state returns to the GPU), trains step 1, evaluates and writes its final
   checkpoint;
6. ``base-model_32b``: the 32B base evaluation, split over every GPU the machine has (``--base-processes``: torchrun,
   one engine per GPU, each set's rows in contiguous shares, as the rule runs a base job with ``resources.base.gpu``
   GPUs); on the CPU preset over 2 processes;
7. ``node/tokenizer``, ``node/base-student`` and ``node/grpo-student-math-s0``: the node profile's math expert (S3's
   self-teacher, S4's math expert) from ``profile=node-pilot``: GRPO of a Qwen3-1.7B-Base-shaped student, 2,048-token
   answers, 64 rows per step, on the one GPU the node profile's planner gives it, its engine at the plan's share; two
   steps, after the tokenizer and base jobs it needs (``--jobs`` runs either group alone: a device that allows 10
   minutes a command takes the paper's jobs in one call and the node profile's in another).

For each job the pilot records its wall time, its phases from the job's own records (the ledger's ``phase_s`` per
step; the evaluation and checkpoint seconds in its log), the device's peak used memory (``nvidia-smi``, polled every
0.2 s: the engine's memory and the trainer's together, as vLLM's start-up check sees them; on a CPU the process
tree's peak RSS) and the planner's prediction for the same job (``opdgrpo resources``: its peak per GPU and whether
vLLM would start). Before anything runs, the plan is checked against the device's own memory: on a GPU too small for
the jobs it exits 2 naming each job that would not fit.

    timeout 570 python benchmarks/gpu_pilot.py --json results/gpu_pilot.json     # one GPU (H200: about 7-8 minutes)
    python benchmarks/gpu_pilot.py --cpu-smoke --json /tmp/p.json                 # the same jobs at toy shapes on CPU

The kill and resume keep two checkpoints of the student on disk at once (the one resumed from and the new one written
beside it before the rotation), each its full weights and Adam state: 12 bytes a parameter, 45 GiB for the 4B shape.
Where the work directory's disk holds less than that, the pilot refuses before anything runs; ``--no-resume`` then
runs the OPD job once, checkpointing only at its end (one checkpoint), and the JSON says the resume went untested.

Exit status: 0 every job finished as planned; 2 no device, a GPU too small for the plan, or a disk too small for two
checkpoints (nothing ran); 3 the time guard stopped it (the JSON holds what finished); 5 a job failed (its log's tail
is in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import common

REPO = common.REPO
SCHEMA = "opdgrpo.gpu_pilot/2"
OPD_RUN, KILLED_AT = "opd-teacher_8b-code-s0", 1
#: S2's difficulty job: each model's solve rates sampled in a process of its own.
DIFFICULTY_JOB = "difficulty-math-teacher_8b"
#: The node profile's math expert (S3's self-teacher, S4's math expert) on one GPU at its shapes, after the tokenizer
#: and base jobs it needs (conf/profile/node-pilot.yaml: GRPO of a Qwen3-1.7B-Base-shaped student, 2,048-token
#: answers, the one GPU the node profile's planner gives it); its jobs are named ``node/<job>`` in the records.
NODE, NODE_PROFILE = "node/", "node-pilot"
NODE_RUN = f"{NODE}grpo-student-math-s0"
#: The jobs, in order (the OPD run twice: killed after its first checkpoint, then resumed).
JOBS = ["tokenizer", "base-student", "base-teacher_8b", DIFFICULTY_JOB, OPD_RUN, "base-model_32b",
        f"{NODE}tokenizer", f"{NODE}base-student", NODE_RUN]
#: The base job split over the machine's GPUs (the others run on one, as they only feed the OPD run).
SPLIT_JOB = "base-model_32b"
#: --cpu-smoke: the same profile and jobs, models and lengths small enough for two cores. The embeddings keep more
#: rows than the tokenizer has tokens, as Qwen3's 151,936 rows over the pilot's scratch tokenizer do.
CPU_OVERRIDES = [
    "model@models.student=random_qwen3", "model@models.teacher_8b=random_qwen3", "model@models.model_32b=random_qwen3",
    "models.student.vocab_size=1280", "models.teacher_8b.vocab_size=1280", "models.model_32b.vocab_size=1280",
    "models.teacher_8b.hidden_size=256", "models.model_32b.hidden_size=256", "models.model_32b.num_hidden_layers=3",
    "threads=2", "train.precision=auto", "pretrain.precision=auto", "train.vllm.dtype=float32", "~train.vllm_alone.max_model_len",
    "train.max_new_tokens=24", "pretrain.eval.max_new_tokens=24", "train.prompts_per_step=2",
    "methods.opd.rollouts_per_prompt=2", "train.max_tokens_per_microbatch=384", "train.logit_chunk_tokens=8",
]
#: --engine hf: sample with the project's sampler, and drop the keys only a vLLM engine reads.
WITHOUT_VLLM = ("train.engine=hf", "~train.vllm", "~train.vllm_alone", "methods.grpo.engine_is_cap=null")
#: --cpu-smoke for the node profile's job: a small student, short answers, a few rows.
NODE_CPU_OVERRIDES = [
    "model@models.student=random_qwen3", "threads=2", "train.precision=auto", "pretrain.precision=auto",
    "train.vllm.dtype=float32", "train.max_new_tokens=24", "pretrain.eval.max_new_tokens=24", "train.prompts_per_step=2",
    "methods.grpo.group_size=4", "train.max_tokens_per_microbatch=384", "train.logit_chunk_tokens=8",
]
PRESETS = {"gpu": {"overrides": [], "node_overrides": [], "max_seconds": 540},
           "cpu": {"overrides": CPU_OVERRIDES, "node_overrides": NODE_CPU_OVERRIDES, "max_seconds": 900}}
GIB = 2**30


class TimeGuard(RuntimeError):
    """``--max-seconds`` ran out."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", action="store_true", help="the CPU preset: the same jobs at toy shapes")
    p.add_argument("--max-seconds", type=float, help="time guard over the whole pilot (GPU 540, under a `timeout 570`)")
    p.add_argument("--workdir", type=Path, help="where the jobs write (default: a temporary directory, removed)")
    p.add_argument("--json", type=Path, default=REPO / "results" / "gpu_pilot.json")
    p.add_argument("--plan-only", action="store_true", help="print the planner's predictions for the jobs and stop")
    p.add_argument("--gpu-memory-gib", type=float, help="plan for a GPU of this memory (default: nvidia-smi's); the "
                                                         "pilot refuses to start when a job would not fit it")
    p.add_argument("--engine", choices=("vllm", "hf"), default="vllm",
                   help="hf: the project's own sampler where vLLM is not installed (vLLM's start, sleep and sync "
                        "then go unmeasured)")
    p.add_argument("--jobs", nargs="+", choices=JOBS, help="run these of the pilot's jobs only (in the pilot's order; "
                                                            "a job's inputs must be among them or already written)")
    p.add_argument("--base-processes", type=int,
                   help=f"processes (one per GPU) {SPLIT_JOB} is split over (default: the GPUs nvidia-smi lists; 2 on "
                        "the CPU preset)")
    p.add_argument("--no-resume", action="store_true",
                   help="run the OPD job once, one checkpoint at its end, for a disk that cannot hold two")
    p.add_argument("overrides", nargs="*", help="more config overrides (key=value), after the preset's")
    args = p.parse_args(argv)
    args.preset = "cpu" if args.cpu_smoke else "gpu"
    if args.base_processes is None:
        args.base_processes = 2 if args.cpu_smoke else max(1, gpu_count())
    if args.max_seconds is None:
        args.max_seconds = PRESETS[args.preset]["max_seconds"]
    return args


# --------------------------------------------------------------------------------------------------------------------
# The plan, and what the planner predicts


def gpu_count() -> int:
    """GPUs ``nvidia-smi`` lists (0 without one)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def device_memory_gib() -> float | None:
    """The first visible GPU's memory (``nvidia-smi``), None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return float(out.split()[0]) / 1024
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def compose_plan(args: argparse.Namespace, results: Path, memory_gib: float | None, profile: str = "pilot"):
    """The pilot's config and plan (``profile``: ``pilot``, or ``node-pilot`` for the node profile's job, which the
    command line's overrides leave alone); on a GPU ``hardware.memory_gib`` is the device's own."""
    from opdgrpo.config import compose
    from opdgrpo.plan.build import build_plan

    node = profile == NODE_PROFILE
    preset = PRESETS[args.preset]["node_overrides" if node else "overrides"]
    if args.no_resume and not node:   # one checkpoint, at the run's end
        preset = [*preset, f"train.checkpoint_every={10**6}"]
    if args.engine == "hf":   # the engine's own keys go with it
        preset = [o for o in preset if "train.vllm" not in o] + list(WITHOUT_VLLM)
    overrides = [f"profile={profile}", f"results_dir={results}", *preset, *([] if node else args.overrides)]
    if memory_gib is not None and args.preset == "gpu":
        overrides.append(f"hardware.memory_gib={memory_gib:.1f}")
    cfg = compose(overrides, REPO / "conf")
    return cfg, build_plan(cfg)


def predictions(cfg: dict[str, Any], plan, prefix: str = "") -> tuple[dict[str, dict[str, Any]], list[str], str]:
    """The planner's estimate of each pilot job (peak GiB per GPU, its phase, vLLM's start, the engine's share and
    max_num_seqs) by its name in the pilot (``prefix`` + job id), what would not fit, and the engine settings the
    rules would export to the jobs (:func:`opdgrpo.cost.engine_share.engine_env`)."""
    from opdgrpo.cost.engine_share import engine_env, engine_plan
    from opdgrpo.cost.resources import estimate_jobs, unfit

    every = estimate_jobs(cfg, plan)
    estimates = [e for e in every if prefix + e.job in JOBS]
    out = {}
    for e in estimates:
        engine, choice = e.engine, e.engine_choice
        out[prefix + e.job] = {"peak_gib": round(e.peak / GIB, 1), "peak_phase": e.peak_phase, "hours": e.hours,
                      "engine_starts": None if engine is None else bool(engine.starts),
                      "max_model_len": None if engine is None else int(engine.max_model_len),
                      "gpu_memory_utilization": None if choice is None else choice.gpu_memory_utilization,
                      "max_num_seqs": None if choice is None else choice.max_num_seqs,
                      "rows_at_once": None if engine is None else engine.rows_at_once}
    return out, unfit(cfg, estimates), engine_env(engine_plan(cfg, plan, every), plan)


def checkpoint_bytes(cfg: dict[str, Any], plan) -> int:
    """One checkpoint of the OPD run's student: its full weights and Adam's two moments, all float32."""
    from opdgrpo.cost.memory_model import ADAM_STATE_BYTES, Shape, params
    from opdgrpo.cost.model import architecture, model_of

    student = model_of(plan.jobs[OPD_RUN].config["student"]["from"], plan.jobs)
    return int((4 + ADAM_STATE_BYTES) * params(Shape.of(architecture(cfg, student))))


def disk_problem(workdir: Path, need: int) -> str | None:
    """Why the kill and resume cannot run in ``workdir``: two checkpoints must fit at once."""
    existing = next(d for d in (workdir, *workdir.parents) if d.exists())   # the work directory may not exist yet
    free = shutil.disk_usage(existing).free
    if free >= 2 * need:
        return None
    return (f"the kill and resume keep two checkpoints of {need / GIB:.1f} GiB on disk at once; {workdir} has "
            f"{free / GIB:.1f} GiB free. Give --workdir on a larger disk, or --no-resume (the OPD run once, one "
            f"checkpoint, the resume untested)")


# --------------------------------------------------------------------------------------------------------------------
# Running one job as its rule does, with a memory poll beside it


class MemoryPoll:
    """Peak memory while a job runs: the GPU's used memory (``nvidia-smi``: the engine's and the trainer's, and the
    CUDA contexts), or on a CPU the job's process tree's resident memory."""

    def __init__(self, pid: int, gpu: bool):
        self.pid, self.gpu, self.peak = pid, gpu, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "MemoryPoll":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> float:
        if self.gpu:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                                 capture_output=True, text=True, timeout=10).stdout
            return float(out.split()[0]) * 2**20
        import psutil

        try:
            root = psutil.Process(self.pid)
            return float(sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]))
        except psutil.Error:
            return 0.0

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.peak = max(self.peak, self._sample())
            except (OSError, subprocess.SubprocessError, ValueError, IndexError):
                pass


def command(job, out_dir: Path, processes: int = 1) -> list[str]:
    """The rule's command for ``job`` (workflow/rules/*.smk): training under torchrun, one process; a base job under
    torchrun with ``processes`` processes where it is more than one (``resources.base.gpu``); the difficulty job as
    one process (which spawns one per model)."""
    from opdgrpo import job_identity

    cfg = json.dumps(job_identity.identity(job.config), sort_keys=True)
    py = [sys.executable, "-m"]
    torchrun = [*py, "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc_per_node"]
    if job.kind == "tokenizer":
        return [*py, "opdgrpo.cli", "tokenizer", "--out", str(out_dir), "--config-json", cfg]
    if job.kind == "base":
        launch = [*torchrun, str(processes), "-m"] if processes > 1 else py
        return [*launch, "opdgrpo.cli", "pretrain", "--out", str(out_dir), "--config-json", cfg]
    if job.kind == "difficulty":
        return [*py, "opdgrpo.cli", "difficulty", "--out", str(out_dir), "--config-json", cfg]
    return [*torchrun, "1", "-m", "opdgrpo.cli", "train", "--out", str(out_dir), "--config-json", cfg]


def run_job(plan, job_id: str, logs: Path, deadline: float, *, gpu: bool, attempt: int = 1,
            fault: str | None = None, processes: int = 1, engine: str = "{}", label: str | None = None) -> dict[str, Any]:
    """Start one job, wait for it under the deadline, and return what it took; ``engine``: the engine settings the
    rules export (:func:`predictions`), so the job's engine gets the plan's share and max_num_seqs; ``label``: the
    job's name in the pilot's records (its id by default; ``node/<id>`` for the node profile's)."""
    label = label or job_id
    from opdgrpo import job_identity

    job = plan.jobs[job_id]
    cmd = command(job, Path(job.out_dir), processes)
    if job.kind == "train":
        cmd += ["--attempt", str(attempt)]
    # as the rules export them (workflow/rules/common.smk): the runtime keys, and the DAG's one precision record, so
    # `precision: auto` (the CPU preset) is decided once for every job; without it a resumed attempt measured `auto`
    # again and, on a loaded machine, refused its bf16 checkpoint in fp32
    env = {**os.environ, job_identity.ENV: json.dumps(job_identity.runtime(j.config for j in plan.jobs.values())),
           job_identity.PRECISION_RECORD_ENV: str((Path(plan.root) / "precision.json").absolute()),
           job_identity.ENGINE_ENV: engine, "OPDGRPO_FAULT": fault or ""}
    log = logs / f"{label.replace('/', '-')}.{attempt}.log"
    left = deadline - time.time()
    if left <= 0:
        raise TimeGuard(f"no time left to start {job_id}")
    t0 = time.time()
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)
        with MemoryPoll(proc.pid, gpu) as poll:
            try:
                code = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise TimeGuard(f"{job_id} was still running when --max-seconds ran out (log: {log})") from None
    record = {"job": label, "attempt": attempt, "fault": fault, "exit": code, "seconds": round(time.time() - t0, 1),
              "peak_memory_gib": round(poll.peak / GIB, 2), "log": str(log)}
    record.update(job_records(Path(job.out_dir), log))
    if code != 0 and not fault:
        record["log_tail"] = log.read_text(errors="replace")[-4000:]
    return record


def job_records(out_dir: Path, log: Path) -> dict[str, Any]:
    """What the job itself recorded: its steps' ``phase_s``, evaluation and checkpoint seconds, its engines."""
    out: dict[str, Any] = {}
    ledger = out_dir / "ledger.jsonl"
    if ledger.is_file():
        lines = [json.loads(x) for x in ledger.read_text().splitlines() if x.strip()]
        out["steps"] = [{"step": r["step"], "wall_s": r["wall_s"], "phase_s": r.get("phase_s", {}),
                         "tokens": r.get("tokens"), "flops": r["flops"], "step_flops": r["step_flops"],
                         "generated_tokens_per_s": r["tokens"]["completion"] / max(r["phase_s"]["sample"], 1e-9)}
                        for r in lines if "tokens" in r]
    text = log.read_text(errors="replace")
    for event in ("eval", "checkpoint"):
        seconds = [float(s) for s in re.findall(rf"\b{event} .*?seconds=([0-9.]+)", text)]
        if seconds:
            out[f"{event}_seconds"] = seconds
    done = out_dir / "done.json"
    if done.is_file():
        summary = json.loads(done.read_text())
        out["done"] = {k: summary[k] for k in ("steps", "wall_s", "parameters", "engines", "processes",
                                               "cuda_max_memory_reserved_bytes", "samplers") if k in summary}
    return out


# --------------------------------------------------------------------------------------------------------------------
# The whole pilot


def split_label(label: str) -> tuple[str, str]:
    """A pilot job's name as (its plan's prefix, its job id): ``node/<id>`` is the node profile's."""
    return (NODE, label[len(NODE):]) if label.startswith(NODE) else ("", label)


def expected(records: list[dict[str, Any]], plans: dict[str, Any], jobs: list[str] = JOBS, base_processes: int = 1,
             gpu: bool = False) -> list[str]:
    """What a finished pilot must show, as failures: every job done, the killed attempt killed and resumed (steps
    0 and 1 once each), vLLM engines placed under torchrun, the split base job over its processes, the difficulty
    job's two models sampled in two processes of their own (under vLLM), the node profile's run two steps on one
    process, and every engine's requests seeded on a CPU only (``gpu``: vLLM's fast sampler), log-probs for the
    training rollouts only (raw at temperature 1). ``plans``: each plan by its prefix (:func:`split_label`)."""
    problems = []
    plan = plans[""]
    by = {(r["job"], r["attempt"]): r for r in records}
    selection = by.get((DIFFICULTY_JOB, 1))
    if selection is not None and selection["exit"] == 0 and plan.jobs[DIFFICULTY_JOB].config.get("engine") == "vllm":
        samplers = selection.get("done", {}).get("samplers") or {}
        problems += difficulty_problems(samplers)
        problems += policy_problems(DIFFICULTY_JOB, [s.get("engine", {}) for s in samplers.values()], gpu, None)
    split = by.get((SPLIT_JOB, 1))
    if split is not None and split["exit"] == 0 and split.get("done", {}).get("processes") != base_processes:
        problems.append(f"{SPLIT_JOB}: ran on {split.get('done', {}).get('processes')} processes, not {base_processes}")
    for job in jobs:
        last = max((r for r in records if r["job"] == job), key=lambda r: r["attempt"], default=None)
        prefix, job_id = split_label(job)
        if last is None or last["exit"] != 0 or not (Path(plans[prefix].jobs[job_id].out_dir) / "done.json").is_file():
            problems.append(f"{job} did not finish")
    node = by.get((NODE_RUN, 1))
    if node is not None and node["exit"] == 0:
        problems += node_problems(node, plans[NODE], gpu)
    killed = by.get((OPD_RUN, 1))
    if (OPD_RUN, 2) not in by:   # --no-resume: one attempt, both steps
        if killed is not None and killed["exit"] == 0 and [s["step"] for s in killed.get("steps", [])] != [0, 1]:
            problems.append(f"{OPD_RUN}: its ledger holds steps {[s['step'] for s in killed.get('steps', [])]}")
        return problems
    if killed is not None and killed["exit"] == 0:
        problems.append(f"{OPD_RUN}: the fault update:{KILLED_AT} did not stop it")
    resumed = by.get((OPD_RUN, 2))
    if resumed is not None and resumed["exit"] == 0:
        steps = [s["step"] for s in resumed.get("steps", [])]
        if steps != [0, 1]:
            problems.append(f"{OPD_RUN}: the ledger after the resume holds steps {steps}, not [0, 1]")
        engines = resumed.get("done", {}).get("engines") or []
        vllm = plan.jobs[OPD_RUN].config["train"].get("engine") == "vllm"
        if vllm and [e.get("backend") for e in engines] != ["external_launcher"]:
            problems.append(f"{OPD_RUN}: engine {engines} is not one external_launcher engine")
        if vllm:
            problems += policy_problems(OPD_RUN, engines, gpu, "raw_logprobs")
    return problems


def node_problems(record: dict[str, Any], plan, gpu: bool) -> list[str]:
    """The node profile's math expert: both steps once, on one process, its engine under torchrun's launcher with
    the training policy of its device."""
    problems = []
    steps = [s["step"] for s in record.get("steps", [])]
    if steps != [0, 1]:
        problems.append(f"{NODE_RUN}: its ledger holds steps {steps}, not [0, 1]")
    done = record.get("done", {})
    if done.get("processes") != 1:
        problems.append(f"{NODE_RUN}: ran on {done.get('processes')} processes, not the 1 GPU the node profile gives it")
    if plan.jobs[split_label(NODE_RUN)[1]].config["train"].get("engine") == "vllm":
        engines = done.get("engines") or []
        if [e.get("backend") for e in engines] != ["external_launcher"]:
            problems.append(f"{NODE_RUN}: engine {engines} is not one external_launcher engine")
        problems += policy_problems(NODE_RUN, engines, gpu, "raw_logprobs")
    return problems


def policy_problems(job: str, engines: list[dict[str, Any]], gpu: bool, logprobs: str | None) -> list[str]:
    """Engines whose sampling policy is not the one for their device: requests seeded on a CPU only, and the
    training rollouts' log-probs ``logprobs`` (None: a job that asks for none)."""
    want = {"requests_seeded": not gpu, "rollout_logprobs": logprobs}
    got = [{k: e.get(k) for k in want} for e in engines]
    return [f"{job}: an engine samples with {g}, not {want}" for g in got if g != want]


def difficulty_problems(samplers: dict[str, Any]) -> list[str]:
    """The difficulty job's ``samplers`` record: the student and the teacher each sampled in a process of its own,
    both children of the job's process, each with one engine."""
    if set(samplers) != {"student", "teacher"}:
        return [f"{DIFFICULTY_JOB}: its done.json records samplers {sorted(samplers)}, not the student's and the teacher's"]
    pids = [samplers[role]["pid"] for role in ("student", "teacher")]
    parents = {samplers[role]["parent_pid"] for role in ("student", "teacher")}
    if len(set(pids)) != 2 or len(parents) != 1 or parents & set(pids):
        return [f"{DIFFICULTY_JOB}: the two models did not sample in two processes of their own ({samplers})"]
    return []


def table(result: dict[str, Any]) -> str:
    rows = []
    for r in result["jobs"]:
        predicted = result["predicted"].get(r["job"], {})
        steps = "; ".join(f"{s['step']}: {s['wall_s']:.1f} s ({', '.join(f'{k} {v:.1f}' for k, v in s['phase_s'].items())}; "
                          f"{s['generated_tokens_per_s']:,.0f} generated tok/s)" for s in r.get("steps", [])) or "-"
        reserved = r.get("done", {}).get("cuda_max_memory_reserved_bytes")
        extra = [f"eval {', '.join(f'{x:.1f}' for x in r['eval_seconds'])} s"] if r.get("eval_seconds") else []
        extra += [f"checkpoint {', '.join(f'{x:.1f}' for x in r['checkpoint_seconds'])} s"] if r.get("checkpoint_seconds") else []
        rows.append([r["job"], r["attempt"], r["exit"], f"{r['seconds']:.1f}", f"{r['peak_memory_gib']:.1f}"
                     + (f" (torch reserved {reserved / GIB:.1f})" if reserved else ""),
                     predicted.get("peak_gib", "-"), predicted.get("peak_phase", "-"), steps, "; ".join(extra) or "-"])
    headers = ["job", "attempt", "exit", "wall s", "peak memory GiB (measured)", "peak GiB / GPU (planner)",
               "planner's peak phase", "steps: wall (phases) s", "evaluations, checkpoints"]
    return common.table(headers, rows)


def write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    args = parse_args(argv)
    memory = args.gpu_memory_gib or device_memory_gib()
    if args.preset == "gpu" and memory is None and not args.plan_only:
        print("gpu pilot: no GPU visible (nvidia-smi); nothing ran. --cpu-smoke runs the same jobs at toy shapes on "
              "the CPU.", file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpu-pilot-"))
    jobs = [j for j in JOBS if j in (args.jobs or JOBS)]
    cfg, plan = compose_plan(args, workdir / "results", memory)
    predicted, problems, engine = predictions(cfg, plan)
    node_cfg, node_plan = compose_plan(args, workdir / "results", memory, profile=NODE_PROFILE)
    node_predicted, node_problems_, node_engine = predictions(node_cfg, node_plan, NODE)
    predicted, problems = {**predicted, **node_predicted}, problems + node_problems_
    plans, engines = {"": plan, NODE: node_plan}, {"": engine, NODE: node_engine}
    need = checkpoint_bytes(cfg, plan)
    disk = None if args.no_resume or args.plan_only else disk_problem(workdir, need)
    result: dict[str, Any] = {"schema": SCHEMA, "preset": args.preset, "status": "running", "commit": common.commit(),
                              "resume": "untested (--no-resume)" if args.no_resume else "killed at update:1, resumed",
                              "checkpoint_gib": round(need / GIB, 1),
                              "versions": common.versions(), "device": {"gpu_memory_gib": memory, "cpu": common.cpu_model()},
                              "jobs_planned": jobs, "predicted": predicted, "jobs": []}
    print(f"gpu pilot ({args.preset}): {len(jobs)} jobs of profile=pilot on {cfg['hardware']['name']} "
          f"({cfg['hardware']['memory_gib']} GiB); the planner predicts per GPU:\n  " + "\n  ".join(
              f"{j}: {p['peak_gib']} GiB ({p['peak_phase']}), {60 * (p['hours'] or 0):.1f} min" for j, p in predicted.items()),
          flush=True)
    if problems:
        result["status"] = "refused: " + "; ".join(problems)
        write(args.json, result)
        print(f"gpu pilot: this GPU ({memory:.0f} GiB) is too small for the pilot's jobs; nothing ran:\n  "
              + "\n  ".join(problems), file=sys.stderr)
        return 2
    if args.plan_only:
        return 0
    if disk:
        result["status"] = "refused: " + disk
        write(args.json, result)
        print(f"gpu pilot: {disk}; nothing ran", file=sys.stderr)
        return 2
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    deadline, code = started + args.max_seconds, 0
    gpu = args.preset == "gpu"
    try:
        for job in jobs:
            attempts = [(1, f"update:{KILLED_AT}"), (2, None)] if job == OPD_RUN and not args.no_resume else [(1, None)]
            prefix, job_id = split_label(job)
            for attempt, fault in attempts:
                record = run_job(plans[prefix], job_id, logs, deadline, gpu=gpu, attempt=attempt, fault=fault,
                                 processes=args.base_processes if job == SPLIT_JOB else 1, engine=engines[prefix],
                                 label=job)
                result["jobs"].append(record)
                write(args.json, result)
                print(f"  {job} (attempt {attempt}{', fault ' + fault if fault else ''}): exit {record['exit']}, "
                      f"{record['seconds']} s, peak {record['peak_memory_gib']} GiB "
                      f"(planner: {predicted.get(job, {}).get('peak_gib', '-')})", flush=True)
                if record["exit"] != 0 and not fault:
                    raise RuntimeError(f"{job} failed (exit {record['exit']}); its log: {record['log']}")
        problems = expected(result["jobs"], plans, jobs, args.base_processes, gpu=gpu)
        result["status"] = "complete" if not problems else "incomplete: " + "; ".join(problems)
        code = 5 if problems else 0
    except TimeGuard as err:
        result["status"], code = f"stopped: {err}", 3
    except RuntimeError as err:
        result["status"], code = f"failed: {err}", 5
    result["wall_seconds"] = round(time.time() - started, 1)
    write(args.json, result)
    print(f"\n### GPU pilot, preset {args.preset} ({result['wall_seconds']} s in all)\n")
    print(table(result))
    print(f"\nJSON: {args.json} (status: {result['status']})")
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
