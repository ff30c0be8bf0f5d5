"""The smoke DAG end to end through Snakemake, in a temp directory, checking every contracted file;
then what a config edit reschedules. The DAG is the session fixture ``smoke_dag`` (tests/e2e/conftest.py), which
tests/e2e/test_slurm.py compares a SLURM run against."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from opdgrpo.config import compose
from opdgrpo.plan.build import build_plan

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]
CURVE_COLUMNS = ["run", "study", "method", "train_domains", "seed", "step", "cumulative_flops", "eval_domain", "eval_set",
                 "accuracy", "mean_response_length"]


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, "--directory", str(workdir), *args], capture_output=True, text=True, timeout=1200)


#: The dry runs the tests below read, by name: `snakemake -n` with these --config values against the finished DAG.
DRY_RUNS = {"unchanged": ("profile=smoke",),
            "opd_kl_top_k": ("profile=smoke", "overrides=[methods.opd.kl_top_k=8]"),
            "grpo_clip_eps": ("profile=smoke", "overrides=[methods.grpo.clip_eps=0.3]"),
            # keys that change no result (opdgrpo.job_identity): a finished DAG stays finished
            "runtime_keys": ("profile=smoke", "overrides=[train.nonfinite=skip,train.max_nonfinite_skips=5,"
                                              "train.activation_checkpointing=true]"),
            # the same CLI spelled another way (as a second checkout or another venv path would): how a job is
            # started is no part of what it computes
            "other_launcher": ("profile=smoke", f"opdgrpo_cmd=env OPDGRPO_UNUSED=1 {sys.executable} -m opdgrpo.cli")}


@pytest.fixture(scope="module")
def dry_runs(smoke_dag) -> dict[str, subprocess.CompletedProcess]:
    """Every dry run of DRY_RUNS, side by side (each is mostly Snakemake composing the plan and building the DAG; a
    dry run takes no lock and writes nothing the others read)."""
    procs = {name: subprocess.Popen([*SNAKEMAKE, "--directory", str(smoke_dag), "-n", "--config", *config],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, config in DRY_RUNS.items()}
    done = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=1200)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


def scheduled_jobs(output: str) -> dict[str, int]:
    """Rule -> count from Snakemake's dry-run 'Job stats' table."""
    table = output.split("Job stats:")[1].split("Reasons:")[0] if "Job stats:" in output else ""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}


@pytest.mark.slow
def test_smoke_dag_writes_every_contracted_file(smoke_dag):
    root = smoke_dag / "results" / "smoke"
    plan = build_plan(compose(["profile=smoke"], REPO / "conf"))
    for job in plan.runs():
        run_dir = root / "runs" / job.id
        for name in ("config.yaml", "ledger.jsonl", "evals.jsonl", "done.json", "checkpoint/config.json", "checkpoint/model.safetensors"):
            assert (run_dir / name).is_file(), f"{job.id}: {name}"
        assert yaml.safe_load((run_dir / "config.yaml").read_text()) == job.config
        ledger = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
        assert [r["step"] for r in ledger] == list(range(job.config["method"]["steps"]))
        # OPD's per-teacher diagnostics (S4's two experts among them), and none in GRPO's ledgers
        opd = job.config["method"]["name"] == "opd"
        assert all(("teachers" in r) == opd for r in ledger), job.id
        assert not opd or all(list(r["teachers"]) == job.config["train_domains"] and sum(
            t["token_share"] for t in r["teachers"].values()) == pytest.approx(1.0) for r in ledger), job.id
        # the rule's shell exec'd the trainer: Snakemake waits on it directly, no shell between them to die first
        begins = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines() if "begin" in line]
        assert begins[-1]["launched_by"][0] == "snakemake", begins
        assert ledger[-1]["cumulative_flops"] == json.loads((run_dir / "done.json").read_text())["cumulative_flops"]
    report = root / "report"
    for name in ("curves.csv", "savings.csv", "savings.md", "claims.md", "claims_detail.md", "base_models.md", "constraints.md",
                 "conditions.md"):
        assert (report / name).stat().st_size > 0, name
    for study in plan.report_spec["studies"]:
        for kind in ("accuracy", "length"):
            for ext in ("png", "pdf"):
                assert (report / f"{study}_{kind}.{ext}").stat().st_size > 1000
    assert "| student |" in (report / "base_models.md").read_text()
    assert "| ifeval |" in (report / "constraints.md").read_text()  # per-constraint rates of the ifeval runs
    assert set(pd.read_csv(report / "savings.csv")["study"]) == {"S4", "S5"}
    curves = pd.read_csv(report / "curves.csv")
    assert list(curves.columns) == CURVE_COLUMNS
    assert curves["accuracy"].between(0, 1).all()
    assert set(curves["run"]) == {j.id for j in plan.runs()}
    assert "math+code" in set(curves["train_domains"])
    claims = (report / "claims.md").read_text()
    for claim in ("S1", "S1b", "S2-in", "S2-heldout", "S3", "S4", "S5-share", "S5-savings", "S5b"):
        assert f"**{claim}" in claims
    assert "in_domain" in set(curves["eval_set"])  # S2's subset runs score their own prompts too


@pytest.mark.slow
def test_savings_cli_on_the_smoke_curves(smoke_dag):
    curves = smoke_dag / "results" / "smoke" / "report" / "curves.csv"
    out = subprocess.run([sys.executable, "-m", "opdgrpo.cli", "savings", "--curves", str(curves), "--joint", "grpo-student-math+code-s0",
                          "--distill", "opd-experts-math+code-s0", "--experts", "grpo-student-math-s0", "grpo-student-code-s0"],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert {"target_accuracy", "joint_flops", "pipeline_flops", "expert_flops", "distill_flops", "savings", "distill_share"} <= set(result)
    assert result["expert_flops"] > 0


@pytest.mark.slow
def test_nothing_to_do_after_a_complete_run(dry_runs):
    dry = dry_runs["unchanged"]
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr


def test_keys_that_change_no_result_rerun_nothing(dry_runs):
    """Switching the non-finite policy or activation recomputation (or tracking: tests/unit/test_job_identity.py)
    leaves a finished DAG finished; a result-changing key reruns (the two tests below)."""
    dry = dry_runs["runtime_keys"]
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-2000:]


@pytest.mark.slow
def test_another_spelling_of_the_command_reruns_nothing(dry_runs):
    """Snakemake reruns a job whose rule's shell text changed; the rules name the interpreter and the CLI by
    placeholders (workflow/rules/common.smk), so a finished DAG stays finished under another interpreter path."""
    dry = dry_runs["other_launcher"]
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-2000:]


@pytest.mark.slow
def test_an_opd_hyperparameter_reruns_only_opd_runs_and_the_report(dry_runs):
    dry = dry_runs["opd_kl_top_k"]
    assert dry.returncode == 0, dry.stderr[-2000:]
    n_opd = sum(1 for j in build_plan(compose(["profile=smoke"], REPO / "conf")).runs() if j.config["method"]["name"] == "opd")
    assert scheduled_jobs(dry.stdout) == {"opd": n_opd, "report": 1, "all": 1}


@pytest.mark.slow
def test_a_grpo_hyperparameter_reruns_grpo_and_everything_downstream(dry_runs):
    dry = dry_runs["grpo_clip_eps"]
    jobs = scheduled_jobs(dry.stdout)
    runs = build_plan(compose(["profile=smoke"], REPO / "conf")).runs()
    grpo = {j.id for j in runs if j.config["method"]["name"] == "grpo"}
    assert jobs["grpo"] == len(grpo) == 10 and jobs["report"] == 1
    # OPD runs whose teachers are GRPO runs (S1b, S3, S4, S5) rerun too; external-teacher OPD (S1, S2, S5b) does not
    from_grpo = [j for j in runs if j.config["method"]["name"] == "opd"
                 and any(t["from"].startswith("run:") for t in j.config["teachers"].values())]
    assert jobs["opd"] == len(from_grpo) == 6


@pytest.mark.slow
def test_snakemakes_html_report_bundles_the_figures_and_tables(smoke_dag):
    """`snakemake --report report.html`, as the README advertises it: one self-contained page with every figure and
    table the report rule registers (report() in workflow/rules/report.smk) and their captions."""
    page = smoke_dag / "report.html"
    done = snakemake(smoke_dag, "--report", str(page), "--config", "profile=smoke")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    html = page.read_text(errors="replace")
    assert page.stat().st_size > 100_000
    plan = build_plan(compose(["profile=smoke"], REPO / "conf"))
    figures = [f"{s}_accuracy.png" for s in plan.report_spec["studies"]]
    for name in ["curves.csv", "savings.csv", "claims.md", *figures]:
        assert name in html, f"{name} is not in the HTML report"
    assert "Matched-accuracy savings" in html   # a caption (workflow/report/savings.rst)


@pytest.mark.slow
def test_publish_copies_the_report_into_docs_results(smoke_dag):
    done = snakemake(smoke_dag, "publish", "--config", "profile=smoke")
    assert done.returncode == 0, done.stderr[-2000:]
    published = smoke_dag / "docs" / "results" / "smoke"
    assert {"claims.md", "savings.md", "base_models.md", "S5_accuracy.png"} <= {p.name for p in published.iterdir()}
    assert not any(p.suffix in (".pdf", ".csv") for p in published.iterdir())  # the README shows PNGs and tables
