"""How a job is told to stop, and how long one process may wait for another: the settings the rules pass on.

Two numbers per job, from the planner's own phase times (high end), so a job is neither killed before its checkpoint
nor torn down by a collective that timed out while another process was doing planned work:

- ``signal_lead_s``: SLURM's warning lead (``--signal=URG@<s>``), the backstop to the trainer's own stop before its
  time limit (:mod:`opdgrpo.train.time_limit`), and how long torchrun waits for its workers after a SIGTERM
  (``--shutdown-timeout``): a training job notes the signal, finishes the step or the evaluation under way (the
  trainer stops between them), saves a checkpoint and exits; the lead covers the longer of a step and an evaluation
  plus a save, with a margin (:func:`opdgrpo.cost.train_time.lead_seconds`). A base or difficulty job does not
  resume: it gets no warning, and keeps the default for torchrun.
- ``collective_timeout_s``: the torch process-group timeout: the longest planned phase during which one process may
  sit in a collective while another works (the main process writing and hashing a checkpoint while the others wait
  in a barrier, uneven code scoring before a gather, uneven evaluation shares before a gather, an engine start, a
  resume's checkpoint reads), times :data:`COLLECTIVE_MARGIN`, never below torch's NCCL default.

Either may be set per kind of job (``resources.<kind>.signal_lead_s``, ``resources.<kind>.collective_timeout_s``),
which wins over the estimate; without a ``hardware`` block there is no estimate and the defaults apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from opdgrpo.cost.job_estimate import JobEstimate
from opdgrpo.cost.train_time import lead_seconds

#: The warning lead without an estimate (what workflow/profiles/slurm ships for the CPU profiles).
SIGNAL_LEAD_DEFAULT_S = 120
#: The process-group timeout without an estimate.
COLLECTIVE_DEFAULT_S = 1800
#: torch's default timeout of an NCCL process group (``torch.distributed.constants.default_pg_nccl_timeout``).
NCCL_DEFAULT_S = 600
#: The collective timeout over the longest planned wait.
COLLECTIVE_MARGIN = 2.0


@dataclass(frozen=True)
class StopSettings:
    """One job's stop settings (module docstring); ``why`` names the phase (or the key) that set each."""

    signal_lead_s: int
    collective_timeout_s: int
    why: str


def _minutes(seconds: float) -> int:
    """Whole minutes, up: a lead or a timeout rounded to what a person reads."""
    return 60 * math.ceil(seconds / 60)


def settings(cfg: Mapping[str, Any], kind: str, est: JobEstimate | None) -> StopSettings:
    """The stop settings of one job of ``kind`` (``est``: its estimate; None without ``hardware``)."""
    block = (cfg.get("resources") or {}).get(kind) or {}
    lead, lead_why = SIGNAL_LEAD_DEFAULT_S, "default"
    wait, wait_why = COLLECTIVE_DEFAULT_S, "default"
    if est is not None and est.costs:
        if kind == "train":
            lead = _minutes(lead_seconds(est))
            lead_why = f"{'an evaluation' if est.eval_s > est.step_s else 'a step'} and a checkpoint save"
        else:
            lead_why = f"default (a {kind} job does not resume: a warning only ends it)"
        if est.gpus <= 1:
            wait, wait_why = NCCL_DEFAULT_S, "torch's NCCL default (one process: nothing waits for another)"
        elif est.waits:
            phase = max(est.waits, key=est.waits.get)
            wait = max(NCCL_DEFAULT_S, _minutes(COLLECTIVE_MARGIN * est.waits[phase]))
            wait_why = phase if wait > NCCL_DEFAULT_S else f"torch's NCCL default (longest wait: {phase})"
    if block.get("signal_lead_s"):
        lead, lead_why = int(block["signal_lead_s"]), f"resources.{kind}.signal_lead_s"
    if block.get("collective_timeout_s"):
        wait, wait_why = int(block["collective_timeout_s"]), f"resources.{kind}.collective_timeout_s"
    return StopSettings(int(lead), int(wait), f"signal lead: {lead_why}; collective timeout: {wait_why}")


def stop_settings_of(cfg: Mapping[str, Any], jobs: Mapping[str, str],
                     estimates: Mapping[str, JobEstimate]) -> dict[str, StopSettings]:
    """Stop settings of every job in ``jobs`` (job id -> kind), from its estimate where there is one."""
    return {job: settings(cfg, kind, estimates.get(job)) for job, kind in jobs.items()}
