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


def check_style(style: str) -> None:
    if style not in ("brief", "thinking"):
        raise ValueError(f"demonstration style must be 'brief' or 'thinking', got {style!r}")
