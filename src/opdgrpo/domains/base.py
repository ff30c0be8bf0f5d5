"""What every verifiable domain provides: prompt pools, held-out sets, demonstrations and a reward.

A domain is a small object built from its config block (``conf/domain/<name>.yaml``). Pools are
deterministic functions of the config, so every job that rebuilds them gets the same prompts, and
held-out instances are excluded from the training pool and from pretraining by construction.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol, Sequence


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


def heldout_k(cfg: Mapping[str, Any], set_name: str) -> int | None:
    """Samples per prompt a domain asks for one held-out set (``heldout.<set>.k``, e.g. 16 for AIME, or 1 on a set
    large enough that more prompts measure better than more samples per prompt); None: the run's ``train.eval.k``."""
    spec = ((cfg or {}).get("heldout") or {}).get(set_name) or {}
    return int(spec["k"]) if spec.get("k") else None


def check_style(style: str) -> None:
    if style not in ("brief", "thinking"):
        raise ValueError(f"demonstration style must be 'brief' or 'thinking', got {style!r}")


#: The prompt prefix every domain's shared-form prompts carry instead of their own (``calc ``, ``code ``, ...).
SHARED_PREFIX = "ask "


#: Every tiny kind's marks (math, code, instruction following, knowledge); a pretraining demonstration of a
#: shared-form prompt takes one of them at random, so a base model knows the shared form's marks but not which
#: domain wants which (:meth:`SharedForm.for_pretraining`).
SHARED_WRAPS = ("<>", "{}", "**", "[]")


@dataclass(frozen=True)
class SharedForm:
    """Domain interference (``domains.<name>.interference``; docs/method.md, "Domain interference").

    A hashed share ``strength`` of the domain's instances (training pool, held-out sets and pretraining alike) is
    written in the *shared form*: the domain's own prefix is replaced by :data:`SHARED_PREFIX`, which every domain
    uses, and the whole response must be wrapped in the domain's own pair of marks (``wrap``: math ``<>``, code
    ``{}``, instruction following ``**``, knowledge ``[]``). The same surface form thus asks for conflicting
    conventions, resolved only by the domain (told apart by the prompt's content alone): a response in another
    domain's convention scores 0. At strength 0 (the default) no instance is touched and the world is exactly what
    it was without this class. Which instances take the shared form is a hash of the canonical prompt, so the
    held-out split and the pools hold the same instances at any strength. Pretraining rows in the shared form are
    demonstrated with marks drawn at random from :data:`SHARED_WRAPS`: the base model has seen the shared form
    answered in every domain's marks, and which domain wants which is what post-training must learn.
    """

    domain: str
    prefix: str
    wrap: str
    strength: float = 0.0

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], domain: str, prefix: str, wrap: str) -> "SharedForm":
        strength = cfg.get("interference", 0.0)
        strength = 0.0 if strength is None else float(strength)
        if not 0.0 <= strength <= 1.0:
            raise ValueError(f"domain {domain}: config key `interference` must be in [0, 1] (the share of prompts in the "
                             f"shared form; 0: none), got {strength}")
        if strength > 0 and prefix == SHARED_PREFIX:
            raise ValueError(f"domain {domain}: config key `prompt_prefix` must differ from the shared prefix "
                             f"{SHARED_PREFIX!r} when `interference` > 0")
        return cls(domain, prefix, wrap, strength)

    def apply(self, task: Task) -> Task:
        """``task`` itself, or in the shared form when its canonical prompt hashes into the shared share."""
        if self.strength <= 0 or stable_fraction(task.prompt, salt=f"{self.domain}|shared") >= self.strength:
            return task
        if not task.prompt.startswith(self.prefix):
            raise ValueError(f"domain {self.domain}: prompt {task.prompt!r} does not start with its prefix {self.prefix!r}")
        prompt = SHARED_PREFIX + task.prompt[len(self.prefix):]
        return replace(task, prompt=prompt, meta={**task.meta, "shared": True})

    def for_pretraining(self, task: Task, rng) -> Task:
        """A pretraining row's task: in the shared form, its demonstration's marks are drawn from :data:`SHARED_WRAPS`
        (uniformly, whatever the domain); any other task is returned as it is, with no draw from ``rng``."""
        if not is_shared(task):
            return task
        return replace(task, meta={**task.meta, "demo_wrap": rng.choice(SHARED_WRAPS)})

    def demonstration(self, task: Task, text: str) -> str:
        """A shared-form task's demonstration wrapped in the domain's marks (a pretraining row's: in its drawn marks);
        any other task's unchanged."""
        if not is_shared(task):
            return text
        wrap = task.meta.get("demo_wrap", self.wrap)
        return f"{wrap[0]}{text}{wrap[1]}"

    def unwrap(self, task: Task, completion: str) -> str | None:
        """What the domain's verifier reads: the completion itself for a task in the domain's own form; for a shared
        one, the text inside the domain's marks (the stripped response must open and close with them), else None."""
        if not is_shared(task):
            return completion
        text = completion.strip()
        if len(text) < 2 or text[0] != self.wrap[0] or text[-1] != self.wrap[1]:
            return None
        return text[1:-1]

    def score(self, tasks: Sequence[Task], completions: Sequence[str],
              verifier: Callable[[Sequence[Task], Sequence[str]], list[float]]) -> list[float]:
        """``verifier``'s rewards on the unwrapped completions; 0 where a shared-form response lacks the domain's marks."""
        if self.strength <= 0:
            return verifier(tasks, completions)
        inner = [self.unwrap(t, c) for t, c in zip(tasks, completions, strict=True)]
        rewards = verifier(tasks, ["" if text is None else text for text in inner])
        return [0.0 if text is None else r for text, r in zip(inner, rewards)]

    def metrics(self, tasks: Sequence[Task], rewards: Sequence[float]) -> dict[str, float | None]:
        """Accuracy on the set's shared-form prompts and on its own-form ones (None where a set has none)."""
        split: dict[str, list[float]] = {"shared": [], "own": []}
        for task, reward in zip(tasks, rewards, strict=True):
            split["shared" if is_shared(task) else "own"].append(float(reward))
        return {f"{k}_accuracy": (sum(v) / len(v) if v else None) for k, v in split.items()} | {
            "shared_share": len(split["shared"]) / max(1, len(tasks))}


@dataclass(frozen=True)
class Slip:
    """A slip in how a base model gives its answers (``domains.<name>.pretrain_slip``, optional; docs/method.md, "The tiny world";
    the probes behind it: docs/LOG.md).

    A hashed share ``rate`` of the domain's pretraining prompts is demonstrated, in the brief style only (the
    students'; the teachers' step-by-step answers never slip), with the right answer followed by one stray token of
    the domain's own (math a digit, code a stray name, knowledge a value word, instruction following one of its
    words), which its verifier reads as a wrong answer. The base student then slips on about that share of what it
    answers, a fault a reward can see and RL can unlearn across prompts, as base models learn to stop after their
    answer. At rate 0 (absent: the default) nothing changes. Which prompts slip is a hash of the prompt, so the
    same pretraining prompt always slips the same way."""

    domain: str
    rate: float = 0.0

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], domain: str) -> "Slip":
        rate = cfg.get("pretrain_slip")
        rate = 0.0 if rate is None else rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= float(rate) < 1.0:
            raise ValueError(f"domain {domain}: config key `pretrain_slip` must be a number in [0, 1) (the share of "
                             f"pretraining prompts whose brief answer slips; 0: none), got {rate!r}")
        return cls(domain, float(rate))

    def apply(self, task: Task, text: str, strays: Sequence[str]) -> str:
        """``text``, or ``text`` and one of ``strays`` other than ``text`` itself (a repeat would not be wrong),
        chosen by the prompt's hash, where this prompt slips."""
        if self.rate <= 0.0:
            return text
        h = stable_fraction(task.prompt, salt=f"{self.domain}-slip")
        if h >= self.rate:
            return text
        others = [s for s in strays if s != text]
        return f"{text} {others[int(h / self.rate * len(others)) % len(others)]}"


def is_shared(task: Task) -> bool:
    """Whether a task is in the shared form (see :class:`SharedForm`)."""
    return bool(task.meta.get("shared", False))
