"""Paper-scale math: real training and held-out sets from the hub, scored by math-verify.

Each set in ``conf/domain/paper_math.yaml`` (``train`` and every ``heldout.<name>``) names a ``source`` (see
:mod:`opdgrpo.domains.hub`) and, optionally, the columns to read:

- ``problem_key``: the problem statement (default: the first of ``problem``, ``question``, ``prompt`` present);
- ``answer_key``: the gold answer (default: the first of ``answer``, ``solution``, ``ground_truth``,
  ``reward_model.ground_truth``);
- ``id_key``: a row id for ``Task.meta`` (default: the first of ``id``, ``extra_info.index``, ``unique_id``,
  ``problem_idx``; none: a hash of the problem).

- ``answer_format``: ``plain`` (default: the answer column holds the answer) or ``boxed`` (it holds a worked solution
  whose last ``\\boxed{}``, or ``\\fbox{}``, holds the answer: MATH's ``solution``, the only answer column of
  ``DigitalLearningGmbH/MATH-lighteval``).

A dotted key reads inside a struct column (``reward_model.ground_truth``); a problem stored as chat messages
(``[{role, content}, ...]``) is read from its first user message. Gold answers become strings: numbers stored as
floats (AMC23's ``27.0``) become ``"27"``. The instruction wrapper DAPO-Math-17k puts around each problem
("Solve the following math problem step by step. The last line ... Answer: $Answer ...") is removed, since
the domain's ``prompt_template`` asks for a boxed answer instead.

Held-out rows without a problem or answer are an error (the benchmark would shrink silently); training rows
without one are skipped.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Mapping, Sequence

from ..verifiers.math import MathVerifier
from .base import Task
from .hub import HubDomain

PROBLEM_KEYS = ("problem", "question", "prompt")
ANSWER_KEYS = ("answer", "solution", "ground_truth", "reward_model.ground_truth")
ID_KEYS = ("id", "extra_info.index", "unique_id", "problem_idx")

# DAPO-Math-17k's prompt template (BytedTsinghua-SIA/DAPO-Math-17k, kept in open-r1's `prompt`/`source_prompt`)
DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response should be of the "
               "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.")
DAPO_SUFFIX = 'Remember to put your answer on its own line after "Answer:".'

VERIFIER_DEFAULTS = {"workers": 4, "timeout_s": 5.0, "chunk_size": 16, "deadline_s": None}
ANSWER_FORMATS = ("plain", "boxed")


def last_boxed(text: str) -> str | None:
    """What the last ``\\boxed{...}`` (or ``\\fbox{...}``) of a worked solution holds, braces matched
    (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``); the brace-less ``\\boxed 5`` holds the text up to the next
    ``$`` or space. None when the text has no box, or its last box is never closed."""
    at = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if at < 0:
        return None
    rest = text[at + (6 if text.startswith("\\boxed", at) else 5):]
    if rest.startswith(" "):
        inner = rest[1:].split("$", 1)[0].split()
        return inner[0] if inner else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        depth += (char == "{") - (char == "}")
        if depth == 0:
            return rest[1:i].strip() or None
    return None


def strip_dapo_wrapper(text: str) -> str:
    """The bare problem inside DAPO-Math-17k's instruction wrapper (text without the wrapper is unchanged)."""
    text = text.strip()
    if text.startswith(DAPO_PREFIX):
        text = text[len(DAPO_PREFIX):].strip()
    if text.endswith(DAPO_SUFFIX):
        text = text[:-len(DAPO_SUFFIX)].strip()
    return text


def gold_string(value: Any) -> str | None:
    """A gold answer as the string math-verify parses: ``27.0 -> "27"``, ``0.5 -> "0.5"``, None when missing."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"a boolean gold answer ({value!r}) is not a math answer")
    if isinstance(value, (list, tuple)):       # e.g. Qwen2.5-Math's `answer: ["27.0"]`
        parts = [p for p in (gold_string(v) for v in value) if p]
        return ", ".join(parts) or None
    if isinstance(value, float) or type(value).__name__.startswith("float"):
        value = float(value)
        if math.isnan(value) or math.isinf(value):
            return None
        return str(int(value)) if value.is_integer() else format(value, ".15g")
    if isinstance(value, int) or type(value).__name__.startswith("int"):
        return str(int(value))
    text = str(value).strip()
    return text or None


def read_field(row: Mapping[str, Any], key: str) -> Any:
    """``row[key]``, where a dotted key reads inside struct columns (``reward_model.ground_truth``)."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(key)
        value = value[part]
    return value


def has_field(row: Mapping[str, Any], key: str) -> bool:
    try:
        read_field(row, key)
    except KeyError:
        return False
    return True


def problem_text(value: Any) -> str | None:
    """A problem statement from a string or from chat messages (the first user turn)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        turns = [m for m in value if isinstance(m, Mapping)]
        users = [m for m in turns if m.get("role") == "user"] or turns
        value = users[0].get("content") if users else None
        if value is None:
            return None
    text = strip_dapo_wrapper(str(value))
    return text or None


class HubMathDomain(HubDomain):
    """Competition math from hub data sets (see the module docstring and ``conf/domain/paper_math.yaml``).

    Config keys beyond :class:`~opdgrpo.domains.hub.HubDomain`'s: per set ``problem_key``, ``answer_key``,
    ``id_key``, ``answer_format``; ``verifier: {workers, timeout_s, chunk_size, deadline_s}`` (:class:`MathVerifier`).
    """

    #: lm-eval-harness stops its math tasks at "Problem:" (minerva_math, hendrycks_math) and "Question:" (gsm8k); here
    #: at a paragraph's start, where a next problem begins (a solution may say "the problem: ..." mid-line).
    NEXT_QUESTION = ("\n\nProblem:", "\n\nQuestion:")

    def __init__(self, cfg: Mapping[str, Any]):
        super().__init__(cfg)
        if not isinstance(cfg.get("train"), Mapping):
            raise ValueError(f"config key `domains.{self.name}.train` must be a mapping with a `source`, "
                             f"got {cfg.get('train')!r}")
        heldout = cfg.get("heldout") or {}
        if not isinstance(heldout, Mapping):
            raise ValueError(f"config key `domains.{self.name}.heldout` must map set names to specs, got {heldout!r}")
        # hub.py's to_task receives the config path of the set a row comes from; map it back to the set's spec
        self._specs: dict[str, tuple[str, str, Mapping[str, Any]]] = {
            f"domains.{self.name}.train": ("train", "train", cfg["train"])}
        for set_name, spec in heldout.items():
            if not isinstance(spec, Mapping):
                raise ValueError(f"config key `domains.{self.name}.heldout.{set_name}` must be a mapping with a "
                                 f"`source`, got {spec!r}")
            self._specs[f"domains.{self.name}.heldout.{set_name}"] = ("heldout", str(set_name), spec)
        for where, (_, _, spec) in self._specs.items():
            if spec.get("answer_format", "plain") not in ANSWER_FORMATS:
                raise ValueError(f"config key `{where}.answer_format` must be one of {list(ANSWER_FORMATS)}, got "
                                 f"{spec.get('answer_format')!r}")
        self._keys: dict[str, tuple[str, str, str | None]] = {}
        self.verifier = MathVerifier(**self._verifier_args(cfg.get("verifier")))

    def _verifier_args(self, vcfg: Any) -> dict[str, Any]:
        where = f"domains.{self.name}.verifier"
        if vcfg is None:
            vcfg = {}
        if not isinstance(vcfg, Mapping):
            raise ValueError(f"config key `{where}` must be a mapping like {VERIFIER_DEFAULTS}, got {vcfg!r}")
        unknown = sorted(set(vcfg) - set(VERIFIER_DEFAULTS))
        if unknown:
            raise ValueError(f"config key `{where}` has unknown keys {unknown}; known: {sorted(VERIFIER_DEFAULTS)}")
        args = {**VERIFIER_DEFAULTS, **{k: v for k, v in vcfg.items() if v is not None or k == "deadline_s"}}
        try:
            return {"workers": int(args["workers"]), "timeout_s": float(args["timeout_s"]),
                    "chunk_size": int(args["chunk_size"]),
                    "deadline_s": None if args["deadline_s"] is None else float(args["deadline_s"])}
        except (TypeError, ValueError) as err:
            raise ValueError(f"config key `{where}`: {err}") from err

    # -- rows to tasks -------------------------------------------------------------------------------
    def required_columns(self, role: str) -> Sequence[str]:
        """Column names differ per set (``problem`` vs ``question`` vs ``prompt``), so each set's columns are
        resolved and checked on its first row, in :meth:`to_task`, with errors naming the set's config keys."""
        return ()

    def _resolve_keys(self, row: Mapping[str, Any], where: str, spec: Mapping[str, Any]) -> tuple[str, str, str | None]:
        columns = sorted(row)

        def pick(key_name: str, defaults: Sequence[str], required: bool) -> str | None:
            explicit = spec.get(key_name)
            if explicit:
                if not has_field(row, str(explicit)):
                    raise ValueError(f"config key `{where}.{key_name}`: data set has no column {explicit!r}; "
                                     f"its columns are {columns}")
                return str(explicit)
            for key in defaults:
                if has_field(row, key):
                    return key
            if required:
                raise ValueError(f"config key `{where}.{key_name}`: none of the default columns {list(defaults)} is "
                                 f"in the data set (columns: {columns}); set `{where}.{key_name}` to the column "
                                 f"that holds it")
            return None

        return pick("problem_key", PROBLEM_KEYS, True), pick("answer_key", ANSWER_KEYS, True), \
            pick("id_key", ID_KEYS, False)

    def to_task(self, row: Mapping[str, Any], where: str) -> Task | None:
        if where not in self._specs:
            raise ValueError(f"domain {self.name}: rows from unknown config key {where!r}")
        role, set_name, spec = self._specs[where]
        if where not in self._keys:
            self._keys[where] = self._resolve_keys(row, where, spec)
        problem_key, answer_key, id_key = self._keys[where]
        problem = problem_text(read_field(row, problem_key))
        try:
            answer = gold_string(read_field(row, answer_key))
        except ValueError as err:
            raise ValueError(f"config key `{where}.answer_key` ({answer_key!r}): {err}") from err
        boxed = spec.get("answer_format") == "boxed"
        if boxed and answer is not None:
            answer = last_boxed(answer)
        row_id = read_field(row, id_key) if id_key else None
        if row_id is None and problem is not None:
            row_id = hashlib.sha256(problem.encode()).hexdigest()[:12]
        if problem is None or answer is None:
            if role == "train":
                return None
            what = "problem" if problem is None else "\\boxed{} answer" if boxed else "answer"
            raise ValueError(f"config key `{where}`: held-out row {row_id!r} has no {what} (columns "
                             f"{problem_key!r}, {answer_key!r}); fix the data set or the `problem_key`/`answer_key`"
                             f"{'/`answer_format`' if boxed else ''}")
        return Task(domain=self.name, prompt=self.prompt(problem), answer=answer,
                    meta={"source": set_name, "id": str(row_id)})

    # -- rewards -------------------------------------------------------------------------------------
    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        if len(tasks) != len(completions):
            raise ValueError(f"domain {self.name}: {len(tasks)} tasks but {len(completions)} completions")
        return self.verifier.score([str(t.answer) for t in tasks], completions)

    def close(self) -> None:
        """Stop the verifier's worker processes."""
        self.verifier.close()
