"""The studies of the paper, one module each, found through :data:`REGISTRY`.

Every module of this package that defines ``STUDY`` (an instance of :class:`~opdgrpo.plan.studies.base.Study`) is a
study; modules without one are shared bases (:mod:`~opdgrpo.plan.studies.comparison` for S1/S1b,
:mod:`~opdgrpo.plan.studies.consolidation` for S4/S5). The planner (which checks each study's block), the cost model
and the report all ask this registry; none of them names a study. The report's half of each study (figures, claim
verdicts, savings) is :mod:`opdgrpo.report.studies`, which imports this package and never the other way round.

Adding a study: one module here (``STUDY = MyStudy()``, see :mod:`~opdgrpo.plan.studies.base` for the hooks), its report
half in ``opdgrpo/report/studies/<name>.py`` (``REPORT = MyStudyReport()``) where it draws or judges anything, and
one ``conf/study/<name>.yaml``, listed in a profile's defaults as ``/study@studies.<NAME>: <name>``.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from opdgrpo.plan.studies.base import ClaimDef, CostSheet, SeedEntries, Study

__all__ = ["REGISTRY", "ClaimDef", "CostSheet", "SeedEntries", "Study"]


def _discover() -> dict[str, Study[Any]]:
    """Import every module of the package and collect its ``STUDY``, keyed and ordered by study name."""
    found: dict[str, Study[Any]] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name == "base":
            continue
        study = getattr(importlib.import_module(f"{__name__}.{info.name}"), "STUDY", None)
        if study is None:
            continue
        if not study.name or study.name in found:
            raise RuntimeError(f"opdgrpo.plan.studies.{info.name}: study name {study.name!r} is empty or registered twice")
        strays = [c.id for c in study.claims if c.study != study.name]
        if strays:
            raise RuntimeError(f"opdgrpo.plan.studies.{info.name}: claims {strays} do not belong to study {study.name}")
        found[study.name] = study
    return dict(sorted(found.items()))


#: Study name (the key of its ``studies.<name>`` conf block and report-spec entry) -> the study, ordered by name.
REGISTRY: dict[str, Study[Any]] = _discover()
