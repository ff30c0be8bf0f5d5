"""Shared fixtures: a smoke-scale world (tokenizer and base models) built once per test session; and each test's tier
marker, from its folder: tests/unit -> `unit`, tests/integration -> `integration`, tests/e2e -> `e2e` (README, Tests)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from opdgrpo.config import compose
from opdgrpo.plan.build import build_plan

REPO = Path(__file__).resolve().parents[1]
TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(config, items):
    """Mark every test with its tier, the first folder under tests/ (so `-m unit`, `-m "not e2e"` select by tier)."""
    tests = Path(__file__).resolve().parent
    for item in items:
        try:
            tier = item.path.resolve().relative_to(tests).parts[0]
        except ValueError:
            continue
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def smoke_world(tmp_path_factory):
    """Compose the smoke profile under a temp results dir and build its tokenizer and base models."""
    from opdgrpo.runio import write_json
    from opdgrpo.stages.pretrain import pretrain
    from opdgrpo.train.tokenizer import build_tokenizer, save_tokenizer

    root = tmp_path_factory.mktemp("world")
    cfg = compose(["profile=smoke", f"results_dir={root}/results"], REPO / "conf")
    plan = build_plan(cfg)
    tok_job = plan.jobs["tokenizer"]
    tc = tok_job.config
    save_tokenizer(build_tokenizer(tc["domains"], tc["tokenizer"]["vocab_size"], tc["tokenizer"]["samples_per_domain"]), Path(tok_job.out_dir))
    write_json(Path(tok_job.done), {})
    for job in plan.by_kind("base"):
        if job.label in ("student", "teacher_m"):
            pretrain(job.config, Path(job.out_dir))
    return cfg, plan


@pytest.fixture(scope="session")
def knowing_student(smoke_world, tmp_path_factory) -> str:
    """The smoke student pretrained until GRPO finds rewards (tests/learning.py), once per session."""
    from learning import pretrain_knowing_student

    return pretrain_knowing_student(smoke_world[1], tmp_path_factory.mktemp("knowing") / "student")


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """Tests (and the in-process train/pretrain calls they make) set torch's thread count; the thread count can choose
    the kernel, so each test starts from the session's own."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _fresh_check_memo():
    """The code checker remembers outcomes per process (opdgrpo.sandbox.execution); each test runs the programs it names, so a
    batch of hostile and good programs stays a batch in every test, not only the first."""
    from opdgrpo.sandbox import execution

    execution._memo.clear()
    yield
    execution._memo.clear()


@pytest.fixture
def fresh_numerics(monkeypatch):
    """No fast-path decision carried over from another test, and ``OPDGRPO_FAST_PATHS`` unset."""
    from opdgrpo.train import numerics

    monkeypatch.delenv(numerics.ENV, raising=False)
    numerics.reset()
    yield
    numerics.reset()


@pytest.fixture
def rigged_rewards(monkeypatch) -> None:
    """Every group's rewards alternate 1, 0, 1, 0, ... whatever was sampled, so every GRPO step has a gradient.
    Whether a barely pretrained smoke student finds a reward in a few steps depends on the CPU's last bits (see
    tests/integration/test_distributed.py); tests using this check what the updates do, not the rewards."""
    from opdgrpo.train import loop as trainer

    sample_and_score = trainer.sample_and_score

    def rigged(*args, **kwargs):
        scored = sample_and_score(*args, **kwargs)
        scored.rewards = (torch.arange(len(scored.rewards)) % 2).to(scored.rewards.dtype)
        return scored

    monkeypatch.setattr(trainer, "sample_and_score", rigged)
