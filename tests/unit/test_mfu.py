"""MFU per run: achieved FLOP/s in every ledger line, the run's mean and MFU in done.json, the table in mfu.md."""

from __future__ import annotations

import json
import time

import pytest
import torch

from opdgrpo.report.mfu import mfu_markdown
from opdgrpo.runio import write_json
from opdgrpo.train.peak import LAYOUTS, matmul_dtype, matmul_peak, mfu_summary, run_peak

PEAK_KEYS = {"flops_per_s", "median_flops_per_s", "dtype", "autocast", "device", "threads", "shape", "layouts",
             "best_layout", "repeats", "statistic", "seconds"}


def test_peak_is_measured_once_per_process_in_the_runs_dtype():
    assert matmul_dtype("bf16") == torch.bfloat16 and matmul_dtype("fp32") == torch.float32
    assert matmul_dtype("fp32", torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="train.precision"):
        matmul_dtype("fp16")
    with pytest.raises(ValueError, match="resolve"):
        matmul_dtype("auto")
    state = torch.get_rng_state()
    first = matmul_peak(torch.float32)
    assert torch.equal(state, torch.get_rng_state())   # the run's random streams are untouched
    assert set(first) == PEAK_KEYS and first["dtype"] == "float32" and first["device"] == "cpu"
    assert first["threads"] == torch.get_num_threads() and first["repeats"] >= 3 * len(LAYOUTS)
    assert first["shape"] == [512] * 3 and not first["autocast"]
    assert 1e8 < first["median_flops_per_s"] <= first["flops_per_s"] < 1e14
    assert first["flops_per_s"] == max(first["layouts"].values()) == first["layouts"][first["best_layout"]]
    t0 = time.perf_counter()
    assert matmul_peak(torch.float32) == first   # remembered, not measured again
    assert time.perf_counter() - t0 < 0.05
    assert matmul_peak(torch.bfloat16)["dtype"] == "bfloat16"


def test_the_peak_is_measured_in_the_runs_own_arithmetic():
    """bf16 autocast over float32 weights is timed under autocast, not as a plain bfloat16 multiply (on a CPU
    without bfloat16 instructions the two differ, and the plain one put MFU above 1); bfloat16 weights multiply
    plainly; float32 is float32."""
    assert run_peak("bf16")["autocast"] and run_peak("bf16")["dtype"] == "bfloat16"
    assert not run_peak("bf16", torch.bfloat16)["autocast"] and run_peak("bf16", torch.bfloat16)["dtype"] == "bfloat16"
    assert not run_peak("fp32")["autocast"] and run_peak("fp32")["dtype"] == "float32"
    assert set(run_peak("bf16")["layouts"]) == set(LAYOUTS) == {"linear", "mm"}


def test_mfu_summary_is_total_flops_over_total_step_time():
    ledger = [{"step_flops": 3e9, "wall_s": 1.0}, {"step_flops": 1e9, "wall_s": 3.0}]
    out = mfu_summary(ledger, {"flops_per_s": 4e9}, processes=2)
    assert out["achieved_flops_per_s"] == pytest.approx(1e9) and out["train_wall_s"] == 4.0
    assert out["mfu"] == pytest.approx(1e9 / 8e9) and out["peak"]["processes"] == 2
    assert mfu_summary([], {"flops_per_s": 1.0})["mfu"] is None


def test_mfu_table_reads_done_json_falls_back_to_the_ledger_and_marks_unfinished(tmp_path):
    runs = tmp_path / "runs"
    peak = {"flops_per_s": 4e11, "dtype": "bfloat16", "device": "cpu", "threads": 1, "shape": [1024] * 3,
            "statistic": "best of repeats (median also kept)", "processes": 1}
    write_json(runs / "new" / "done.json", {"method": "grpo", "cumulative_flops": 2e12, "train_wall_s": 20.0,
                                           "achieved_flops_per_s": 1e11, "mfu": 0.25, "peak": peak})
    write_json(runs / "old" / "done.json", {"method": "opd", "cumulative_flops": 3e12})
    (runs / "old" / "ledger.jsonl").write_text(json.dumps({"step_flops": 3e12, "wall_s": 60.0}) + "\n")
    write_json(tmp_path / "base" / "done.json", {"pretrain_flops": 5e12, "train_wall_s": 25.0, "achieved_flops_per_s": 2e11,
                                                "mfu": 0.5, "peak": peak})
    spec = {"runs": [{"run": "new", "method": "grpo"}, {"run": "old", "method": "opd"}, {"run": "gone", "method": "grpo"}],
            "base_models": {"student": str(tmp_path / "base")}}
    text = mfu_markdown(spec, runs, "tiny")
    assert "| new | grpo | 2 TFLOP | 20.0 | 100.0 | 400.0 | 25.0% |" in text
    assert "| old | opd | 3 TFLOP | 60.0 | 50.0 | n/a | n/a |" in text
    assert "| gone | grpo | n/a | n/a | n/a | n/a | not finished |" in text
    assert "| student | pretraining | 5 TFLOP | 25.0 | 200.0 | 400.0 | 50.0% |" in text
    assert "1024x1024x1024 `bfloat16` matrix multiply on `cpu` with 1 thread(s)" in text
