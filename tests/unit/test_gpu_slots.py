"""GPU slots on one machine (opdgrpo.gpu_slots) and the launcher that claims them (opdgrpo.launch): processes racing
for slots get disjoint ones, all or none; a slot stays busy while any process of its job lives; a waiting job names
who holds what; the launcher sets the job's process count and devices and execs with the locks held."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from opdgrpo import gpu_slots
from opdgrpo.launch import job_out, with_processes

DEVICES = ["0", "1", "2", "3"]


def _python(code: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], stdout=subprocess.PIPE, text=True, **kw)


RACER = """
    import json, sys, time
    from opdgrpo import gpu_slots
    start = float(sys.argv[2])
    while time.time() < start:   # every racer asks at the same instant
        time.sleep(0.001)
    claim = gpu_slots.claim(sys.argv[1], ["0", "1", "2", "3"], 2, sys.argv[3], poll_s=0.05)
    time.sleep(0.4)
    print(json.dumps({"slots": claim.slots, "begin": claim.acquired_at, "end": time.time()}))
"""


def test_processes_racing_for_slots_get_disjoint_ones(tmp_path):
    """Five jobs of 2 slots on a machine of 4, started at once: at most two run together, and any two that run at the
    same time hold different slots."""
    start = time.time() + 1.0
    procs = [_python(RACER, str(tmp_path), str(start), f"job{i}") for i in range(5)]
    got = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(len(set(g["slots"])) == 2 for g in got)
    together = [(a, b) for i, a in enumerate(got) for b in got[i + 1:] if a["begin"] < b["end"] and b["begin"] < a["end"]]
    assert together, "no two jobs ran side by side"
    assert all(not set(a["slots"]) & set(b["slots"]) for a, b in together), got
    for g in got:   # never three at once
        assert sum(o["begin"] <= g["begin"] < o["end"] for o in got) <= 2, got


HOLDER = """
    import json, os, subprocess, sys, time
    from opdgrpo import gpu_slots
    claim = gpu_slots.claim(sys.argv[1], ["0"], 1, "parent")
    env = {**os.environ, gpu_slots.RECORD_ENV: json.dumps(claim.record())}
    # a worker as torchrun starts one: its descriptors closed; it takes its own lock from the record
    child = subprocess.Popen([sys.executable, "-c", "from opdgrpo import gpu_slots; gpu_slots.hold_from_env(); "
                              "print('held', flush=True); import time; time.sleep(60)"], env=env,
                             stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    print(child.pid, flush=True)
"""


def test_a_slot_stays_busy_while_any_process_of_its_job_lives(tmp_path):
    parent = _python(HOLDER, str(tmp_path))
    child = int(parent.communicate(timeout=60)[0].split()[-1])   # the claiming process has exited
    try:
        said = []
        with pytest.raises(TimeoutError):
            gpu_slots.claim(tmp_path, ["0"], 1, "next", say=said.append, poll_s=0.05, timeout_s=0.5)
        assert "job parent" in said[0] and f"pid {child}" in said[0], said
        assert gpu_slots.holders(gpu_slots.slot_path(tmp_path, "0")) == [child]
    finally:
        os.kill(child, 9)   # the job's last process: its lock goes with it
    got = _python("import sys; from opdgrpo import gpu_slots; print(gpu_slots.claim(sys.argv[1], ['0'], 1, 'next', "
                  "timeout_s=30).slots)", str(tmp_path)).communicate(timeout=60)[0]
    assert got.strip() == "(0,)"


def test_a_job_takes_all_its_slots_or_none_while_it_waits(tmp_path):
    holder = _python("import sys, time; from opdgrpo import gpu_slots; gpu_slots.claim(sys.argv[1], ['0', '1', '2'], 1, "
                     "'first'); print('ok', flush=True); time.sleep(60)", str(tmp_path))
    try:
        assert holder.stdout.readline().strip() == "ok"
        with pytest.raises(TimeoutError):   # 3 of 3 while one is held: waits, holding none
            gpu_slots.claim(tmp_path, ["0", "1", "2"], 3, "big", say=lambda _: None, poll_s=0.05, timeout_s=0.3)
        out = _python("import sys; from opdgrpo import gpu_slots; print(gpu_slots.claim(sys.argv[1], ['0', '1', '2'], 2, "
                      "'two', timeout_s=5).slots)", str(tmp_path)).communicate(timeout=60)[0]
        assert out.strip() == "(1, 2)"   # the free ones, not adjacent to the held one's order
        lines = gpu_slots.slots_status(tmp_path)
        assert lines[0].startswith("device 0: job first") and lines[1:] == ["device 1: free", "device 2: free"], lines
    finally:
        holder.kill()
        holder.wait()


def test_the_machines_devices_and_a_bad_count():
    assert gpu_slots.machine_devices(2, "3,5,7", 8) == ["3", "5"]
    assert gpu_slots.machine_devices(4, None, 0) == ["0", "1", "2", "3"]   # no GPU: slots stand for GPUs
    with pytest.raises(ValueError, match="machine.gpus is 4, but CUDA_VISIBLE_DEVICES names 2"):
        gpu_slots.machine_devices(4, "0,1", 8)
    with pytest.raises(ValueError, match="machine.gpus is 8, but CUDA sees 4 GPUs"):
        gpu_slots.machine_devices(8, None, 4)
    with pytest.raises(ValueError, match="asks for 5 GPU slots of a machine of 4"):
        gpu_slots.claim("/nonexistent", DEVICES, 5, "x")


def test_the_launcher_sets_the_count_and_finds_the_job():
    cmd = ["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "8", "-m", "opdgrpo.cli",
           "train", "--out", "results/p/runs/r/"]
    assert with_processes(cmd, 2)[5] == "2" and job_out(cmd) == "results/p/runs/r"
    assert with_processes(["torchrun", "--nproc-per-node=8", "x"], 4) == ["torchrun", "--nproc-per-node=4", "x"]
    assert job_out(["x", "--out=a/b"]) == "a/b" and job_out(["x"]) is None


PROBE = """
    import json, os, sys
    from opdgrpo import gpu_slots
    record = gpu_slots.record_of()
    held = record and gpu_slots.holders(gpu_slots.slot_path(record["dir"], record["devices"][0]))
    print(json.dumps({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "record": record, "pid": os.getpid(),
                      "held": held, "argv": sys.argv[1:]}))
"""


def _launch(tmp_path: Path, jobs: dict, slots: dict | None, out: str) -> dict:
    env = {**os.environ, gpu_slots.MACHINE_ENV: json.dumps({"jobs": jobs, "slots": slots})}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run([sys.executable, "-m", "opdgrpo.launch", "--", sys.executable, "-c", textwrap.dedent(PROBE),
                           "--out", out], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return {**json.loads(done.stdout), "stderr": done.stderr}


def test_the_launcher_claims_the_jobs_slots_and_execs_holding_them(tmp_path):
    slots = {"dir": str(tmp_path), "devices": DEVICES}
    got = _launch(tmp_path, {"res/p/runs/r": 2}, slots, "res/p/runs/r")
    assert got["visible"] == "0,1" and got["record"]["slots"] == [0, 1] and got["held"] == [got["pid"]]
    assert "gpu slots: job res/p/runs/r on 2 GPU(s): slots 0,1 (CUDA_VISIBLE_DEVICES=0,1)" in got["stderr"]
    tokenizer = _launch(tmp_path, {"res/p/runs/r": 2}, slots, "res/p/base/tokenizer")   # no GPU: sees none
    assert tokenizer["visible"] == "" and tokenizer["record"] is None
    under_slurm = _launch(tmp_path, {"res/p/runs/r": 2}, None, "res/p/runs/r")          # SLURM assigns: untouched
    assert under_slurm["visible"] is None and under_slurm["record"] is None
