"""S2: the difficulty study (conf/study/s2.yaml).

One selection job (:meth:`opdgrpo.plan.planner.Planner.difficulty`, shared by every seed) cuts the domain's training
prompts into ``student_bins x teacher_bins`` subsets by the base student's and an external teacher's solve rates;
GRPO and OPD from the teacher then train on each subset alone. Each subset run also scores its own training prompts
(eval set ``in_domain``); the report copies each subset's solve rates from its GRPO run's ``done.json``
(:mod:`opdgrpo.report.studies.s2`, which also judges the claims).

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

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from opdgrpo.plan.naming import into, study_student
from opdgrpo.plan.studies.base import ClaimDef, CostSheet, Study

if TYPE_CHECKING:
    from opdgrpo.plan.planner import Planner


class Subset(TypedDict):
    """One difficulty subset and its two runs; the solve rates are added by the report (``S2Report.attach``)."""

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
        from opdgrpo.errors import ConfigError

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


def trainer_seed(index: int, seed: int, seeds: list[int], spread: bool) -> int:
    """The seed that trains subset ``index``: ``seed`` itself, or with ``spread`` the seeds in turn."""
    return seeds[index % len(seeds)] if spread else seed


def _grpo_id(student: str, domain: str, subset: str, seed: int) -> str:
    return f"grpo-{student}-{domain}_{subset}-s{seed}"


STUDY = S2()
