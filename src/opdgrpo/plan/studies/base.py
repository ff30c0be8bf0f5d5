"""The study contract: what one study (S1, S2, ...) owns, and the small vocabulary its hooks share.

A study is one module of :mod:`opdgrpo.plan.studies` that defines ``STUDY``, an instance of a :class:`Study` subclass
named like its ``studies.<name>`` block in ``conf/``. Everything about that study lives there, in data-flow order:

* **conf**: :attr:`Study.schema`, :attr:`Study.keys` and :meth:`Study.validate`, checked by the planner
  (:func:`opdgrpo.plan.build.check_studies`) beyond the generic checks :func:`opdgrpo.config.validate` applies to every
  study block (domains, teachers, student, mix);
* **plan**: :meth:`Study.plan` asks the planner for the study's runs and returns its *report-spec entry*, a
  ``TypedDict`` (plain JSON: Snakemake writes it into ``spec.json``, the report reads it back; the TypedDict is the
  one place both sides take its keys from);
* **cost model**: :meth:`Study.cost_rows` (the FLOP figures ``opdgrpo flops estimate`` prints for the study);
* **claims**: the rows :attr:`Study.claims` and their :attr:`Study.direction_tests` sentence, and what the report
  writes for the study (:attr:`Study.figure_stems`, :attr:`Study.table_stems`, :attr:`Study.run_keys`).

The report reads, draws and judges a study in its own half, :mod:`opdgrpo.report.studies` (one module per study, a
:class:`~opdgrpo.report.studies.base.StudyReport`), which imports this one. Imports stay one-way: the studies import
the planner's vocabulary (:mod:`opdgrpo.plan.planner`) and never the report, so planning loads no plotting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypedDict, TypeVar

if TYPE_CHECKING:  # type hints only: the planner and the report import this module, not the other way round
    from opdgrpo.plan.planner import Planner

#: A study's report-spec entry type (a TypedDict, one per study kind: what its plan writes and its report reads).
Entry = TypeVar("Entry", bound=Mapping[str, Any])


@dataclass(frozen=True)
class ClaimDef:
    """A paper claim: its id, what it says, and the paper's numbers (one row of ``claims.md``)."""

    id: str
    study: str
    claim: str
    paper: str


class SeedEntries(TypedDict):
    """A study's report-spec entry when several seeds are planned: one entry per seed, in ``seeds`` order."""

    title: str
    seeds: list[Any]


class CostSheet(Protocol):
    """Where :meth:`Study.cost_rows` writes its figures (:mod:`opdgrpo.cost.model` provides it)."""

    study_runs: list[str]   # the planned runs that list this study

    def cost(self, run: str) -> float:
        """A run's FLOPs (predicted, or from its ledger); NaN when unknown."""
        ...

    def add(self, quantity: str, runs: Sequence[str], unit: str = "flops", value: float | None = None) -> None:
        """One figure: ``value`` (default: the runs' FLOPs summed) in ``unit`` ("flops" | "%" | "x")."""
        ...


class Study(Generic[Entry]):
    """Base of every study; subclasses set the class attributes and override the hooks they need.

    ``Entry`` is the study's report-spec entry type: :meth:`plan` returns one, the report-side hooks receive one
    (read back from ``spec.json``), so both halves take the entry's keys from the same TypedDict.
    """

    #: The key of its conf block (``studies.<name>``) and of its report-spec entry; also its registry key.
    name: ClassVar[str] = ""
    #: Its rows of claims.md, in order (each ``ClaimDef.study`` is ``name``).
    claims: ClassVar[tuple[ClaimDef, ...]] = ()
    #: Its sentence(s) in claims.md's "Direction tests" paragraph: how each of its claims is decided.
    direction_tests: ClassVar[str] = ""
    #: Where that sentence goes in the paragraph, lowest first. The paragraph predates the registry (S2 was described
    #: after S4), so the studies' ranks keep its order and claims.md byte for byte; a new study may keep the default.
    direction_tests_rank: ClassVar[int] = 1000
    #: Keys of its report-spec entry (at any depth) whose values are run ids: the report checks they are planned.
    run_keys: ClassVar[frozenset[str]] = frozenset()
    #: Whether every seed's entry names the same runs in the same places (its figures draw means over seeds). S2
    #: spreads its subsets over the seeds, so its seeds' entries differ and each line is one run.
    replicated: ClassVar[bool] = True
    #: A JSON Schema of its conf block beyond the keys every study shares (src/opdgrpo/schemas/study.schema.yaml);
    #: config validation checks it, errors naming ``studies.<name>.<key>``. Rules across keys go in :meth:`validate`.
    schema: ClassVar[dict[str, Any] | None] = None
    #: The keys of its conf block it reads, beyond ``name``, ``title`` and its ``schema``'s properties; config
    #: validation refuses any other, so a key that would do nothing here (``studies.S3.share_threshold``, a typo)
    #: fails naming it. None: not checked (a study whose ``schema`` has ``additionalProperties: false``).
    keys: ClassVar[frozenset[str] | None] = None

    def read_keys(self) -> frozenset[str] | None:
        """Every key of its conf block this study reads (None: its schema checks them)."""
        if self.keys is None:
            return None
        return self.keys | {"name", "title"} | set((self.schema or {}).get("properties", {}))
    #: Its figures in the report, ``<name>_<stem>.png/.pdf`` (Snakemake's outputs of the report rule). "length" is
    #: drawn generically when :meth:`figures` gives none.
    figure_stems: ClassVar[tuple[str, ...]] = ("accuracy", "length")
    #: Its tables in the report beyond savings and claims, ``<name>_<stem>.md/.csv`` (from :meth:`tables`).
    table_stems: ClassVar[tuple[str, ...]] = ()

    # -- conf and plan --------------------------------------------------------------------------------------------
    def validate(self, cfg: dict[str, Any]) -> None:
        """Raise :class:`opdgrpo.config.ConfigError` naming the key for what this study's block gets wrong."""

    def plan(self, planner: Planner, block: Mapping[str, Any], seed: int) -> Entry:
        """Ask ``planner`` for this seed's runs; return the report-spec entry that names them."""
        raise NotImplementedError(f"study {self.name} plans nothing")

    # -- cost model -----------------------------------------------------------------------------------------------
    def cost_rows(self, entry: Entry, sheet: CostSheet) -> None:
        """Add this study's FLOP figures to ``sheet`` (default: the total of its runs)."""
        sheet.add("all runs", sheet.study_runs)


#: Study keys of the matching rule (:mod:`opdgrpo.report.matching`) that the plan copies into a report-spec entry;
#: the report gives an entry without them the rule's defaults.
MATCHING_KEYS = ("tolerance", "smooth_window", "tolerance_se", "share_threshold", "min_joint_gain_se")


def matching_keys(block: Mapping[str, Any]) -> dict[str, Any]:
    """The matching-rule keys a study's conf block sets (``tolerance`` always, 0 when unset)."""
    out = {k: block[k] for k in MATCHING_KEYS if block.get(k) is not None}
    out["tolerance"] = float(block.get("tolerance") or 0.0)
    return out


def check_smooth_window(cfg: Mapping[str, Any], name: str) -> None:
    """``studies.<name>.smooth_window`` must be odd: its trailing mean then sits on an evaluation point."""
    from opdgrpo.errors import ConfigError

    window = cfg["studies"][name].get("smooth_window")
    if window is not None and window % 2 == 0:
        raise ConfigError(f"config key `studies.{name}.smooth_window` must be odd (a trailing mean on an evaluation point), got {window}")
