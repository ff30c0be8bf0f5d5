"""The report's half of S2 (the study: :mod:`opdgrpo.plan.studies.s2`): each subset's solve rates copied from its runs,
one panel per subset, and the claims S2-in and S2-heldout."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opdgrpo.plan.studies.s2 import S2Entry, Subset
from opdgrpo.report.curves import ReportInputError, domain_curve, format_pct, run_curve
from opdgrpo.report.plots import STEP0_CAPTION, Panel, render
from opdgrpo.report.uncertainty import FAILS, HOLDS
from opdgrpo.runio import IN_DOMAIN_SET

from .base import StudyReport, Verdicts

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from opdgrpo.report.plots import PlotContext


class S2Report(StudyReport[S2Entry]):
    name = "S2"

    def attach(self, entry: S2Entry, runs_dir: Path) -> None:
        """Copy each subset's solve rates from its GRPO run's ``done.json`` into the entry, for this seed's subsets
        and for the ranking over all of them (the report reads run directories only)."""
        for sub in entry.get("subsets", []):
            sub.update(_subset_info(Path(runs_dir), sub["grpo"], sub["name"]))  # type: ignore[typeddict-item]
        for ranked in entry.get("ranking", []):
            ranked["teacher_rate"] = _subset_info(Path(runs_dir), ranked["run"], ranked["name"])["teacher_rate"]

    def figures(self, entry: S2Entry, ctx: PlotContext) -> dict[str, Figure]:
        """One panel per subset (ranked by the teacher's solve rate): GRPO and OPD on the subset's own prompts
        (solid, in-domain) and on held-out math (dotted); and the same panels for response length."""
        key, domain = self.name, entry["domain"]
        acc_panels, len_panels = [], []
        every = [sub for inst in (ctx.instances or [entry]) for sub in inst.get("subsets", [])]   # every seed's
        subsets = sorted(every, key=lambda sub: (float(sub.get("teacher_rate", 0.0)), sub["name"]))
        for sub in subsets:
            rates = ""
            if "teacher_rate" in sub:
                rates = f" (solve rate: student {100 * sub['student_rate']:.0f}%, teacher {100 * sub['teacher_rate']:.0f}%)"
            acc = Panel(title=f"{sub['name']}{rates}{_seed_of(sub['grpo'])}", ylabel="accuracy (%)")
            length = Panel(title=f"{sub['name']}{rates}{_seed_of(sub['grpo'])}", ylabel="mean response length (tokens)")
            for method, run in (("GRPO", sub["grpo"]), ("OPD", sub["opd"])):
                acc.lines.append(ctx.line(run, IN_DOMAIN_SET, f"{method}, in-domain", color_key=method))
                acc.lines.append(ctx.line(run, domain, f"{method}, held-out {domain}", linestyle=":", marker="s",
                                          color_key=method))
                length.lines.append(ctx.line(run, domain, f"{method}, held-out {domain}", "mean_response_length",
                                             color_key=method))
            acc_panels.append(acc)
            len_panels.append(length)
        caption = (STEP0_CAPTION + " Panels are ordered by the teacher's solve rate on the subset, lowest first; "
                   "in-domain = the subset's own training prompts.")
        return {f"{key}_accuracy": render(acc_panels, f"{key}: {entry.get('title', key)}", caption),
                f"{key}_length": render(len_panels, f"{key}: mean response length - {entry.get('title', key)}", caption)}

    def evaluate(self, entry: S2Entry, curves: pd.DataFrame,
                 savings: Mapping[str, Mapping[str, Any]]) -> Verdicts:
        """Per subset, GRPO's final in-domain accuracy vs OPD's in-domain peak; then who finishes higher on held-out.

        Subsets are ranked by the teacher's solve rate (``teacher_rate``, from the runs' ``done.json``); the
        ``low_teacher_subsets`` lowest are where the paper has OPD finishing higher on held-out math.
        """
        domain, subsets = entry["domain"], list(entry.get("subsets", []))
        if not subsets:
            return {}
        if any("teacher_rate" not in sub for sub in subsets):
            raise ReportInputError("S2: subsets lack the teacher's solve rate (the runs' done.json has no train_subset)")
        out: Verdicts = {"S2-in": _in_domain_verdict(subsets, curves)}
        ranking = entry.get("ranking") or subsets
        if any("teacher_rate" not in r for r in ranking):
            raise ReportInputError("S2: the ranking lacks the teacher's solve rates (attach was not run)")
        low = _lowest(ranking, int(entry.get("low_teacher_subsets", 3)))
        out["S2-heldout"] = _heldout_verdict(domain, subsets, low, len(ranking), curves)
        return out


def _seed_of(run: str) -> str:
    """``", seed 1"`` for a run id ending in ``-s1`` (the planner's naming), else nothing."""
    found = re.search(r"-s(\d+)$", run)
    return f", seed {found.group(1)}" if found else ""


def _subset_info(runs_dir: Path, run: str, name: str) -> dict[str, Any]:
    """A subset's solve rates and size, as its GRPO run's ``done.json`` recorded them."""
    done = runs_dir / run / "done.json"
    if not done.is_file():
        raise ReportInputError(f"{done}: not found (S2 subset {name})")
    info = json.loads(done.read_text(encoding="utf-8")).get("train_subset")
    if not info:
        raise ReportInputError(f"{done}: no 'train_subset' (S2 subset {name}); rerun the run")
    return {k: info[k] for k in ("student_rate", "teacher_rate", "size") if k in info}


def _lowest(ranking: list[Any], n_low: int) -> set[str]:
    """The names of the ``n_low`` subsets the teacher solves least, over every subset of the study."""
    ranked = sorted(ranking, key=lambda sub: (float(sub["teacher_rate"]), sub["name"]))
    return {sub["name"] for sub in ranked[:n_low]}


def _in_domain_curve(curves: pd.DataFrame, run: str) -> pd.DataFrame:
    """A subset run's accuracy on its own training prompts, by step."""
    rows = run_curve(curves, run)
    rows = rows[rows["eval_set"] == IN_DOMAIN_SET].sort_values("step", kind="stable")
    if rows.empty:
        raise ReportInputError(f"run '{run}' has no in-domain evaluation (eval set '{IN_DOMAIN_SET}')")
    return rows


def _in_domain_verdict(subsets: list[Subset], curves: pd.DataFrame) -> tuple:
    """S2-in: GRPO's final in-domain accuracy above OPD's in-domain peak on every subset."""
    in_parts, in_fail, in_margins = [], [], []
    for sub in subsets:
        g_final = float(_in_domain_curve(curves, sub["grpo"])["accuracy"].iloc[-1])
        o_peak = float(_in_domain_curve(curves, sub["opd"])["accuracy"].max())
        in_margins.append(g_final - o_peak)
        in_parts.append(f"{sub['name']} {format_pct(g_final)} vs {format_pct(o_peak)}")
        if not g_final > o_peak:
            in_fail.append(sub["name"])
    n = len(subsets)
    return (f"GRPO final vs OPD peak, in-domain: {'; '.join(in_parts)} (GRPO higher on {n - len(in_fail)}/{n})",
            HOLDS if not in_fail else f"{FAILS}: OPD's peak is at least GRPO's final on {', '.join(in_fail)}",
            min(in_margins), True)


def _heldout_verdict(domain: str, subsets: list[Subset], low: set[str], n_all: int, curves: pd.DataFrame) -> tuple:
    """S2-heldout: OPD finishes higher on held-out on the subsets in ``low`` (the teacher's lowest solve rates over
    all ``n_all`` subsets of the study), GRPO on the rest; ``subsets`` are the ones this seed trained."""
    n = len(subsets)
    ranked = sorted(subsets, key=lambda sub: (float(sub["teacher_rate"]), sub["name"]))
    parts, mismatched, margins = [], [], []
    for sub in ranked:
        g = float(domain_curve(curves, sub["grpo"], domain)["accuracy"].iloc[-1])
        o = float(domain_curve(curves, sub["opd"], domain)["accuracy"].iloc[-1])
        winner = "OPD" if o > g else "GRPO"
        expected = "OPD" if sub["name"] in low else "GRPO"
        margins.append(o - g if expected == "OPD" else g - o)
        parts.append(f"{sub['name']} (teacher {100 * float(sub['teacher_rate']):.0f}%, expected {expected}): {winner} "
                     f"{format_pct(max(o, g))} vs {format_pct(min(o, g))}")
        if winner != expected:
            mismatched.append(sub["name"])
    ours = (f"ranked by teacher solve rate: {'; '.join(parts)}; pattern (OPD on the {len(low)} lowest of {n_all}, GRPO "
            f"on the rest) matched on {n - len(mismatched)}/{n}")
    return ours, HOLDS if not mismatched else f"{FAILS}: not matched on {', '.join(mismatched)}", min(margins), True


REPORT = S2Report()
