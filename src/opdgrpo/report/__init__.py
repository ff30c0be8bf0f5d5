"""The report stage: run directories + a report spec -> ``results/<profile>/report/``.

Modules: :mod:`~opdgrpo.report.curves` (load evals.jsonl into curves.csv's long form, domain/mix accuracy),
:mod:`~opdgrpo.report.savings` (the paper's headline matched-FLOP savings; our own implementation, the
contract in docs/method.md, with the ``opdgrpo savings`` CLI), :mod:`~opdgrpo.report.plots` (figures),
:mod:`~opdgrpo.report.claims` (claims.md) and :mod:`~opdgrpo.report.build` (``opdgrpo report``).

Names are imported lazily so ``python -m opdgrpo.report.savings`` neither loads matplotlib nor trips runpy's
"found in sys.modules" warning.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CURVE_COLUMNS": "curves",
    "ReportInputError": "curves",
    "ReportWarning": "curves",
    "load_curves": "curves",
    "domain_accuracy": "curves",
    "mix_accuracy": "curves",
    "compute_savings": "savings",
    "claims_table": "claims",
    "build_report": "build",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'opdgrpo.report' has no attribute {name!r}")
    return getattr(importlib.import_module(f"opdgrpo.report.{module}"), name)
