"""A slice of the paper DAG's rehearsal and smoke runs on a real one-node SLURM cluster (munge, slurmctld, slurmd on
127.0.0.1) through the SLURM profile (workflow/profiles/slurm, snakemake-executor-plugin-slurm): the rehearsal's S4
multi-teacher distillation, on 2 processes started by torchrun inside its allocation with a vLLM engine per process,
and the report, against the session's local rehearsal (``rehearsal_dag``, tests/e2e/conftest.py); a 2-process
smoke run with a 2-minute time limit on a proctrack/cgroup cluster (where SLURM's warning reaches only the job step's
Snakemake), each attempt of which but the last stops itself before its limit (opdgrpo.train.time_limit), saves a
checkpoint that takes 12 s, exits 130 and is resubmitted by Snakemake until it completes, every step once, its
ledger equal to an uninterrupted run's (a resume by a second
`snakemake` call after a stop is the same checkpoint path: tests/integration/test_train.py, test_distributed.py,
test_fsdp.py, and the rehearsal's killed run); and a retry after a real error (a NaN stop) that refuses to train.

Needs root and apt-get (Debian/Ubuntu) to install and start the daemons; skipped with the reason otherwise. The
time-limited run and the refused retry copy their upstream (tokenizer, student) from the session's smoke DAG
(``smoke_dag``), the slice its upstream from the rehearsal: this module alone builds both."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import pandas as pd
import pytest

from opdgrpo.train.step_stats import TIMING_KEYS

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ["munge", "slurmctld", "slurmd", "slurm-client"]
SLURM_CONF = Path("/etc/slurm/slurm.conf")  # the plugin's job step drops SLURM_CONF (every SLURM_* variable)
CGROUP_CONF = SLURM_CONF.parent / "cgroup.conf"
FIRST_POLL_S = 5                             # --slurm-init-seconds-before-status-checks
# The plugin lengthens its wait between status checks by 10 s after each check that finds no job finished (5, 15,
# 25, ... s, up to 180 s: a job that ends at 50 s is seen at 80 s), which on a real cluster spares the controller.
# Here the controller is ours and every job is short: the main Snakemake caps that wait at POLL_S (its
# `next_seconds_between_status_checks` setter clamped before the CLI starts), so a finished job is seen within
# POLL_S. Only when Snakemake learns of a job's end changes; the profile, the plugin's submission, its status
# parsing and the resubmissions are the real ones.
POLL_S = 5
SLURM_SNAKEMAKE = [sys.executable, "-c", (
    "from snakemake_executor_plugin_slurm import Executor\n"
    "wait = Executor.next_seconds_between_status_checks\n"
    f"Executor.next_seconds_between_status_checks = property(wait.fget, lambda self, s: wait.fset(self, min(s, {POLL_S})))\n"
    "from snakemake.cli import main\n"
    "main()\n"), "--snakefile", str(REPO / "Snakefile")]
PARTITION = "opdgrpo"

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]


def _sh(*cmd: str, check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, timeout=timeout, **kw)


def _installed() -> bool:
    return all(shutil.which(b) for b in ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel"))


def _real_memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return max(1024, int(line.split()[1]) // 1024 - 2048)   # below the machine's: slurmd refuses more
    raise RuntimeError("no MemTotal in /proc/meminfo")


def _slurm_conf(host: str, state: Path, proctrack: str) -> str:
    """A one-node cluster. ``proctrack``: ``cgroup``, as SchedMD recommends and most GPU clusters run (a signal to a
    job step reaches only its tasks, the direct children of slurmstepd; the step's end SIGKILLs every process in its
    cgroup), else ``linuxproc`` (signals reach every descendant) where this machine's cgroups cannot host it."""
    return "\n".join([
        "ClusterName=opdgrpo-test",
        f"SlurmctldHost={host}(127.0.0.1)",
        "SlurmUser=root",
        "AuthType=auth/munge",
        f"ProctrackType=proctrack/{proctrack}",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "SchedulerType=sched/backfill",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MinJobAge=3600",   # finished jobs stay visible to squeue polling and to `scontrol show job` (no slurmdbd)
        "ReturnToService=2",
        "KillWait=30",      # SLURM's default: SIGKILL 30 s after the time limit's SIGTERM
        "SlurmctldPort=6817",
        "SlurmdPort=6818",
        f"StateSaveLocation={state}/ctld",
        f"SlurmdSpoolDir={state}/d",
        f"SlurmctldPidFile={state}/slurmctld.pid",
        f"SlurmdPidFile={state}/slurmd.pid",
        f"SlurmctldLogFile={state}/slurmctld.log",
        f"SlurmdLogFile={state}/slurmd.log",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={_real_memory_mb()} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={host} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """Install (once) and start munged, slurmctld and slurmd; stop exactly these daemons afterwards."""
    pytest.importorskip("snakemake_executor_plugin_slurm", reason="the slurm extra is not installed: pip install -e '.[slurm]'")
    if os.geteuid() != 0:
        pytest.skip("SLURM integration test needs root to install and start munge/slurmctld/slurmd")
    if not _installed():
        if not shutil.which("apt-get"):
            pytest.skip("SLURM integration test needs apt-get to install munge/slurmctld/slurmd/slurm-client")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        done = subprocess.run(["apt-get", "install", "-y", *PACKAGES], capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            done = subprocess.run(["sh", "-c", "apt-get update && apt-get install -y " + " ".join(PACKAGES)],
                                  capture_output=True, text=True, env=env, timeout=900)
        if done.returncode != 0 or not _installed():
            pytest.skip(f"could not install SLURM with apt-get: {done.stderr[-1000:]}")
    for daemon in ("munged", "slurmctld", "slurmd"):
        if _sh("pgrep", "-x", daemon, check=False).returncode == 0:
            pytest.skip(f"a {daemon} is already running on this machine; not touching someone else's cluster")
    if SLURM_CONF.exists() and "opdgrpo-test" not in SLURM_CONF.read_text():
        pytest.skip(f"{SLURM_CONF} exists and is not ours; not overwriting a real cluster's configuration")

    state = tmp_path_factory.mktemp("slurm")
    for sub in ("ctld", "d"):
        (state / sub).mkdir()
    host = socket.gethostname().split(".")[0]
    wrote_conf, wrote_cgroup_conf = not SLURM_CONF.exists(), not CGROUP_CONF.exists()
    SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
    if wrote_cgroup_conf:   # proctrack/cgroup only (TaskPlugin stays task/none): no CPU or memory constraints
        CGROUP_CONF.write_text("# opdgrpo-test\nCgroupPlugin=autodetect\nCgroupMountpoint=/sys/fs/cgroup\n")
    run_munge = Path("/run/munge")
    run_munge.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_munge, "munge", "munge")
    if not Path("/etc/munge/munge.key").exists():
        _sh("runuser", "-u", "munge", "--", "mungekey", "--create")

    procs: dict[str, subprocess.Popen] = {}
    logs: dict = {}
    try:
        logs = {name: open(state / f"{name}.out", "w") for name in ("munged", "slurmctld", "slurmd")}
        procs["munged"] = subprocess.Popen(["munged", "-F"], user="munge", group="munge", extra_groups=[],
                                           stdout=logs["munged"], stderr=subprocess.STDOUT)
        time.sleep(1)
        proctrack = "cgroup"
        if not _cluster_up(procs, logs, host, state, proctrack):   # this machine's cgroups cannot host it
            _stop(procs, ("slurmd", "slurmctld"))
            proctrack = "linuxproc"
            print("WARNING: proctrack/cgroup did not start here; the SLURM tests run under proctrack/linuxproc, where "
                  "a job step's signal reaches every process (not what most GPU clusters run)")
            assert _cluster_up(procs, logs, host, state, proctrack), (state / "slurmd.out").read_text()[-2000:]
        yield {"host": host, "state": state, "proctrack": proctrack}
    finally:
        _sh("scancel", "--partition", PARTITION, check=False)
        _stop(procs, ("slurmd", "slurmctld", "munged"))   # exactly the daemons started here, by PID
        for f in logs.values():
            f.close()
        if wrote_conf:
            SLURM_CONF.unlink(missing_ok=True)
        if wrote_cgroup_conf:
            CGROUP_CONF.unlink(missing_ok=True)
        left = [name for name in ("munged", "slurmctld", "slurmd") if _sh("pgrep", "-x", name, check=False).returncode == 0]
        assert not left, f"daemons still running after teardown: {left}"


def _cluster_up(procs: dict, logs: dict, host: str, state: Path, proctrack: str) -> bool:
    """Write slurm.conf with ``proctrack``, start slurmctld and slurmd, and wait for the node to be idle (False if
    slurmd gives up: proctrack/cgroup needs a cgroup hierarchy it can create a job's groups in)."""
    SLURM_CONF.write_text(_slurm_conf(host, state, proctrack))
    procs["slurmctld"] = subprocess.Popen(["slurmctld", "-D", "-i"], stdout=logs["slurmctld"], stderr=subprocess.STDOUT)
    time.sleep(1)
    procs["slurmd"] = subprocess.Popen(["slurmd", "-D", "-N", host], stdout=logs["slurmd"], stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline:
        info = _sh("sinfo", "-h", "-o", "%T", check=False)
        if info.returncode == 0 and info.stdout.strip().startswith("idle"):
            return True
        if procs["slurmd"].poll() is not None:
            return False
        assert procs["slurmctld"].poll() is None, (state / "slurmctld.out").read_text()[-2000:]
        time.sleep(1)
    return False


def _stop(procs: dict, names: Sequence[str]) -> None:
    for name in names:
        p = procs.get(name)
        if p and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def slurm_snakemake(workdir: Path, *args: str, timeout_s: int = 600) -> list[str]:
    """Snakemake through the SLURM profile, with the test cluster's site settings. Snakemake ignores SIGTERM while
    jobs run but stops on SIGINT, hence `timeout -s INT`. The training rules' warning lead comes from the plan
    (`resources.train.signal_lead_s` where the profile has no `hardware` block)."""
    return ["timeout", "-s", "INT", str(timeout_s), *SLURM_SNAKEMAKE, "--directory", str(workdir),
            "--workflow-profile", str(REPO / "workflow" / "profiles" / "slurm"),
            "--default-resources", f"slurm_partition={PARTITION}",
            "--slurm-no-account",                                  # no slurmdbd here: no accounts to check
            "--slurm-status-command", "squeue",                    # sacct hangs without slurmdbd
            "--slurm-init-seconds-before-status-checks", str(FIRST_POLL_S),
            "--latency-wait", "5", "--jobs", "4", *args]


TIMING = TIMING_KEYS


def _ledger(run_dir: Path) -> list[dict]:
    path = run_dir / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


#: A slice of the paper DAG's rehearsal (profile=rehearsal; tests/e2e/test_rehearsal.py) through SLURM: S4's
#: multi-teacher OPD on 2 processes with a vLLM engine per process, and the report. Everything else of S4 (the
#: tokenizers, the random base models, the two GRPO experts, joint GRPO) is copied from the session's local
#: rehearsal, with Snakemake's records of it; S2 is left out. Until the rehearsal existed this was the smoke DAG's S4
#: on 1 process, and a separate 2-process smoke run.
REHEARSAL = "results/rehearsal"
SLICE = ("opd-experts-math+code-s0",)
COPIED = (f"{REHEARSAL}/base", *(f"{REHEARSAL}/runs/{run}" for run in
                                 ("grpo-student-math-s0", "grpo-student-code-s0", "grpo-student-math+code-s0")),
          ".snakemake/metadata")
DROPPED = ("~studies.S2",)
DAG_CONFIG = ("--config", "profile=rehearsal", f"overrides=[{','.join(DROPPED)}]")
#: For the time-limited run: the smoke DAG's tokenizer and student.
UPSTREAM = ("results/smoke/base/tokenizer", "results/smoke/base/student", ".snakemake/metadata")


@pytest.fixture(scope="module")
def slurm_and_local_dags(slurm_cluster, rehearsal_dag, tmp_path_factory):
    """The rehearsal's S4 slice through SLURM, and the whole rehearsal run locally (the session's
    ``rehearsal_dag``): dropping S2 leaves every remaining job's config as it is (checked in the test), so its S4
    rows are what the local rehearsal gives."""
    slurm_dir = tmp_path_factory.mktemp("slurm_dag")
    for rel in COPIED:   # built locally (copytree keeps mtimes: Snakemake sees them current)
        shutil.copytree(rehearsal_dag.workdir / rel, slurm_dir / rel)
    t0 = time.time()
    done = subprocess.run(slurm_snakemake(slurm_dir, *DAG_CONFIG), capture_output=True, text=True, timeout=700)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    print(f"the rehearsal's S4 distillation and report through SLURM: {time.time() - t0:.0f} s")
    return slurm_dir, rehearsal_dag.workdir, done.stdout + done.stderr


def test_rehearsal_slice_through_slurm_matches_the_local_run(slurm_and_local_dags):
    from opdgrpo.config import compose
    from opdgrpo.plan.build import build_plan

    slurm_dir, local_dir, log = slurm_and_local_dags
    subset = build_plan(compose(["profile=rehearsal", *DROPPED], REPO / "conf")).jobs
    whole = build_plan(compose(["profile=rehearsal"], REPO / "conf")).jobs
    assert {j: job.config for j, job in subset.items()} == {j: whole[j].config for j in subset}   # the same jobs
    assert "jobid" in log.lower(), log[-2000:]   # the jobs went through sbatch
    ran = set(re.findall(r"^rule (\w+):", log, flags=re.M))
    assert ran == {"opd", "report"}, ran                          # the slice, nothing upstream
    slurm_curves = pd.read_csv(slurm_dir / REHEARSAL / "report" / "curves.csv")
    local_curves = pd.read_csv(local_dir / REHEARSAL / "report" / "curves.csv")
    assert set(slurm_curves["study"]) == {"S4"} and "S2" in set(local_curves["study"])
    local_curves = local_curves[local_curves["study"] == "S4"].reset_index(drop=True)
    assert list(slurm_curves.columns) == list(local_curves.columns) and len(slurm_curves) == len(local_curves)
    keys = ["run", "study", "method", "train_domains", "seed", "step", "eval_domain", "eval_set"]   # a run shows in several studies
    merged = slurm_curves.merge(local_curves, on=keys, how="outer", suffixes=("_slurm", "_local"), indicator=True)
    assert (merged["_merge"] == "both").all(), merged[merged["_merge"] != "both"][keys]
    values = [c for c in local_curves.columns if c not in keys]
    a, b = merged[[f"{c}_slurm" for c in values]].to_numpy(), merged[[f"{c}_local" for c in values]].to_numpy()
    differ = merged[((a != b) & ~(pd.isna(a) & pd.isna(b))).any(axis=1)]
    assert differ.empty, f"curve rows differ between SLURM and local runs:\n{differ[keys].to_string()}"
    for run in SLICE:   # the same steps, FLOPs, tokens and numbers as the local run
        slurm_ledger, local_ledger = _ledger(slurm_dir / REHEARSAL / "runs" / run), _ledger(local_dir / REHEARSAL / "runs" / run)
        assert [{k: v for k, v in r.items() if k not in TIMING} for r in slurm_ledger] == \
            [{k: v for k, v in r.items() if k not in TIMING} for r in local_ledger], run


def test_a_job_with_two_processes_runs_them_inside_its_allocation(slurm_and_local_dags):
    """`resources.train.processes=2` (what gpu=2 gives on a GPU cluster): the rule starts 2 processes with torchrun
    inside the one SLURM job, each with its own vLLM engine at its own local rank, and they train one run together."""
    slurm_dir, _, log = slurm_and_local_dags
    assert "cpus_per_task=2" in log                               # the training jobs asked SLURM for 2 CPUs
    for run in SLICE:
        run_dir = slurm_dir / REHEARSAL / "runs" / run
        summary = json.loads((run_dir / "done.json").read_text())
        assert summary["processes"] == 2
        assert [(e["backend"], e["local_rank"], e["engine_world"]) for e in summary["engines"]] == \
            [("external_launcher", 0, 2), ("external_launcher", 1, 2)]
        assert [r["step"] for r in _ledger(run_dir)] == list(range(summary["steps"]))


# A run longer than its allocation, stopped the way a GPU cluster stops it: a 2-minute time limit, SLURM's warning
# (`--signal=URG@40`, the rule's lead) and proctrack/cgroup, under which that warning reaches only the job step's
# task, the inner Snakemake (which ignores it), never torchrun or its workers. The trainer stops itself:
# it reads its job's end time from SLURM and, once the next step and a checkpoint save (plus a 30-s margin) no longer
# fit, saves and exits 130 (opdgrpo.train.time_limit); every save lasts at least SAVE_S (OPDGRPO_FAULT=checkpoint_s,
# as a large model's write and hash on a shared filesystem would), and the job must end, save complete, before its
# time limit. Snakemake resubmits it (the profile's preemptible-retries) until the run completes. Steps last at least
# PACE_S (OPDGRPO_FAULT=pace: a sleep, numbers unchanged), so the run needs 112 s of steps: more than one allocation
# on any machine (2 attempts, about 3 minutes in all), and a trainer that does not stop itself (the rules of
# 1fe98d4) runs past its time limit, since no warning reaches it. 2 processes under torchrun, as a GPU node's runs.
LIMITED_RUN = "grpo-student-math-s0"
LIMITED_STEPS, PACE_S, SAVE_S = 280, 0.4, 12
LIMIT_MIN, WARNING_S, PROCESSES = 2, 40, 2


def _job_times(job: str) -> dict[str, float]:
    """StartTime, EndTime (seconds since the epoch) and TimeLimit (seconds) of a finished SLURM job, from slurmctld's
    record (MinJobAge keeps it; there is no slurmdbd here)."""
    shown = _sh("scontrol", "show", "job", "-o", job).stdout
    fields = dict(f.split("=", 1) for f in shown.split() if "=" in f)
    h, m, sec = (int(x) for x in fields["TimeLimit"].split(":"))
    return {"start": time.mktime(time.strptime(fields["StartTime"], "%Y-%m-%dT%H:%M:%S")),
            "end": time.mktime(time.strptime(fields["EndTime"], "%Y-%m-%dT%H:%M:%S")),
            "limit": 3600.0 * h + 60.0 * m + sec, "state": fields["JobState"]}


@pytest.fixture(scope="module")
def time_limited_run(slurm_cluster, smoke_dag, tmp_path_factory):
    """The run through SLURM with a 2-minute limit, and the same job config uninterrupted, by hand, next to it."""
    from opdgrpo.config import compose
    from opdgrpo.plan.build import build_plan

    workdir = tmp_path_factory.mktemp("time_limited")
    # fp32: the test is about resume bookkeeping, compared bit for bit with an uninterrupted run. Once, in a full
    # suite on a loaded Xeon with AMX, the SLURM run's bf16 backward differed from the reference's from step 2 (grad
    # norm 0.3954 against 0.3958, the loss equal) while the test alone matched; float32 keeps AMX's bf16 kernels out.
    # Checkpoints only at stops and at the end (each save lasts SAVE_S); an evaluation every 40 steps.
    overrides = [f"methods.grpo.steps={LIMITED_STEPS}", f"resources.train.runtime={LIMIT_MIN}",
                 f"++resources.train.signal_lead_s={WARNING_S}", f"++resources.train.processes={PROCESSES}",
                 "train.precision=fp32", f"train.checkpoint_every={10 * LIMITED_STEPS}", "train.eval_every=40"]
    args = (f"results/smoke/runs/{LIMITED_RUN}/done.json", "--config", "profile=smoke", f"overrides=[{','.join(overrides)}]")
    t0 = time.time()
    for rel in UPSTREAM:   # tokenizer and student, built locally (copytree keeps mtimes: Snakemake sees them current)
        shutil.copytree(smoke_dag / rel, workdir / rel)
    t_up = time.time()
    # the job config exactly as the rule passes it (workflow/rules/common.smk job_config: sorted keys)
    cfg = build_plan(compose(["profile=smoke", *overrides], REPO / "conf")).jobs[LIMITED_RUN].config
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc_per_node",
                str(PROCESSES), "-m", "opdgrpo.cli"]   # as the rule starts it, uninterrupted
    reference = subprocess.Popen([*torchrun, "train", "--out", "reference", "--config-json", json.dumps(cfg, sort_keys=True)],
                                 cwd=workdir, env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = subprocess.run(slurm_snakemake(workdir, *args), capture_output=True, text=True, timeout=700,
                          env={**os.environ, "OPDGRPO_FAULT": f"pace:{PACE_S},checkpoint_s:{SAVE_S}"})   # sbatch --export=ALL
    ref_out, _ = reference.communicate(timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert reference.returncode == 0, ref_out[-3000:]
    assert "rule pretrain" not in done.stdout + done.stderr and "rule tokenizer" not in done.stdout + done.stderr
    print(f"upstream copied {t_up - t0:.0f} s; the run through SLURM with a {LIMIT_MIN}-minute limit "
          f"(and the reference beside it) {time.time() - t_up:.0f} s")
    return workdir, done.stdout + done.stderr


def test_a_run_longer_than_its_time_limit_stops_itself_saves_and_resumes(time_limited_run, slurm_cluster):
    from opdgrpo.attempts import records

    workdir, out = time_limited_run
    run_dir = workdir / "results" / "smoke" / "runs" / LIMITED_RUN
    seen = records(run_dir)
    begins = [r for r in seen if "begin" in r]
    ends = [r for r in seen if "end" in r]
    print("attempts:", json.dumps(seen, indent=None))
    assert len(begins) >= 2, seen                                              # cut at least once
    assert [r["attempt"] for r in begins] == list(range(1, len(begins) + 1))   # Snakemake's attempts 1, 2, ...
    assert len({r["slurm_job"] for r in begins}) == len(begins)                # each its own allocation
    for begin in begins:   # no attempt ran past its limit (a trainer that never stops does, until killed)
        job = _job_times(begin["slurm_job"])
        assert job["end"] - job["start"] <= job["limit"], (begin, job)
    # Every attempt but the last stopped on its own before its allocation ended, its save complete: under
    # proctrack/cgroup the warning never reached it, so the reason is the time limit it read from SLURM
    assert [r["end"] for r in ends] == ["interrupted"] * (len(begins) - 1) + ["done"], seen
    reason = "SLURM job" if slurm_cluster["proctrack"] == "cgroup" else ("SLURM job", "signal 15")
    for begin, end in zip(begins, ends[:-1]):
        assert end["why"].startswith(reason), end
        assert int(end["at"]) <= _job_times(begin["slurm_job"])["end"], end    # the job ended after the save
    # Who SLURM's signals reach: the trainer's launcher is torchrun, whose parent is the step's task, the inner
    # Snakemake (the rules exec the launcher: no shell between them), whose parent is slurmstepd
    assert all(r["launched_by"] == ["torch.distributed.run", "snakemake", "slurmstepd"] for r in begins), begins
    starts = [r["step"] for r in begins]
    assert starts[0] == 0 and all(a < b for a, b in zip(starts, starts[1:]))   # every attempt made progress
    assert [r["step"] for r in ends[:-1]] == starts[1:]                        # each resumed where the last stopped
    # Snakemake deletes the job log before each attempt; the last one's log starts with every earlier attempt
    log = (workdir / "results" / "smoke" / "logs" / f"{LIMITED_RUN}.log").read_text()
    for r, e in zip(begins[:-1], ends):
        assert (f"== attempt {r['attempt']} (SLURM job {r['slurm_job']}, began {r['begin']}): from step {r['step']}, "
                f"{e['end']} at checkpoint step {e['step']}") in log, log[:3000]
    last = begins[-1]
    assert f"== attempt {last['attempt']} (SLURM job {last['slurm_job']}): resuming at step {last['step']}" in log
    assert f"resuming {LIMITED_RUN} at step {last['step']}" in log
    saved = re.search(rf"checkpoint run={LIMITED_RUN} step={LIMITED_STEPS} seconds=([0-9.]+)", log)
    assert saved and float(saved.group(1)) >= SAVE_S, log[-3000:]             # a save takes SAVE_S
    assert f"== attempt {last['attempt']}: done at checkpoint step {LIMITED_STEPS}" in log
    assert "Error in rule grpo" in out and "== attempt 1 (SLURM job" in out, out[-3000:]   # shown as a failed job log

    ledger, reference = _ledger(run_dir), _ledger(workdir / "reference")
    assert [r["step"] for r in ledger] == list(range(LIMITED_STEPS))          # every step exactly once
    assert len(reference) == LIMITED_STEPS
    for cut, whole in zip(ledger, reference):                                  # the same steps, FLOPs, tokens, numbers
        assert {k: v for k, v in cut.items() if k not in TIMING} == {k: v for k, v in whole.items() if k not in TIMING}
    summary, ref_summary = (json.loads((d / "done.json").read_text()) for d in (run_dir, workdir / "reference"))
    assert summary["processes"] == PROCESSES and summary["collective_timeout_s"] == 1800   # the plan's, no hardware block
    assert summary["cumulative_flops"] == ref_summary["cumulative_flops"] == ledger[-1]["cumulative_flops"]
    assert summary["final_eval"] == ref_summary["final_eval"]


def test_a_retry_after_a_real_error_does_not_train(time_limited_run):
    """A real error is not trained into again: the run stops at a NaN loss (exit 3), its retry refuses in seconds
    (exit 4, before loading a model) and Snakemake reports the failure."""
    from opdgrpo.attempts import records

    workdir, _ = time_limited_run
    run = "grpo-student-code-s0"
    args = (f"results/smoke/runs/{run}/done.json", "--config", "profile=smoke", "overrides=[methods.grpo.steps=2]",
            "--preemptible-retries", "1")
    t0 = time.time()
    done = subprocess.run(slurm_snakemake(workdir, *args), capture_output=True, text=True, timeout=400,
                          env={**os.environ, "OPDGRPO_FAULT": "nan_loss:1"})
    assert done.returncode != 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = records(workdir / "results" / "smoke" / "runs" / run)
    assert [(r["attempt"], r.get("end", "begin")) for r in seen] == [(1, "begin"), (1, "nonfinite")], seen
    log = (workdir / "results" / "smoke" / "logs" / f"{run}.log").read_text()
    assert "error: attempt 2: not training, attempt 1 ended nonfinite" in log, log[-3000:]
    assert not (workdir / "results" / "smoke" / "runs" / run / "done.json").exists()
    print(f"a NaN stop, then a refused retry, through SLURM: {time.time() - t0:.0f} s")


def test_the_profiles_placeholders_stop_a_run_before_any_submission(slurm_cluster, tmp_path):
    """The SLURM profile as shipped names no partition or account (`EDIT-ME-...`): the run stops before its first
    sbatch, naming both settings, instead of sbatch refusing job after job."""
    cmd = [c for c in slurm_snakemake(tmp_path, "--config", "profile=smoke") if c not in (f"slurm_partition={PARTITION}",
                                                                                          "--default-resources", "--slurm-no-account")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert "default-resources.slurm_partition is 'EDIT-ME-partition'" in out and "slurm_account" in out, out[-3000:]
    assert "jobid" not in out.lower() and not (tmp_path / "results").exists(), out[-3000:]
