"""The report's half of each study, found through :data:`REPORTS` (one :class:`~.base.StudyReport` per registered
study, keyed and ordered like :data:`opdgrpo.plan.studies.REGISTRY`).

Every module of this package that defines ``REPORT`` renders the study it names; a study without one gets the
default (no figures of its own, no claims evaluated). Modules without ``REPORT`` are shared bases
(:mod:`~.comparison` for S1/S1b, :mod:`~.consolidation` for S4/S5).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from opdgrpo.plan.studies import REGISTRY

from .base import StudyReport, Verdicts

__all__ = ["REPORTS", "StudyReport", "Verdicts"]


def _discover() -> dict[str, StudyReport[Any]]:
    """Import every module of the package and collect its ``REPORT``; every study gets one (the default if none)."""
    found: dict[str, StudyReport[Any]] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name == "base":
            continue
        report = getattr(importlib.import_module(f"{__name__}.{info.name}"), "REPORT", None)
        if report is None:
            continue
        if report.name not in REGISTRY or report.name in found:
            raise RuntimeError(f"{__name__}.{info.name}: report of {report.name!r}, which is no registered study or "
                               "has a report already")
        found[report.name] = report
    return {name: found.get(name) or StudyReport(name) for name in REGISTRY}


#: Study name -> its report half, for every registered study, ordered by name.
REPORTS: dict[str, StudyReport[Any]] = _discover()
