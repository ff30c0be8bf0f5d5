"""``profile=rehearsal``: the paper DAG composed for real on CPU before anyone spends GPU-hours on it. Every rule a
paper run uses (read from a dry run of ``profile=paper``), every training run on 2 processes under torchrun with
its own vLLM engine per process, models in hub format through from_pretrained, the fixtures through ``datasets``;
one run SIGKILLed in an update and resumed by the next ``snakemake``; the report at the end.

The DAG is the session's ``rehearsal_dag`` (tests/e2e/conftest.py; test_slurm.py runs a slice of it through SLURM).
Skipped only where vLLM is not installed; CI installs it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from opdgrpo.config import compose
from opdgrpo.plan.build import build_plan

REPO = Path(__file__).resolve().parents[2]
RULE = re.compile(r"^(?:local)?rule (\w+):", flags=re.M)


@pytest.fixture(scope="module")
def paper_rules(paper_dry_run) -> set[str]:
    """The rules a paper run executes: the session's dry run of ``profile=paper`` (tests/e2e/conftest.py)."""
    assert paper_dry_run.returncode == 0, paper_dry_run.stderr[-3000:]
    return set(RULE.findall(paper_dry_run.stdout + paper_dry_run.stderr))


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "ledger.jsonl").read_text().splitlines() if line.strip()]


def test_rehearsal_runs_every_rule_of_the_paper_dag(rehearsal_dag, paper_rules):
    workdir, killed, whole = rehearsal_dag.workdir, rehearsal_dag.killed, rehearsal_dag.whole
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-5000:]
    ran = set(RULE.findall(killed.stdout + killed.stderr + whole.stdout + whole.stderr))
    assert {"tokenizer", "model_tokenizer", "pretrain", "difficulty", "grpo", "opd", "report"} <= paper_rules
    assert paper_rules <= ran, f"rules of the paper DAG the rehearsal never ran: {sorted(paper_rules - ran)}"
    report = workdir / "results" / "rehearsal" / "report"
    assert "A rehearsal, not a result." in (report / "claims.md").read_text()
    assert (report / "S4_accuracy.png").is_file() and (report / "S2_accuracy.png").is_file()


def test_rehearsal_trains_on_two_processes_each_with_its_own_engine(rehearsal_dag):
    """Each training run: 2 torchrun processes, each rank's vLLM engine under ``external_launcher`` at its own local
    rank (cuda:0 and cuda:1 on a GPU node) with ``max_model_len`` the job's longest row; the planned steps."""
    workdir = rehearsal_dag.workdir
    plan = build_plan(compose(["profile=rehearsal"], REPO / "conf"))
    runs = [j for j in plan.jobs.values() if j.kind == "train"]
    assert {j.config["method"]["name"] for j in runs} == {"grpo", "opd"}
    assert any(len(j.config.get("teachers") or {}) > 1 for j in runs)            # multi-teacher OPD (S4)
    for job in runs:
        run_dir = workdir / job.out_dir
        done = _json(run_dir / "done.json")
        assert done["processes"] == 2 and done["steps"] == job.config["method"]["steps"], job.id
        engines = done["engines"]
        assert [(e["rank"], e["backend"], e["local_rank"], e["engine_world"]) for e in engines] == \
            [(0, "external_launcher", 0, 2), (1, "external_launcher", 1, 2)], job.id
        assert len({e["max_model_len"] for e in engines}) == 1 and engines[0]["max_model_len"] < 2048, engines
        # CPU engines: each request seeded; rollouts at temperature 1 read vLLM's raw log-probs (the processed ones
        # there), so every step logs the engine/trainer gap, and GRPO (engine_is_cap 3) its importance weights
        assert {(e["requests_seeded"], e["rollout_logprobs"]) for e in engines} == {(True, "raw_logprobs")}, engines
        for line in (json.loads(x) for x in (run_dir / "ledger.jsonl").read_text().splitlines() if x.strip()):
            assert "engine_logprob_diff_mean" in line["metrics"], (job.id, line["step"])
            assert ("engine_is_weight_mean" in line["metrics"]) == (job.config["method"]["name"] == "grpo"), job.id
        assert _steps(run_dir) == list(range(job.config["method"]["steps"])), job.id
        evals = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines() if line.strip()]
        assert evals and all(0.0 <= r["accuracy"] <= 1.0 for r in evals[-1]["results"])


def test_rehearsal_base_jobs_write_weightless_hub_directories_and_evaluate_them(rehearsal_dag):
    """``source: random``: each base job writes a hub-format directory with no weights (config, tokenizer, seed),
    links it as a hub snapshot is linked, and evaluates every held-out set of the paper's four domains split over 2
    processes under torchrun, a vLLM engine each (as a GPU node's base job, one per GPU); a loader draws the weights
    from the seed."""
    from transformers import AutoTokenizer

    from opdgrpo.train.models import RANDOM_INIT, load_model

    base = rehearsal_dag.workdir / "results" / "rehearsal" / "base"
    for model in ("student", "qwen3_4b", "student_olmo3"):
        done = _json(base / model / "done.json")
        assert done["source"] == "random" and done["counted"] is False
        assert {r["eval_domain"] for r in done["heldout"]} == {"math", "code", "ifeval", "knowledge"}
        assert done["processes"] == 2 and [(e["backend"], e["local_rank"]) for e in done["engines"]] == \
            [("external_launcher", 0), ("external_launcher", 1)], model
        link = base / model / "checkpoint"
        assert link.is_symlink() and (link / "config.json").is_file() and (link / RANDOM_INIT).is_file()
        assert not list(link.glob("*.safetensors"))
    student = load_model(base / "student" / "checkpoint")
    assert student.config.head_dim == 128 and done["parameters"] > 0
    chat = AutoTokenizer.from_pretrained(str(base / "student" / "checkpoint"))
    own = AutoTokenizer.from_pretrained(str(base / "student_olmo3" / "checkpoint"))
    assert chat.chat_template and "<|im_end|>" in chat.get_vocab() and len(own) != len(chat)


def test_rehearsal_difficulty_job_samples_each_model_in_a_process_of_its_own(rehearsal_dag):
    """S2's difficulty job under vLLM: the student's and the teacher's solve rates each sampled in a spawned process
    of its own (one engine per process: two in one process do not give the GPU back on CUDA), both children of the
    job's process, each engine alone (vLLM's own executor, local rank 0) at the job's longest row."""
    plan = build_plan(compose(["profile=rehearsal"], REPO / "conf"))
    (job,) = [j for j in plan.jobs.values() if j.kind == "difficulty"]
    done = _json(rehearsal_dag.workdir / job.out_dir / "done.json")
    samplers = done["samplers"]
    assert set(samplers) == {"student", "teacher"} and done["counted"] is False
    pids = {role: s["pid"] for role, s in samplers.items()}
    assert pids["student"] != pids["teacher"], samplers
    assert samplers["student"]["parent_pid"] == samplers["teacher"]["parent_pid"] not in pids.values(), samplers
    for s in samplers.values():
        assert (s["engine"]["backend"], s["engine"]["local_rank"], s["engine"]["engine_world"]) == ("uni", 0, 1)
        assert s["engine"]["max_model_len"] < 2048 and s["engine"]["sleeps"] is False
        assert (s["engine"]["requests_seeded"], s["engine"]["rollout_logprobs"]) == (True, None)   # asks for none
    assert min(done["selection_flops"].values()) > 0


def test_rehearsal_jobs_side_by_side_get_gpu_slots_of_their_own(rehearsal_dag):
    """The rehearsal's machine block (4 GPU slots, docs/one-machine.md): under local Snakemake each job of 2
    processes claims 2 slots (opdgrpo.launch, opdgrpo.gpu_slots) and records them in its done.json (a training run,
    in each attempt's record too); any two jobs that ran at the same time held disjoint slots, so their
    CUDA_VISIBLE_DEVICES never shared a device, and some did run side by side. The tokenizer jobs took none."""
    from gpu_slot_checks import slots_side_by_side

    workdir = rehearsal_dag.workdir
    plan = build_plan(compose(["profile=rehearsal"], REPO / "conf"))
    slots_side_by_side(workdir, plan, lambda job: {"tokenizer": 0, "difficulty": 1}.get(job.kind, 2), {0, 1, 2, 3})
    log = (workdir / "results" / "rehearsal" / "logs" / f"{rehearsal_dag.killed_run}.log").read_text()
    assert log.startswith(f"gpu slots: job results/rehearsal/runs/{rehearsal_dag.killed_run} on 2 GPU(s): slots ")


def test_rehearsal_resumes_the_killed_run(rehearsal_dag):
    """Killed in step 2's update (SIGKILL of one process: torchrun stops the other), the run kept its step-1
    checkpoint; the next ``snakemake`` resumed it: every step once."""
    killed, whole, run = rehearsal_dag.killed, rehearsal_dag.whole, rehearsal_dag.killed_run
    assert killed.returncode != 0 and run in killed.stdout + killed.stderr
    assert "rule grpo:" in whole.stdout + whole.stderr
    run_dir = rehearsal_dag.workdir / "results" / "rehearsal" / "runs" / run
    assert _steps(run_dir) == [0, 1, 2]
    assert _json(run_dir / "done.json")["steps"] == 3
