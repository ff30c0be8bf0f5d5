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

Model variants come from :meth:`opdgrpo.plan.planner.Planner.model_variant` (a variant equal to the profile's model is that
model: the base stage is shared by content); runs are named ``s6-i<level>-tf<level>-...`` and never shared with
S4/S5b's, so enabling S6 changes no other run. The report (:mod:`opdgrpo.report.studies.s6`) reads each cell with
S4's matching rule and savings (:func:`~opdgrpo.report.studies.consolidation.matched_savings`) and S5b's collapse rule (final held-out accuracy below half
of step 0's), with 95% t intervals over seeds (:mod:`opdgrpo.report.uncertainty`): ``S6_map.md/.csv`` (one row per
cell and distillation budget) and ``S6_map.png`` (a savings heat map per budget, and the collapse map). S6 makes no
paper claim of its own.

* **distill_budgets** (optional, steps): the distillation budget, the knob a probe of the default world found binding
  (docs/method.md, "The default world"). Each
  cell's distillation runs the largest budget once and the savings are read again with its curve cut at each smaller
  one. That reading is what a run of that many steps records: every random draw of a run is seeded by (seed, step)
  (:mod:`opdgrpo.train.batching`), the learning rate has no decay (warm-up only), and each smaller budget must be an
  evaluation point (a multiple of ``train.eval_every``), so the cut curve ends where the shorter run's would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from opdgrpo.plan.naming import into, study_student
from opdgrpo.plan.studies.base import CostSheet, Study, check_smooth_window, matching_keys
from opdgrpo.run_shape import method_settings

if TYPE_CHECKING:
    from opdgrpo.plan.planner import Planner

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
    eval_sizes: NotRequired[dict[str, dict[str, list[float]]]]   # the joint run's held-out sizes (attached)


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
        from opdgrpo.domains import KINDS
        from opdgrpo.errors import ConfigError

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
        from opdgrpo.errors import ConfigError

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
        steps = method_settings(planner.cfg["methods"]["grpo"])["domain_steps"]
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


STUDY = S6()
