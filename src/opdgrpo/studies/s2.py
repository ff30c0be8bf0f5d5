"""S2: the difficulty study (conf/study/s2.yaml).

One selection job (:meth:`opdgrpo.plan.Planner.difficulty`, shared by every seed) cuts the domain's training
prompts into ``student_bins x teacher_bins`` subsets by the base student's and an external teacher's solve rates;
GRPO and OPD from the teacher then train on each subset alone. Each subset run also scores its own training prompts
(eval set ``in_domain``); the report copies each subset's solve rates from its GRPO run's ``done.json``.

With several seeds and ``spread_over_seeds`` (the default), subset *i* is trained by seed ``seeds[i % n]`` only: the
paper trains each subset once, and the seeds then replicate the study over disjoint groups of subsets (8 subsets
over 3 seeds: 3, 3 and 2) at a third of the cost of every seed training every subset. Each seed's entry lists its own
subsets and, under ``ranking``, every subset's GRPO run, so the subsets are ranked by the teacher's solve rate over
all of them, not within a seed's group.

* **S2-in**: on every subset, GRPO's final accuracy on the subset's own prompts > OPD's peak there.
* **S2-heldout**: subsets ranked by the teacher's solve rate; OPD's final held-out accuracy > GRPO's on the
  ``low_teacher_subsets`` lowest-ranked ones (3 in the paper), GRPO's >= OPD's on the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from .base import ClaimDef, CostSheet, Study, Verdicts, into, study_student

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from opdgrpo.plan import Planner
    from opdgrpo.report.plots import PlotContext


class Subset(TypedDict):
    """One difficulty subset and its two runs; the solve rates are added by the report (:meth:`S2.attach`)."""

    name: str
    grpo: str
    opd: str
    student_rate: NotRequired[float]
    teacher_rate: NotRequired[float]
    size: NotRequired[int]


class Ranked(TypedDict):
    """A subset of the whole study (whichever seed trained it) and the GRPO run whose ``done.json`` has its rates."""

    name: str
    run: str
    teacher_rate: NotRequired[float]


class S2Entry(TypedDict):
    """Report-spec entry of S2 (one per seed): this seed's subsets, and every subset for the ranking."""

    title: str
    domain: str
    teacher_model: str
    subsets: list[Subset]
    ranking: list[Ranked]
    low_teacher_subsets: int


class S2(Study[S2Entry]):
    name = "S2"
    keys = frozenset({"domain", "teacher", "student"})   # and every key of its schema
    claims = (
        ClaimDef(
            "S2-in", "S2",
            "On every difficulty subset, GRPO's final in-domain accuracy beats OPD's peak",
            "all 8 math subsets (Qwen3-1.7B student, Qwen3-4B thinking teacher)",
        ),
        ClaimDef(
            "S2-heldout", "S2",
            "On held-out math, OPD finishes higher on the subsets the teacher solves least, GRPO on the rest",
            "OPD higher on the 3 subsets where the teacher solved the fewest prompts, GRPO on the other 5",
        ),
    )
    direction_tests = (
        "**S2-in** - on every subset GRPO's final accuracy on the subset's own prompts > OPD's peak there. "
        "**S2-heldout** - subsets ranked by the teacher's solve rate; OPD's final held-out accuracy > GRPO's on the "
        "lowest-ranked ones (3 in the paper), GRPO's >= OPD's on the rest."
    )
    direction_tests_rank = 50
    run_keys = frozenset({"grpo", "opd"})
    replicated = False   # seeds train different subsets: no seed's run has a twin in another seed
    schema = {
        "type": "object",
        "required": ["domain", "teacher", "k", "temperature", "student_bins", "teacher_bins", "batch_size",
                     "pool_size", "low_teacher_subsets", "spread_over_seeds"],
        "properties": {
            "k": {"type": "integer", "minimum": 1, "description": "samples per prompt for a solve rate"},
            "temperature": {"type": "number", "minimum": 0},
            "student_bins": {"type": "integer", "minimum": 1},
            "teacher_bins": {"type": "integer", "minimum": 1},
            "batch_size": {"type": "integer", "minimum": 1, "description": "rows per sampling batch (at most)"},
            "max_batch_tokens": {"type": ["integer", "null"], "minimum": 1,
                                 "description": "KV-cache budget of a sampling batch: rows x (longest prompt + "
                                                "max_new_tokens) at most this; null: batch_size rows per batch"},
            "pool_size": {"type": ["integer", "null"], "minimum": 1, "description": "prompts rated; null: the whole pool"},
            "low_teacher_subsets": {"type": "integer", "minimum": 0,
                                    "description": "how many subsets (lowest teacher solve rate first) OPD should win"},
            "grpo_steps": {"type": ["integer", "null"], "minimum": 1},
            "opd_steps": {"type": ["integer", "null"], "minimum": 1},
            "eval_every": {"type": ["integer", "null"], "minimum": 1},
            "in_domain_eval_size": {"type": ["integer", "null"], "minimum": 1},
            "spread_over_seeds": {"type": "boolean",
                                  "description": "true: subset i is trained by seed seeds[i % len(seeds)] only (the "
                                                 "paper trains each subset once); false: every seed trains every subset"},
        },
    }

    def validate(self, cfg: dict[str, Any]) -> None:
        """The selection rule must yield non-empty subsets and a sensible comparison (the schema checked each key)."""
        from opdgrpo.config import ConfigError

        key = f"studies.{self.name}"
        s2 = cfg["studies"][self.name]
        n = s2["student_bins"] * s2["teacher_bins"]
        if s2["pool_size"] is not None and s2["pool_size"] < n:
            raise ConfigError(f"config key `{key}.pool_size` ({s2['pool_size']}) must be at least student_bins x "
                              f"teacher_bins ({n})")
        low = s2["low_teacher_subsets"]
        if low > n:
            raise ConfigError(f"config key `{key}.low_teacher_subsets` must be in [0, {n}] (the number of subsets), "
                              f"got {low}")

    def plan(self, planner: Planner, s: Mapping[str, Any], seed: int) -> S2Entry:
        """The selection job, then a GRPO and an OPD run on each of this seed's subsets (all of them unless
        ``spread_over_seeds``)."""
        from opdgrpo.subsets import subset_names

        d, t, st = s["domain"], s["teacher"], study_student(s)
        selection = planner.difficulty(s)
        if self.name not in selection.studies:
            selection.studies.append(self.name)
        evals = {"eval_every": s.get("eval_every")}
        names = subset_names(int(s["student_bins"]), int(s["teacher_bins"]))
        trained_by = {name: trainer_seed(i, seed, planner.cfg["seeds"], bool(s["spread_over_seeds"]))
                      for i, name in enumerate(names)}
        subsets = []
        for name in names:
            if trained_by[name] != seed:
                continue
            sub = (selection, {"domain": d, "subset": name, "eval_size": s.get("in_domain_eval_size")})
            grpo = planner.add_run(_grpo_id(st, d, name, seed), self.name, "grpo", [d], seed, f"base:{st}",
                               method_overrides={"steps": s.get("grpo_steps")}, label=f"GRPO {name}",
                               train_overrides=evals, subset=sub)
            opd = planner.add_run(f"opd-{t}-{into(st)}{d}_{name}-s{seed}", self.name, "opd", [d], seed, f"base:{st}",
                              {d: f"base:{t}"}, {"steps": s.get("opd_steps")}, label=f"OPD {t} {name}",
                              train_overrides=evals, subset=sub)
            subsets.append(Subset(name=name, grpo=grpo.id, opd=opd.id))
        ranking = [Ranked(name=name, run=_grpo_id(st, d, name, trained_by[name])) for name in names]
        return S2Entry(title=s["title"], domain=d, teacher_model=t, subsets=subsets, ranking=ranking,
                       low_teacher_subsets=int(s.get("low_teacher_subsets", 3)))

    def cost_rows(self, entry: S2Entry, sheet: CostSheet) -> None:
        """Totals over the subsets, per method."""
        grpo, opd = [x["grpo"] for x in entry["subsets"]], [x["opd"] for x in entry["subsets"]]
        sheet.add(f"GRPO, {len(grpo)} subsets", grpo)
        sheet.add(f"OPD {entry['teacher_model']}, {len(opd)} subsets", opd)

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
        from opdgrpo.report.plots import STEP0_CAPTION, Panel, render
        from opdgrpo.runio import IN_DOMAIN_SET

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
        from opdgrpo.report.curves import ReportInputError

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


def trainer_seed(index: int, seed: int, seeds: list[int], spread: bool) -> int:
    """The seed that trains subset ``index``: ``seed`` itself, or with ``spread`` the seeds in turn."""
    return seeds[index % len(seeds)] if spread else seed


def _grpo_id(student: str, domain: str, subset: str, seed: int) -> str:
    return f"grpo-{student}-{domain}_{subset}-s{seed}"


def _seed_of(run: str) -> str:
    """``", seed 1"`` for a run id ending in ``-s1`` (the planner's naming), else nothing."""
    found = re.search(r"-s(\d+)$", run)
    return f", seed {found.group(1)}" if found else ""


def _subset_info(runs_dir: Path, run: str, name: str) -> dict[str, Any]:
    """A subset's solve rates and size, as its GRPO run's ``done.json`` recorded them."""
    from opdgrpo.report.curves import ReportInputError

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
    from opdgrpo.report.curves import ReportInputError, run_curve
    from opdgrpo.runio import IN_DOMAIN_SET

    rows = run_curve(curves, run)
    rows = rows[rows["eval_set"] == IN_DOMAIN_SET].sort_values("step", kind="stable")
    if rows.empty:
        raise ReportInputError(f"run '{run}' has no in-domain evaluation (eval set '{IN_DOMAIN_SET}')")
    return rows


def _in_domain_verdict(subsets: list[Subset], curves: pd.DataFrame) -> tuple:
    """S2-in: GRPO's final in-domain accuracy above OPD's in-domain peak on every subset."""
    from opdgrpo.report.curves import format_pct
    from opdgrpo.report.uncertainty import FAILS, HOLDS

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
    from opdgrpo.report.curves import domain_curve, format_pct
    from opdgrpo.report.uncertainty import FAILS, HOLDS

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


STUDY = S2()
