"""Accuracy-vs-training-FLOPs figures and response-length-vs-FLOPs figures, one of each per study.

The paper's argument is made on accuracy-vs-FLOPs curves, so every figure uses cumulative *training* FLOPs on a
log x axis (evaluation FLOPs are never counted), one line per method/run label, a marker at every evaluation point.

x axis unit: the largest SI unit (EFLOP, PFLOP, TFLOP, GFLOP, ...) in which the figure's largest FLOP count is >= 1,
so the tiny profile reads "TFLOP" instead of "1e-6 EFLOP".

Step 0 on a log axis (our choice): every run starts at 0 training FLOPs, which a log axis cannot show and symlog would
distort around its linear region. We draw 0 at a stand-in position one whole decade below the decade of the smallest
nonzero FLOP count in the figure, label that tick "0", and draw a dotted vertical "axis break" between it and the
first real decade; every figure's caption says so. Distances left of the break mean nothing.

Figures are built on :class:`matplotlib.figure.Figure` with the Agg canvas (no pyplot global state), and returned
to the caller, which saves them (PNG and PDF) atomically. Each study draws its own figures from these primitives
(:meth:`opdgrpo.plan.studies.base.Study.figures`); :func:`plot_lengths` is the length figure of a study that draws none.
With several seeds each line is the mean over seeds at each evaluation step with its 95% t interval as a shaded band
(:class:`PlotContext` maps a run to its twins in the other seeds).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg  # the Agg backend, without touching pyplot's global one
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

from opdgrpo.report.curves import domain_accuracy, flop_unit, mix_accuracy, run_curve
from opdgrpo.report.uncertainty import mean_interval
from opdgrpo.runio import IN_DOMAIN_SET

STEP0_CAPTION = (
    "x: cumulative training FLOPs, log scale. Step 0 (0 FLOPs) is drawn at the tick labelled 0, one decade left of "
    "the first nonzero decade, past the dotted axis break."
)

_COLORS = ["#000000", "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


# ------------------------------------------------------------------------------------------------- figure model
@dataclass
class Line:
    """One curve: FLOPs (raw) against a y value, with a legend label."""

    label: str
    flops: np.ndarray
    y: np.ndarray
    linestyle: str = "-"
    marker: str = "o"
    color_key: str | None = None  # lines sharing a key share a colour (e.g. a run shifted in the mix panel)
    lo: np.ndarray | None = None  # a 95% interval over seeds, drawn as a band (None: one seed)
    hi: np.ndarray | None = None


@dataclass
class Panel:
    """One axes: its lines and reference marks (horizontal lines, vertical FLOP lines, highlighted points)."""

    title: str
    ylabel: str
    lines: list[Line] = field(default_factory=list)
    hlines: list[tuple[float, str]] = field(default_factory=list)
    vlines: list[tuple[float, str]] = field(default_factory=list)
    points: list[tuple[float, float, str]] = field(default_factory=list)


@dataclass
class PlotContext:
    """What a study plotter needs besides its own spec entry."""

    curves: pd.DataFrame
    labels: Mapping[str, str]
    savings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seed_runs: Mapping[str, Sequence[str]] = field(default_factory=dict)  # a run -> the same run in every seed
    instances: Sequence[Mapping[str, Any]] = ()  # every seed's study entry (a figure over seeds, as S6's map)
    final_flops: Mapping[str, float] = field(default_factory=dict)  # each run's final FLOPs (done.json)

    def label(self, run: str) -> str:
        """Legend label of a run: the spec's ``label`` or the run id."""
        return str(self.labels.get(run, run))

    def series(self, run: str, domain: str | Sequence[str], value: str = "accuracy") -> Series:
        """A run's curve on one domain (or the mean over a mix of domains); with several seeds, the mean over
        seeds at each step and its 95% t interval (FLOPs: the seeds' mean)."""
        runs = list(self.seed_runs.get(run, [run]))
        per_seed = [_one_series(self.curves, r, domain, value) for r in runs]
        if len(per_seed) == 1:
            steps, flops, y = per_seed[0]
            return Series(flops, y)
        common = sorted(set.intersection(*(set(st.tolist()) for st, _, _ in per_seed)))
        if not common:
            raise ValueError(f"runs {runs} share no evaluation step")
        flops = np.mean([[f[list(st).index(c)] for c in common] for st, f, _ in per_seed], axis=0)
        ys = np.array([[y[list(st).index(c)] for c in common] for st, _, y in per_seed])
        stats = np.array([mean_interval(ys[:, j]) for j in range(len(common))])
        top = 100.0 if value == "accuracy" else np.inf  # the interval is clipped to the values that can occur
        return Series(flops, stats[:, 0], np.clip(stats[:, 1], 0.0, top), np.clip(stats[:, 2], 0.0, top))

    def line(self, run: str, domain: str | Sequence[str], label: str, value: str = "accuracy", **style: Any) -> Line:
        ser = self.series(run, domain, value)
        return Line(label, ser.flops, ser.y, lo=ser.lo, hi=ser.hi, **style)


@dataclass
class Series:
    flops: np.ndarray
    y: np.ndarray
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None


def _one_series(curves: pd.DataFrame, run: str, domain: str | Sequence[str], value: str) -> tuple[np.ndarray, ...]:
    """(steps, FLOPs, value) of one run: a held-out domain, a mix of domains (list), or ``in_domain`` (S2)."""
    rows = run_curve(curves, run)
    if isinstance(domain, str) and domain == IN_DOMAIN_SET:
        cur = rows[rows["eval_set"] == IN_DOMAIN_SET].sort_values("step", kind="stable")
        if cur.empty:
            raise ValueError(f"run '{run}' has no in-domain evaluation")
    elif isinstance(domain, str):
        cur = domain_accuracy(rows)
        cur = cur[cur["eval_domain"] == domain]
        if cur.empty:
            raise ValueError(f"run '{run}' has no evaluation on domain '{domain}'")
    else:
        cur = mix_accuracy(rows, list(domain))
    y = cur[value].to_numpy(dtype=float)
    return (cur["step"].to_numpy(), cur["cumulative_flops"].to_numpy(dtype=float),
            100.0 * y if value == "accuracy" else y)


# ------------------------------------------------------------------------------------------------------ rendering
def _zero_position(positive: Sequence[float]) -> float:
    """Stand-in x (scaled units) for 0 FLOPs: one decade below the decade of the smallest positive value."""
    return 10.0 ** (math.floor(math.log10(min(positive))) - 1)


def render(panels: Sequence[Panel], title: str, caption: str = STEP0_CAPTION) -> Figure:
    """Draw panels side by side (at most 3 per row) sharing one FLOP unit and one stand-in position for 0."""
    raw = [f for p in panels for ln in p.lines for f in ln.flops] + [x for p in panels for x, _ in p.vlines]
    raw += [x for p in panels for x, _, _ in p.points]
    positive = [float(f) for f in raw if f > 0]
    has_zero = any(f <= 0 for f in raw)
    scale, unit = flop_unit(max(positive)) if positive else (1.0, "FLOP")
    scaled_pos = [f / scale for f in positive] or [1.0]
    x0 = _zero_position(scaled_pos)

    def sx(values: Any) -> np.ndarray:
        arr = np.asarray(values, dtype=float) / scale
        return np.where(arr <= 0, x0, arr)

    n = max(len(panels), 1)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(5.2 * ncols, 4.0 * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    lo_dec = math.floor(math.log10(x0 if has_zero else min(scaled_pos)))
    hi_dec = math.ceil(math.log10(max(scaled_pos)))
    if hi_dec <= lo_dec:
        hi_dec = lo_dec + 1
    decades = list(range(lo_dec, hi_dec + 1))
    stride = max(1, math.ceil(len(decades) / 8))
    ticks = [10.0**d for d in decades[::stride]]
    if has_zero and x0 not in ticks:
        ticks = [x0, *ticks]

    def fmt(x: float, _pos: int | None = None) -> str:
        if has_zero and math.isclose(x, x0, rel_tol=1e-9):
            return "0"
        return f"{x:g}"

    colors: dict[str, str] = {}
    for idx, panel in enumerate(panels):
        ax = axes[idx // ncols][idx % ncols]
        for line in panel.lines:
            key = line.color_key or line.label
            color = colors.setdefault(key, _COLORS[len(colors) % len(_COLORS)])
            order = np.argsort(np.asarray(line.flops, dtype=float), kind="stable")
            ax.plot(
                sx(np.asarray(line.flops)[order]), np.asarray(line.y)[order], linestyle=line.linestyle,
                marker=line.marker, markersize=4, linewidth=1.6, color=color, label=line.label,
            )
            if line.lo is not None and line.hi is not None:
                ax.fill_between(sx(np.asarray(line.flops)[order]), np.asarray(line.lo)[order],
                                np.asarray(line.hi)[order], color=color, alpha=0.15, linewidth=0)
        for y, label in panel.hlines:
            ax.axhline(y, color="grey", linestyle="--", linewidth=1.0, label=label)
        for x, label in panel.vlines:
            ax.axvline(sx([x])[0], color="#7f7f7f", linestyle="-.", linewidth=1.0, label=label)
        for x, y, label in panel.points:
            ax.plot(sx([x]), [y], marker="*", markersize=12, linestyle="none", color="#bcbd22",
                    markeredgecolor="black", label=label)
        ax.set_xscale("log")
        ax.set_xlim(x0 / 2 if has_zero else min(scaled_pos) / 2, max(10.0**hi_dec, 1.5 * max(scaled_pos)))
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FuncFormatter(fmt))
        ax.xaxis.set_minor_locator(LogLocator(subs=tuple(range(2, 10))))
        ax.xaxis.set_minor_formatter(NullFormatter())
        if has_zero:
            ax.axvline(x0 * math.sqrt(10.0), color="black", linestyle=":", linewidth=0.8)
        ax.set_xlabel(f"training FLOPs ({unit}, log scale)")
        ax.set_ylabel(panel.ylabel)
        ax.set_title(panel.title, fontsize=11)
        ax.grid(True, which="major", alpha=0.3)
        if panel.lines or panel.hlines:
            ax.legend(fontsize=8, loc="best")
    for idx in range(len(panels), nrows * ncols):
        axes[idx // ncols][idx % ncols].set_visible(False)
    fig.suptitle("\n".join(textwrap.wrap(title, width=48 * ncols, break_on_hyphens=False)), fontsize=13)
    if caption:
        fig.supxlabel("\n".join(textwrap.wrap(caption, width=int(110 * ncols / 2) if ncols > 1 else 90)), fontsize=8)
    return fig


# ------------------------------------------------------------------------------------------------ length figure
def plot_lengths(key: str, runs: Sequence[str], ctx: PlotContext, title: str) -> dict[str, Figure]:
    """Any study: mean response length on held-out sets against training FLOPs, one panel per evaluated domain,
    one line per run of the study (external-teacher OPD's length inflation, S1b, shows here for every study)."""
    domains: list[str] = []
    for run in runs:
        for d in domain_accuracy(run_curve(ctx.curves, run))["eval_domain"]:
            if d not in domains:
                domains.append(d)
    panels = []
    for domain in domains:
        panel = Panel(title=domain, ylabel="mean response length (tokens)")
        for run in runs:
            try:
                label = ctx.label(run)
                trained = run_curve(ctx.curves, run)["train_domains"].iloc[0]
                panel.lines.append(ctx.line(run, domain, f"{label} [{trained}]", "mean_response_length", color_key=run,
                                            linestyle="-" if run_curve(ctx.curves, run)["method"].iloc[0] == "grpo" else "--"))
            except ValueError:
                continue
        panels.append(panel)
    return {f"{key}_length": render(panels, f"{key}: mean response length - {title}")}
