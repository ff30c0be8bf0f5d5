"""MFU in real runs: achieved FLOP/s in every ledger line, the run's mean and MFU in done.json (training and pretraining)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from opdgrpo.runio import read_jsonl
from opdgrpo.train.loop import train

PEAK_KEYS = {"flops_per_s", "median_flops_per_s", "dtype", "autocast", "device", "threads", "shape", "layouts",
             "best_layout", "repeats", "statistic", "seconds"}


@pytest.mark.parametrize("precision", ["auto", "bf16"])
def test_run_ledger_and_done_carry_achieved_flops_and_mfu(smoke_world, tmp_path, precision):
    """MFU below 1 under explicit bf16 too: on a CPU without bfloat16 instructions the peak is timed under autocast
    in the step's own layouts (a plain bfloat16 multiply's peak gave MFU 3.25 there)."""
    _, plan = smoke_world
    cfg = copy.deepcopy(plan.jobs["grpo-student-math-s0"].config)
    cfg["method"]["steps"], cfg["run_id"] = 2, "mfu-test"
    cfg["train"]["precision"] = precision
    train(cfg, tmp_path / "run")
    ledger = read_jsonl(tmp_path / "run" / "ledger.jsonl")
    for line in ledger:   # wall_s is rounded to the millisecond, the rate is not
        assert line["step_flops"] / line["achieved_flops_per_s"] == pytest.approx(line["wall_s"], abs=6e-4)
    done = json.loads((tmp_path / "run" / "done.json").read_text())
    chosen = done["numerics"]["precision"]   # smoke: `auto`, resolved on this machine
    assert chosen["requested"] == precision and chosen["resolved"] in ({"bf16", "fp32"} if precision == "auto" else {precision})
    assert set(done["peak"]) == PEAK_KEYS | {"processes"}
    assert done["peak"]["dtype"] == {"bf16": "bfloat16", "fp32": "float32"}[chosen["resolved"]]
    assert done["peak"]["autocast"] == (chosen["resolved"] == "bf16")
    assert done["train_wall_s"] == pytest.approx(sum(r["wall_s"] for r in ledger))
    assert done["achieved_flops_per_s"] == pytest.approx(done["cumulative_flops"] / done["train_wall_s"])
    assert done["mfu"] == pytest.approx(done["achieved_flops_per_s"] / done["peak"]["flops_per_s"])
    assert 0 < done["mfu"] < 1


def test_pretraining_done_carries_mfu(smoke_world):
    _, plan = smoke_world
    done = json.loads((Path(plan.jobs["base-student"].out_dir) / "done.json").read_text())
    assert done["pretrain_flops"] / done["achieved_flops_per_s"] == pytest.approx(done["train_wall_s"], abs=6e-4)
    assert 0 < done["mfu"] < 1 and done["peak"]["flops_per_s"] > 0
    assert done["numerics"]["precision"]["key"] == "pretrain.precision"
    assert all("achieved_flops_per_s" in r for r in read_jsonl(Path(plan.jobs["base-student"].out_dir) / "ledger.jsonl"))
