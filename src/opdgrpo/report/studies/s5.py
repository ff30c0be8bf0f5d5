"""The report's half of S5: :class:`~.consolidation.ConsolidationReport` (the study: :mod:`opdgrpo.plan.studies.s5`)."""

from __future__ import annotations

from .consolidation import ConsolidationReport


class S5Report(ConsolidationReport):
    name = "S5"


REPORT = S5Report()
