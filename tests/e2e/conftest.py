"""Fixtures shared by the e2e modules: the smoke DAG run locally once per session (tests/e2e/test_pipeline.py checks
its files; tests/e2e/test_slurm.py compares a SLURM run of study S4 against its curves)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, "--directory", str(workdir), *args], capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="session")
def smoke_dag(tmp_path_factory) -> Path:
    """The whole smoke DAG through Snakemake (the default workflow profile), locally, in a temp directory. Tests only
    read it, dry-run against it or add files beside results/ (`publish` writes docs/results)."""
    workdir = tmp_path_factory.mktemp("dag")
    done = snakemake(workdir, "--config", "profile=smoke")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return workdir
