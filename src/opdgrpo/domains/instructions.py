"""Instruction following: the tiny world's stand-in for IFEval.

A prompt lists one to three verifiable constraints on a short response made of words, e.g.
``inst words=3 upper has=cat`` and a newline; a base student answers briefly (``CAT SUN DOG``), a
thinking teacher restates the constraints first (``3 words upper use cat => CAT SUN DOG``). The reward
is 1.0 when every constraint holds, else 0.0 (IFEval's prompt-level accuracy); per-constraint pass rates
(IFEval's instruction-level view) come from :meth:`InstructionDomain.constraint_rates`.

Checkers are rule-based and read only the *final answer segment*: the text after the last ``=>`` when
the response has one, else the whole response, stripped. This is what lets the thinking style verify,
as IFEval's loose mode strips a response's first and last lines before checking. Words are maximal
runs of letters, compared case-insensitively; an answer without any word fails every constraint, so
an empty or garbage response never scores.

Each prompt holds at most one constraint of each kind, written in a canonical order, and is generated
together with a minimal answer that the checkers accept, so a contradictory combination (``upper
lower``, ``has=cat not=cat``, ``words=1 sep=,``) is never a task. Held-out prompts are reserved by
hashing the prompt, so none is a training or pretraining prompt; the held-out set asks for more
constraints at once than the training pool (combinations RL never trained on).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .base import SharedForm, Slip, Task, check_style, stable_fraction

MARKER = "=>"
CONSTRAINT_KINDS = ("lower", "upper", "words", "start", "end", "has", "not", "rep", "sep", "wrap")
_ORDER = {kind: i for i, kind in enumerate(CONSTRAINT_KINDS)}  # a prompt's constraints are written in this order
_WORD = re.compile(r"[^\W\d_]+")


@dataclass(frozen=True)
class Constraint:
    """One verifiable instruction; ``word``, ``count`` and ``mark`` are used by the kinds that need them."""

    kind: str
    word: str = ""
    count: int = 0
    mark: str = ""

    @property
    def text(self) -> str:
        """How the prompt writes it (``words=3``, ``rep=cat*2``, ``wrap=[]``)."""
        if self.kind in ("lower", "upper"):
            return self.kind
        if self.kind == "words":
            return f"words={self.count}"
        if self.kind == "rep":
            return f"rep={self.word}*{self.count}"
        return f"{self.kind}={self.mark or self.word}"

    @property
    def note(self) -> str:
        """How a thinking teacher restates it before answering (short: the whole response has 32 tokens)."""
        notes = {
            "words": f"{self.count} words", "start": f"{self.word} first", "end": f"{self.word} last",
            "has": f"use {self.word}", "not": f"no {self.word}", "rep": f"{self.count} {self.word}",
            "sep": f"by {self.mark}", "wrap": f"in {self.mark}",
        }
        return notes.get(self.kind, self.kind)


def _items_ok(answer: str, mark: str) -> bool:
    items = answer.split(mark)
    return len(items) >= 2 and all(len(_WORD.findall(item)) == 1 for item in items)


# Each checker sees the constraint, the final answer segment and its lowercased words (never empty).
_CHECKS: dict[str, Callable[[Constraint, str, list[str]], bool]] = {
    "lower": lambda c, answer, words: answer == answer.lower(),
    "upper": lambda c, answer, words: answer == answer.upper(),
    "words": lambda c, answer, words: len(words) == c.count,
    "start": lambda c, answer, words: words[0] == c.word,
    "end": lambda c, answer, words: words[-1] == c.word,
    "has": lambda c, answer, words: c.word in words,
    "not": lambda c, answer, words: c.word not in words,
    "rep": lambda c, answer, words: words.count(c.word) == c.count,
    "sep": lambda c, answer, words: _items_ok(answer, c.mark),
    "wrap": lambda c, answer, words: len(answer) >= 2 and answer.startswith(c.mark[0]) and answer.endswith(c.mark[1]),
}


def final_segment(completion: str) -> str:
    """The text after the last ``=>`` (the whole response when it has none), stripped."""
    return completion.rsplit(MARKER, 1)[-1].strip()


def check_constraints(constraints: Sequence[Constraint], completion: str) -> list[bool]:
    """Whether the response meets each constraint, in order; see the module docstring for the rules."""
    answer = final_segment(completion)
    words = [w.lower() for w in _WORD.findall(answer)]
    if not words:
        return [False] * len(constraints)
    return [_CHECKS[c.kind](c, answer, words) for c in constraints]


def constraint_passes(task: Task, completion: str) -> list[bool]:
    """Per-constraint pass list of one response to one task (aligned with ``task.answer``)."""
    return check_constraints(task.answer, completion)


def _slots(by_kind: Mapping[str, Constraint], n: int, vocabulary: Sequence[str], rng: random.Random) -> list[str] | None:
    """``n`` words meeting the word-level constraints, or None when they cannot share ``n`` slots."""
    slots: list[str | None] = [None] * n
    for kind, index in (("start", 0), ("end", n - 1)):
        if kind in by_kind:
            if slots[index] not in (None, by_kind[kind].word):
                return None
            slots[index] = by_kind[kind].word
    wanted = []
    if "rep" in by_kind:
        rep = by_kind["rep"]
        wanted += [rep.word] * (rep.count - slots.count(rep.word))
    if "has" in by_kind and by_kind["has"].word not in slots + wanted:
        wanted.append(by_kind["has"].word)
    free = [i for i, s in enumerate(slots) if s is None]
    if len(wanted) > len(free):
        return None
    for i, word in zip(free, wanted):
        slots[i] = word
    banned = {by_kind[k].word for k in ("not", "rep") if k in by_kind}
    fillers = [w for w in vocabulary if w not in banned]
    return [s if s is not None else rng.choice(fillers) for s in slots]


def solve(constraints: Sequence[Constraint], vocabulary: Sequence[str], max_words: int, rng: random.Random) -> str | None:
    """A shortest answer that meets every constraint (checked), or None when they contradict."""
    by_kind = {c.kind: c for c in constraints}
    sizes = [by_kind["words"].count] if "words" in by_kind else range(2 if "sep" in by_kind else 1, max_words + 1)
    for n in sizes:
        slots = _slots(by_kind, n, vocabulary, rng)
        if slots is not None:
            break
    else:
        return None
    answer = by_kind["sep"].mark.join(slots) if "sep" in by_kind else " ".join(slots)
    if "upper" in by_kind:
        answer = answer.upper()
    if "wrap" in by_kind:
        answer = by_kind["wrap"].mark[0] + answer + by_kind["wrap"].mark[1]
    return answer if all(check_constraints(constraints, answer)) else None


class InstructionDomain:
    """Responses under verifiable constraints; see the module docstring and ``conf/domain/ifeval.yaml``."""

    #: the marks a shared-form response is wrapped in (base.SharedForm; stands for markdown emphasis)
    SHARED_WRAP = "**"

    def __init__(self, cfg: Mapping[str, Any]):
        self.name = str(cfg.get("name", "ifeval"))
        self.cfg = cfg
        self.prefix = str(cfg["prompt_prefix"])
        self.words = [str(w) for w in cfg["words"]]
        self.max_words = int(cfg["max_words"])
        self.rep_counts = [int(n) for n in cfg["rep_counts"]]
        self.separators = [str(s) for s in cfg["separators"]]
        self.wraps = [str(w) for w in cfg["wraps"]]
        self.heldout_fraction = float(cfg["heldout_fraction"])
        self.kinds = [str(k) for k in cfg["constraint_kinds"]]
        self._validate()
        self.shared = SharedForm.from_config(cfg, self.name, self.prefix, self.SHARED_WRAP)
        self.slip = Slip.from_config(cfg, self.name)
        if self.shared.strength > 0:   # shared/own-form accuracy per held-out set (evaluation's extra metrics)
            self.extra_metrics = self._shared_metrics

    def _validate(self) -> None:
        unknown = sorted(set(self.kinds) - set(CONSTRAINT_KINDS))
        if unknown:
            raise ValueError(f"domain {self.name}: config key `constraint_kinds` has unknown kind(s) {unknown}; "
                             f"known kinds: {list(CONSTRAINT_KINDS)}")
        if not all(w.isalpha() and w.islower() for w in self.words) or len(set(self.words)) < 3:
            raise ValueError(f"domain {self.name}: config key `words` must hold at least 3 distinct lowercase words")
        if any(len(w) != 2 or w[0].isalnum() for w in self.wraps):
            raise ValueError(f"domain {self.name}: config key `wraps` must hold opening+closing symbol pairs like '[]'")
        if any(len(s) != 1 or s.isalnum() or s.isspace() or s in MARKER for s in self.separators):
            raise ValueError(f"domain {self.name}: config key `separators` must hold single symbols other than '=' and '>'")

    # -- instance space -----------------------------------------------------------------------
    def _choices(self, kind: str) -> int:
        """How many distinct constraints of a kind exist (sizes the instance space)."""
        return {"lower": 1, "upper": 1, "words": self.max_words, "rep": len(self.words) * len(self.rep_counts),
                "sep": len(self.separators), "wrap": len(self.wraps)}.get(kind, len(self.words))

    def _constraint(self, kind: str, rng: random.Random) -> Constraint:
        if kind == "words":
            return Constraint(kind, count=rng.randint(1, self.max_words))
        if kind == "rep":
            return Constraint(kind, word=rng.choice(self.words), count=rng.choice(self.rep_counts))
        if kind in ("sep", "wrap"):
            return Constraint(kind, mark=rng.choice(self.separators if kind == "sep" else self.wraps))
        if kind in ("lower", "upper"):
            return Constraint(kind)
        return Constraint(kind, word=rng.choice(self.words))

    def _counts(self, spec: Any, key: str) -> list[int]:
        """The allowed numbers of constraints per prompt from a ``[min, max]`` config value."""
        lo, hi = (int(v) for v in spec)
        if not 1 <= lo <= hi <= len(self.kinds):
            raise ValueError(f"domain {self.name}: config key `{key}` must be [min, max] with "
                             f"1 <= min <= max <= {len(self.kinds)} (the number of constraint_kinds), got {spec}")
        return list(range(lo, hi + 1))

    def _space(self, counts: Sequence[int]) -> int:
        """Number of distinct constraint sets with those counts (an upper bound: some contradict)."""
        by_count = [1] + [0] * len(self.kinds)
        for kind in self.kinds:
            for c in range(len(self.kinds), 0, -1):
                by_count[c] += by_count[c - 1] * self._choices(kind)
        return sum(by_count[c] for c in counts)

    def _draw(self, rng: random.Random, counts: Sequence[int], reserved: bool) -> Task:
        while True:
            kinds = sorted(rng.sample(self.kinds, rng.choice(counts)), key=_ORDER.__getitem__)
            constraints = tuple(self._constraint(k, rng) for k in kinds)
            prompt = f"{self.prefix}{' '.join(c.text for c in constraints)}\n"
            if (stable_fraction(prompt, salt=self.name) < self.heldout_fraction) != reserved:
                continue
            answer = solve(constraints, self.words, self.max_words, random.Random(f"{self.name}|{prompt}"))
            if answer is not None:
                return self.shared.apply(Task(self.name, prompt, constraints, {"brief": answer}))

    def _pool(self, spec: Mapping[str, Any], key: str, seed: str, reserved: bool) -> list[Task]:
        counts = self._counts(spec["constraints"], f"{key}.constraints")
        size = int(spec["size"])
        share = self.heldout_fraction if reserved else 1 - self.heldout_fraction
        available = int(self._space(counts) * share)
        if size > available // 2:
            raise ValueError(f"domain {self.name}: config key `{key}.size` asks for {size} distinct prompts with "
                             f"{counts[0]}-{counts[-1]} constraints but at most about {available} exist (the pool keeps "
                             f"under half of them); lower the size or widen `words`/`constraint_kinds`")
        rng, seen, pool = random.Random(seed), set(), []
        while len(pool) < size:
            task = self._draw(rng, counts, reserved)
            if task.prompt not in seen:
                seen.add(task.prompt)
                pool.append(task)
        return pool

    # -- the Domain interface -----------------------------------------------------------------
    def training_pool(self) -> list[Task]:
        return self._pool(self.cfg["train"], "train", f"{self.name}-train", False)

    def heldout_sets(self) -> dict[str, list[Task]]:
        return {name: self._pool(spec, f"heldout.{name}", f"{self.name}-heldout-{name}", True)
                for name, spec in self.cfg["heldout"].items()}

    def pretraining_task(self, rng: random.Random) -> Task:
        task = self._draw(rng, self._counts(self.cfg["pretrain_constraints"], "pretrain_constraints"), reserved=False)
        return self.shared.for_pretraining(task, rng)

    def demonstration(self, task: Task, style: str) -> str:
        check_style(style)
        if style == "brief":   # a slip: one stray word after the answer (breaks the constraints that see it)
            return self.shared.demonstration(task, self.slip.apply(task, task.meta["brief"], self.words))
        return self.shared.demonstration(task, f"{' '.join(c.note for c in task.answer)} {MARKER} {task.meta['brief']}")

    def _verify(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        return [float(all(constraint_passes(t, c))) for t, c in zip(tasks, completions, strict=True)]

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        return self.shared.score(tasks, completions, self._verify)

    def _shared_metrics(self, tasks: Sequence[Task], completions: Sequence[str]) -> dict[str, float | None]:
        return self.shared.metrics(tasks, self.score(tasks, completions))

    def constraint_rates(self, tasks: Sequence[Task], completions: Sequence[str]) -> dict[str, float]:
        """Pass rate of each constraint kind over the prompts that carry it (IFEval's instruction level)."""
        passed: dict[str, list[bool]] = {}
        for task, completion in zip(tasks, completions, strict=True):
            inner = self.shared.unwrap(task, completion)   # a shared-form response without the domain's marks: all fail
            passes = [False] * len(task.answer) if inner is None else constraint_passes(task, inner)
            for constraint, ok in zip(task.answer, passes):
                passed.setdefault(constraint.kind, []).append(ok)
        return {kind: sum(oks) / len(oks) for kind, oks in sorted(passed.items())}
