"""A running job says what it is doing: step lines with an ETA, evaluation and checkpoint events, a summary."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys


def test_a_training_job_logs_steps_with_an_eta_while_it_runs(smoke_world, tmp_path):
    _, plan = smoke_world
    cfg = copy.deepcopy(plan.jobs["grpo-student-math-s0"].config)
    cfg["method"]["steps"] = 4
    cfg["train"].update({"eval_every": 2, "checkpoint_every": 2})
    log = tmp_path / "job.log"
    with open(log, "w") as out:   # what a Snakemake rule does: `opdgrpo train ... > {log} 2>&1`
        done = subprocess.run([sys.executable, "-m", "opdgrpo.cli", "train", "--out", str(tmp_path / "run"),
                               "--config-json", json.dumps(cfg)], stdout=out, stderr=subprocess.STDOUT, timeout=300)
    text = log.read_text()
    assert done.returncode == 0, text[-3000:]
    steps = re.findall(r"progress run=grpo-student-math-s0 step=(\d+)/4 pct=\d+% elapsed=\d+:\d\d:\d\d eta=\d+:\d\d:\d\d "
                       r"reward=\S+ loss=\S+ len=\S+ gen_tok_s=\d+ flops=\S+", text)
    assert steps[0] == "1" and steps[-1] == "4"
    assert re.search(r"eval run=grpo-student-math-s0 step=0 math/amc=\S+ math/aime=\S+ seconds=", text)
    assert re.search(r"checkpoint run=grpo-student-math-s0 step=2 seconds=", text)
    assert re.search(r"done run=grpo-student-math-s0 steps=4 wall=\d+:\d\d:\d\d flops=\S+", text)
    assert text.index("step=1/4") < text.index("checkpoint run=grpo-student-math-s0 step=2") < text.index("step=4/4")
