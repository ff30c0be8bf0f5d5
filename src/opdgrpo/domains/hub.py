"""Paper-scale domains: real data sets read through Hugging Face ``datasets``, scored by real verifiers.

A data set is named in conf by a ``source`` block::

    source: {path: HuggingFaceH4/aime_2024, name: null, split: train, revision: null, data_files: null}

``path`` is a hub id or a local directory (or file) holding the same data, e.g. a parquet copy made on a machine
with network access, or the fixtures under ``tests/fixtures/hub/``. ``datasets.load_dataset`` reads both through
the same call, so the tests exercise the loader the paper profile uses.

:class:`HubDomain` turns rows into :class:`~opdgrpo.domains.base.Task` s; each subclass says how a row becomes
a prompt and an answer (``to_task``) and how a completion is scored (``score``). Hub domains have no pretraining
stage: their models come from the hub, already trained.
"""

from __future__ import annotations

import random
from typing import Any, Mapping, Sequence

from .. import schema
from .base import Task

#: What a ``source`` block may hold (its schema: src/opdgrpo/schemas/domain.schema.yaml).
SOURCE_KEYS = schema.known_keys("domain.schema.yaml#/$defs/data", "source")


def load_rows(source: Mapping[str, Any], where: str):
    """The rows of one data set (a ``datasets.Dataset``); ``where`` names the config key in errors."""
    import datasets

    if not isinstance(source, Mapping) or not source.get("path") or not source.get("split"):
        raise ValueError(f"config key `{where}` must be a mapping with at least `path` (hub id or local directory) "
                         f"and `split`, got {source!r}")
    unknown = sorted(set(source) - set(SOURCE_KEYS))
    if unknown:
        raise ValueError(f"config key `{where}` has unknown keys {unknown}; known: {list(SOURCE_KEYS)}")
    try:
        return datasets.load_dataset(str(source["path"]), source.get("name"), split=str(source["split"]),
                                     revision=source.get("revision"), data_files=source.get("data_files"))
    except Exception as err:  # a missing local copy, no network, a wrong split: say which key to fix
        raise ValueError(f"config key `{where}`: cannot load {source['path']!r} (split {source['split']!r}): "
                         f"{type(err).__name__}: {err}. Without network access, fill the datasets cache on a node "
                         f"with network (`opdgrpo fetch --profile <profile>`) and set HF_DATASETS_OFFLINE=1, or point "
                         f"`{where}.path` at a local copy of the data set (a directory of parquet files)") from err


def require_columns(rows, columns: Sequence[str], where: str) -> None:
    missing = [c for c in columns if c not in rows.column_names]
    if missing:
        raise ValueError(f"config key `{where}`: data set lacks column(s) {missing}; it has {rows.column_names}")


class HubDomain:
    """Prompts and answers from hub data sets. Config keys (see ``conf/domain/paper_*.yaml``):

    - ``train: {source, size, seed}``: the RL training set; ``size`` keeps a seeded sample (null: all rows);
    - ``heldout: {<set>: {source, size, k}}``: held-out benchmarks; ``k`` samples per prompt (avg@k, pass@k);
    - per set, ``keep: {<column>: [values]}``: only rows whose column holds one of the values (a difficulty slice:
      ``{level: [Level 3, Level 4, Level 5]}`` of MATH, ``{difficulty: [easy, medium]}`` of LiveCodeBench), before
      ``size`` samples and before any row is turned into a task;
    - ``prompt_template``: how a problem becomes the user message (``{problem}`` is replaced).

    Duplicate prompts are dropped from the training set, and training prompts that appear in a held-out set are
    removed (decontamination by exact prompt match) so held-out accuracy never measures training prompts.
    """

    name: str
    #: Rows load in the jobs, not when the DAG is planned (config validation checks only the source blocks).
    LAZY_POOLS = True

    #: Headers of a next question that evaluation harnesses stop base models at (lm-eval-harness's ``until`` lists):
    #: a continuation that writes one has finished its own answer. Per domain; see :attr:`stop_strings`.
    NEXT_QUESTION: tuple[str, ...] = ()

    def __init__(self, cfg: Mapping[str, Any]):
        self.cfg = cfg
        self.name = str(cfg["name"])
        self.template = str(cfg.get("prompt_template") or "{problem}")
        for where, spec in self._set_specs():
            check_keep(spec.get("keep"), f"{where}.keep")

    def _set_specs(self) -> list[tuple[str, Mapping[str, Any]]]:
        """``(config key, block)`` of the training set and every held-out set that is a mapping (each kind reports
        a block of another shape with its own error)."""
        specs = [(f"domains.{self.name}.train", self.cfg.get("train"))]
        heldout = self.cfg.get("heldout")
        if isinstance(heldout, Mapping):
            specs += [(f"domains.{self.name}.heldout.{n}", s) for n, s in heldout.items()]
        return [(w, s) for w, s in specs if isinstance(s, Mapping)]

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """Where a base model's completion ends (``train.stop_strings``, :mod:`opdgrpo.train.stops`): the harnesses'
        next-question headers and the prompt's own text that follows every problem (a completion that writes it
        again is writing its next problem, whose answer an answer reader must not read)."""
        return tuple(dict.fromkeys(self.NEXT_QUESTION + self.prompt_markers()))

    def prompt_markers(self) -> tuple[str, ...]:
        """The prompt's fixed text after the problem (``prompt_template``'s first line after ``{problem}``, up to any
        ``{``), on a new line: only a new problem puts it there. Too short a text (under 12 characters) could be a
        completion's own words, so it is not used."""
        return line_marker(self.template.partition("{problem}")[2])

    # -- subclasses ------------------------------------------------------------------------------
    def to_task(self, row: Mapping[str, Any], where: str) -> Task | None:
        """One row as a task (None to skip a row the verifier cannot use)."""
        raise NotImplementedError

    def required_columns(self, role: str) -> Sequence[str]:
        """Columns a row of a ``train`` or ``heldout`` set must have."""
        return ()

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------------------
    def prompt(self, problem: str) -> str:
        return self.template.replace("{problem}", problem)

    def _tasks(self, spec: Mapping[str, Any], where: str, role: str) -> list[Task]:
        rows = load_rows(spec.get("source"), f"{where}.source")
        require_columns(rows, self.required_columns(role), f"{where}.source")
        keep = spec.get("keep") or {}
        require_columns(rows, list(keep), f"{where}.keep")
        tasks = [t for t in (self.to_task(row, where) for row in rows if kept(row, keep)) if t is not None]
        if keep and not tasks:
            raise ValueError(f"config key `{where}.keep`: no row of {spec['source'].get('path')!r} holds "
                             f"{dict(keep)!r}; the values are compared exactly, as the data set writes them")
        size = spec.get("size")
        if size is not None and int(size) < len(tasks):
            tasks = random.Random(f"{self.name}-{where}-{spec.get('seed', 0)}").sample(tasks, int(size))
        return tasks

    def heldout_sets(self) -> dict[str, list[Task]]:
        if not hasattr(self, "_heldout"):
            self._heldout = {name: self._tasks(spec, f"domains.{self.name}.heldout.{name}", "heldout")
                             for name, spec in (self.cfg.get("heldout") or {}).items()}
        return self._heldout

    def training_pool(self) -> list[Task]:
        if not hasattr(self, "_pool"):
            where = f"domains.{self.name}.train"
            tasks = self._tasks(self.cfg["train"], where, "train")
            held = {t.prompt for tasks_ in self.heldout_sets().values() for t in tasks_}
            seen: set[str] = set()
            pool = []
            for t in tasks:
                if t.prompt in seen or t.prompt in held:
                    continue
                seen.add(t.prompt)
                pool.append(t)
            if not pool:
                raise ValueError(f"config key `{where}`: no usable training rows after dropping duplicates and "
                                 f"held-out prompts")
            self._pool = pool
        return self._pool

    def pretraining_task(self, rng) -> Task:
        raise ValueError(f"domain {self.name}: hub domains have no pretraining stage (models come from the hub with "
                         f"`source: hub`); only `kind`s of the tiny world build tokenizers and pretrain")

    def demonstration(self, task: Task, style: str) -> str:
        return self.pretraining_task(None)


def check_keep(keep: Any, where: str) -> None:
    """A ``keep`` block is ``{column: [value, ...]}``: at least one column, each with at least one scalar value."""
    if keep is None:
        return
    if not isinstance(keep, Mapping) or not keep:
        raise ValueError(f"config key `{where}` must map column names to lists of the values to keep, e.g. "
                         f"{{difficulty: [easy]}}; got {keep!r}")
    for column, values in keep.items():
        if (not isinstance(values, Sequence) or isinstance(values, str) or not values
                or not all(isinstance(v, (str, int, float, bool)) for v in values)):
            raise ValueError(f"config key `{where}.{column}` must be a non-empty list of the column's values "
                             f"(strings or numbers), got {values!r}")


def kept(row: Mapping[str, Any], keep: Mapping[str, Sequence[Any]]) -> bool:
    """Whether ``row`` holds one of ``keep``'s values in every column it names (no ``keep``: every row)."""
    return all(row[column] in values for column, values in keep.items())


def line_marker(text: str) -> tuple[str, ...]:
    """``text``'s first non-blank line up to any ``{`` (a placeholder), after a newline; none when under 12 characters."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "").partition("{")[0].rstrip()
    return ("\n" + line,) if len(line) >= 12 else ()
