"""The report's half of S1b: its claims judged on the curves (the study: :mod:`opdgrpo.plan.studies.s1b`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opdgrpo.plan.studies.comparison import ComparisonEntry
from opdgrpo.report.curves import domain_curve
from opdgrpo.report.uncertainty import FAILS, HOLDS, UNMEASURED, resolution_floor

from .base import Verdicts
from .comparison import ComparisonReport, loses_per_flop

if TYPE_CHECKING:
    import pandas as pd


class S1bReport(ComparisonReport):
    name = "S1b"

    def evaluate(self, entry: ComparisonEntry, curves: pd.DataFrame,
                 savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
        """The S1 test with the GRPO-trained teacher, and response-length inflation."""
        out: Verdicts = {"S1b-acc": loses_per_flop(entry, curves)}
        parts, inflated, pairs = [], 0, 0
        for comp in entry.get("comparisons", []):
            domain = comp["domain"]
            g_len = float(domain_curve(curves, comp["grpo"], domain)["mean_response_length"].iloc[-1])
            for label, run in comp.get("opd", {}).items():
                o_len = float(domain_curve(curves, run, domain)["mean_response_length"].iloc[-1])
                pairs += 1
                inflated += o_len > g_len
                parts.append(f"{domain}, {label}: final length OPD {o_len:.1f} vs GRPO {g_len:.1f} tokens")
        if pairs == 0:
            out["S1b-len"] = ("no comparisons in the spec", f"{UNMEASURED}: the study lists no comparisons")
        else:
            summary = f"OPD longer in {inflated}/{pairs} pairs"
            verdict = HOLDS if inflated > pairs / 2 else f"{FAILS}: {summary}"
            # a count of pairs moves the margin in steps of 1 / pairs: its rounding error is the least spread
            out["S1b-len"] = ("; ".join(parts) + f" ({summary})", verdict, inflated / pairs - 0.5, True,
                              resolution_floor(1.0 / pairs))
        return out


REPORT = S1bReport()
