"""The report's half of S6 (the study and its grid: :mod:`opdgrpo.plan.studies.s6`): every cell read with S4's matching
rule and savings and S5b's collapse rule, over seeds, as ``S6_map.md/.csv`` and the ``S6_map`` heat maps."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opdgrpo.plan.studies.s6 import S6Entry
from opdgrpo.report.curves import domain_curve
from opdgrpo.report.matching import eval_sizes
from opdgrpo.report.savings import finite_figures, format_savings, sign_over_seeds
from opdgrpo.report.uncertainty import FAILS, HOLDS, interval_verdict, mean_interval

from .base import StudyReport
from .consolidation import matched_savings

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from opdgrpo.report.plots import PlotContext

#: The collapse rule of S5b: a domain collapses when its final accuracy is below this share of step 0's.
COLLAPSE_SHARE = 0.5


class S6Report(StudyReport[S6Entry]):
    name = "S6"

    def attach(self, entry: S6Entry, runs_dir: Path) -> None:
        """Each cell's joint run's held-out sizes (the standard error of its savings target)."""
        for cell in entry["cells"]:
            cell["eval_sizes"] = eval_sizes(Path(runs_dir) / cell["joint"])

    def tables(self, instances: Sequence[S6Entry], curves: pd.DataFrame,
               final_flops: Mapping[str, float]) -> dict[str, tuple[pd.DataFrame, str]]:
        """``S6_map.csv/.md``: one row per cell."""
        frame = map_frame(instances, curves, final_flops)
        return {"map": (frame, map_markdown(frame, instances[0]))}

    def figures(self, entry: S6Entry, ctx: PlotContext) -> dict[str, Figure]:
        """``S6_map``: the savings and the collapse heat maps."""
        instances = list(ctx.instances) or [entry]
        return {f"{self.name}_map": map_figure(map_frame(instances, ctx.curves, ctx.final_flops), instances[0])}


# ---------------------------------------------------------------------------------------------------- the map data
def _collapse(margins: Sequence[float]) -> str:
    """A domain's collapse over seeds from margins final - half of step 0: ``collapsed`` when the interval lies below
    0 (one seed: the margin), ``no`` above, ``inconclusive`` when it spans 0."""
    if len(margins) == 1:
        return "no" if margins[0] >= 0 else "collapsed"
    _, lo, hi = mean_interval(margins)
    return {HOLDS: "no", FAILS: "collapsed"}.get(interval_verdict(lo, hi, strict=False), "inconclusive")


def _savings_cells(entry: S6Entry, index: int, curves: pd.DataFrame, final_flops: Mapping[str, float],
                   budget: int | None = None) -> dict[str, Any]:
    """One seed's savings result of cell ``index`` (S4's matching rule and savings), its distillation's curve cut
    at ``budget`` steps (None: the whole run)."""
    cell = entry["cells"][index]
    if budget is not None:
        curves = curves[(curves["run"] != cell["distill"]) | (curves["step"] <= budget)]
    sub = {k: entry[k] for k in ("tolerance", "smooth_window", "tolerance_se", "min_joint_gain_se") if k in entry}  # type: ignore[literal-required]
    sub.update(domains=entry["domains"], joint=cell["joint"], distill=cell["distill"], experts=cell["experts"],
               eval_sizes=cell.get("eval_sizes"))
    return matched_savings("S6", sub, curves, final_flops)[2]


def _stats(prefix: str, values: Sequence[float]) -> dict[str, float]:
    """``{prefix, prefix_lo, prefix_hi}``: the mean and its 95% t interval over seeds (NaN when none)."""
    mean, lo, hi = mean_interval(values) if values else (math.nan,) * 3
    return {prefix: mean, f"{prefix}_lo": lo, f"{prefix}_hi": hi}


def _collapse_columns(instances: Sequence[S6Entry], index: int, curves: pd.DataFrame) -> dict[str, Any]:
    """Per collapse domain: step-0 (the base student) and final accuracy of the external-teacher run, with intervals,
    and its collapse verdict; the mean retention final / step 0 over the domains; the collapsed domains."""
    row: dict[str, Any] = {}
    retention: list[list[float]] = [[] for _ in instances]
    collapsed, unsure = [], []
    for d in instances[0]["collapse_domains"]:
        first, last = [], []
        for i, inst in enumerate(instances):
            acc = domain_curve(curves, inst["cells"][index]["external"], d)["accuracy"]
            first.append(float(acc.iloc[0]))
            last.append(float(acc.iloc[-1]))
            if first[-1] > 0:   # a domain at 0% from the start has nothing to collapse
                retention[i].append(last[-1] / first[-1])
        verdict = _collapse([b - COLLAPSE_SHARE * a for a, b in zip(first, last)])
        row.update({**_stats(f"{d}_base", first), **_stats(f"{d}_final", last), f"{d}_collapse": verdict})
        (collapsed if verdict == "collapsed" else unsure if verdict == "inconclusive" else []).append(d)
    row.update(_stats("retention", [sum(r) / len(r) for r in retention if r]))
    row["collapse"] = "+".join(collapsed) or ("inconclusive: " + "+".join(unsure) if unsure else "none")
    return row


def budgets_of(entry: S6Entry) -> list[int | None]:
    """The distillation budgets of a spec entry; [None] (the whole run) for a spec written before they existed."""
    return list(entry.get("distill_budgets") or [None])


def map_frame(instances: Sequence[S6Entry], curves: pd.DataFrame,
              final_flops: Mapping[str, float]) -> pd.DataFrame:
    """One row per cell and distillation budget: savings over seeds (mean and 95% t interval of the seeds with a
    finite figure, how many had one, every seed's reading, the sign by
    :func:`~opdgrpo.report.savings.sign_over_seeds`) and the collapse columns (:func:`_collapse_columns`, the same
    for every budget of a cell)."""
    import pandas as pd


    budgets = budgets_of(instances[0])
    rows = []
    for index, cell in enumerate(instances[0]["cells"]):
        collapse = _collapse_columns(instances, index, curves)
        for budget in budgets:
            cut = None if budget == budgets[-1] else budget
            results = [_savings_cells(inst, index, curves, final_flops, cut) for inst in instances]
            readings = [(r.get("savings"), r.get("savings_bound", "")) for r in results]
            figures = finite_figures(readings)
            shares = [float(r["distill_share"]) for r in results if r.get("distill_share") is not None]
            rows.append({
                "interference": cell["interference"], "thinking_fraction": cell["thinking_fraction"],
                "distill_steps": budget, "seeds": len(instances), **_stats("savings", figures),
                "matched": f"{len(figures)}/{len(instances)}",
                "readings": ", ".join(format_savings(v, bound) for v, bound in readings),
                "savings_sign": sign_over_seeds(readings), **_stats("distill_share", shares), **collapse,
            })
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------ table and figure
def _pct(mean: float, lo: float, hi: float, signed: bool = False, sep: str = " ") -> str:
    """``+12.3% [-4.0, +28.6]``; ``n/a`` for NaN; no interval when it has zero width (one seed). Whole percents
    beyond +-100% (a pipeline that costs 100x joint GRPO reads -9900%; decimals would only crowd a map cell)."""
    if mean != mean:
        return "n/a"
    fmt = ("+" if signed else "") + (".0f" if max(abs(mean), abs(lo), abs(hi)) >= 1 else ".1f")
    text = f"{100 * mean:{fmt}}%"
    return text if lo == hi else f"{text}{sep}[{100 * lo:{fmt}}, {100 * hi:{fmt}}]"


def map_markdown(frame: pd.DataFrame, entry: S6Entry) -> str:
    """S6_map.md: the map as a table, one row per cell and distillation budget, with how each column is read."""
    domains = list(entry["collapse_domains"])
    seeds = int(frame["seeds"].iloc[0]) if len(frame) else 0
    lines = [
        f"# S6: where the claims flip ({seeds} seed{'s' if seeds != 1 else ''} per cell)", "",
        f"Savings: S4's matched-FLOP savings of experts + multi-teacher OPD against joint GRPO on "
        f"{' + '.join(entry['domains'])} (savings.md's rule: a figure or a bound per seed), mean over the seeds with a "
        "finite figure with a 95% t interval (matched: how many had one; readings: every seed's); sign: with a figure "
        "for every seed, positive / negative when the interval excludes 0, else positive / negative when every "
        "seed's figure or bound says so, inconclusive otherwise. Collapse: OPD from the external teacher on "
        f"{' + '.join(entry['external_domains'])}; step 0 is the base student, a domain collapses when its final "
        f"accuracy is below {COLLAPSE_SHARE:g} x step 0's (the 95% t interval of final - {COLLAPSE_SHARE:g} x step 0 "
        "below 0); retention = final / step 0, mean over the domains. Distill steps: the distillation's budget, its "
        "curve read up to that step (the same for every budget of a cell: the collapse columns)."
        + (" One seed: no intervals, indicative only." if seeds == 1 else ""), "",
        "| interference | thinking fraction | distill steps | savings | matched | readings | sign | distill share | "
        + " | ".join(f"{d}: step 0 -> final" for d in domains) + " | retention | collapse |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(domains) + "---|---|",
    ]
    for _, r in frame.iterrows():
        accs = [f"{_pct(r[f'{d}_base'], r[f'{d}_base_lo'], r[f'{d}_base_hi'])} -> "
                f"{_pct(r[f'{d}_final'], r[f'{d}_final_lo'], r[f'{d}_final_hi'])}" for d in domains]
        retention = "n/a" if r["retention"] != r["retention"] else (
            f"{r['retention']:.2f}" + ("" if r["retention_lo"] == r["retention_hi"]
                                       else f" [{r['retention_lo']:.2f}, {r['retention_hi']:.2f}]"))
        lines.append(f"| {r['interference']:g} | {r['thinking_fraction']:g} | {_steps(r['distill_steps'])} | "
                     f"{_pct(r['savings'], r['savings_lo'], r['savings_hi'], signed=True)} | {r['matched']} | {r['readings']} | "
                     f"{r['savings_sign']} | {_pct(r['distill_share'], r['distill_share_lo'], r['distill_share_hi'])} | "
                     + " | ".join(accs) + f" | {retention} | {r['collapse']} |")
    return "\n".join(lines + [""])


def _steps(budget: Any) -> str:
    """A budget cell: its steps, or "all" for a spec without budgets (the whole run)."""
    return "all" if budget is None or budget != budget else f"{int(budget)}"


def _grid(frame: pd.DataFrame, column: str, xs: Sequence[float], ys: Sequence[float]) -> list[list[Any]]:
    """``column`` as a grid: rows = thinking fraction (``ys`` order), columns = interference (``xs`` order)."""
    cells = {(float(r["thinking_fraction"]), float(r["interference"])): r[column] for _, r in frame.iterrows()}
    return [[cells[(y, x)] for x in xs] for y in ys]


def _heatmap(ax: Any, values: list[list[float]], labels: list[list[str]], xs: Sequence[float], ys: Sequence[float],
             cmap: str, limits: tuple[float, float]) -> Any:
    """One annotated heat map (NaN cells grey) on ``ax``; returns the image for a colour bar."""
    import numpy as np
    from matplotlib import colormaps

    data = np.ma.masked_invalid(np.asarray(values, dtype=float))
    colors = colormaps[cmap].with_extremes(bad="#d9d9d9")
    image = ax.imshow(data, cmap=colors, vmin=limits[0], vmax=limits[1], aspect="auto")
    for i, row in enumerate(labels):
        for j, text in enumerate(row):
            ax.text(j, i, text, ha="center", va="center", fontsize=7.5,
                    bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.7, "linewidth": 0})
    ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
    ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys])
    ax.set_xlabel("domain interference (share of shared-form prompts)")
    ax.set_ylabel("student's thinking fraction (1 = fluent in the teachers' style)")
    return image


def _sign_edges(ax: Any, signs: list[list[str]]) -> None:
    """Thick lines between neighbouring cells whose savings have opposite signs: where the savings flip."""
    for i, row in enumerate(signs):
        for j, sign in enumerate(row):
            if j + 1 < len(row) and {sign, row[j + 1]} == {"positive", "negative"}:
                ax.plot([j + 0.5, j + 0.5], [i - 0.5, i + 0.5], color="black", linewidth=3.5)
            if i + 1 < len(signs) and {sign, signs[i + 1][j]} == {"positive", "negative"}:
                ax.plot([j - 0.5, j + 0.5], [i + 0.5, i + 0.5], color="black", linewidth=3.5)


def map_figure(frame: pd.DataFrame, entry: S6Entry) -> Figure:
    """Heat maps over the grid: savings at each distillation budget (sign flips outlined) and retention of the
    external-teacher OPD (collapsed cells boxed in red, inconclusive ones dashed), each cell annotated with its value
    and interval."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    xs, ys = list(entry["interference"]), sorted(entry["thinking_fraction"], reverse=True)
    budgets = budgets_of(entry)
    fig = Figure(figsize=(6.2 * (len(budgets) + 1), 1.35 * len(ys) + 2.6), layout="constrained")
    FigureCanvasAgg(fig)
    *lefts, right = fig.subplots(1, len(budgets) + 1)
    for left, budget in zip(lefts, budgets):
        at = frame[frame["distill_steps"].isna()] if budget is None else frame[frame["distill_steps"] == budget]
        _savings_map(fig, left, at, entry, budget, xs, ys)
    frame = frame.drop_duplicates(["interference", "thinking_fraction"])   # collapse: the same at every budget
    ret_labels = [[_retention_label(r, entry["collapse_domains"]) for r in row] for row in _rows(frame, xs, ys)]
    image = _heatmap(right, _grid(frame, "retention", xs, ys), ret_labels, xs, ys, "viridis", (0.0, 1.5))
    fig.colorbar(image, ax=right, label="retention: final / step-0 accuracy")
    for i, row in enumerate(_rows(frame, xs, ys)):
        for j, r in enumerate(row):
            if r["collapse"] != "none":
                unsure = r["collapse"].startswith("inconclusive")
                right.add_patch(Rectangle((j - 0.47, i - 0.47), 0.94, 0.94, fill=False, edgecolor="#d62728",
                                          linewidth=3, linestyle="--" if unsure else "-"))
    right.set_title(f"S5b collapse, OPD from {entry['teacher_model']} on {' + '.join(entry['external_domains'])}\n"
                    f"(read on {' + '.join(entry['collapse_domains'])}; red box: collapse, dashed: inconclusive)",
                    fontsize=10)
    fig.suptitle(f"S6: {entry.get('title', 'sensitivity map')}", fontsize=12)
    return fig


def _savings_label(row: pd.Series) -> str:
    """A cell's mean and interval, or, with no mean, every seed's reading one per line (three bounds fit its width)."""
    marks = {"positive": "+", "negative": "-", "inconclusive": "?"}
    value = _pct(row["savings"], row["savings_lo"], row["savings_hi"], True, sep="\n")
    value = value.replace("n/a", row["readings"].replace(", ", "\n"))
    return f"{value}\n{marks[row['savings_sign']]} ({row['matched']} figures)"


def _savings_map(fig: Figure, ax: Any, frame: pd.DataFrame, entry: S6Entry, budget: int | None,
                 xs: Sequence[float], ys: Sequence[float]) -> None:
    """One savings heat map (the rows of one distillation budget), sign flips outlined."""
    labels = [[_savings_label(r) for r in row] for row in _rows(frame, xs, ys)]
    image = _heatmap(ax, _percent(_grid(frame, "savings", xs, ys)), labels, xs, ys, "RdBu", (-100, 100))
    fig.colorbar(image, ax=ax, label="savings vs joint GRPO (%)")
    _sign_edges(ax, _grid(frame, "savings_sign", xs, ys))
    steps = "" if budget is None else f", distillation {budget} steps"
    ax.set_title(f"S4 savings, {' + '.join(entry['domains'])}{steps}\n(+/-: sign by 95% interval; thick line: sign "
                 "flips)", fontsize=10)


def _rows(frame: pd.DataFrame, xs: Sequence[float], ys: Sequence[float]) -> list[list[Any]]:
    """The frame's rows as a grid (thinking fraction x interference)."""
    by = {(float(r["thinking_fraction"]), float(r["interference"])): r for _, r in frame.iterrows()}
    return [[by[(y, x)] for x in xs] for y in ys]


def _percent(grid: list[list[float]]) -> list[list[float]]:
    return [[100 * float(v) for v in row] for row in grid]


def _retention_label(r: Any, domains: Sequence[str]) -> str:
    """A collapse cell's text: retention with its interval, then each domain's step 0 -> final."""
    head = "n/a" if r["retention"] != r["retention"] else f"{r['retention']:.2f}" + (
        "" if r["retention_lo"] == r["retention_hi"] else f" [{r['retention_lo']:.2f}, {r['retention_hi']:.2f}]")
    parts = [f"{d} {100 * r[f'{d}_base']:.0f}->{100 * r[f'{d}_final']:.0f}%" for d in domains]
    return "\n".join([head, *parts])


REPORT = S6Report()
