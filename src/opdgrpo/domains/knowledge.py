"""Knowledge: the tiny world's stand-in for MMLU-Pro/GPQA, where RL must sharpen recall of known facts.

A seeded world of pseudo-word entities (``zaboli``) with a few relations (``color``, ``home``, ``size``,
``friend``), each fact one value from a small set (or another entity). Pretraining states *every* fact
(``know zaboli color:`` then ``red``) and asks the non-reserved ones as questions, so the base model has
seen each held-out fact but never a held-out prompt. RL trains on direct questions about non-reserved
(entity, relation) pairs (``know color of zaboli?`` and a newline, then ``red``); a hashed share of the
pairs is held out and asked in the same phrasing and as multiple choice
(``know zaboli color? a)blue b)red c)green`` then ``b``).

Scoring is exact match of the normalised final answer: the last word after the last ``=>`` (or of the
whole response), lowercased, punctuation stripped. A multiple-choice answer is the option's *letter*,
as MMLU-Pro scores the chosen option: naming the value instead scores 0, so a model that forgets the
format loses the item. A thinking teacher recalls the fact first: ``zaboli color red => b``.
"""

from __future__ import annotations

import random
import string
from typing import Any, Mapping, Sequence

from .base import SharedForm, Slip, Task, check_style, stable_fraction

MARKER = "=>"
ENTITY_VALUES = "entities"  # a relation whose values are the other entities (``friend``)
PHRASINGS = ("statement", "direct", "choice")
_LETTERS = "abcdefgh"


def extract_answer(completion: str) -> str | None:
    """The last word after the last ``=>`` (or of the whole response), normalised; None when there is none."""
    words = completion.rsplit(MARKER, 1)[-1].split()
    if not words:
        return None
    return words[-1].strip(string.punctuation).lower() or None


class KnowledgeDomain:
    """Recall of generated facts; see the module docstring and ``conf/domain/knowledge.yaml``."""

    #: the marks a shared-form response is wrapped in (base.SharedForm; stands for a bracketed choice)
    SHARED_WRAP = "[]"

    def __init__(self, cfg: Mapping[str, Any]):
        self.name = str(cfg.get("name", "knowledge"))
        self.cfg = cfg
        self.prefix = str(cfg["prompt_prefix"])
        self.shared = SharedForm.from_config(cfg, self.name, self.prefix, self.SHARED_WRAP)
        self.slip = Slip.from_config(cfg, self.name)
        if self.shared.strength > 0:   # shared/own-form accuracy per held-out set (evaluation's extra metrics)
            self.extra_metrics = self._shared_metrics
        self.choices = int(cfg["choices"])
        self.heldout_fraction = float(cfg["heldout_fraction"])
        self.relations = {str(r): v for r, v in cfg["relations"].items()}
        self._value_words = sorted({str(v) for values in self.relations.values() if values != ENTITY_VALUES for v in values})
        self.pretrain_phrasings = {str(p): float(w) for p, w in cfg["pretrain_phrasings"].items()}
        unknown = sorted(set(self.pretrain_phrasings) - set(PHRASINGS))
        if unknown:
            raise ValueError(f"domain {self.name}: config key `pretrain_phrasings` has unknown phrasing(s) {unknown}; "
                             f"known: {list(PHRASINGS)}")
        self.entities = self._entities()
        self.facts = self._facts()
        self.pairs = [(e, r) for e in self.entities for r in self.relations]
        self.reserved = {p for p in self.pairs if stable_fraction(" ".join(p), salt=self.name) < self.heldout_fraction}
        self._check_choices()

    # -- the world ----------------------------------------------------------------------------
    def _entities(self) -> list[str]:
        """``entities`` distinct pseudo-words of ``syllables_per_entity`` syllables, from ``seed``."""
        syllables = self.cfg["syllables"]
        if not all(isinstance(s, str) and s.isalpha() and s.islower() for s in syllables):
            raise ValueError(f"domain {self.name}: config key `syllables` must hold lowercase letter strings, got "
                             f"{syllables} (quote ones that YAML reads as booleans, like no or on)")
        lo, hi = (int(n) for n in self.cfg["syllables_per_entity"])
        count = int(self.cfg["entities"])
        if count > sum(len(syllables) ** n for n in range(lo, hi + 1)) // 2:
            raise ValueError(f"domain {self.name}: config key `entities` = {count} is too many for the syllables "
                             f"given (keep it under half the possible words); add syllables or lower it")
        taken = {str(v) for values in self.relations.values() if values != ENTITY_VALUES for v in values}
        taken |= {*self.relations, self.prefix.strip(), "of"}
        rng, entities = random.Random(f"{self.name}-world-{self.cfg['seed']}"), []
        while len(entities) < count:
            word = "".join(rng.choice(syllables) for _ in range(rng.randint(lo, hi)))
            if word not in entities and word not in taken:
                entities.append(word)
        return entities

    def _values(self, entity: str, relation: str) -> list[str]:
        values = self.relations[relation]
        return [e for e in self.entities if e != entity] if values == ENTITY_VALUES else [str(v) for v in values]

    def _facts(self) -> dict[tuple[str, str], str]:
        rng = random.Random(f"{self.name}-facts-{self.cfg['seed']}")
        return {(e, r): rng.choice(self._values(e, r)) for e in self.entities for r in self.relations}

    def _check_choices(self) -> None:
        smallest = min(len(self._values(self.entities[0], r)) for r in self.relations)
        if not 2 <= self.choices <= min(smallest, len(_LETTERS)):
            raise ValueError(f"domain {self.name}: config key `choices` = {self.choices} must be between 2 and the "
                             f"smallest relation's number of values ({smallest})")

    # -- prompts ------------------------------------------------------------------------------
    def _task(self, entity: str, relation: str, phrasing: str) -> Task:
        return self.shared.apply(self._canonical_task(entity, relation, phrasing))

    def _canonical_task(self, entity: str, relation: str, phrasing: str) -> Task:
        value = self.facts[entity, relation]
        meta = {"entity": entity, "relation": relation, "value": value, "phrasing": phrasing}
        if phrasing == "statement":
            return Task(self.name, f"{self.prefix}{entity} {relation}:", value, meta)
        if phrasing == "direct":
            return Task(self.name, f"{self.prefix}{relation} of {entity}?\n", value, meta)
        rng = random.Random(f"{self.name}|{entity}|{relation}")
        options = rng.sample([v for v in self._values(entity, relation) if v != value], self.choices - 1)
        options.insert(rng.randrange(self.choices), value)
        shown = " ".join(f"{letter}){option}" for letter, option in zip(_LETTERS, options))
        letter = _LETTERS[options.index(value)]
        return Task(self.name, f"{self.prefix}{entity} {relation}? {shown}\n", letter, meta)

    def _phrasing(self, spec: Mapping[str, Any], key: str) -> str:
        phrasing = str(spec["phrasing"])
        if phrasing not in ("direct", "choice"):
            raise ValueError(f"domain {self.name}: config key `{key}.phrasing` must be 'direct' or 'choice' "
                             f"(statements are pretraining only), got {phrasing!r}")
        return phrasing

    def _pool(self, spec: Mapping[str, Any], key: str, reserved: bool) -> list[Task]:
        phrasing = self._phrasing(spec, key)
        pairs = [p for p in self.pairs if (p in self.reserved) == reserved]
        size = len(pairs) if spec.get("size") is None else int(spec["size"])
        if size > len(pairs):
            raise ValueError(f"domain {self.name}: config key `{key}.size` asks for {size} facts but only "
                             f"{len(pairs)} {'held-out' if reserved else 'training'} facts exist; add entities or lower it")
        return [self._task(e, r, phrasing) for e, r in random.Random(f"{self.name}-{key}").sample(pairs, size)]

    # -- the Domain interface -----------------------------------------------------------------
    def training_pool(self) -> list[Task]:
        return self._pool(self.cfg["train"], "train", reserved=False)

    def heldout_sets(self) -> dict[str, list[Task]]:
        return {name: self._pool(spec, f"heldout.{name}", reserved=True) for name, spec in self.cfg["heldout"].items()}

    def pretraining_task(self, rng: random.Random) -> Task:
        """A statement of any fact, or a question about a non-reserved one (never a held-out prompt)."""
        phrasing = rng.choices(list(self.pretrain_phrasings), list(self.pretrain_phrasings.values()))[0]
        while True:
            entity, relation = rng.choice(self.pairs)
            if phrasing == "statement" or (entity, relation) not in self.reserved:
                return self.shared.for_pretraining(self._task(entity, relation, phrasing), rng)

    def demonstration(self, task: Task, style: str) -> str:
        check_style(style)
        if style == "brief":   # a slip: a stray value word after the answer (the verifier reads the last word)
            return self.shared.demonstration(task, self.slip.apply(task, task.answer, self._value_words))
        meta = task.meta
        return self.shared.demonstration(task, f"{meta['entity']} {meta['relation']} {meta['value']} {MARKER} {task.answer}")

    def _verify(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        return [float(extract_answer(c) == t.answer) for t, c in zip(tasks, completions, strict=True)]

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        return self.shared.score(tasks, completions, self._verify)

    def _shared_metrics(self, tasks: Sequence[Task], completions: Sequence[str]) -> dict[str, float | None]:
        return self.shared.metrics(tasks, self.score(tasks, completions))
