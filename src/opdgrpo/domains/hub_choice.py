"""Knowledge at paper scale: multiple-choice benchmarks from the hub, scored by the option letter.

Every set (``train`` and each ``heldout`` entry) names its ``format``, which says how a row of that data set
becomes a question, its options and the correct one:

``mmlu_pro``  ``TIGER-Lab/MMLU-Pro`` (split ``test``): ``question``, ``options`` (list of up to 10 strings),
              ``answer`` (the letter) and ``answer_index`` (int64). Options equal to ``"N/A"`` (padding in some
              copies, dropped by MMLU-Pro's own evaluation) are removed and the index remapped.
``mmlu``      ``cais/mmlu`` (config ``all``, split ``auxiliary_train`` or ``test``): ``question``, ``choices``
              (list of strings), ``answer`` (ClassLabel A-D, an int64 index; a letter string is accepted too).
``gpqa``      ``Idavidrein/gpqa`` (config ``gpqa_diamond``, split ``train``; gated, see below): ``Question``,
              ``Correct Answer``, ``Incorrect Answer 1..3``. The correct answer is always stored first, so the
              four options are put in a deterministic per-question order (:func:`shuffled_options`, keyed by
              ``Record ID`` and the set's ``shuffle_seed``), the same in every job and Python version.

The prompt is the question, the lettered options (``A. ...``) and ``instruction`` (a config key; ``{letters}``
becomes the letter range, e.g. ``A-J``), which asks for "The answer is (X)". The task's answer is the letter; the
reward is :func:`~opdgrpo.verifiers.choice.score_choice` (no random guess on a miss).

GPQA is gated on the hub: accept its terms on huggingface.co with your account and make a token available
(``huggingface-cli login`` or ``HF_TOKEN``) on the machine that downloads it, or point ``source.path`` at a
local parquet copy.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from ..verifiers.choice import LETTERS, score_choice
from .base import Task
from .hub import HubDomain, line_marker

DEFAULT_INSTRUCTION = ('Think step by step, then end your response with "The answer is (X)", where X is the letter '
                       '({letters}) of the correct option.')
PADDING = "N/A"  # MMLU-Pro's filler for questions with fewer than ten options in some copies


class Choice(NamedTuple):
    """One multiple-choice question, format-independent."""

    question: str
    options: list[str]
    correct: int  # index into options
    ident: str  # the data set's own id, for tracing a task back to its row
    group: str  # category / subject / domain


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def _read_mmlu_pro(row: Mapping[str, Any], where: str, seed: int) -> Choice | None:
    options, index = [], None
    for i, option in enumerate(row["options"] or []):
        if _text(option) == PADDING:
            continue
        if i == row["answer_index"]:
            index = len(options)
        options.append(_text(option))
    qid = row.get("question_id")
    answer_index = row["answer_index"]
    if answer_index is None or not 0 <= int(answer_index) < len(row["options"] or []) or index is None:
        raise ValueError(f"config key `{where}.source`: MMLU-Pro row question_id={qid} has answer_index "
                         f"{answer_index!r} outside its {len(row['options'] or [])} options (or on an N/A filler); "
                         f"is `{where}.format` right?")
    if _text(row["answer"]) != LETTERS[int(answer_index)]:
        raise ValueError(f"config key `{where}.source`: MMLU-Pro row question_id={qid} has answer "
                         f"{row['answer']!r} but answer_index {answer_index} (letter {LETTERS[int(answer_index)]})")
    return Choice(_text(row["question"]), options, index, str(qid), _text(row.get("category")))


def _read_mmlu(row: Mapping[str, Any], where: str, seed: int) -> Choice | None:
    options = [_text(c) for c in row["choices"] or []]
    answer = row["answer"]
    index = LETTERS.find(answer.strip().upper()) if isinstance(answer, str) and len(answer.strip()) == 1 else answer
    if not isinstance(index, int) or not 0 <= index < len(options):
        raise ValueError(f"config key `{where}.source`: MMLU row {_text(row['question'])[:60]!r} has answer "
                         f"{answer!r}, not an index into its {len(options)} choices; is `{where}.format` right?")
    return Choice(_text(row["question"]), options, index, "", _text(row.get("subject")))


GPQA_OPTIONS = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")


def shuffled_options(options: Sequence[str], key: str, seed: int) -> tuple[list[str], int]:
    """``options`` (correct one first) in a deterministic order for ``key``; returns (options, correct index).

    The order sorts option positions by a SHA-256 of (seed, key, position): a uniform permutation that
    depends on nothing but its inputs (not on PYTHONHASHSEED or ``random``'s algorithm).
    """
    order = sorted(range(len(options)), key=lambda i: hashlib.sha256(f"{seed}|{key}|{i}".encode()).digest())
    return [options[i] for i in order], order.index(0)


def _read_gpqa(row: Mapping[str, Any], where: str, seed: int) -> Choice | None:
    raw = [_text(row[column]) for column in GPQA_OPTIONS]
    if not all(raw):
        return None  # an option is missing: the question cannot be asked fairly
    ident = _text(row.get("Record ID")) or _text(row["Question"])
    options, correct = shuffled_options(raw, ident, seed)
    return Choice(_text(row["Question"]), options, correct, ident, _text(row.get("High-level domain")))


class Format(NamedTuple):
    columns: tuple[str, ...]
    read: Callable[[Mapping[str, Any], str, int], Choice | None]


FORMATS: dict[str, Format] = {
    "mmlu_pro": Format(("question", "options", "answer", "answer_index"), _read_mmlu_pro),
    "mmlu": Format(("question", "choices", "answer"), _read_mmlu),
    "gpqa": Format(("Question", *GPQA_OPTIONS), _read_gpqa),
}


def format_problem(question: str, options: Sequence[str], instruction: str) -> str:
    """Question, lettered options and the answer instruction (``{letters}`` -> ``A-D``)."""
    shown = "\n".join(f"{LETTERS[i]}. {option}" for i, option in enumerate(options))
    letters = f"{LETTERS[0]}-{LETTERS[len(options) - 1]}"
    return f"{question}\n\nOptions:\n{shown}\n\n{instruction.replace('{letters}', letters)}"


class HubChoiceDomain(HubDomain):
    """Multiple-choice knowledge benchmarks; config keys beyond :class:`HubDomain`'s:

    - ``train.format`` / ``heldout.<set>.format``: ``mmlu_pro``, ``mmlu`` or ``gpqa`` (the row schema);
    - ``train.shuffle_seed`` / ``heldout.<set>.shuffle_seed``: option order for ``gpqa`` (default 0);
    - ``instruction``: the answer instruction after the options (default :data:`DEFAULT_INSTRUCTION`).
    """

    #: MMLU-Pro's own evaluation stops at "Question:"; lm-eval-harness's mmlu_pro at "Question:" and "Q:" (here only
    #: at a line's start: a bare "Q:" may be an option's or a reasoning's text).
    NEXT_QUESTION = ("Question:", "\n\nQ:")

    def __init__(self, cfg: Mapping[str, Any]):
        super().__init__(cfg)
        self.instruction = str(cfg.get("instruction") or DEFAULT_INSTRUCTION)
        if not isinstance(cfg.get("train"), Mapping):
            raise ValueError(f"domain {self.name}: config key `domains.{self.name}.train` must be a mapping with "
                             f"`source` and `format`")
        sets = {f"domains.{self.name}.train": cfg["train"]}
        sets.update({f"domains.{self.name}.heldout.{k}": v for k, v in (cfg.get("heldout") or {}).items()})
        for where, spec in sets.items():
            fmt = spec.get("format") if isinstance(spec, Mapping) else None
            if fmt not in FORMATS:
                raise ValueError(f"config key `{where}.format` must be one of {sorted(FORMATS)}, got {fmt!r}")
        self._active: tuple[str, int] | None = None

    def prompt_markers(self) -> tuple[str, ...]:
        """The answer instruction (up to its ``{letters}``), which ends every prompt: a completion that writes it again
        has written a next question and its options, and would answer it next."""
        return tuple(dict.fromkeys(super().prompt_markers() + line_marker(self.instruction)))

    def _tasks(self, spec: Mapping[str, Any], where: str, role: str) -> list[Task]:
        # The base class asks for columns and rows without the set's spec; remember which set is loading.
        self._active = (str(spec["format"]), int(spec.get("shuffle_seed") or 0))
        try:
            return super()._tasks(spec, where, role)
        finally:
            self._active = None

    def required_columns(self, role: str) -> Sequence[str]:
        return FORMATS[self._active[0]].columns if self._active else ()

    def to_task(self, row: Mapping[str, Any], where: str) -> Task | None:
        if self._active is None:
            raise RuntimeError("HubChoiceDomain.to_task reads rows only while a set loads (training_pool, "
                               "heldout_sets): the set's `format` decides how")
        fmt, seed = self._active
        choice = FORMATS[fmt].read(row, where, seed)
        if choice is None or not choice.question or len(choice.options) < 2:
            return None
        if len(choice.options) > len(LETTERS):
            raise ValueError(f"config key `{where}.source`: a question has {len(choice.options)} options; at most "
                             f"{len(LETTERS)} can be lettered")
        problem = format_problem(choice.question, choice.options, self.instruction)
        meta = {"format": fmt, "n_options": len(choice.options), "id": choice.ident, "group": choice.group}
        return Task(self.name, self.prompt(problem), LETTERS[choice.correct], meta)

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        return [score_choice(c, t.answer, int(t.meta["n_options"])) for t, c in zip(tasks, completions, strict=True)]
