"""The report's half of S1: its claims judged on the curves (the study: :mod:`opdgrpo.plan.studies.s1`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opdgrpo.plan.studies.comparison import ComparisonEntry

from .base import Verdicts
from .comparison import ComparisonReport, loses_per_flop

if TYPE_CHECKING:
    import pandas as pd


class S1Report(ComparisonReport):
    name = "S1"

    def evaluate(self, entry: ComparisonEntry, curves: pd.DataFrame,
                 savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
        """External-teacher OPD vs GRPO per FLOP."""
        return {"S1": loses_per_flop(entry, curves)}


REPORT = S1Report()
