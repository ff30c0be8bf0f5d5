"""Checkpoints of a post-training run: the model in Hugging Face format plus the trainer's state.

A checkpoint is written to ``checkpoint.tmp/``, sealed with ``manifest.json`` (the sha256 and size of every other
file, written last) and renamed to ``checkpoint/``; the previous checkpoint is kept as ``checkpoint.old/``. At every
moment of a save at least one complete, sealed checkpoint exists, so a kill anywhere loses at most the steps since
the last one. On resume :func:`resume_point` takes the newest checkpoint whose manifest matches its files and whose
trainer state loads, warning about (and removing) a corrupt newer one; if none is valid the run starts over.
The trainer state records the config hash: a run whose config changed starts over instead of resuming.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from opdgrpo.job_identity import RUNTIME_KEYS, canonical_names, without_engine_runtime
from opdgrpo.runio import file_sha256
from opdgrpo.train import faults
from opdgrpo.train.finished import read_done, verify_finished

STATE_FILE = "trainer_state.pt"
MANIFEST = "manifest.json"
CANDIDATES = ("checkpoint", "checkpoint.old")
#: Seconds per GB of a checkpoint: written at 1 GB/s and read back at 1 GB/s for its sha256 manifest (ours, until a
#: GPU run's log, which prints each save's seconds, replaces it). The planner prices saves with it, and a run under
#: SLURM estimates its first save with it (opdgrpo.train.time_limit) until it has measured one.
CHECKPOINT_S_PER_GB = 2.0
#: Bytes of a checkpoint per student parameter: the fp32 weights (the gathered master state) and Adam's two moments.
CHECKPOINT_BYTES_PER_PARAM = 12

log = logging.getLogger("opdgrpo.train.checkpoint")


class CorruptCheckpoint(RuntimeError):
    """A checkpoint directory that is incomplete, truncated or altered since it was written."""


def config_hash(cfg: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]


#: Keys of ``train`` that change no step of a run (:mod:`opdgrpo.job_identity` says why): out of the run's identity.
NOT_IDENTITY_KEYS = RUNTIME_KEYS


def upstream_fingerprint(cfg: dict[str, Any]) -> dict[str, str]:
    """What identifies the checkpoints a run starts from and distils: each one's digest, from its job's ``done.json``,
    after checking that output is whole (:func:`opdgrpo.train.finished.verify_finished`, which raises naming the file).

    A rerun of an upstream job (a retrained teacher) leaves this run's config unchanged but its checkpoint
    stale; folding the upstream digests into the run's identity makes such a run start over. The digest is the
    upstream's weights, not the text of its ``done.json``, so rewriting that file restarts nothing below it.
    """
    paths = {"student": cfg["student"]["path"], **{f"teacher:{d}": t["path"] for d, t in cfg.get("teachers", {}).items()}}
    prints = {role: verify_finished(Path(path)) for role, path in paths.items()}
    if cfg.get("train_subset"):   # the selection itself, once its job's record parses
        subsets = Path(cfg["train_subset"]["file"])
        read_done(subsets.parent / "done.json")
        prints["subsets"] = file_sha256(subsets)
    return prints


class ResumeRefused(RuntimeError):
    """A checkpoint of this very run that cannot be resumed as things are set now; the message names the key."""


def run_identity(cfg: dict[str, Any]) -> str:
    """The hash a checkpoint must carry to be resumed by this run: its config (less :data:`NOT_IDENTITY_KEYS` and
    ``train.precision``) and its upstream checkpoints. The precision is left out because ``auto`` names no arithmetic:
    the one the checkpoint was trained in is kept in its trainer state and compared with the one this process
    resolved (:func:`check_precision`), so switching ``auto`` to the value it had chosen resumes the run. Renamed keys
    are hashed by their old names (:func:`opdgrpo.job_identity.canonical_names`): a checkpoint written before a
    rename still resumes. The engine's share and ``max_num_seqs`` are left out as the job's identity leaves them
    (:func:`opdgrpo.job_identity.without_engine_runtime`): a resumed attempt whose plan chose other values resumes."""
    cfg = without_engine_runtime(canonical_names(cfg))
    hashed = {**cfg, "train": {k: v for k, v in cfg["train"].items() if k not in NOT_IDENTITY_KEYS and k != "precision"}}
    return config_hash({"config": hashed, "upstream": upstream_fingerprint(cfg)})


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file() and p.relative_to(path).as_posix() != MANIFEST)


def write_manifest(path: Path) -> None:
    """Seal a checkpoint directory: sha256 and size of every file in it, written last."""
    files = {p.relative_to(path).as_posix(): {"sha256": file_sha256(p), "bytes": p.stat().st_size} for p in _files(path)}
    (path / MANIFEST).write_text(json.dumps({"format": 1, "files": files}, indent=1, sort_keys=True) + "\n")


def verify_checkpoint(path: Path) -> bool:
    """Raise :class:`CorruptCheckpoint`, naming the file, unless every file the manifest lists is there, unchanged.

    Returns False for a checkpoint without a manifest but with a trainer state: one written before manifests existed
    (the writer renames only sealed checkpoints into place, so no newer one lacks it); it cannot be verified.
    """
    manifest = path / MANIFEST
    if not manifest.is_file():
        if (path / STATE_FILE).is_file():
            return False
        raise CorruptCheckpoint(f"{manifest}: missing, and no {STATE_FILE} (incomplete checkpoint)")
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as err:
        raise CorruptCheckpoint(f"{manifest}: unreadable ({err})") from err
    if STATE_FILE not in files:
        raise CorruptCheckpoint(f"{manifest}: does not list {STATE_FILE}")
    for name, want in sorted(files.items()):
        file = path / name
        if not file.is_file():
            raise CorruptCheckpoint(f"{file}: missing")
        size = file.stat().st_size
        if size != want["bytes"]:
            raise CorruptCheckpoint(f"{file}: {size} bytes, the manifest says {want['bytes']} (truncated or overwritten)")
        if file_sha256(file) != want["sha256"]:
            raise CorruptCheckpoint(f"{file}: sha256 differs from the manifest (corrupted)")
    return True


def expected_save_seconds(student_params: float) -> float:
    """One save of a student with ``student_params`` parameters: its write and hash (also one resume's reads)."""
    return CHECKPOINT_S_PER_GB * CHECKPOINT_BYTES_PER_PARAM * student_params / 1e9


def save_checkpoint(run_dir: Path, model, tokenizer, optimizer, step: int, cumulative_flops: float, cfg_hash: str,
                    state_dict: dict[str, Any] | None = None, optimizer_state: dict[str, Any] | None = None,
                    **extra: Any) -> None:
    """Write, seal and rename a checkpoint into place; ``extra`` goes into the trainer state as it is.
    ``state_dict``/``optimizer_state``: the full states gathered from several processes (default: the objects')."""
    tmp, final, old = run_dir / "checkpoint.tmp", run_dir / "checkpoint", run_dir / "checkpoint.old"
    started = time.time()
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, state_dict=state_dict)
    tokenizer.save_pretrained(tmp)
    faults.kill_point("checkpoint_write", step)
    torch.save(
        {
            "step": step,
            "cumulative_flops": cumulative_flops,
            "config_hash": cfg_hash,
            "optimizer": optimizer.state_dict() if optimizer_state is None else optimizer_state,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            **extra,
        },
        tmp / STATE_FILE,
    )
    write_manifest(tmp)
    faults.pace_checkpoint(started)   # test-only: a save as slow as a large model's on a shared filesystem
    # Rotate: `checkpoint` (complete) becomes `checkpoint.old`, replacing the one before. If there is no `checkpoint`
    # (a fallback removed a corrupt one) the existing `checkpoint.old` stays: it is the only complete one.
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    faults.kill_point("checkpoint_rename", step)
    tmp.rename(final)


def load_state(path: Path) -> dict[str, Any]:
    """The trainer state of a checkpoint, after checking it against its manifest."""
    if not verify_checkpoint(path):
        log.warning("%s: no %s (written before checkpoints were checksummed); loading it unverified", path, MANIFEST)
    try:
        # onto the CPU: a state saved from a GPU would otherwise load onto the device it was saved from (every rank's
        # copy on cuda:0); the optimizer moves its state to its parameters' devices as it loads it
        return torch.load(path / STATE_FILE, weights_only=False, map_location="cpu")
    except Exception as err:  # a file that matches its manifest but does not unpickle: written corrupt
        raise CorruptCheckpoint(f"{path / STATE_FILE}: cannot be loaded ({type(err).__name__}: {err})") from err


def resume_point(run_dir: Path) -> tuple[Path | None, dict[str, Any] | None]:
    """The newest valid checkpoint and its trainer state, or ``(None, None)``.

    ``checkpoint/`` is tried first, then ``checkpoint.old/`` (the one before, or the only one left by a kill
    mid-rotation). Each invalid one is reported with a warning naming the bad file; a corrupt ``checkpoint/`` is
    removed when ``checkpoint.old/`` is used, so the next save keeps the valid one as ``checkpoint.old/``.
    """
    bad = []
    for name in CANDIDATES:
        path = run_dir / name
        if not path.is_dir():
            continue
        try:
            state = load_state(path)
        except CorruptCheckpoint as err:
            log.warning("%s: invalid checkpoint, not resumed from it: %s", path, err)
            bad.append(path)
            continue
        for corrupt in bad:
            log.warning("%s: removing the invalid checkpoint; resuming from %s (step %s)", corrupt, path, state.get("step"))
            shutil.rmtree(corrupt, ignore_errors=True)
        return path, state
    if bad:
        log.warning("%s: no valid checkpoint (%s); the run starts over", run_dir, ", ".join(p.name for p in bad))
    return None, None


def check_precision(state: dict[str, Any], resolved: str, configured: str, run_id: str, run_dir: Path) -> None:
    """:class:`ResumeRefused` unless the checkpoint was trained in the arithmetic this process resolved: a run that
    changed from float32 to bf16 halfway (``precision: auto`` measured again on a loaded machine) is neither run's
    curve. A checkpoint from before the precision was recorded is resumed as it is."""
    trained = state.get("precision")
    if trained is None or trained == resolved:
        return
    raise ResumeRefused(
        f"run {run_id}: its checkpoint at step {state.get('step')} was trained in {trained}, and `train.precision: "
        f"{configured}` resolves to {resolved} in this process; pass `train.precision={trained}` to resume it in the "
        f"arithmetic it started in, or delete {run_dir} to redo the run in {resolved}")


def history_gaps(run_dir: Path, start: int, eval_every: int) -> str | None:
    """What is missing from a run's history before its resume point ``start``, or None when it is whole: one ledger
    line per step and one evaluation per scheduled step (0, ``eval_every``, ...). A checkpoint whose history was lost
    (an ``evals.jsonl`` deleted by hand, a copy that left it out) would otherwise be resumed into a curve with no
    step-0 evaluation, which every gain is measured from; such a run is redone instead."""
    from opdgrpo.runio import read_jsonl

    steps = {r.get("step") for r in read_jsonl(run_dir / "ledger.jsonl")}
    evals = {r.get("step") for r in read_jsonl(run_dir / "evals.jsonl")}
    no_line = [s for s in range(start) if s not in steps]
    no_eval = [s for s in range(0, start, eval_every) if s not in evals]
    parts = ([f"ledger.jsonl lacks step(s) {_listed(no_line)}"] if no_line else []) + (
        [f"evals.jsonl lacks the evaluation(s) at step(s) {_listed(no_eval)}"] if no_eval else [])
    return "; ".join(parts) or None


def _listed(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:5])) + (f" and {len(steps) - 5} more" if len(steps) > 5 else "")


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
