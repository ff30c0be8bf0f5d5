"""A smoke student with a reward signal, for tests that compare GRPO updates (shared by the tiers; see conftest)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from opdgrpo.runio import read_jsonl
from opdgrpo.train.loop import train


def pretrain_knowing_student(plan, out: Path) -> str:
    """The smoke student pretrained 300 steps: it answers some knowledge questions, so GRPO has a reward signal."""
    from opdgrpo.stages.pretrain import pretrain

    job = copy.deepcopy(plan.jobs["base-student"].config)
    job["model"]["pretrain"]["steps"] = 300
    pretrain(job, out)
    return str(out / "checkpoint")


def one_process_run_that_learns(cfg: dict, tmp_path: Path, seeds: int = 16) -> tuple[dict, Path]:
    """The one-process reference run, at the first seed whose first step has a gradient.

    A GRPO group whose sampled rewards are all equal has zero advantages; a step made only of such groups has zero
    gradient, and two processes would "agree" with one without either updating anything. Which seed gives the first
    step a reward signal depends on the machine's last bits (seed 0 gave none on two Intel Xeons), so the test looks
    for one rather than assuming it; the second step then starts from updated weights in both runs.
    """
    for seed in range(seeds):
        cfg = {**copy.deepcopy(cfg), "seed": seed}
        one = tmp_path / f"one-seed{seed}"
        train(copy.deepcopy(cfg), one)
        if read_jsonl(one / "ledger.jsonl")[0]["grad_norm"] > 0:
            return cfg, one
    pytest.fail(f"none of seeds 0-{seeds - 1} gave the first step a gradient: the smoke student finds no reward signal")


#: A "short answer": at most this many characters (a property the base student meets by chance in about 5-10% of its
#: samples and GRPO teaches it in a few steps, by stopping early).
SHORT_CHARS = 3


def short_answer_scores(domains, tasks, texts) -> torch.Tensor:
    """Stands in for :func:`opdgrpo.train.rollout.score`: 1 for a short answer, 0 otherwise, whatever the task asked. The
    smoke student learns no real domain in a CI-sized run; this gives tests a reward GRPO measurably raises."""
    return torch.tensor([float(len(text.strip()) <= SHORT_CHARS) for text in texts])
