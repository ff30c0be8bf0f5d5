"""``opdgrpo fetch`` against a stand-in for the Hugging Face Hub (tests/hub_stub.py on 127.0.0.1), and the jobs run
offline (``HF_HUB_OFFLINE=1``) before and after it: a job fails at its start naming what is missing and the fetch
command, then runs from the caches the fetch filled.

The stand-in serves a tiny Qwen3 model saved with save_pretrained as ``Qwen/Qwen3-4B-Base`` (plus a file the jobs'
``allow_patterns`` leave out) and the math fixtures (tests/fixtures/hub/, the hub's schemas) as their data set repos.
Both libraries read ``HF_ENDPOINT`` and ``HF_HOME`` when imported, so every step is a subprocess, as on a cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hub_stub import HubStub

from opdgrpo.config import compose
from opdgrpo.plan.build import build_plan

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "hub"
#: The paper profile cut to S3 (the student's math runs), without base evaluations: 5 jobs reading one model (the
#: student's repo, which the tokenizer also comes from) and the 4 math data sets.
MATH_ONLY = [*(f"studies.{s}=null" for s in ("S1", "S1b", "S2", "S4", "S5", "S5b")),
             *(f"models.{m}=null" for m in ("student_1p7b", "student_8b", "student_olmo3", "olmo3_7b_think", "qwen3_4b",
                                            "qwen3_8b", "qwen3_14b", "qwen3_32b")),
             "pretrain.eval.max_prompts=0"]
DATA_SETS = {"open-r1/DAPO-Math-17k-Processed": "open-r1__DAPO-Math-17k-Processed", "HuggingFaceH4/aime_2024":
             "HuggingFaceH4__aime_2024", "math-ai/aime25": "math-ai__aime25", "math-ai/amc23": "math-ai__amc23"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The stand-in hub, serving a tiny Qwen3 student with a chat tokenizer and the math data sets."""
    from opdgrpo.train.models import build_model
    from opdgrpo.train.tokenizer import CHAT_TEMPLATE, CHAT_TOKENS, build_tokenizer

    smoke = compose(["profile=smoke"], REPO / "conf")
    tok = build_tokenizer(smoke["domains"], 256, 50)
    tok.add_special_tokens({"additional_special_tokens": CHAT_TOKENS})
    tok.chat_template = CHAT_TEMPLATE
    model = tmp_path_factory.mktemp("hub") / "qwen3"
    build_model(smoke["models"]["student"], len(tok), tok.pad_token_id, tok.eos_token_id, 0).save_pretrained(model)
    tok.save_pretrained(model)
    (model / "optimizer.pt").write_bytes(b"not in MODEL_FILES")   # a file the jobs' allow_patterns leave out
    repos = {("model", "Qwen/Qwen3-4B-Base"): model, **{("dataset", hub_id): FIXTURES / d for hub_id, d in DATA_SETS.items()}}
    with HubStub(repos) as stub:
        yield stub


def _env(hub: HubStub, home: Path, offline: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update({"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "PYTHONPATH": str(REPO / "src")})
    return {**env, "HF_HUB_OFFLINE": "1"} if offline else env


def _opdgrpo(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opdgrpo.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def _fetch(hub: HubStub, home: Path, *extra: str) -> tuple[subprocess.CompletedProcess, list[tuple[str, str]]]:
    """``opdgrpo fetch`` and the requests the hub got while it ran."""
    before = len(hub.requests)
    done = _opdgrpo(_env(hub, home), "fetch", "--profile", "paper", *extra, *MATH_ONLY)
    return done, hub.requests[before:]


def _rows(stdout: str) -> dict[str, list[str]]:
    """status -> the rows with it (a row: status, size, then the item)."""
    rows: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        if line and not line.startswith(("#", "total")):
            rows.setdefault(line.split("  ")[0].strip(), []).append(line)
    return rows


def test_fetch_fills_empty_caches_then_finds_them_cached(hub, tmp_path):
    home = tmp_path / "hf"
    dry, requests = _fetch(hub, home, "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert len(_rows(dry.stdout)["to fetch"]) == 5 and requests == [] and not (home / "hub").exists()

    done, requests = _fetch(hub, home)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(done.stdout)
    assert len(rows["fetched"]) == 5 and set(rows) == {"fetched", "unused"}, done.stdout
    model = rows["fetched"][0]
    assert f"tokenizer.path, models.student.path: Qwen/Qwen3-4B-Base (revision main) from {hub.endpoint}/Qwen/Qwen3-4B-Base" in model
    assert model.split()[2] == "kB" and float(model.split()[1]) > 300   # the tiny model's 365 kB of weights
    assert any(f"math-ai/amc23 (split test, revision main) from {hub.endpoint}/datasets/math-ai/amc23" in r for r in rows["fetched"])
    got = {path.rsplit("/", 1)[1] for path in hub.downloads()}
    assert {"model.safetensors", "tokenizer.json", "train.parquet", "test.parquet"} <= got and "optimizer.pt" not in got
    total = done.stdout.splitlines()[-1]
    assert total.startswith("total: ") and total.endswith("on disk for 5 item(s) (5 fetched)")

    again, requests = _fetch(hub, home)
    assert again.returncode == 0 and requests == []   # found without asking the hub anything
    cached = _rows(again.stdout)["cached"]
    assert len(cached) == 5 and all(r.endswith(": already in the cache, not downloaded") for r in cached)
    assert again.stdout.splitlines()[-1] == total.replace("fetched", "cached")


def test_a_failed_item_is_named_and_the_others_are_fetched(hub, tmp_path):
    done, _ = _fetch(hub, tmp_path / "hf", "models.student.path=Qwen/Qwen3-4B-Nope")
    assert done.returncode == 1
    rows = _rows(done.stdout)
    assert len(rows["FAILED"]) == 1 and len(rows["fetched"]) == 5   # the tokenizer's repo is still the real one
    assert "models.student.path: Qwen/Qwen3-4B-Nope (revision main): RepositoryNotFoundError" in rows["FAILED"][0]
    assert done.stdout.splitlines()[-1].endswith("(5 fetched, 1 failed); failed: models.student.path")


def test_jobs_offline_fail_at_start_then_run_from_the_fetched_caches(hub, tmp_path):
    home = tmp_path / "hf"
    plan = build_plan(compose(["profile=paper", f"results_dir={tmp_path}/results", *MATH_ONLY], REPO / "conf"))
    offline = _env(hub, home, offline=True)

    def job(name: str) -> list[str]:
        command = {"tokenizer": "tokenizer", "base": "pretrain", "train": "train"}[plan.jobs[name].kind]
        return [command, "--out", plan.jobs[name].out_dir, "--config-json", json.dumps(plan.jobs[name].config)]

    asked = len(hub.requests)
    started = time.time()
    base = _opdgrpo(offline, *job("base-student"))
    assert base.returncode != 0 and time.time() - started < 60
    assert "config key `models.student.path`: Qwen/Qwen3-4B-Base (revision main) is not on this machine" in base.stderr
    assert "run `opdgrpo fetch --profile paper`" in base.stderr
    assert not (Path(plan.jobs["base-student"].out_dir) / "checkpoint").exists()   # failed before anything was written
    train = _opdgrpo(offline, *job("grpo-student-math-s0"))
    assert train.returncode != 0
    assert all(f"config key `{k}`" in train.stderr for k in ("domains.math.train.source", "domains.math.heldout.aime24.source",
                                                            "domains.math.heldout.aime25.source", "domains.math.heldout.amc23.source"))
    assert len(hub.requests) == asked   # offline: nothing was asked of the hub

    assert _fetch(hub, home)[0].returncode == 0
    after = len(hub.requests)
    for name in ("tokenizer", "base-student"):   # the real jobs, offline, from the caches
        done = _opdgrpo(offline, *job(name))
        assert done.returncode == 0, done.stderr[-3000:]
    assert Path(plan.jobs["base-student"].out_dir, "checkpoint", "model.safetensors").is_file()
    check = ("import json, sys; from opdgrpo.cli import _require_cached; "
             "_require_cached('train', json.loads(sys.argv[1]), sys.argv[2])")
    run = plan.jobs["grpo-student-math-s0"]
    done = subprocess.run([sys.executable, "-c", check, json.dumps(run.config), run.out_dir], env=offline,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(hub.requests) == after   # offline: the jobs asked the hub nothing
