"""The GPU pilot (``benchmarks/gpu_pilot.py``) on CPU, its preset for CI: the six jobs of ``profile=pilot`` at toy
shapes through the rules' own commands (training under torchrun, FSDP2 on one process, vLLM under
``external_launcher``, its step-0 evaluation first), S2's difficulty job with each model's engine in a process of
its own, the OPD run killed after its first checkpoint and resumed, the 32B-shaped base evaluation split over 2
processes with an engine each; then the node profile's math expert (profile=node-pilot: GRPO on one process after its
tokenizer and base jobs); the refusal of a GPU too small for the paper shapes; the time guard. About 3 minutes on 2
cores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_pilot.py"

pytestmark = pytest.mark.timeout(600)


def _in_process(*argv: str) -> int:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_pilot

    return gpu_pilot.main(list(argv))


def _failed_log_tails(logs: Path) -> str:
    """The last lines of every job log that says it failed: the pilot's own message only names the file, which pytest
    removes with its temporary directory."""
    tails = []
    for log in sorted(logs.glob("*.log")) if logs.is_dir() else []:
        lines = log.read_text(errors="replace").splitlines()
        if any(word in line for line in lines for word in ("error", "Error", "Traceback")):
            tails.append(f"\n--- {log.name} (last 25 lines)\n" + "\n".join(lines[-25:]))
    return "".join(tails)


def test_cpu_preset_runs_the_pilot_jobs_kills_and_resumes_the_opd_run(tmp_path):
    pytest.importorskip("vllm", reason="the pilot samples with vLLM (scripts/install.sh --vllm)")
    out = tmp_path / "pilot.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cpu-smoke", "--json", str(out), "--workdir", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=580, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr + _failed_log_tails(tmp_path / "w" / "logs")
    result = json.loads(out.read_text())
    assert result["schema"] == "opdgrpo.gpu_pilot/2" and result["status"] == "complete"
    jobs = [(r["job"], r["attempt"]) for r in result["jobs"]]
    assert jobs == [("tokenizer", 1), ("base-student", 1), ("base-teacher_8b", 1), ("difficulty-math-teacher_8b", 1),
                    ("opd-teacher_8b-code-s0", 1), ("opd-teacher_8b-code-s0", 2), ("base-model_32b", 1),
                    ("node/tokenizer", 1), ("node/base-student", 1), ("node/grpo-student-math-s0", 1)]
    selection, killed, resumed, split = result["jobs"][3:7]
    node = result["jobs"][-1]   # the node profile's math expert on one process, two steps, its engine under torchrun
    assert node["exit"] == 0 and [s["step"] for s in node["steps"]] == [0, 1] and node["done"]["processes"] == 1
    assert [(e["backend"], e["requests_seeded"], e["rollout_logprobs"]) for e in node["done"]["engines"]] == \
        [("external_launcher", True, "raw_logprobs")]
    assert result["predicted"]["node/grpo-student-math-s0"]["engine_starts"] is True
    samplers = selection["done"]["samplers"]   # one process per model, each the job's child, each with one engine
    assert selection["exit"] == 0 and len({samplers["student"]["pid"], samplers["teacher"]["pid"]}) == 2
    assert samplers["student"]["parent_pid"] == samplers["teacher"]["parent_pid"] != samplers["student"]["pid"]
    assert [samplers[role]["engine"]["backend"] for role in ("student", "teacher")] == ["uni", "uni"]
    assert {(samplers[r]["engine"]["requests_seeded"], samplers[r]["engine"]["rollout_logprobs"]) for r in samplers} \
        == {(True, None)}   # a CPU: seeded requests; S2 asks for no log-probs
    assert split["done"]["processes"] == 2 and [(e["backend"], e["local_rank"]) for e in split["done"]["engines"]] == \
        [("external_launcher", 0), ("external_launcher", 1)]
    assert killed["fault"] == "update:1" and killed["exit"] != 0 and [s["step"] for s in killed["steps"]] == [0]
    assert killed["checkpoint_seconds"] and killed["eval_seconds"]   # step 0's evaluation and checkpoint, then killed
    assert resumed["exit"] == 0 and [s["step"] for s in resumed["steps"]] == [0, 1]
    assert [e["backend"] for e in resumed["done"]["engines"]] == ["external_launcher"] and resumed["done"]["processes"] == 1
    assert [(e["requests_seeded"], e["rollout_logprobs"]) for e in resumed["done"]["engines"]] == [(True, "raw_logprobs")]
    for step in resumed["steps"]:
        assert set(step["phase_s"]) == {"sample", "fixed_logprobs", "train"} and step["generated_tokens_per_s"] > 0
        assert step["flops"]["teacher"] > 0 and step["flops"]["train"] > 0
    for record in result["jobs"]:
        assert record["seconds"] > 0 and record["peak_memory_gib"] > 0, record
    for job in ("base-model_32b", "base-student", "base-teacher_8b", "difficulty-math-teacher_8b", "opd-teacher_8b-code-s0"):
        assert result["predicted"][job]["peak_gib"] > 0, job
        assert result["predicted"][job]["engine_starts"] is True, job
    base = tmp_path / "w" / "results" / "pilot" / "base" / "model_32b" / "checkpoint"
    assert (base / "random_init.json").is_file() and not list(base.glob("*.safetensors"))   # nothing but configs
    assert "| job | attempt | exit |" in proc.stdout


def test_a_gpu_too_small_for_the_paper_shapes_is_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "p.json"
    code = _in_process("--gpu-memory-gib", "40", "--json", str(out), "--workdir", str(tmp_path / "w"))
    err = capsys.readouterr().err
    assert code == 2 and "too small" in err and "base-model_32b" in err and "opd-teacher_8b-code-s0" in err
    result = json.loads(out.read_text())
    assert result["status"].startswith("refused:") and result["jobs"] == []
    assert not (tmp_path / "w" / "logs").exists()


def test_time_guard_stops_with_exit_3_and_keeps_the_json(tmp_path):
    out = tmp_path / "p.json"
    code = _in_process("--cpu-smoke", "--max-seconds", "0", "--json", str(out), "--workdir", str(tmp_path / "w"))
    result = json.loads(out.read_text())
    assert code == 3 and result["status"].startswith("stopped:") and result["jobs"] == []


def test_a_disk_too_small_for_two_checkpoints_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    """The lent H200 had 64 GiB free; the kill and resume keep two 45 GiB checkpoints of the 4B student at once."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_pilot

    monkeypatch.setattr(gpu_pilot.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 64 * 2**30})())
    out = tmp_path / "p.json"
    code = gpu_pilot.main(["--gpu-memory-gib", "139", "--json", str(out), "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err
    assert code == 2 and "two checkpoints of 45.0 GiB" in err and "64.0 GiB free" in err and "--no-resume" in err
    result = json.loads(out.read_text())
    assert result["status"].startswith("refused:") and result["jobs"] == [] and result["checkpoint_gib"] == 45.0
    assert not (tmp_path / "w" / "logs").exists()
