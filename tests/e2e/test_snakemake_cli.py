"""Snakemake on the repository's workflow, briefly: plain `snakemake` from the root finds the Snakefile and the default
workflow profile; bad input is refused before anything is scheduled; the paper profile's whole DAG plans offline with
each job's resources."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]


@pytest.mark.parametrize("override,message", [
    ("domains.math.kind=algebra", "domains.math.kind"),
    ("results_dir=/etc/passwd/x", "results_dir"),
])
def test_snakemake_refuses_before_scheduling(tmp_path, override, message):
    """The Snakefile composes (and so validates) before it plans: nothing is scheduled, nothing written."""
    out = subprocess.run([*SNAKEMAKE, "--directory", str(tmp_path), "-n", "--config", "profile=smoke", f"overrides=[{override}]"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert message in out.stdout + out.stderr and "Job stats" not in out.stdout
    assert not (tmp_path / "results").exists()


def test_snakemake_dry_run_lists_the_paper_dag_with_resources(tmp_path):
    out = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--config", "profile=paper",
                          f'overrides=["results_dir={tmp_path}"]'],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", text, flags=re.M))
    # every model of the profile gets its base stage (linked and evaluated), so the base-model table compares them:
    # 7 Qwen3 models, the Olmo-3 student and its Olmo-3 teacher; the Olmo tokenizer is a job of its own
    assert int(counts["opd"]) > 10 and int(counts["grpo"]) > 10 and int(counts["pretrain"]) == 9, counts
    assert int(counts["tokenizer"]) == 1 and int(counts["model_tokenizer"]) == 1, counts
    assert re.search(r"gpu=8", text) and re.search(r"runtime=2880", text)   # training jobs: one 8-GPU node


def test_snakemake_refuses_a_paper_job_that_would_not_fit_its_gpus(tmp_path):
    """opdgrpo.resources' estimate against the profile's `hardware`: nothing is scheduled, the knob is named."""
    out = subprocess.run([*SNAKEMAKE, "-n", "--cores", "1", "--config", "profile=paper",
                          f'overrides=["results_dir={tmp_path}","train.vllm.gpu_memory_utilization=0.9"]'],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Job stats" not in out.stdout
    assert "would run out of GPU memory" in text and "change: a lower train.vllm.gpu_memory_utilization" in text, text[-3000:]


def test_plain_snakemake_from_the_root_finds_the_snakefile_and_the_default_profile(tmp_path):
    """No --snakefile, no --cores, no --workflow-profile, as the README runs it: the root Snakefile, and the local
    profile workflow/profiles/default, found as profiles/default through the link profiles -> workflow/profiles (it
    gives the cores: without it Snakemake refuses to run). One real job, the tokenizer, in a temp directory."""
    assert (REPO / "profiles" / "default").resolve() == (REPO / "workflow" / "profiles" / "default").resolve()
    target = "results/smoke/base/tokenizer/done.json"
    out = subprocess.run([sys.executable, "-m", "snakemake", "--directory", str(tmp_path), target, "--config", "profile=smoke"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "Using workflow specific profile profiles/default" in text
    assert (tmp_path / target).is_file()
