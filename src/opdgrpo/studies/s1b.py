"""S1b: the external teacher further trained with GRPO in the domain, then distilled (conf/study/s1b.yaml).

The teacher's own GRPO run is planned under the study label ``S1b-teacher`` and not counted in the
distillation's FLOPs, as in the paper.

* **S1b-acc**: the S1 test (:func:`~opdgrpo.studies.comparison.loses_per_flop`) with the GRPO-trained teacher.
* **S1b-len**: OPD's mean response length at its final evaluation point > GRPO's at its final point (domain mean
  over held-out sets). The paper says "often", so it holds iff true for more than half of the domain x teacher pairs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .base import ClaimDef, Verdicts, into, study_student
from .comparison import Comparison, ComparisonEntry, ComparisonStudy, loses_per_flop, window_key

if TYPE_CHECKING:
    import pandas as pd

    from opdgrpo.plan import Planner


class S1b(ComparisonStudy):
    name = "S1b"
    keys = frozenset({"domains", "teacher", "teacher_steps", "student", "smooth_window"})
    claims = (
        ClaimDef(
            "S1b-acc", "S1b",
            "With the teacher further trained by GRPO, OPD still loses to GRPO per training FLOP",
            "OPD still generally loses to GRPO per training FLOP",
        ),
        ClaimDef(
            "S1b-len", "S1b",
            "External-teacher OPD inflates the student's response length",
            "external-teacher OPD often inflates response length",
        ),
    )
    direction_tests = (
        "**S1b-len** - OPD's final mean response length > GRPO's final, in more than half of S1b's pairs (the paper "
        "says 'often')."
    )
    direction_tests_rank = 20

    def plan(self, planner: Planner, s: Mapping[str, Any], seed: int) -> ComparisonEntry:
        """Per domain: the student's GRPO run, the teacher's own GRPO run, and OPD from that trained teacher."""
        comparisons, t, st = [], s["teacher"], study_student(s)
        for d in s["domains"]:
            grpo = planner.grpo_expert(self.name, d, seed, st)
            teacher = planner.add_run(f"grpo-{t}-{d}-s{seed}", f"{self.name}-teacher", "grpo", [d], seed, f"base:{t}",
                                  method_overrides={"steps": s.get("teacher_steps")}, label=f"GRPO {t} (teacher)")
            label = f"OPD {t}+GRPO"
            opd = planner.add_run(f"opd-{t}_grpo-{into(st)}{d}-s{seed}", self.name, "opd", [d], seed, f"base:{st}",
                              {d: f"run:{teacher.id}"}, label=label)
            comparisons.append(Comparison(domain=d, grpo=grpo.id, opd={label: opd.id}, teacher=teacher.id))
        return ComparisonEntry(title=s["title"], comparisons=comparisons, **window_key(s))

    def evaluate(self, entry: ComparisonEntry, curves: pd.DataFrame,
                 savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
        """The S1 test with the GRPO-trained teacher, and response-length inflation."""
        from opdgrpo.report.curves import domain_curve
        from opdgrpo.report.uncertainty import FAILS, HOLDS, UNMEASURED

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
            out["S1b-len"] = ("; ".join(parts) + f" ({summary})", verdict, inflated / pairs - 0.5, True)
        return out


STUDY = S1b()
