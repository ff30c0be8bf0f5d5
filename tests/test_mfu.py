"""MFU per run: achieved FLOP/s in every ledger line, the run's mean and MFU in done.json, the table in mfu.md."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
import torch

from opdgrpo.peak import matmul_dtype, matmul_peak, mfu_summary
from opdgrpo.report.mfu import mfu_markdown
from opdgrpo.runio import read_jsonl, write_json
from opdgrpo.train import train

PEAK_KEYS = {"flops_per_s", "median_flops_per_s", "dtype", "device", "threads", "shape", "repeats", "statistic", "seconds"}


def test_peak_is_measured_once_per_process_in_the_runs_dtype():
    assert matmul_dtype("bf16") == torch.bfloat16 and matmul_dtype("fp32") == torch.float32
    assert matmul_dtype("fp32", torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="train.precision"):
        matmul_dtype("fp16")
    state = torch.get_rng_state()
    first = matmul_peak(torch.float32)
    assert torch.equal(state, torch.get_rng_state())   # the run's random streams are untouched
    assert set(first) == PEAK_KEYS and first["dtype"] == "float32" and first["device"] == "cpu"
    assert first["threads"] == torch.get_num_threads() and first["repeats"] >= 10 and first["shape"] == [1024] * 3
    assert 1e8 < first["median_flops_per_s"] <= first["flops_per_s"] < 1e14
    t0 = time.perf_counter()
    assert matmul_peak(torch.float32) == first   # remembered, not measured again
    assert time.perf_counter() - t0 < 0.05
    assert matmul_peak(torch.bfloat16)["dtype"] == "bfloat16"


def test_mfu_summary_is_total_flops_over_total_step_time():
    ledger = [{"step_flops": 3e9, "wall_s": 1.0}, {"step_flops": 1e9, "wall_s": 3.0}]
    out = mfu_summary(ledger, {"flops_per_s": 4e9}, processes=2)
    assert out["achieved_flops_per_s"] == pytest.approx(1e9) and out["train_wall_s"] == 4.0
    assert out["mfu"] == pytest.approx(1e9 / 8e9) and out["peak"]["processes"] == 2
    assert mfu_summary([], {"flops_per_s": 1.0})["mfu"] is None


def test_run_ledger_and_done_carry_achieved_flops_and_mfu(smoke_world, tmp_path):
    _, plan = smoke_world
    cfg = copy.deepcopy(plan.jobs["grpo-student-math-s0"].config)
    cfg["method"]["steps"], cfg["run_id"] = 2, "mfu-test"
    train(cfg, tmp_path / "run")
    ledger = read_jsonl(tmp_path / "run" / "ledger.jsonl")
    for line in ledger:   # wall_s is rounded to the millisecond, the rate is not
        assert line["step_flops"] / line["achieved_flops_per_s"] == pytest.approx(line["wall_s"], abs=6e-4)
    done = json.loads((tmp_path / "run" / "done.json").read_text())
    assert set(done["peak"]) == PEAK_KEYS | {"processes"} and done["peak"]["dtype"] == "bfloat16"   # smoke: bf16
    assert done["train_wall_s"] == pytest.approx(sum(r["wall_s"] for r in ledger))
    assert done["achieved_flops_per_s"] == pytest.approx(done["cumulative_flops"] / done["train_wall_s"])
    assert done["mfu"] == pytest.approx(done["achieved_flops_per_s"] / done["peak"]["flops_per_s"])
    assert 0 < done["mfu"] < 1


def test_pretraining_done_carries_mfu(smoke_world):
    _, plan = smoke_world
    done = json.loads((Path(plan.jobs["base-student"].out_dir) / "done.json").read_text())
    assert done["pretrain_flops"] / done["achieved_flops_per_s"] == pytest.approx(done["train_wall_s"], abs=6e-4)
    assert 0 < done["mfu"] < 1 and done["peak"]["flops_per_s"] > 0
    assert all("achieved_flops_per_s" in r for r in read_jsonl(Path(plan.jobs["base-student"].out_dir) / "ledger.jsonl"))


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
