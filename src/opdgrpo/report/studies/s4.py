"""The report's half of S4: :class:`~.consolidation.ConsolidationReport` (the study: :mod:`opdgrpo.plan.studies.s4`)."""

from __future__ import annotations

from .consolidation import ConsolidationReport


class S4Report(ConsolidationReport):
    name = "S4"


REPORT = S4Report()
