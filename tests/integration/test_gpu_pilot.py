"""The GPU pilot (``benchmarks/gpu_pilot.py``) end to end on CPU at toy shapes: its JSON's schema, positive and
finite figures, every row generated to the full length, a real backward (non-zero gradient norm), and the time guard
(exit 3 with the JSON of what finished). One subprocess, 20-45 s on 2 busy cores."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_pilot.py"

pytestmark = pytest.mark.timeout(240)

STEP_KEYS = {"step", "sequences", "sequence_tokens", "new_tokens_per_row", "seconds", "phase_seconds", "generated_tokens",
             "generation_tokens_per_s", "training_tokens_per_s", "achieved_flops_per_s", "mfu_measured_peak",
             "mfu_nominal_peak", "rollout_mfu_measured_peak", "train_mfu_measured_peak", "peak_memory_bytes",
             "phase_peak_memory_bytes", "ledger"}
POSITIVE = ("seconds", "generation_tokens_per_s", "training_tokens_per_s", "achieved_flops_per_s", "mfu_measured_peak",
            "rollout_mfu_measured_peak", "train_mfu_measured_peak", "peak_memory_bytes", "sequence_tokens")


def pilot(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "pilot.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cpu-smoke", "--json", str(out), *extra],
                          capture_output=True, text=True, timeout=200, cwd=REPO)
    assert out.is_file(), proc.stdout + proc.stderr
    return proc, json.loads(out.read_text())


def finite_positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_cpu_smoke_writes_the_pilot_json_and_table(tmp_path):
    proc, result = pilot(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["schema"] == "opdgrpo.gpu_pilot/1" and result["status"] == "complete"
    assert result["device"]["type"] == "cpu" and result["device"]["name"]
    assert {"torch", "transformers", "python"} <= set(result["versions"])
    assert finite_positive(result["peak"]["measured"]["flops_per_s"])
    autocast = result["peak"]["measured"]["autocast"]   # --precision auto: bf16 autocast where this CPU has it
    assert result["peak"]["measured"]["dtype"] == ("bfloat16" if autocast else "float32")
    assert result["peak"]["nominal_flops_per_s"] is None   # a CPU has no datasheet entry
    plan = result["plan"]
    assert plan["sequences"] == plan["prompts"] * plan["group"] and plan["micro_batches"] == 2

    assert [r["method"] for r in result["runs"]] == ["grpo", "opd"]
    for run in result["runs"]:
        assert run["status"] == "ok" and finite_positive(run["student_parameters"])
        assert (run["teacher"] is not None) == (run["method"] == "opd") == finite_positive(run["teacher_parameters"])
        assert finite_positive(run["state_bytes_after_step"]["optimizer_state"])
        assert [s["step"] for s in run["steps"]] == [0, 1]
        for step in run["steps"]:
            assert set(step) == STEP_KEYS
            bad = {k: step[k] for k in POSITIVE if not finite_positive(step[k])}
            assert not bad, bad
            assert step["mfu_nominal_peak"] is None and step["mfu_measured_peak"] < 1
            line = step["ledger"]
            # random weights and an EOS outside the vocabulary: every row runs to the full length, and it is counted
            assert line["tokens"]["completion"] == plan["sequences"] * plan["max_new_tokens"] == step["generated_tokens"]
            assert step["new_tokens_per_row"] == plan["max_new_tokens"]
            assert line["flops"]["rollout"] > 0 and line["flops"]["train"] > 0
            assert (line["flops"]["teacher"] > 0) == (run["method"] == "opd")
            assert line["step_flops"] == pytest.approx(sum(line["flops"].values()))
            assert finite_positive(line["grad_norm"]) and math.isfinite(line["loss"])   # a real backward and update
            assert 0 < line["reward"] < 1   # the synthetic reward: share of even token ids
            assert step["seconds"] >= step["phase_seconds"]["sample_and_score"] + step["phase_seconds"]["train_and_update"] - 1e-6
    assert "| method | student <- teacher |" in proc.stdout and "gpu pilot plan:" in proc.stdout


def test_time_guard_stops_with_exit_3_and_keeps_the_json(tmp_path, capsys):
    """In process (the subprocess's imports would double the test's time): a guard already spent stops before setup."""
    import logging
    import signal

    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_pilot

    handler, level = signal.getsignal(signal.SIGALRM), logging.getLogger("opdgrpo").level
    try:
        code = gpu_pilot.main(["--cpu-smoke", "--methods", "grpo", "--max-seconds", "0", "--json", str(tmp_path / "p.json")])
    finally:
        signal.signal(signal.SIGALRM, handler)
        logging.getLogger("opdgrpo").setLevel(level)
    result = json.loads((tmp_path / "p.json").read_text())
    assert code == 3 and result["status"].startswith("stopped: time guard") and result["runs"] == []
    assert "the JSON holds what finished" in capsys.readouterr().err
