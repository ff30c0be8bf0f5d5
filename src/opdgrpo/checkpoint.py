"""Checkpoints of a post-training run: the model in Hugging Face format plus the trainer's state.

A checkpoint is written to ``checkpoint.tmp/`` and renamed into place, the previous one kept as
``checkpoint.old/`` until the rename is done, so a kill at any moment leaves one complete checkpoint.
The trainer state records the config hash: a run whose config changed starts over instead of resuming.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"


def config_hash(cfg: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_checkpoint(run_dir: Path, model, tokenizer, optimizer, step: int, cumulative_flops: float, cfg_hash: str) -> None:
    tmp, final, old = run_dir / "checkpoint.tmp", run_dir / "checkpoint", run_dir / "checkpoint.old"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save(
        {
            "step": step,
            "cumulative_flops": cumulative_flops,
            "config_hash": cfg_hash,
            "optimizer": optimizer.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        },
        tmp / STATE_FILE,
    )
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def find_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint, including one left as ``checkpoint.old`` by a kill mid-rename."""
    for name in ("checkpoint", "checkpoint.old"):
        path = run_dir / name
        if (path / STATE_FILE).is_file():
            return path
    return None


def load_state(path: Path) -> dict[str, Any]:
    return torch.load(path / STATE_FILE, weights_only=False)


def restore_rng(state: dict[str, Any]) -> None:
    """Put the global RNGs back as they were at the checkpoint (only when it is resumed)."""
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])


def clear_run(run_dir: Path) -> None:
    """Remove what a previous, different config left (its ledger would not match this config)."""
    for name in ("checkpoint", "checkpoint.old", "checkpoint.tmp"):
        shutil.rmtree(run_dir / name, ignore_errors=True)
    for name in ("ledger.jsonl", "evals.jsonl", "done.json"):
        (run_dir / name).unlink(missing_ok=True)
