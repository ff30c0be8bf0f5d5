"""Wall time a job spends beside its FLOPs: code scoring, checkpoint saves, model loads and engine start-ups.

Each figure is a (low, high) pair: the high end is what the refusals (:func:`opdgrpo.cost.resources.unfit`) and the
SLURM settings (:mod:`opdgrpo.cost.stops`) are sized from. The figures are ours until a GPU pilot's job log
replaces them (each checkpoint line prints its seconds, vLLM logs its start-up phases); docs/cost-model.md says
where each comes from.

- **Code scoring** (:mod:`opdgrpo.verifiers.code`, :mod:`opdgrpo.sandbox.stdio`): every answer's program runs in
  its own sandbox, a fresh forked process per test; a program runs every test unless one stops it (a time limit, a
  crash: the harness stops there), so a wrong but fast program costs all its tests and a slow one its tests up to
  one ``per_test_timeout_s`` (6 s, LiveCodeBench's). Training problems keep ``max_tests`` tests (15), held-out
  ones all of theirs (LiveCodeBench's public and private tests: :data:`HELDOUT_TESTS` assumed). Each process
  scores its own rows with ``verifier.workers`` sandboxes at once (null: the CPU count, at most 4), the GPUs idle.
- **Checkpoints** (:mod:`opdgrpo.train.checkpoint`): the main process writes the gathered fp32 weights and Adam's
  two moments (12 bytes per student parameter), then reads every file back for the sha256 manifest, while the
  other processes wait in a barrier; on resume every process hashes and loads it again.
- **Start-ups**: every attempt of a job reads its models from the shared filesystem (the trainer's student and
  teachers; a base job's model by its vLLM engine, the stage itself building it on `meta`) and starts its
  vLLM engine: ``torch.compile`` (cached after the first start), the profiling forward, CUDA graph capture.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

# A checkpoint save's seconds: the trainer's own estimate (its bytes per parameter and GB/s), which it also uses to
# stop in time under SLURM (opdgrpo.train.time_limit).
from opdgrpo.train.checkpoint import expected_save_seconds

#: GB/s a job reads model weights at from a shared filesystem (low end: a fast one, high end: a busy one). Ours.
LOAD_GBPS = (2.0, 0.5)
#: Seconds of one vLLM engine start beyond reading weights: ``torch.compile`` (tens of seconds, cached after the
#: first start), the profiling forward, CUDA graph capture of 51 decode sizes (10-60 s). Ours.
ENGINE_START_S = (60.0, 240.0)
#: Seconds of one sandbox's start (interpreter, namespaces, payload), per program scored. Ours.
SANDBOX_START_S = (0.2, 0.5)
#: Seconds of one test that ends in time (fork, input file, the program's own run on the longest inputs). Ours.
TEST_S = (0.03, 0.15)
#: Share of programs stopped by a test's time limit (each pays one ``per_test_timeout_s``). Ours.
TIMEOUT_SHARE = (0.03, 0.10)
#: Tests per held-out LiveCodeBench problem (its public and private tests, run in full). Ours.
HELDOUT_TESTS = 30
#: Sandboxes a process runs at once when ``verifier.workers`` is null (the CPU count, at most 4).
DEFAULT_WORKERS = 4

LOW, HIGH = 0, 1


def program_seconds(verifier: Mapping[str, Any] | None, tests: int, end: int) -> float:
    """Seconds to score one program against ``tests`` tests at the ``end`` (LOW or HIGH) of the range."""
    timeout = float((verifier or {}).get("per_test_timeout_s") or 6.0)
    return SANDBOX_START_S[end] + tests * TEST_S[end] + TIMEOUT_SHARE[end] * timeout


def workers(verifier: Mapping[str, Any] | None) -> int:
    return int((verifier or {}).get("workers") or DEFAULT_WORKERS)


def scoring_seconds(domain: Mapping[str, Any], rows: float, heldout: bool, end: int) -> float:
    """Seconds one process takes to score ``rows`` answers of ``domain``: a ``hub_code`` domain's programs, its
    sandboxes in parallel, a training problem's ``max_tests`` tests or a held-out problem's :data:`HELDOUT_TESTS`;
    any other kind scores in no time worth counting here (string checks, math-verify)."""
    if rows <= 0 or domain.get("kind") != "hub_code":
        return 0.0
    verifier = domain.get("verifier") or {}
    tests = HELDOUT_TESTS if heldout else int(verifier.get("max_tests") or HELDOUT_TESTS)
    return math.ceil(rows) * program_seconds(verifier, tests, end) / workers(verifier)


def checkpoint_seconds(student_params: float) -> float:
    """One save of a student with ``student_params`` parameters: write and hash (also one resume's reads)."""
    return expected_save_seconds(student_params)


def load_seconds(weight_bytes: float, end: int) -> float:
    """Reading ``weight_bytes`` of model files from the shared filesystem."""
    return weight_bytes / 1e9 / LOAD_GBPS[end]
