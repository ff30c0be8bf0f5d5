"""S6: where the claims flip (conf/study/s6.yaml), a sensitivity map beyond the paper.

The paper explains its two consolidation results by two properties of its world: domains that interfere under
joint training (so S4's experts + multi-teacher OPD beat joint GRPO) and a student-teacher style gap (so S5b's
external thinking teacher collapses a base student). S6 sweeps both knobs on a grid and reruns, in every cell and
with every seed, what S4 needs (one GRPO expert per domain, joint GRPO on the mix, multi-teacher OPD of the experts)
and what S5b needs (OPD from the external teacher on all of its domains):

* **interference** levels: ``domains.<d>.interference`` (docs/method.md, "Domain interference") set on every domain
  of the world; each level is its own *world* (its own tokenizer, pretrained student and teacher: the share applies
  to pretraining rows too). Level 0 is the world without interference (conf/domain's 0.0).
* **thinking_fraction** levels: the student's ``models.<student>.pretrain.thinking_fraction`` (1.0: fluent in the
  teachers' step-by-step style; 0.0: a pure base student), one pretrained student per level and world.

Model variants come from :meth:`opdgrpo.plan.Planner.model_variant` (a variant equal to the profile's model is that
model: the base stage is shared by content); runs are named ``s6-i<level>-tf<level>-...`` and never shared with
S4/S5b's, so enabling S6 changes no other run. The report reads each cell with S4's matching rule and savings
(:func:`~opdgrpo.studies.consolidation.matched_savings`) and S5b's collapse rule (final held-out accuracy below half
of step 0's), with 95% t intervals over seeds (:mod:`opdgrpo.report.uncertainty`): ``S6_map.md/.csv`` (one row per
cell and distillation budget) and ``S6_map.png`` (a savings heat map per budget, and the collapse map). S6 makes no
paper claim of its own.

* **distill_budgets** (optional, steps): the distillation budget, the knob issue 18's probe found binding. Each
  cell's distillation runs the largest budget once and the savings are read again with its curve cut at each smaller
  one. That reading is what a run of that many steps records: every random draw of a run is seeded by (seed, step)
  (:mod:`opdgrpo.batching`), the learning rate has no decay (warm-up only), and each smaller budget must be an
  evaluation point (a multiple of ``train.eval_every``), so the cut curve ends where the shorter run's would.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from .base import CostSheet, Study, check_smooth_window, into, matching_keys, study_student

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from opdgrpo.plan import Planner
    from opdgrpo.report.plots import PlotContext

#: The collapse rule of S5b: a domain collapses when its final accuracy is below this share of step 0's.
COLLAPSE_SHARE = 0.5
_LEVELS = {"type": "array", "minItems": 2, "items": {"type": "number", "minimum": 0, "maximum": 1}}
_NAMES = {"type": "array", "minItems": 1, "items": {"type": "string"}}
_STEPS = {"type": ["integer", "null"], "minimum": 1, "description": "null: the method's steps"}


class Cell(TypedDict):
    """One grid cell of one seed: its levels, its models and its runs."""

    interference: float
    thinking_fraction: float
    student_model: str
    teacher_model: str
    experts: list[str]     # S4's part: one GRPO expert per domain, in ``domains`` order
    joint: str             # joint GRPO on the mix
    distill: str           # multi-teacher OPD of the experts
    external: str          # S5b's part: OPD from the external teacher on ``external_domains``
    eval_sizes: NotRequired[dict[str, dict[str, list[int]]]]   # the joint run's held-out sizes (attached)


class S6Entry(TypedDict):
    """Report-spec entry of S6 (one seed)."""

    title: str
    teacher_model: str     # the external teacher (conf model); each cell distils its world's variant of it
    domains: list[str]
    external_domains: list[str]
    collapse_domains: list[str]
    interference: list[float]
    thinking_fraction: list[float]
    cells: list[Cell]      # thinking_fraction-major, then interference, in the conf's order
    distill_budgets: NotRequired[list[int]]   # distillation steps the savings are read at (the last: the run's own)
    tolerance: float
    smooth_window: NotRequired[int]
    tolerance_se: NotRequired[float]
    min_joint_gain_se: NotRequired[float]


def _budgets(planner: Planner, s: Mapping[str, Any]) -> list[int]:
    """The distillation steps the savings are read at; the last is the distillation run's own."""
    return [int(b) for b in s.get("distill_budgets") or [s.get("distill_steps") or planner.cfg["methods"]["opd"]["steps"]]]


def level_tag(level: float) -> str:
    """A level in run ids and model names: 0.25 -> ``0p25``, 1.0 -> ``1``, 0 -> ``0``."""
    return f"{float(level):g}".replace(".", "p")


def world_domains(domains: Mapping[str, Any], level: float) -> dict[str, Any]:
    """Every domain block at interference ``level`` (0.0: the world with none, hash-pinned; conf/domain's default, so
    a level equal to the profile's is the profile's own world)."""
    return {name: {**block, "interference": float(level)} for name, block in domains.items()}


class S6(Study[S6Entry]):
    name = "S6"
    direction_tests_rank = 90
    run_keys = frozenset({"experts", "joint", "distill", "external"})
    figure_stems = ("map",)
    table_stems = ("map",)
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["title", "interference", "thinking_fraction", "domains", "external_domains", "collapse_domains",
                     "teacher"],
        "properties": {
            "name": {"type": "string"},
            "title": {"type": "string"},
            "student": {"type": ["string", "null"], "description": "the model whose variants the map trains"},
            "interference": {**_LEVELS, "description": "levels of domains.<d>.interference, set on every domain"},
            "thinking_fraction": {**_LEVELS, "description": "levels of the student's pretrain.thinking_fraction"},
            "min_levels": {"type": "integer", "minimum": 2,
                           "description": "the fewest levels each knob must list (3 for a map; 2 for a smoke test)"},
            "domains": {**_NAMES, "minItems": 2, "description": "S4's part: experts, joint GRPO and their OPD"},
            "joint_steps": _STEPS,
            "distill_steps": _STEPS,
            "distill_budgets": {"type": ["array", "null"], "minItems": 1, "items": {"type": "integer", "minimum": 1},
                                "description": "distillation steps to read the savings at (null: distill_steps "
                                               "only); the distillation runs the largest"},
            "mix": {"anyOf": [{"type": "null"}, {"$ref": "train.schema.yaml#/$defs/mix"}]},
            "external_domains": {**_NAMES, "description": "S5b's part: OPD from `teacher` on these domains at once"},
            "teacher": {"type": "string"},
            "external_steps": _STEPS,
            "collapse_domains": {**_NAMES, "description": "domains whose collapse the map reports (of external_domains)"},
            "tolerance": {"type": "number", "minimum": 0},
            "smooth_window": {"type": "integer", "minimum": 1},
            "tolerance_se": {"type": "number", "minimum": 0},
            "min_joint_gain_se": {"type": "number", "minimum": 0},
        },
    }

    # -- conf and plan --------------------------------------------------------------------------------------------
    def validate(self, cfg: dict[str, Any]) -> None:
        """Levels distinct, enough of them, spanning the ends the map is about; domains known and able to interfere."""
        from opdgrpo.config import ConfigError
        from opdgrpo.domains import KINDS

        key, s = f"studies.{self.name}", cfg["studies"][self.name]
        check_smooth_window(cfg, self.name)
        need = int(s.get("min_levels") or 3)
        ends = {"interference": (0.0,), "thinking_fraction": (0.0, 1.0)}
        for knob, required in ends.items():
            levels = [float(x) for x in s[knob]]
            if len(levels) < need:
                raise ConfigError(f"config key `{key}.{knob}` must list at least {need} levels (`{key}.min_levels`), "
                                  f"got {levels}")
            if len({level_tag(x) for x in levels}) != len(levels):
                raise ConfigError(f"config key `{key}.{knob}` lists a level twice (levels are compared at 6 digits), "
                                  f"got {levels}")
            missing = [x for x in required if x not in levels]
            if missing:
                raise ConfigError(f"config key `{key}.{knob}` must include {missing} (the map's reference end), got {levels}")
        for knob in ("external_domains", "collapse_domains"):
            unknown = [d for d in s[knob] if d not in cfg["domains"]]
            if unknown:
                raise ConfigError(f"config key `{key}.{knob}` names {unknown}, not in `domains` ({sorted(cfg['domains'])})")
        self._validate_budgets(cfg, key, s)
        stray = [d for d in s["collapse_domains"] if d not in s["external_domains"]]
        if stray:
            raise ConfigError(f"config key `{key}.collapse_domains` names {stray}, not among `{key}.external_domains`")
        flat = [d for d, b in cfg["domains"].items() if not hasattr(KINDS.get(b["kind"]), "SHARED_WRAP")]
        if max(float(x) for x in s["interference"]) > 0 and flat:
            raise ConfigError(f"config key `{key}.interference` sets levels > 0 on every domain, but {flat} have no "
                              "shared form (only the tiny synthetic kinds do)")

    @staticmethod
    def _validate_budgets(cfg: dict[str, Any], key: str, s: Mapping[str, Any]) -> None:
        """Budgets ascending and distinct, each but the largest an evaluation point of the distillation, and not
        together with ``distill_steps`` (which would then do nothing)."""
        from opdgrpo.config import ConfigError

        budgets = s.get("distill_budgets")
        if budgets is None:
            return
        if s.get("distill_steps") is not None:
            raise ConfigError(f"config key `{key}.distill_steps` does nothing when `{key}.distill_budgets` is set (the "
                              "distillation runs the largest budget): set one of them")
        if list(budgets) != sorted(set(budgets)):
            raise ConfigError(f"config key `{key}.distill_budgets` must be distinct and ascending, got {list(budgets)}")
        every = int(cfg["train"]["eval_every"])
        off = [b for b in budgets[:-1] if b % every]
        if off:
            raise ConfigError(f"config key `{key}.distill_budgets` lists {off}, not multiples of `train.eval_every` "
                              f"({every}): a smaller budget must be an evaluation point of the longest distillation")

    def plan(self, planner: Planner, s: Mapping[str, Any], seed: int) -> S6Entry:
        """Per cell (thinking fraction x interference): the cell's world, its student and teacher variants, then
        S4's runs and S5b's run from that student."""
        st, teacher = study_student(s), str(s["teacher"])
        cells: list[Cell] = []
        for frac in s["thinking_fraction"]:
            for level in s["interference"]:
                world = (f"i{level_tag(level)}", world_domains(planner.cfg["domains"], float(level)))
                student = planner.model_variant(st, f"tf{level_tag(frac)}_i{level_tag(level)}",
                                                {"pretrain": {"thinking_fraction": float(frac)}}, world)
                teacher_v = planner.model_variant(teacher, f"i{level_tag(level)}", None, world)
                cells.append(self._cell(planner, s, seed, (float(level), float(frac)), student, teacher_v))
        return S6Entry(title=s["title"], teacher_model=teacher, domains=list(s["domains"]),
                       external_domains=list(s["external_domains"]),
                       collapse_domains=list(s["collapse_domains"]), interference=[float(x) for x in s["interference"]],
                       thinking_fraction=[float(x) for x in s["thinking_fraction"]], cells=cells,
                       distill_budgets=_budgets(planner, s), **matching_keys(s))

    def _cell(self, planner: Planner, s: Mapping[str, Any], seed: int, levels: tuple[float, float], student: str,
              teacher: str) -> Cell:
        """One cell's runs: S4's experts, joint GRPO and multi-teacher OPD, and S5b's external-teacher OPD."""
        level, frac = levels
        prefix = f"s6-i{level_tag(level)}-tf{level_tag(frac)}-{into(study_student(s))}"
        where = f" (i={level:g}, tf={frac:g})"
        domains, external, base = list(s["domains"]), list(s["external_domains"]), f"base:{student}"
        mix, train = "+".join(domains), {"mix": s.get("mix")}
        steps = planner.cfg["methods"]["grpo"].get("domain_steps") or {}
        experts = [planner.add_run(f"{prefix}grpo-{d}-s{seed}", self.name, "grpo", [d], seed, base,
                               method_overrides={"steps": steps.get(d)}, label=f"GRPO {d} expert{where}")
                   for d in domains]
        joint = planner.add_run(f"{prefix}grpo-{mix}-s{seed}", self.name, "grpo", domains, seed, base,
                            method_overrides={"steps": s.get("joint_steps")}, label=f"joint GRPO{where}",
                            train_overrides=train)
        distill = planner.add_run(f"{prefix}opd-experts-{mix}-s{seed}", self.name, "opd", domains, seed, base,
                              {d: f"run:{e.id}" for d, e in zip(domains, experts)}, {"steps": _budgets(planner, s)[-1]},
                              label=f"multi-teacher OPD{where}", train_overrides=train)
        ext = planner.add_run(f"{prefix}opd-{s['teacher']}-{'+'.join(external)}-s{seed}", self.name, "opd", external, seed,
                          base, {d: f"base:{teacher}" for d in external}, {"steps": s.get("external_steps")},
                          label=f"OPD {s['teacher']} (all domains){where}", train_overrides=train)
        return Cell(interference=level, thinking_fraction=frac, student_model=student, teacher_model=teacher,
                    experts=[e.id for e in experts], joint=joint.id, distill=distill.id, external=ext.id)

    # -- cost model -----------------------------------------------------------------------------------------------
    def cost_rows(self, entry: S6Entry, sheet: CostSheet) -> None:
        """Per seed: the consolidation runs and the external-teacher runs over all cells, and the whole map."""
        cells = entry["cells"]
        s4 = [r for c in cells for r in (*c["experts"], c["joint"], c["distill"])]
        s5b = [c["external"] for c in cells]
        sheet.add(f"experts + joint GRPO + distillation, {len(cells)} cells", s4)
        sheet.add(f"external-teacher OPD, {len(cells)} cells", s5b)
        sheet.add("the map (one seed)", [*s4, *s5b])

    # -- report ---------------------------------------------------------------------------------------------------
    def attach(self, entry: S6Entry, runs_dir: Path) -> None:
        """Each cell's joint run's held-out sizes (the standard error of its savings target)."""
        from opdgrpo.report.matching import eval_sizes

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
    from opdgrpo.report.uncertainty import FAILS, HOLDS, interval_verdict, mean_interval

    if len(margins) == 1:
        return "no" if margins[0] >= 0 else "collapsed"
    _, lo, hi = mean_interval(margins)
    return {HOLDS: "no", FAILS: "collapsed"}.get(interval_verdict(lo, hi, strict=False), "inconclusive")


def _savings_cells(entry: S6Entry, index: int, curves: pd.DataFrame, final_flops: Mapping[str, float],
                   budget: int | None = None) -> dict[str, Any]:
    """One seed's savings result of cell ``index`` (S4's matching rule and savings), its distillation's curve cut
    at ``budget`` steps (None: the whole run)."""
    from .consolidation import matched_savings

    cell = entry["cells"][index]
    if budget is not None:
        curves = curves[(curves["run"] != cell["distill"]) | (curves["step"] <= budget)]
    sub = {k: entry[k] for k in ("tolerance", "smooth_window", "tolerance_se", "min_joint_gain_se") if k in entry}  # type: ignore[literal-required]
    sub.update(domains=entry["domains"], joint=cell["joint"], distill=cell["distill"], experts=cell["experts"],
               eval_sizes=cell.get("eval_sizes"))
    return matched_savings("S6", sub, curves, final_flops)[2]


def _stats(prefix: str, values: Sequence[float]) -> dict[str, float]:
    """``{prefix, prefix_lo, prefix_hi}``: the mean and its 95% t interval over seeds (NaN when none)."""
    from opdgrpo.report.uncertainty import mean_interval

    mean, lo, hi = mean_interval(values) if values else (math.nan,) * 3
    return {prefix: mean, f"{prefix}_lo": lo, f"{prefix}_hi": hi}


def _collapse_columns(instances: Sequence[S6Entry], index: int, curves: pd.DataFrame) -> dict[str, Any]:
    """Per collapse domain: step-0 (the base student) and final accuracy of the external-teacher run, with intervals,
    and its collapse verdict; the mean retention final / step 0 over the domains; the collapsed domains."""
    from opdgrpo.report.curves import domain_curve

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

    from opdgrpo.report.savings import finite_figures, format_savings, sign_over_seeds

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


def _savings_map(fig: Figure, ax: Any, frame: pd.DataFrame, entry: S6Entry, budget: int | None,
                 xs: Sequence[float], ys: Sequence[float]) -> None:
    """One savings heat map (the rows of one distillation budget), sign flips outlined."""
    marks = {"positive": "+", "negative": "-", "inconclusive": "?"}
    labels = [[_pct(r["savings"], r["savings_lo"], r["savings_hi"], True, sep="\n").replace("n/a", r["readings"])
               + f"\n{marks[r['savings_sign']]} ({r['matched']} figures)" for r in row] for row in _rows(frame, xs, ys)]
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


STUDY = S6()
