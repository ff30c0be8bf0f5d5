"""A base evaluation split over processes, as a GPU node runs it (``resources.base.gpu`` processes under torchrun, one
engine each): every held-out set cut into contiguous shares, one per process, gathered in order; the main process
writes. On CPU with gloo: greedy answers equal one process's (the project's sampler does not depend on how rows are
batched), and under vLLM each process's engine sits at its own local rank under ``external_launcher`` with the
process group's timeout the rule passed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opdgrpo.config import compose
from opdgrpo.plan.build import build_plan

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "opdgrpo.cli"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc_per_node", "2"]
#: the rehearsal's student, evaluated on a few prompts of every domain with short answers
OVERRIDES = ["profile=rehearsal", "pretrain.eval.max_prompts=3", "pretrain.eval.max_new_tokens=6", "threads=1"]


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout + done.stderr


def _jobs(root: Path, *extra: str):
    plan = build_plan(compose([*OVERRIDES, f"results_dir={root}", *extra], REPO / "conf"))
    tok, base = plan.jobs["tokenizer"], plan.jobs["base-student"]
    if not Path(tok.done).exists():
        _run([*CLI, "tokenizer", "--out", tok.out_dir, "--config-json", json.dumps(tok.config)], root)
    return base


def _done(out: Path) -> dict:
    return json.loads((out / "done.json").read_text())


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("base_split")


def test_greedy_base_evaluation_on_two_processes_equals_one(smoke_world, knowing_student, tmp_path):
    """The smoke world's student pretrained until it solves prompts, as a hub checkpoint (a local directory),
    evaluated greedily on every held-out set by one process and by two: the same accuracy and answer lengths per set
    (it solves some, at varied lengths)."""
    _, plan = smoke_world
    job = plan.jobs["base-student"]
    cfg = json.loads(json.dumps(job.config))
    cfg["model"] = {**cfg["model"], "source": "hub", "path": str(knowing_student), "revision": None}
    cfg["pretrain"]["eval"].update(temperature=0.0, k=2)
    text = json.dumps(cfg)
    _run([*CLI, "pretrain", "--out", str(tmp_path / "one"), "--config-json", text], tmp_path)
    log = _run([*TORCHRUN, "-m", "opdgrpo.cli", "pretrain", "--out", str(tmp_path / "two"), "--config-json", text,
                "--collective-timeout", "321"], tmp_path)
    one, two = _done(tmp_path / "one"), _done(tmp_path / "two")
    assert one["processes"] == 1 and two["processes"] == 2
    assert "2 processes; collective timeout 321 s (planned: 321 s)" in log, log[-3000:]
    assert one["heldout"] == two["heldout"]   # every set: accuracy, pass@k, lengths
    assert any(r["accuracy"] > 0 for r in two["heldout"]), two["heldout"]
    assert len({r["mean_response_length"] for r in two["heldout"]}) > 1, two["heldout"]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed (scripts/install.sh --vllm)")
def test_each_process_evaluates_its_share_with_its_own_engine(world):
    base = _jobs(world)
    assert base.config["engine"] == "vllm"
    _run([*TORCHRUN, "-m", "opdgrpo.cli", "pretrain", "--out", str(world / "vllm"), "--config-json",
          json.dumps(base.config), "--collective-timeout", "600"], world, timeout=900)
    done = _done(world / "vllm")
    assert done["processes"] == 2
    assert [(e["rank"], e["backend"], e["local_rank"], e["engine_world"]) for e in done["engines"]] == \
        [(0, "external_launcher", 0, 2), (1, "external_launcher", 1, 2)]
    for result in done["heldout"]:   # each set whole: its prompts x k, gathered from both shares
        assert result["n_prompts"] <= 3 and result["k"] >= 1, result
    assert (world / "vllm" / "checkpoint").is_symlink() and (world / "vllm" / "evals.jsonl").is_file()
