"""Snakemake on the repository's workflow, briefly: plain `snakemake` from the root finds the Snakefile and the default
workflow profile; bad input is refused before anything is scheduled; the paper profile's whole DAG plans offline with
each job's resources."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from side_by_side import run_side_by_side

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]
TOKENIZER = "results/smoke/base/tokenizer/done.json"
REFUSED = {"domains.math.kind=algebra": "domains.math.kind", "results_dir=/etc/passwd/x": "results_dir"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Every Snakemake invocation of this module, side by side (each is mostly Snakemake composing the plan and
    building its DAG, one core each), by name: its directory and its result."""
    dirs, cmds = {}, {}
    for override in REFUSED:
        dirs[override] = tmp_path_factory.mktemp("refused")
        cmds[override] = [*SNAKEMAKE, "--directory", str(dirs[override]), "-n", "--config", "profile=smoke", f"overrides=[{override}]"]
    dirs["typo"] = tmp_path_factory.mktemp("typo")
    cmds["typo"] = [*SNAKEMAKE, "--directory", str(dirs["typo"]), "-n", "--config", "profle=smoke"]
    dirs["paper_too_big"] = tmp_path_factory.mktemp("paper_too_big")
    cmds["paper_too_big"] = [*SNAKEMAKE, "-n", "--cores", "1", "--config", "profile=paper",
                             f'overrides=["results_dir={dirs["paper_too_big"]}","train.vllm.gpu_memory_utilization=0.9"]']
    dirs["machine"] = tmp_path_factory.mktemp("machine")   # the paper on one 8-GPU machine, counts the planner's
    cmds["machine"] = [*SNAKEMAKE, "-n", "-p", "--cores", "1", "--config", "profile=paper",
                       f'overrides=["results_dir={dirs["machine"]}","+machine={{gpus: 8}}","resources.train.gpu=null",'
                       '"resources.base.gpu=null"]']
    dirs["node"] = tmp_path_factory.mktemp("node")
    cmds["node"] = [*SNAKEMAKE, "-n", "--cores", "1", "--config", "profile=node", f'overrides=["results_dir={dirs["node"]}"]']
    dirs["plain"] = tmp_path_factory.mktemp("plain")
    cmds["plain"] = [sys.executable, "-m", "snakemake", "--directory", str(dirs["plain"]), TOKENIZER, "--config", "profile=smoke"]
    done = run_side_by_side(cmds, timeout=900, cwd=REPO)
    return {name: (dirs[name], done[name]) for name in cmds}


@pytest.mark.parametrize("override,message", REFUSED.items())
def test_snakemake_refuses_before_scheduling(runs, override, message):
    """The Snakefile composes (and so validates) before it plans: nothing is scheduled, nothing written."""
    tmp_path, out = runs[override]
    assert out.returncode != 0
    assert message in out.stdout + out.stderr and "Job stats" not in out.stdout
    assert not (tmp_path / "results").exists()


def test_a_misspelt_config_key_is_refused_not_ignored(runs):
    """`--config profle=smoke` would otherwise start the default profile's DAG; the workflow's own keys are checked."""
    tmp_path, out = runs["typo"]
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Job stats" not in out.stdout
    assert "unknown `--config` key(s) ['profle']" in text and "did you mean ['profile']" in text, text[-3000:]
    assert not (tmp_path / "results").exists()


def test_snakemake_dry_run_lists_the_paper_dag_with_resources(paper_dry_run):
    out = paper_dry_run
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", text, flags=re.M))
    # every model of the profile gets its base stage (linked and evaluated), so the base-model table compares them:
    # 7 Qwen3 models, the Olmo-3 student and its Olmo-3 teacher; the Olmo tokenizer is a job of its own
    assert int(counts["opd"]) > 10 and int(counts["grpo"]) > 10 and int(counts["pretrain"]) == 9, counts
    assert int(counts["tokenizer"]) == 1 and int(counts["model_tokenizer"]) == 1, counts
    assert re.search(r"gpu=8", text) and re.search(r"runtime=2880", text)   # training jobs: one 8-GPU node
    # SLURM's warning, a backstop to the trainer's own stop (SIGURG: ignored by Snakemake and torchrun), goes to the
    # training jobs only: every grpo and opd job names one, no base job does (it does not resume)
    for rule, warned in (("grpo", True), ("opd", True), ("pretrain", False)):
        blocks = re.findall(rf"^(?:local)?rule {rule}:\n(.*?)(?=^\S|\Z)", text, flags=re.M | re.S)
        assert blocks and all(bool(re.search(r"slurm_extra=--signal=URG@\d+", b)) == warned for b in blocks), rule


def test_on_one_machine_each_paper_job_gets_its_own_count_and_the_rules_text_stays(runs):
    """The paper profile with a machine block and its counts left to the planner (docs/one-machine.md): each job asks
    for its own GPUs (`gpu`, and `gpu_slots`, which the local executor bounds by machine.gpus), 1 to 8; its command
    goes through opdgrpo.launch, which sets torchrun's count per job, and otherwise reads as the SLURM profile's (a
    rule whose text changed would rerun its finished jobs)."""
    _, out = runs["machine"]
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    asks = re.findall(r"resources: .*?gpu=(\d+).*?gpu_slots=(\d+)|resources: .*?gpu_slots=(\d+).*?gpu=(\d+)", text)
    counts = [(int(a or d), int(b or c)) for a, b, c, d in asks]
    assert counts and all(g == s for g, s in counts) and {g for g, _ in counts} >= {1, 2, 4, 8}, counts
    launch = re.findall(r"exec \S+ -m opdgrpo\.launch -- \S+ -m torch\.distributed\.run --standalone --nnodes 1 "
                        r"--nproc_per_node 8 --shutdown-timeout \d+ -m opdgrpo\.cli train ", text)
    assert len(launch) == 31, len(launch)   # every training job (the text: 8, the SLURM profile's; each job its own)


def test_snakemake_dry_run_lists_the_node_dag_offline(runs):
    """profile=node (docs/node-profile.md): S3 and S4 over three seeds, one base model, on one machine of 8 GPUs
    with each job's count the planner's (a GPU slot per GPU it asks for)."""
    _, out = runs["node"]
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", text, flags=re.M))
    assert {k: int(counts[k]) for k in ("tokenizer", "pretrain", "grpo", "opd", "report")} == {
        "tokenizer": 1, "pretrain": 1, "grpo": 9, "opd": 9, "report": 1}, counts
    asked = [dict(kv.split("=", 1) for kv in line.split(", ")) for line in re.findall(r"resources: (.*)", text)]
    counts = [(int(r["gpu"]), int(r["gpu_slots"])) for r in asked if "gpu" in r]
    assert counts and all(g == s for g, s in counts) and {g for g, _ in counts} == {1, 8}, counts
    assert re.search(r"runtime=720", text)


def test_snakemake_refuses_a_paper_job_that_would_not_fit_its_gpus(runs):
    """opdgrpo.cost.resources' estimate against the profile's `hardware`: nothing is scheduled, the knob is named."""
    _, out = runs["paper_too_big"]
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Job stats" not in out.stdout
    assert "would run out of GPU memory" in text and "change: a lower train.vllm.gpu_memory_utilization" in text, text[-3000:]


def test_plain_snakemake_from_the_root_finds_the_snakefile_and_the_default_profile(runs):
    """No --snakefile, no --cores, no --workflow-profile, as the README runs it: the root Snakefile, and the local
    profile workflow/profiles/default, found as profiles/default through the link profiles -> workflow/profiles (it
    gives the cores: without it Snakemake refuses to run). One real job, the tokenizer, in a temp directory."""
    assert (REPO / "profiles" / "default").resolve() == (REPO / "workflow" / "profiles" / "default").resolve()
    tmp_path, out = runs["plain"]
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "Using workflow specific profile profiles/default" in text
    assert (tmp_path / TOKENIZER).is_file()
