"""Verifiable domains by kind; a domain's config names its kind (``kind: arithmetic``)."""

from __future__ import annotations

from typing import Any, Mapping

from .base import Domain, Task, heldout_overlap
from .code import CodeDomain
from .hub_choice import HubChoiceDomain
from .hub_code import HubCodeDomain
from .hub_ifeval import HubIFEvalDomain
from .hub_math import HubMathDomain
from .instructions import InstructionDomain
from .knowledge import KnowledgeDomain
from .math import MathDomain

KINDS = {
    "arithmetic": MathDomain,
    "function_synthesis": CodeDomain,
    "instruction_following": InstructionDomain,
    "knowledge": KnowledgeDomain,
    # paper scale: real data sets through `datasets`, real verifiers (domains/hub*.py)
    "hub_choice": HubChoiceDomain,
    "hub_code": HubCodeDomain,
    "hub_ifeval": HubIFEvalDomain,
    "hub_math": HubMathDomain,
}


def build_domain(cfg: Mapping[str, Any]) -> Domain:
    kind = cfg.get("kind")
    if kind not in KINDS:
        raise ValueError(f"domain {cfg.get('name')!r}: unknown kind {kind!r}; known kinds: {sorted(KINDS)}")
    return KINDS[kind](cfg)


__all__ = ["Domain", "Task", "build_domain", "heldout_overlap", "KINDS"]
