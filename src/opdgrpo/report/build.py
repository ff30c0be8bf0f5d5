"""Build ``results/<profile>/report/`` from run directories and the planner's report spec.

The report reads only run directories (data flows one way: conf -> plan -> runs -> report) and writes, atomically (temp file then ``os.replace``,
so an interrupted report never leaves a half-written file that Snakemake would take as done):

* ``curves.csv`` -- long form, the contracted columns (:data:`opdgrpo.report.curves.CURVE_COLUMNS`);
* ``savings.csv`` and ``savings.md`` -- one row per consolidation study present (and seed), matched-FLOP savings;
* ``claims.md`` -- one short line per paper claim: paper value, ours as numbers, the verdict with its study's
  measurability conditions; ``claims_detail.md`` -- every seed's measurement and the direction tests;
* ``conditions.md`` -- the measurability conditions of the consolidation studies, per seed;
* ``mfu.md`` -- per run: training FLOPs, wall time of its steps, achieved GFLOP/s, measured peak, MFU;
* ``<study>_accuracy.png/.pdf`` and ``<study>_length.png/.pdf`` per study.

What is study-specific (its savings row, figures, claims, data copied from run directories) comes from the study's
report half (:data:`opdgrpo.report.studies.REPORTS`) and its declarations (:data:`opdgrpo.plan.studies.REGISTRY`); this
module only orchestrates. Study keys the registry does not know are
skipped with a note instead of failing, so a spec from a newer planner still yields the report for the studies this
code knows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from opdgrpo.plan.studies import REGISTRY
from opdgrpo.progress import Stages
from opdgrpo.report.claims import claims_pages, cost_ratio
from opdgrpo.report.conditions import condition_rows, conditions_markdown, conditions_note, study_conditions
from opdgrpo.report.constraints import constraints_markdown
from opdgrpo.report.curves import (
    ReportInputError,
    format_flops,
    format_pct,
    load_curves,
    load_final_flops,
    referenced_runs,
    study_instances,
    validate_spec_runs,
)
from opdgrpo.report.mfu import mfu_markdown
from opdgrpo.report.plots import PlotContext, plot_lengths
from opdgrpo.report.savings import SAVINGS_COLUMNS, finite_figures, format_savings, sign_over_seeds
from opdgrpo.report.studies import REPORTS

DPI = 150


# ------------------------------------------------------------------------------------------------------- inputs
def load_spec(path: Path) -> dict[str, Any]:
    """Read the report spec; errors name the file and the missing key."""
    path = Path(path)
    if not path.is_file():
        raise ReportInputError(f"{path}: report spec not found")
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ReportInputError(f"{path}: malformed JSON ({exc})") from exc
    if not isinstance(spec, dict):
        raise ReportInputError(f"{path}: expected a JSON object")
    for key in ("profile", "runs"):
        if key not in spec:
            raise ReportInputError(f"{path}: missing key '{key}'")
    if not isinstance(spec.get("studies", {}), dict):
        raise ReportInputError(f"{path}: key 'studies' must be an object")
    return spec


def known_studies(spec: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(study keys this code handles, notes for the ones it skips)."""
    known, notes = [], []
    for key in spec.get("studies", {}) or {}:
        if key in REGISTRY:
            known.append(key)
        else:
            notes.append(f"study {key}: no report kind registered for it; skipped")
    return known, notes


def check_study_runs(spec: Mapping[str, Any], keys: Sequence[str]) -> None:
    """Every run a handled study names must be listed in ``spec['runs']`` (else the planner has a bug)."""
    listed = {entry["run"] for entry in spec["runs"]}
    for key in keys:
        for run in referenced_runs(spec["studies"][key]):
            if run not in listed:
                raise ReportInputError(f"report spec: study {key} refers to run '{run}', which is not in 'runs'")


# ------------------------------------------------------------------------------------------------------ savings
def consolidation_rows(
    spec: Mapping[str, Any], curves: pd.DataFrame, final_flops: Mapping[str, float]
) -> list[dict[str, Any]]:
    """savings.csv's rows: each study present that has a savings row (the consolidation studies, registry order),
    one row per seed, and a ``seed = all`` summary row when there are several."""
    rows = []
    for key, study in REPORTS.items():
        entry = (spec.get("studies") or {}).get(key)
        if entry is None:
            continue
        per_seed = [study.savings_row(spec, inst, curves, final_flops) for inst in study_instances(entry)]
        per_seed = [row for row in per_seed if row is not None]
        rows.extend(per_seed)
        if len(per_seed) > 1:
            rows.append(seed_summary_row(per_seed))
    return rows


def seed_summary_row(per_seed: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``seed = all`` row of a study run with several seeds: means over seeds, every seed's reading, the range
    of the savings when every seed has a finite figure (with 3 seeds a range, not an interval: a bootstrap over 3
    values has 10 resamples and would only restate it), and the sign over seeds
    (:func:`~opdgrpo.report.savings.sign_over_seeds`, the rule claims.md uses)."""
    first = per_seed[0]
    row: dict[str, Any] = {k: first.get(k) for k in ("study", "domains", "paper_savings", "paper_distill_share",
                                                       "tolerance_points", "smooth_window", "tolerance_se",
                                                       "min_joint_gain_se", "share_threshold")}
    for k in ("target_accuracy", "joint_flops", "expert_flops", "distill_flops", "pipeline_flops", "distill_share",
              "distill_share_run", "threshold_accuracy", "eval_se", "joint_gain"):
        values = [r.get(k) for r in per_seed]
        row[k] = float(np.mean(values)) if all(v is not None for v in values) else None
    readings = [(r.get("savings"), r.get("savings_bound") or "") for r in per_seed]
    figures = finite_figures(readings)
    row["seed"] = "all"
    row["direction"] = ", ".join(dict.fromkeys(str(r.get("direction")) for r in per_seed))
    row["savings_sign"] = sign_over_seeds(readings)
    row["reason"] = "seeds: " + ", ".join(f"{r.get('seed')}: {format_savings(v, b)} ({r.get('direction')})"
                                          for r, (v, b) in zip(per_seed, readings))
    if len(figures) == len(per_seed):
        row["savings"], row["savings_min"], row["savings_max"] = float(np.mean(figures)), min(figures), max(figures)
        row["status"] = "mean and range over seeds"
    else:
        row["savings"] = row["savings_min"] = row["savings_max"] = None
        row["status"] = f"figures in {len(figures)}/{len(per_seed)} seeds, bounds or -inf in the others"
    return row


def _saving_cell(r: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    """A row's savings as a cost ratio with the savings beside it; over seeds, the mean and range or every seed's."""
    if r.get("seed") != "all":
        return cost_ratio(r.get("savings"), r.get("savings_bound") or "")
    if r.get("savings_min") is not None:
        return (f"{cost_ratio(r['savings'])}, range {1 - r['savings_max']:.1f}x to {1 - r['savings_min']:.1f}x "
                "over seeds")
    seeds = [o for o in rows if o["study"] == r["study"] and o.get("seed") != "all"]
    return "seeds: " + ", ".join(cost_ratio(o.get("savings"), o.get("savings_bound") or "") for o in seeds)


def _conditions_of(r: Mapping[str, Any], conditions: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """The measurability conditions of a savings row's study and seed (every seed for the ``all`` row)."""
    mine = [c for c in conditions.get(r["study"], []) if r.get("seed") in ("all", c.get("seed"))]
    return conditions_note(mine) or "n/a"


def savings_markdown(rows: Sequence[Mapping[str, Any]], profile: str,
                     conditions: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> str:
    """savings.md: first one sentence per study and seed (the cost ratio, the savings beside it, the conditions),
    then the table with the reading that decides and the other direction's, a figure or a bound."""
    conditions = conditions or {}
    lines = [
        f"# Matched-FLOP savings (profile `{profile}`)",
        "",
        "Cost ratio = pipeline / joint GRPO FLOPs to one target accuracy (savings = 1 - ratio: 2.0x is -100%, 0.5x "
        "is +50%); pipeline = the experts' final training FLOPs + the distillation's FLOPs to the target; distill "
        "share = the whole distillation run / experts (the paper's reading, what S4/S5-share test), and up to the "
        "match = the distillation's FLOPs to the target / experts. Mix accuracy = mean of the domains, domain = mean of its held-out sets, read "
        "on curves smoothed by a trailing moving average over the study's `smooth_window` evaluation points (each "
        "point the mean of itself and the points before it: nothing measured later). A run reaches a target where "
        "its smoothed mix accuracy first comes within `tolerance_se` standard errors of one evaluation point (SE = "
        "sqrt(p(1-p) sum_d sum_s 1/(D^2 S_d^2 n_s k_eff_s)) for n_s prompts per held-out set, each worth k_eff_s = "
        "k_s / design effect independent samples: errors clustered by prompt, the design effect read from pass@2) "
        "plus `tolerance` points of it, linearly interpolated between evaluation points. Two directions: **joint** "
        "(the paper's) targets joint GRPO's best smoothed accuracy and decides when joint GRPO gained at least "
        "`min_joint_gain_se` SE over its start; otherwise **pipeline** decides: it targets the distillation's best "
        "and reads joint GRPO's FLOPs to it. A run that never reaches a target is censored at its last evaluation: "
        "`>=` / `<=` mark a bound. Conditions: the measurability conditions of [conditions.md](conditions.md) for "
        "that study and seed. Numbers are measured from this run's run directories (docs/method.md, \"Savings that "
        "always answer\").",
        "",
    ]
    if not rows:
        return "\n".join(lines + ["No consolidation study in the report spec.", ""])
    glance, whys = [], []
    table = [
        "| study | domains | decides | target | joint FLOPs | expert FLOPs | distill FLOPs | pipeline FLOPs "
        "| pipeline / joint FLOPs (savings) | conditions | sign | distill share (whole run) "
        "| distill share (up to the match) | other direction | paper savings "
        "| paper distill share |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def pct(x: Any, bound: str = "") -> str:
        return "n/a" if x is None else f"{'>= ' if bound else ''}{100 * x:.1f}%"

    for r in rows:
        many = sum(o["study"] == r["study"] for o in rows) > 1
        name = f"{r['study']} (all seeds)" if r.get("seed") == "all" else (
            f"{r['study']} (seed {r['seed']})" if many else r["study"])
        other = "-" if r.get("seed") == "all" else (
            f"{r.get('other_direction')}: target {format_pct(r.get('other_target_accuracy'))}, ratio "
            f"{cost_ratio(r.get('other_savings'), r.get('other_savings_bound') or '')}")
        saving, conds = _saving_cell(r, rows), _conditions_of(r, conditions)
        paper = r.get("paper_savings")
        glance.append(f"- **{name}**: pipeline / joint GRPO FLOPs to reach {format_pct(r['target_accuracy'])}: "
                      f"{saving}" + (f" (paper {1 - paper:.2f}x, {pct(paper)})" if paper is not None else "")
                      + f"; {conds}")
        whys.append(f"- {name}: {r.get('reason', '')}")
        table.append(
            f"| {name} | {r['domains']} | {r.get('direction')} | {format_pct(r['target_accuracy'])} "
            f"| {format_flops(r['joint_flops'])} | {format_flops(r['expert_flops'])} | {format_flops(r['distill_flops'])} "
            f"| {format_flops(r['pipeline_flops'])} | {saving} | {conds} | {r.get('savings_sign')} "
            f"| {pct(r.get('distill_share_run'))} | {pct(r['distill_share'], r.get('share_bound') or '')} | {other} "
            f"| {pct(paper)} | {pct(r['paper_distill_share'])} |".replace("None", "n/a")
        )
    rules = sorted({(r.get("smooth_window"), r.get("tolerance_se"), r["tolerance_points"], r.get("min_joint_gain_se"))
                    for r in rows}, key=str)
    said = "; ".join(f"smoothed over {w} points, tolerance {se} SE + {t:g} accuracy points, joint GRPO's best the "
                     f"target past a gain of {g} SE" for w, se, t, g in rules)
    ses = [f"{r['study']} (seed {r.get('seed')}) {100 * r['eval_se']:.2f} pts" for r in rows
           if r.get("eval_se") is not None and r.get("seed") != "all"]
    lines += [*glance, "", *table, "",
              f"Matching rule: {said}." + (f" One evaluation's SE at the target: {', '.join(ses)}." if ses else ""),
              "", "How each row reads:", "", *whys, ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ writing
def _atomic(path: Path, write: Callable[[Path], None]) -> Path:
    """Write ``path`` through a temp file in the same directory, then ``os.replace`` it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path, text: str) -> Path:
    """Atomically write a text file."""
    return _atomic(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def save_figure(fig: Figure, out_dir: Path, stem: str) -> list[Path]:
    """Atomically save ``<stem>.png`` (dpi 150) and ``<stem>.pdf``."""
    out = []
    for fmt in ("png", "pdf"):
        out.append(_atomic(Path(out_dir) / f"{stem}.{fmt}", lambda tmp, f=fmt: fig.savefig(tmp, format=f, dpi=DPI)))
    return out


# -------------------------------------------------------------------------------------------------------- build
def draw_figures(
    spec: Mapping[str, Any], keys: Sequence[str], curves: pd.DataFrame, rows: Sequence[Mapping[str, Any]],
    notes: list[str], final_flops: Mapping[str, float] | None = None,
) -> dict[str, Figure]:
    """Every registered study's figures, ``{file stem: Figure}``; with several seeds, the first seed's.

    A study whose runs cannot be drawn (e.g. a run never evaluates the compared domain) raises naming the study,
    rather than leaving a contracted figure silently missing.
    """
    labels = {e["run"]: e.get("label", e["run"]) for e in spec["runs"]}
    summary_rows = {r["study"]: r for r in rows if r.get("seed") == "all"}
    first_rows: dict[str, Mapping[str, Any]] = {}
    for r in rows:
        first_rows.setdefault(r["study"], r)
    figures: dict[str, Figure] = {}
    for key in keys:
        instances = study_instances(spec["studies"][key])
        study = dict(instances[0])
        replicated = REGISTRY[key].replicated
        ctx = PlotContext(curves=curves, labels=labels, savings={**first_rows, **summary_rows}, notes=notes,
                          seed_runs=seed_twins(instances) if replicated else {}, instances=instances,
                          final_flops=final_flops or {})
        if len(instances) > 1 and not replicated:
            study["title"] = f"{study.get('title', key)} ({len(instances)} seeds, each training its own subsets)"
        elif len(instances) > 1:  # lines are means over seeds with a 95% band
            study["title"] = f"{study.get('title', key)} (mean and 95% interval over {len(instances)} seeds)"
        try:
            drawn = REPORTS[key].figures(study, ctx)
            if drawn is None:
                notes.append(f"study {key}: no figure registered")
                continue
            if f"{key}_length" not in drawn and "length" in REGISTRY[key].figure_stems:
                drawn.update(plot_lengths(key, referenced_runs(instances[0]), ctx, study.get("title", key)))
            figures.update(drawn)
        except (KeyError, ValueError) as exc:
            raise ReportInputError(f"study {key}: cannot draw its figure: {exc}") from exc
    return figures


def study_tables(spec: Mapping[str, Any], keys: Sequence[str], curves: pd.DataFrame,
                 final_flops: Mapping[str, float]) -> dict[str, tuple[pd.DataFrame, str]]:
    """Every study's own tables (:meth:`~opdgrpo.plan.studies.base.Study.tables`), ``{file stem: (frame, markdown)}``."""
    out: dict[str, tuple[pd.DataFrame, str]] = {}
    for key in keys:
        instances = study_instances(spec["studies"][key])
        try:
            drawn = REPORTS[key].tables(instances, curves, final_flops)
        except (KeyError, ValueError) as exc:
            raise ReportInputError(f"study {key}: cannot build its tables: {exc}") from exc
        out.update({f"{key}_{stem}": table for stem, table in drawn.items()})
    return out


def seed_twins(instances: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Each run of the first seed's study entry -> the runs in the same place of every seed's entry."""
    per_seed = [referenced_runs(inst) for inst in instances]
    if any(len(runs) != len(per_seed[0]) for runs in per_seed):
        raise ReportInputError("report spec: the per-seed entries of a study name different numbers of runs")
    return {runs[0]: list(runs) for runs in zip(*per_seed)}


def attach_run_info(spec: dict[str, Any], runs_dir: Path) -> None:
    """Let each registered study copy into its spec entries (in place, every seed's) what it reads from run
    directories besides the curves, e.g. S2's subset solve rates
    (:meth:`~opdgrpo.report.studies.base.StudyReport.attach`)."""
    for key, entry in (spec.get("studies") or {}).items():
        study = REPORTS.get(key)
        if study is None:
            continue
        for inst in entry["seeds"] if isinstance(entry.get("seeds"), list) else [entry]:
            study.attach(inst, runs_dir)


def base_models_markdown(spec: Mapping[str, Any], profile: str) -> str:
    """base_models.md: each base model's size and greedy held-out accuracy per set, read from its ``done.json``
    (pretraining is not post-training compute, so these are the starting points, not results of a study)."""
    lines = [f"# Base models (profile `{profile}`)", "",
             "Held-out accuracy of each base model after pretraining (the evaluation its `done.json` records). "
             "Pretraining FLOPs are not counted as post-training compute.", ""]
    table: list[tuple[str, int, dict[str, float]]] = []
    for label, out_dir in (spec.get("base_models") or {}).items():
        done = Path(out_dir) / "done.json"
        if not done.is_file():
            continue
        d = json.loads(done.read_text(encoding="utf-8"))
        accs = {f"{r['eval_domain']}/{r['eval_set']}": float(r["accuracy"]) for r in d.get("heldout", [])}
        table.append((label, int(d.get("parameters", 0)), accs))
    if not table:
        return "\n".join(lines + ["No base model has finished.", ""])
    sets = sorted({k for _, _, accs in table for k in accs})
    lines += ["| model | parameters | " + " | ".join(sets) + " |", "|---|---|" + "---|" * len(sets)]
    for label, params, accs in table:
        cells = " | ".join(format_pct(accs[k]) if k in accs else "n/a" for k in sets)
        lines.append(f"| {label} | {params / 1e6:.2f} M | {cells} |")
    return "\n".join(lines + [""])


def build_report(spec_path: Path, runs_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Write every report file; return ``{"written": [paths], "notes": [str], "savings": [rows]}``.

    Raises :class:`ReportInputError` (naming the file, run or key) when an input is missing or malformed.
    """
    stage = Stages(f"report-{Path(out_dir).parent.name}")
    spec = load_spec(spec_path)
    validate_spec_runs(spec)
    keys, notes = known_studies(spec)
    check_study_runs(spec, keys)
    runs_dir, out_dir = Path(runs_dir), Path(out_dir)
    attach_run_info(spec, runs_dir)
    curves = load_curves(spec, runs_dir)
    final_flops = load_final_flops(runs_dir, [e["run"] for e in spec["runs"]])
    rows = consolidation_rows(spec, curves, final_flops)
    profile = str(spec["profile"])
    stage("curves", runs=len(spec["runs"]), points=len(curves))

    conditions = condition_rows(spec, curves, runs_dir)
    claims, claims_detail = claims_pages(spec, curves, rows, conditions)
    stage("claims", savings_rows=len(rows))
    figures = draw_figures(spec, keys, curves, rows, notes, final_flops)  # all drawn before anything is written
    stage("figures", figures=len(figures))
    tables = study_tables(spec, keys, curves, final_flops)

    written: list[Path] = []
    written.append(_atomic(out_dir / "curves.csv", lambda tmp: curves.to_csv(tmp, index=False)))
    table = pd.DataFrame(rows, columns=SAVINGS_COLUMNS)
    written.append(_atomic(out_dir / "savings.csv", lambda tmp: table.to_csv(tmp, index=False)))
    written.append(write_text(out_dir / "savings.md",
                              savings_markdown(rows, profile, study_conditions(spec, conditions))))
    written.append(write_text(out_dir / "claims.md", claims))
    written.append(write_text(out_dir / "claims_detail.md", claims_detail))
    written.append(write_text(out_dir / "base_models.md", base_models_markdown(spec, profile)))
    written.append(write_text(out_dir / "constraints.md", constraints_markdown(spec, runs_dir)))
    written.append(write_text(out_dir / "conditions.md", conditions_markdown(spec, curves, runs_dir, conditions)))
    written.append(write_text(out_dir / "mfu.md", mfu_markdown(spec, runs_dir, profile)))
    for stem, fig in figures.items():
        written.extend(save_figure(fig, out_dir, stem))
    for stem, (frame, text) in tables.items():
        written.append(_atomic(out_dir / f"{stem}.csv", lambda tmp, f=frame: f.to_csv(tmp, index=False)))
        written.append(write_text(out_dir / f"{stem}.md", text))
    stage("written", files=len(written), out=str(out_dir))
    return {"written": written, "notes": notes, "savings": rows}


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry of ``opdgrpo report --spec SPEC.json --runs RUNS_DIR --out OUT_DIR``; prints the written paths."""
    p = argparse.ArgumentParser(prog="opdgrpo report", description="Write the report from run directories.")
    p.add_argument("--spec", type=Path, required=True, help="report spec (JSON) written by the planner")
    p.add_argument("--runs", type=Path, required=True, help="directory holding one directory per run")
    p.add_argument("--out", type=Path, required=True, help="report directory to write")
    args = p.parse_args(argv)
    try:
        result = build_report(args.spec, args.runs, args.out)
    except ReportInputError as exc:
        print(f"opdgrpo report: error: {exc}", file=sys.stderr)
        return 2
    for note in result["notes"]:
        print(f"opdgrpo report: note: {note}", file=sys.stderr)
    for path in result["written"]:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
