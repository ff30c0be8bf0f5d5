"""Progress lines: when a step line is written, and how it reads."""

from __future__ import annotations

import re

from opdgrpo.progress import Progress, clock, fields


def test_fast_steps_log_every_few_seconds_and_always_the_first_and_last(caplog, monkeypatch):
    import opdgrpo.progress as progress

    now = [1000.0]
    monkeypatch.setattr(progress.time, "time", lambda: now[0])
    caplog.set_level("INFO", logger="opdgrpo.progress")
    p = Progress("r", total=100, every_s=5.0)
    for step in range(1, 101):
        now[0] += 0.25   # a quarter-second step
        p.step(step, {"loss": 0.5}, 0.25)
    lines = [r.getMessage() for r in caplog.records]
    logged = [int(re.search(r"step=(\d+)/", line).group(1)) for line in lines]
    assert logged == [1, 21, 41, 61, 81, 100]   # the first, then every 20 steps (5 s), and the last
    assert "eta=0:00:25" in lines[0]   # 99 steps left at 0.25 s


def test_lines_read_as_key_value_pairs():
    assert fields({"run": "x", "loss": 0.123456, "flops": 1.5e12, "skip": None}) == "run=x loss=0.1235 flops=1.5e+12"
    assert clock(3725.4) == "1:02:05"


def test_stages_log_each_stage_with_its_seconds(caplog):
    from opdgrpo.progress import Stages

    caplog.set_level("INFO", logger="opdgrpo.progress")
    stage = Stages("report-tiny")
    stage("curves", runs=35)
    stage("written", files=40)
    lines = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(r"stage job=report-tiny stage=curves runs=35 seconds=[\d.]+", lines[0])
    assert lines[1].startswith("stage job=report-tiny stage=written files=40")
