"""Fixtures shared by the e2e modules: the smoke DAG run locally once per session (tests/e2e/test_pipeline.py checks
its files; tests/e2e/test_slurm.py compares a SLURM run of study S4 against its curves), and the rehearsal of the
paper DAG (tests/e2e/test_rehearsal.py checks it; test_slurm.py runs a slice of it through SLURM)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]


def snakemake(workdir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, "--directory", str(workdir), *args], capture_output=True, text=True, timeout=1200,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="session")
def smoke_dag(tmp_path_factory) -> Path:
    """The whole smoke DAG through Snakemake (the default workflow profile), locally, in a temp directory. Tests only
    read it, dry-run against it or add files beside results/ (`publish` writes docs/results)."""
    workdir = tmp_path_factory.mktemp("dag")
    done = snakemake(workdir, "--config", "profile=smoke")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return workdir


@pytest.fixture(scope="session")
def paper_dry_run(tmp_path_factory) -> subprocess.CompletedProcess:
    """``snakemake -n --config profile=paper`` from the repository root, as a user runs it (offline; nothing is
    fetched): the paper's whole DAG with what each job asks SLURM for. test_snakemake_cli.py reads its resources,
    test_rehearsal.py its rules."""
    out = tmp_path_factory.mktemp("paper")
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--config", "profile=paper",
                           f'overrides=["results_dir={out}"]'], capture_output=True, text=True, timeout=900, cwd=REPO)


#: The rehearsal's run killed (SIGKILL in step 2's update, after the step-1 checkpoint) and resumed: joint GRPO, 3 steps.
REHEARSAL_KILLED = "grpo-student-math+code-s0"


@pytest.fixture(scope="session")
def rehearsal_dag(tmp_path_factory) -> SimpleNamespace:
    """``profile=rehearsal`` through Snakemake in a temp directory: first the killed run alone (with its upstream),
    then the whole DAG, which resumes it. Its directory, the killed run's id, and both Snakemake calls."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM not installed: scripts/install.sh --vllm (the rehearsal samples with vLLM, as the paper does)")
    workdir = tmp_path_factory.mktemp("rehearsal")
    killed = snakemake(workdir, f"results/rehearsal/runs/{REHEARSAL_KILLED}/done.json", "--config", "profile=rehearsal",
                       env={"OPDGRPO_FAULT": "update:2"})
    whole = snakemake(workdir, "--config", "profile=rehearsal", env={"OPDGRPO_FAULT": ""})
    return SimpleNamespace(workdir=workdir, killed_run=REHEARSAL_KILLED, killed=killed, whole=whole)
