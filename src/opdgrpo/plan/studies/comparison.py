"""Shared base of S1 and S1b: per domain, the student's GRPO run against OPD runs from external teachers.

Both studies write the same report-spec entry (:class:`ComparisonEntry`) and cost rows, and the report draws and
tests them alike (:mod:`opdgrpo.report.studies.comparison`); they differ in the teachers they plan and in S1b's
extra length claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

from opdgrpo.plan.studies.base import CostSheet, Study, check_smooth_window


class Comparison(TypedDict):
    """One compared domain: its GRPO run and the OPD runs set against it."""

    domain: str
    grpo: str
    opd: dict[str, str]          # legend label ("OPD teacher_m") -> OPD run
    teacher: NotRequired[str]    # S1b: the external teacher's own GRPO run (listed in the cost rows, not counted)


class ComparisonEntry(TypedDict):
    """Report-spec entry of S1 and S1b."""

    title: str
    comparisons: list[Comparison]
    base_length_run: NotRequired[str | None]   # never planned; a hand-written spec may name the base student's run
    smooth_window: NotRequired[int]            # peaks read from trailing moving averages over this many points


class ComparisonStudy(Study[ComparisonEntry]):
    """S1-style study: GRPO vs external-teacher OPD per domain."""

    run_keys = frozenset({"grpo", "opd", "teacher", "base_length_run"})

    def validate(self, cfg: dict[str, Any]) -> None:
        """``smooth_window`` must be odd (a trailing mean on an evaluation point); the schema checked the rest."""
        check_smooth_window(cfg, self.name)

    def cost_rows(self, entry: ComparisonEntry, sheet: CostSheet) -> None:
        """Each run, and OPD's multiple of GRPO; a GRPO-trained teacher's own run listed as not counted."""
        for c in entry["comparisons"]:
            d = c["domain"]
            sheet.add(f"GRPO ({d})", [c["grpo"]])
            for label, run in c["opd"].items():
                sheet.add(f"{label} ({d})", [run])
                sheet.add(f"{label} / GRPO ({d})", [run, c["grpo"]], "x", sheet.cost(run) / sheet.cost(c["grpo"]))
            if c.get("teacher"):
                sheet.add(f"teacher's own GRPO ({d}, not counted)", [c["teacher"]])


def window_key(block: Mapping[str, Any]) -> dict[str, int]:
    """The ``smooth_window`` a study's conf block sets, for its report-spec entry (none: the report's default)."""
    return {"smooth_window": int(block["smooth_window"])} if block.get("smooth_window") is not None else {}
