"""Load evaluation curves from run directories into one long-form table.

The report reads only run directories (the files a run leaves, listed in the README): each run's ``evals.jsonl`` holds
one JSON object per evaluation point. This module turns those files into ``curves.csv``'s long form, one row per
run x study x evaluation point x held-out set, and provides the two aggregations every later stage needs:
a domain's accuracy (mean of its held-out sets) and a mix's accuracy (mean of its domains).

Errors name the file (and line) because a report that silently drops a run would hide exactly the comparison the
paper is about. The one tolerated defect is a truncated last line, which is what a job killed mid-write leaves.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from opdgrpo.plan.studies import REGISTRY
from opdgrpo.runio import IN_DOMAIN_SET, history_changes, iter_jsonl

#: The column order of ``curves.csv``, which users read and the README lists: part of its contract.
CURVE_COLUMNS: list[str] = [
    "run",
    "study",
    "method",
    "train_domains",
    "seed",
    "step",
    "cumulative_flops",
    "eval_domain",
    "eval_set",
    "accuracy",
    "mean_response_length",
]

#: Columns that identify one evaluation point of one run within one study.
POINT_KEYS: list[str] = ["run", "study", "method", "train_domains", "seed", "step", "cumulative_flops"]

_RUN_KEYS = ("run", "studies", "method", "train_domains", "seed")
_EVAL_KEYS = ("step", "cumulative_flops", "results")
_RESULT_KEYS = ("eval_domain", "eval_set", "accuracy", "mean_response_length")


class ReportInputError(ValueError):
    """An input of the report (spec, run directory, curves table) is missing or malformed."""


class ReportWarning(UserWarning):
    """A tolerated defect in a report input (e.g. a truncated last line)."""


# ----------------------------------------------------------------------------------------------------------- reading
def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line_number, object)`` pairs of a run file (:func:`opdgrpo.runio.iter_jsonl`), its defects as
    :class:`ReportInputError` naming ``path:line``; a truncated last line is skipped with a :class:`ReportWarning`
    so an otherwise complete run still reports."""
    try:
        return list(iter_jsonl(Path(path), warning=ReportWarning))
    except (OSError, ValueError) as err:
        raise ReportInputError(str(err)) from err


def _number(value: Any, where: str, key: str, *, lo: float | None = None, hi: float | None = None) -> float:
    """Coerce a JSON value to a finite float in [lo, hi], or raise naming the place and key."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReportInputError(f"{where}: key '{key}' must be a number, got {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise ReportInputError(f"{where}: key '{key}' is not finite ({value!r})")
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        raise ReportInputError(f"{where}: key '{key}' = {value!r} outside [{lo}, {hi}]")
    return x


def read_evals(path: Path) -> list[dict[str, Any]]:
    """Read and validate one run's ``evals.jsonl`` into flat per-set records sorted by step.

    Why validate here: every number downstream (savings, claims) interpolates on these values, so a missing key or
    a percentage where a fraction belongs must fail loudly at the file and line that caused it. A step evaluated
    twice (a resumed job) keeps its last record, with a warning.
    """
    path = Path(path)
    by_step: dict[int, list[dict[str, Any]]] = {}
    for lineno, obj in read_jsonl(path):
        where = f"{path}:{lineno}"
        for key in _EVAL_KEYS:
            if key not in obj:
                raise ReportInputError(f"{where}: missing key '{key}'")
        step_f = _number(obj["step"], where, "step", lo=0)
        if step_f != int(step_f):
            raise ReportInputError(f"{where}: key 'step' must be an integer, got {obj['step']!r}")
        step = int(step_f)
        flops = _number(obj["cumulative_flops"], where, "cumulative_flops", lo=0)
        results = obj["results"]
        if not isinstance(results, list) or not results:
            raise ReportInputError(f"{where}: key 'results' must be a non-empty list")
        rows = []
        for j, res in enumerate(results):
            rwhere = f"{where}: results[{j}]"
            if not isinstance(res, dict):
                raise ReportInputError(f"{rwhere}: expected an object")
            for key in _RESULT_KEYS:
                if key not in res:
                    raise ReportInputError(f"{rwhere}: missing key '{key}'")
            rows.append(
                {
                    "step": step,
                    "cumulative_flops": flops,
                    "eval_domain": str(res["eval_domain"]),
                    "eval_set": str(res["eval_set"]),
                    "accuracy": _number(res["accuracy"], rwhere, "accuracy", lo=0.0, hi=1.0),
                    "mean_response_length": _number(res["mean_response_length"], rwhere, "mean_response_length", lo=0),
                }
            )
        if step in by_step:
            warnings.warn(f"{where}: step {step} evaluated again; keeping the later record", ReportWarning, stacklevel=2)
        by_step[step] = rows
    if not by_step:
        raise ReportInputError(f"{path}: no evaluation points")
    out: list[dict[str, Any]] = []
    prev: tuple[int, float] | None = None
    for step in sorted(by_step):
        flops = by_step[step][0]["cumulative_flops"]
        if prev is not None and flops < prev[1]:
            raise ReportInputError(
                f"{path}: cumulative_flops decreases from step {prev[0]} ({prev[1]:.6g}) to step {step} ({flops:.6g})"
            )
        prev = (step, flops)
        out.extend(by_step[step])
    return out


def _join_domains(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "+".join(str(v) for v in value)


def validate_spec_runs(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the spec's run entries after checking each has the keys the curves table needs (errors name them)."""
    runs = spec.get("runs")
    if not isinstance(runs, list):
        raise ReportInputError("report spec: key 'runs' must be a list")
    seen: set[str] = set()
    for i, entry in enumerate(runs):
        if not isinstance(entry, dict):
            raise ReportInputError(f"report spec: runs[{i}] must be an object")
        for key in _RUN_KEYS:
            if key not in entry:
                name = entry.get("run", f"runs[{i}]")
                raise ReportInputError(f"report spec: run '{name}' is missing key '{key}'")
        if entry["run"] in seen:
            raise ReportInputError(f"report spec: run '{entry['run']}' is listed twice")
        seen.add(entry["run"])
    return runs


def load_curves(spec: dict[str, Any], runs_dir: Path) -> pd.DataFrame:
    """Build the long-form curves table for every run of the report spec.

    One row per run x study x evaluation point x held-out set, columns exactly :data:`CURVE_COLUMNS`; a run in
    several studies appears once per study so each study's slice is a plain filter. A run listed with no studies
    appears once with an empty study. ``train_domains`` is joined by ``"+"``. Rows keep the spec's run order, then
    the run's study order, then step.
    """
    runs_dir = Path(runs_dir)
    frames: list[pd.DataFrame] = []
    for entry in validate_spec_runs(spec):
        run = str(entry["run"])
        run_dir = runs_dir / run
        if not run_dir.is_dir():
            raise ReportInputError(f"{run_dir}: run directory of run '{run}' not found")
        changed = history_changes(run_dir)
        if changed:
            raise ReportInputError(f"run '{run}': {'; '.join(changed)}: its history is not what the run wrote; redo "
                                   f"the run with `snakemake --forcerun {run_dir / 'done.json'}`")
        records = read_evals(run_dir / "evals.jsonl")
        first = min(r["step"] for r in records)
        if first != 0:   # every gain, match and savings figure is read from the curve's start
            raise ReportInputError(
                f"{run_dir / 'evals.jsonl'}: run '{run}' has no step-0 evaluation (its first is at step {first}): its "
                f"history is incomplete; redo the run with `snakemake --forcerun {run_dir / 'done.json'}`")
        base = pd.DataFrame.from_records(records)
        studies = list(entry["studies"]) or [""]
        for study in studies:
            frame = base.copy()
            frame.insert(0, "run", run)
            frame.insert(1, "study", str(study))
            frame.insert(2, "method", str(entry["method"]))
            frame.insert(3, "train_domains", _join_domains(entry["train_domains"]))
            frame.insert(4, "seed", entry["seed"])
            frames.append(frame)
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in CURVE_COLUMNS})
    df = pd.concat(frames, ignore_index=True)
    df["step"] = df["step"].astype("int64")
    return df[CURVE_COLUMNS]


def load_final_flops(runs_dir: Path, runs: Iterable[str]) -> dict[str, float]:
    """Final cumulative training FLOPs per run: ``done.json``, else the ledger's last step, else omitted.

    Why not the last evaluation point: a run need not evaluate at its last step, and the savings contract charges an
    expert's *final* training FLOPs. Runs with neither file are left out so callers fall back to the curves.
    """
    out: dict[str, float] = {}
    for run in runs:
        run_dir = Path(runs_dir) / run
        done = run_dir / "done.json"
        if done.is_file():
            try:
                value = json.loads(done.read_text(encoding="utf-8")).get("cumulative_flops")
            except (json.JSONDecodeError, AttributeError) as exc:
                raise ReportInputError(f"{done}: malformed JSON ({exc})") from exc
            if value is not None:
                out[run] = _number(value, str(done), "cumulative_flops", lo=0)
                continue
        ledger = run_dir / "ledger.jsonl"
        if ledger.is_file():
            records = read_jsonl(ledger)
            if records:
                lineno, last = max(records, key=lambda r: r[1].get("step", -1))
                if "cumulative_flops" in last:
                    out[run] = _number(last["cumulative_flops"], f"{ledger}:{lineno}", "cumulative_flops", lo=0)
    return out


# ------------------------------------------------------------------------------------------------------ aggregation
def run_curve(curves: pd.DataFrame, run: str) -> pd.DataFrame:
    """Rows of one run, once (a run listed under several studies is deduplicated); raises if the run is absent."""
    rows = curves[curves["run"] == run]
    if rows.empty:
        raise ReportInputError(f"run '{run}' not found in the curves table")
    if "study" not in rows.columns:
        return rows
    first_study = rows["study"].iloc[0]
    return rows[rows["study"] == first_study]


def domain_accuracy(df: pd.DataFrame) -> pd.DataFrame:
    """A domain's accuracy (and mean response length) = mean over its held-out sets, per evaluation point.

    The ``in_domain`` set (an S2 run's own training prompts) is left out: it is not held out.

    Why a plain mean over sets: the paper reports math as the mean of its benchmarks, so AIME and AMC weigh
    equally, whatever their sizes. Returns :data:`POINT_KEYS` + ``eval_domain, accuracy, mean_response_length``, sorted by step.
    """
    keys = [k for k in POINT_KEYS if k in df.columns] + ["eval_domain"]
    if "eval_set" in df.columns:  # a subset run's scores on its own training prompts are not held-out accuracy
        df = df[df["eval_set"] != IN_DOMAIN_SET]
    out = (
        df.groupby(keys, dropna=False, sort=False)[["accuracy", "mean_response_length"]]
        .mean()
        .reset_index()
    )
    return out.sort_values(["run", "study", "step", "eval_domain"], kind="stable").reset_index(drop=True)


def mix_accuracy(df: pd.DataFrame, domains: Sequence[str]) -> pd.DataFrame:
    """A mix's accuracy = mean over the listed domains' accuracies, per evaluation point.

    ``df`` may be per-set (curves) or per-domain (:func:`domain_accuracy`). A listed domain that a run never
    evaluates raises (almost surely a misspelt domain); a domain missing at only some evaluation points makes those
    points' mix accuracy NaN, so they can never count as reaching a target. Returns :data:`POINT_KEYS` + ``accuracy,
    mean_response_length`` sorted by run, study, step.
    """
    domains = list(domains)
    if not domains:
        raise ReportInputError("mix_accuracy: no domains given")
    dom = domain_accuracy(df) if "eval_set" in df.columns else df
    keys = [k for k in POINT_KEYS if k in dom.columns]
    for run, rows in dom.groupby("run", sort=False):
        missing = sorted(set(domains) - set(rows["eval_domain"]))
        if missing:
            raise ReportInputError(f"run '{run}' has no evaluation on domain(s) {missing}")
    sub = dom[dom["eval_domain"].isin(domains)]
    # groupby + unstack (not pivot_table(dropna=False), which would build the cartesian product of the keys)
    grouped = sub.groupby(keys + ["eval_domain"], dropna=False, sort=False)[["accuracy", "mean_response_length"]].mean()
    wide_acc = grouped["accuracy"].unstack("eval_domain").reindex(columns=domains)
    wide_len = grouped["mean_response_length"].unstack("eval_domain").reindex(columns=domains)
    out = pd.DataFrame(
        {
            "accuracy": wide_acc.mean(axis=1, skipna=False),
            "mean_response_length": wide_len.mean(axis=1, skipna=False),
        }
    ).reset_index()
    return out.sort_values(["run", "study", "step"], kind="stable").reset_index(drop=True)


def domain_curve(curves: pd.DataFrame, run: str, domain: str) -> pd.DataFrame:
    """One run's accuracy on one domain (mean of its held-out sets) by step: what the claim tests compare.

    Raises :class:`ReportInputError` naming the run and domain when the run never evaluates that domain.
    """
    dom = domain_accuracy(run_curve(curves, run))
    dom = dom[dom["eval_domain"] == domain].sort_values("step", kind="stable")
    if dom.empty:
        raise ReportInputError(f"run '{run}' has no evaluation on domain '{domain}'")
    return dom


# ------------------------------------------------------------------------------------------------------------ units
_FLOP_UNITS: list[tuple[float, str]] = [
    (1e18, "EFLOP"),
    (1e15, "PFLOP"),
    (1e12, "TFLOP"),
    (1e9, "GFLOP"),
    (1e6, "MFLOP"),
    (1e3, "kFLOP"),
    (1.0, "FLOP"),
]


def flop_unit(max_flops: float) -> tuple[float, str]:
    """The largest SI unit in which ``max_flops`` is >= 1 (so tiny runs read "3.2 TFLOP", not "3.2e-6 EFLOP")."""
    for scale, name in _FLOP_UNITS:
        if max_flops >= scale:
            return scale, name
    return 1.0, "FLOP"


def format_flops(flops: float | None, digits: int = 3) -> str:
    """A FLOP count with its own SI unit, e.g. ``1.23 PFLOP``; ``n/a`` for None."""
    if flops is None or (isinstance(flops, float) and math.isnan(flops)):
        return "n/a"
    scale, name = flop_unit(abs(flops))
    return f"{flops / scale:.{digits}g} {name}"


def format_pct(fraction: float | None) -> str:
    """An accuracy fraction as a percentage with one decimal, e.g. ``41.0%``."""
    if fraction is None or (isinstance(fraction, float) and math.isnan(fraction)):
        return "n/a"
    return f"{100.0 * fraction:.1f}%"


# ------------------------------------------------------------------------------------------------- study entries
def study_instances(study: Any) -> list[dict[str, Any]]:
    """A study entry as a list of per-seed entries.

    The planner writes one entry per study, or ``{"title", "seeds": [entry, ...]}`` when it plans several seeds;
    every consumer iterates over this list so both shapes work.
    """
    if isinstance(study, dict) and isinstance(study.get("seeds"), list):
        return [dict(s, title=s.get("title", study.get("title", ""))) for s in study["seeds"]]
    return [study]


def instance_seed(spec: dict[str, Any], instance: dict[str, Any]) -> Any:
    """The seed of a per-seed study entry: the spec's seed of the first run it trained, i.e. of the first value under
    one of the studies' run keys (S2's ``ranking`` names other seeds' runs too). None if none is listed."""
    seeds = {e["run"]: e.get("seed") for e in spec.get("runs", [])}
    return next((seeds[run] for run in referenced_runs(instance) if run in seeds), None)


#: Keys of a study entry whose (nested) string values are run ids: those of every registered study.
_RUN_REF_KEYS: frozenset[str] = frozenset().union(*(study.run_keys for study in REGISTRY.values()))


def referenced_runs(study: Any) -> list[str]:
    """Run ids a study entry refers to: string values under the keys any registered study names runs under
    (:attr:`~opdgrpo.plan.studies.base.Study.run_keys`), in entry order, each once."""
    found: list[str] = []

    def collect(value: Any) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, Mapping):
            for v in value.values():
                collect(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                collect(v)

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                if k in _RUN_REF_KEYS:
                    collect(v)
                else:
                    walk(v)
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v)

    walk(study)
    return list(dict.fromkeys(found))


def set_accuracy(curves: pd.DataFrame, run: str, domains: Sequence[str], flops: float) -> dict[str, dict[str, float]]:
    """``{domain: {set: accuracy}}`` of a run's evaluation point at ``flops`` (its best smoothed point): the sets'
    own accuracies, for the binomial variance of each (:func:`opdgrpo.report.matching.mix_se`)."""
    rows = run_curve(curves, run)
    rows = rows[(rows["cumulative_flops"] == flops) & rows["eval_domain"].isin(list(domains))]
    out: dict[str, dict[str, float]] = {}
    for (domain, name), acc in rows.groupby(["eval_domain", "eval_set"])["accuracy"].mean().items():
        out.setdefault(str(domain), {})[str(name)] = float(acc)
    return out
