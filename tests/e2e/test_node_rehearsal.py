"""``profile=node-rehearsal``: the node profile's DAG (S3 and S4 on one machine of GPUs, docs/node-profile.md) run for
real on CPU before anyone spends a GPU day on it: the MATH and LiveCodeBench fixtures through the real ``datasets``
loaders and verifiers, a random-init hub-format student through from_pretrained, the colocated vLLM engine, the
multi-teacher distillation, and the machine's GPU slots under local Snakemake, two jobs side by side on slots of their
own; then the report, with S3's and S4's rows. About 2 minutes on 2 cores; skipped only where vLLM is not installed
(CI installs it)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from opdgrpo.config import compose
from opdgrpo.plan.build import build_plan

REPO = Path(__file__).resolve().parents[2]
ROOT = "results/node-rehearsal"

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def node_dag(tmp_path_factory):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM not installed: scripts/install.sh --vllm (the node profile samples with vLLM)")
    workdir = tmp_path_factory.mktemp("node_rehearsal")
    done = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory",
                           str(workdir), "--cores", "2", "--config", "profile=node-rehearsal"],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "OPDGRPO_FAULT": ""})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return workdir, build_plan(compose(["profile=node-rehearsal"], REPO / "conf"))


def test_the_node_dag_runs_to_a_report_with_s3_and_s4(node_dag):
    workdir, plan = node_dag
    report = workdir / ROOT / "report"
    curves = pd.read_csv(report / "curves.csv")
    assert set(curves["study"]) == {"S3", "S4"}
    assert set(curves["eval_set"]) == {"math", "lcb"}   # MATH's test sample and LiveCodeBench's later window
    claims = (report / "claims.md").read_text()
    for claim in ("S3-n1", "S3-n8", "S4-share", "S4-savings"):
        row = next(line for line in claims.splitlines() if line.startswith(f"| **{claim}**"))
        assert "not in the report spec" not in row, row
    for name in ("S3_accuracy.png", "S4_accuracy.png", "savings.md", "conditions.md"):
        assert (report / name).stat().st_size > 0, name
    runs = {j.id: j for j in plan.runs()}
    assert len(runs) == 6   # two experts (math: S3's teacher too), joint GRPO, the distillation, OPD n=1 and n=2
    distill = workdir / ROOT / "runs" / "opd-experts-math+code-s0" / "ledger.jsonl"
    lines = [json.loads(line) for line in distill.read_text().splitlines()]
    assert all(set(line["teachers"]) == {"math", "code"} for line in lines)   # per-teacher diagnostics, both experts
    assert all(abs(sum(t["token_share"] for t in line["teachers"].values()) - 1) < 1e-9 for line in lines)


def test_node_jobs_side_by_side_hold_gpu_slots_of_their_own(node_dag):
    """The machine block (2 GPU slots): each base and training job (one process here) claims one slot and records it;
    jobs that ran at the same time held different slots, and some did (the two experts, then joint GRPO)."""
    from gpu_slot_checks import slots_side_by_side

    workdir, plan = node_dag
    ran = slots_side_by_side(workdir, plan, lambda job: 0 if job.kind == "tokenizer" else 1, {0, 1})
    assert len(ran) == 7
