"""What every verifiable domain provides: prompt pools, held-out sets, demonstrations and a reward.

A domain is a small object built from its config block (``conf/domain/<name>.yaml``). Pools are
deterministic functions of the config, so every job that rebuilds them gets the same prompts, and
held-out instances are excluded from the training pool and from pretraining by construction.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence


@dataclass(frozen=True)
class Task:
    """One prompt with everything its verifier needs; ``answer`` is domain-specific."""

    domain: str
    prompt: str
    answer: Any
    meta: Mapping[str, Any] = field(default_factory=dict)


class Domain(Protocol):
    name: str

    def training_pool(self) -> list[Task]: ...

    def heldout_sets(self) -> dict[str, list[Task]]: ...

    def pretraining_task(self, rng) -> Task: ...

    def demonstration(self, task: Task, style: str) -> str: ...

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]: ...


def stable_fraction(key: str, salt: str = "") -> float:
    """A deterministic number in [0, 1) per key, used to split instance spaces into pools."""
    digest = hashlib.sha256(f"{salt}|{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def heldout_overlap(domain: str, pool: Sequence[Task], heldout: Mapping[str, Sequence[Task]]) -> str | None:
    """None when every held-out set is disjoint from the training pool, else what overlaps (one example prompt).

    The domains guarantee disjointness by construction (a hashed share of each instance space is reserved); this
    is the check that the guarantee held, run before any compute, because an overlap would silently turn
    held-out accuracy into training accuracy.
    """
    train_prompts = {t.prompt for t in pool}
    for name, tasks in heldout.items():
        shared = [t.prompt for t in tasks if t.prompt in train_prompts]
        if shared:
            return (f"domain {domain}: held-out set {name!r} shares {len(shared)} prompt(s) with the training pool "
                    f"(e.g. {shared[0]!r}); held-out prompts must never be trained on: fix the domain's split "
                    f"(`domains.{domain}.heldout_fraction`, its generator) so the sets are disjoint")
    return None


def check_style(style: str) -> None:
    if style not in ("brief", "thinking"):
        raise ValueError(f"demonstration style must be 'brief' or 'thinking', got {style!r}")
