"""The report's half of a study: how the report reads, draws and judges what a study declared.

A study's declarations (its name, claims, report-spec entry, figure and table stems) and its plan-side hooks live in
:mod:`opdgrpo.plan.studies`; the hooks that need run directories, curves and the report's statistics live here, one
module per study, as a :class:`StudyReport` named like the study. The report imports both halves; the studies never
import the report, so the planner loads no plotting and no statistics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from opdgrpo.plan.studies import REGISTRY, Study

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from opdgrpo.report.plots import PlotContext

#: A study's report-spec entry type (the TypedDict its plan-side half defines).
Entry = TypeVar("Entry", bound=Mapping[str, Any])

#: Claim id -> ``(ours, verdict)`` or ``(ours, verdict, margin, strict[, floor])``, the margin a number or a
#: (low, high) range: see :func:`opdgrpo.report.claims._combine`.
Verdicts = dict[str, tuple]


class StudyReport(Generic[Entry]):
    """Base of every study's report half; defaults do nothing, so a study writes only what it has.

    The hooks take the *per-seed* entry (a study planned with several seeds is evaluated seed by seed;
    :func:`opdgrpo.report.curves.study_instances`), read back from ``spec.json``.
    """

    #: The study it renders (a key of :data:`opdgrpo.plan.studies.REGISTRY`).
    name: ClassVar[str] = ""

    def __init__(self, name: str | None = None):
        if name is not None:
            self.name = name   # type: ignore[misc]  # the default report of a study without its own module

    @property
    def study(self) -> Study[Any]:
        """The study's declarations: claims, figure stems, the paper's figures."""
        return REGISTRY[self.name]

    def attach(self, entry: Entry, runs_dir: Path) -> None:
        """Copy into ``entry`` (in place) what the report needs from run directories beyond the curves."""

    def savings_row(self, spec: Mapping[str, Any], entry: Entry, curves: pd.DataFrame,
                    final_flops: Mapping[str, float]) -> dict[str, Any] | None:
        """Its row of savings.csv (matched-FLOP savings), or None when the study has no such figure."""
        return None

    def figures(self, entry: Entry, ctx: PlotContext) -> dict[str, Figure] | None:
        """``{file stem: Figure}``: its ``<name>_accuracy`` figure and, where it draws one, ``<name>_length``
        (else the report draws the generic length figure); None: no figure registered."""
        return None

    def tables(self, instances: Sequence[Entry], curves: pd.DataFrame,
               final_flops: Mapping[str, float]) -> dict[str, tuple[pd.DataFrame, str]]:
        """``{stem: (csv frame, markdown text)}`` for each of the study's ``table_stems``, over every seed's entry at
        once (a table with intervals over seeds); default none."""
        return {}

    def evaluate(self, entry: Entry, curves: pd.DataFrame,
                 savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
        """Verdicts of its claims measured on ``curves`` (and its savings row, ``savings[name]``, if any)."""
        return {}
