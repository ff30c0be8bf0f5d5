"""S6, the sensitivity map: its plan (grid -> worlds, model variants and runs), its validation, and its table and
figure from synthetic run data."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from opdgrpo.config import ConfigError, compose
from opdgrpo.plan.build import build_plan
from opdgrpo.plan.studies.s6 import level_tag
from opdgrpo.report.curves import CURVE_COLUMNS
from opdgrpo.report.studies import REPORTS
from opdgrpo.report.studies.s6 import map_figure, map_frame, map_markdown

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
OTHERS = ("S1", "S1b", "S2", "S3", "S4", "S5", "S5b")
#: The smoke-sized map: 2 x 2 levels, the smoke profile's seed (tests/e2e/test_s6_map_dag.py runs it).
SMOKE_MAP = ("+study@studies.S6=s6", "studies.S6.interference=[0,0.5]", "studies.S6.thinking_fraction=[1.0,0.0]",
             "studies.S6.min_levels=2", "studies.S6.joint_steps=6")


def smoke_map(*extra: str, only: bool = True):
    """The smoke-sized map's config (only S6 when ``only``)."""
    drop = tuple(f"~studies.{s}" for s in OTHERS) if only else ()
    return compose(["profile=smoke", *SMOKE_MAP, *drop, *extra], CONF)


# --------------------------------------------------------------------------------------------------------- plan
def test_the_grid_plans_one_world_per_interference_and_one_student_per_cell():
    plan = build_plan(smoke_map())
    entry = plan.report_spec["studies"]["S6"]
    cells = entry["cells"]
    assert [(c["thinking_fraction"], c["interference"]) for c in cells] == [(1.0, 0.0), (1.0, 0.5), (0.0, 0.0),
                                                                             (0.0, 0.5)]
    assert {j.id for j in plan.by_kind("tokenizer")} == {"tokenizer", "tokenizer-i0p5"}
    for cell in cells:
        base = plan.jobs[f"base-{cell['student_model']}"].config
        assert base["model"]["pretrain"]["thinking_fraction"] == cell["thinking_fraction"]
        levels = {d: b.get("interference", 0.0) for d, b in base["domains"].items()}
        assert set(levels) == {"math", "code", "ifeval", "knowledge"} and set(levels.values()) == {cell["interference"]}
        runs = [*cell["experts"], cell["joint"], cell["distill"], cell["external"]]
        assert len(runs) == 5 and all(r.startswith(f"s6-i{level_tag(cell['interference'])}-") for r in runs)
        for run in runs:   # every run trains the cell's student, in the cell's world, with its world's tokenizer
            rc = plan.jobs[run].config
            assert rc["student"]["from"] == f"base:{cell['student_model']}"
            assert rc["domains"] == {d: base["domains"][d] for d in rc["train_domains"]}
            assert rc["tokenizer"] == base["tokenizer"]
        teachers = plan.jobs[cell["external"]].config["teachers"]
        assert {t["from"] for t in teachers.values()} == {f"base:{cell['teacher_model']}"}
    # the teacher is pretrained once per world; at interference 0 it is the profile's own teacher_m
    assert [c["teacher_model"] for c in cells] == ["teacher_m", "teacher_m_i0p5"] * 2
    assert len({r for c in cells for r in (*c["experts"], c["joint"], c["distill"], c["external"])}) == 20


def test_a_cell_equal_to_the_profile_shares_its_base_model():
    plan = build_plan(smoke_map("studies.S6.thinking_fraction=[0.5,0.0,1.0]"))
    cells = plan.report_spec["studies"]["S6"]["cells"]
    assert cells[0]["student_model"] == "student"   # tf 0.5 at interference 0 is the smoke student itself
    assert plan.jobs[cells[0]["joint"]].config["student"]["path"].endswith("base/student/checkpoint")


def test_enabling_s6_changes_no_other_job():
    without = build_plan(compose(["profile=smoke"], CONF))
    with_map = build_plan(smoke_map(only=False))
    for job_id, job in without.jobs.items():
        other = with_map.jobs[job_id]
        assert (other.out_dir, other.config, other.upstream) == (job.out_dir, job.config, job.upstream), job_id
        assert "S6" not in other.studies
    for name, entry in without.report_spec["studies"].items():
        assert with_map.report_spec["studies"][name] == entry


def test_tiny_map_plans_nine_cells_three_seeds_and_nothing_else():
    cfg = compose(["profile=tiny-map"], CONF)
    plan = build_plan(cfg)
    assert list(plan.report_spec["studies"]) == ["S6"] and "teacher_l" not in cfg["models"]
    seeds = plan.report_spec["studies"]["S6"]["seeds"]
    assert len(seeds) == 3 and all(len(e["cells"]) == 9 for e in seeds)
    assert len(plan.runs()) == 9 * 3 * 5 and all(j.studies == ["S6"] for j in plan.runs())
    # 3 worlds (tokenizers), a student per cell (the default world's at the default fraction is `student`) and
    # the teacher in each world
    assert len(plan.by_kind("tokenizer")) == 3 and len(plan.by_kind("base")) == 9 + 3


def test_tiny_map_cells_run_the_tiny_profiles_s4_and_s5b_settings():
    tiny, tiny_map = compose(["profile=tiny"], CONF), compose(["profile=tiny-map"], CONF)
    s6 = tiny_map["studies"]["S6"]
    assert s6["joint_steps"] == tiny["studies"]["S4"]["joint_steps"]
    assert s6["distill_steps"] is None and tiny["studies"]["S4"]["distill_steps"] in s6["distill_budgets"]
    assert s6["external_steps"] == tiny["studies"]["S5b"]["steps"]
    assert s6["teacher"] == tiny["studies"]["S5b"]["teacher"]
    assert {k: v for k, v in tiny_map.items() if k not in ("profile", "studies", "models")} == \
        {k: v for k, v in tiny.items() if k not in ("profile", "studies", "models")}


def test_a_study_or_model_set_to_null_is_switched_off():
    cfg = compose(["profile=smoke", "studies.S1=null", "models.teacher_l=null", "~studies.S1b", "~studies.S3"], CONF)
    assert "S1" not in cfg["studies"] and "teacher_l" not in cfg["models"]
    assert "teacher_l" not in {j.label for j in build_plan(cfg).by_kind("base")}


def test_the_cost_model_prices_every_map_run():
    from opdgrpo.cost.model import estimate_plan, study_totals

    cfg = smoke_map()
    plan = build_plan(cfg)
    estimates = estimate_plan(cfg, plan)
    assert len(estimates) == 20 and all(e.total > 0 for e in estimates)
    rows = {r.quantity: r.value for r in study_totals(plan.report_spec, estimates)}
    assert rows["the map (one seed)"] == pytest.approx(sum(e.total for e in estimates))


# --------------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "overrides,key",
    [
        (("studies.S6.min_levels=3",), "studies.S6.interference"),            # 2 levels where 3 are asked for
        (("studies.S6.interference=[0,1.5]",), "studies.S6.interference[1]"),
        (("studies.S6.thinking_fraction=[0.5,-0.1]",), "studies.S6.thinking_fraction[1]"),
        (("studies.S6.interference=[0.25,0.5]",), "studies.S6.interference"),  # no level 0
        (("studies.S6.thinking_fraction=[0.5,0.0]",), "studies.S6.thinking_fraction"),   # no fluent student
        (("studies.S6.interference=[0,0.5,0.5]",), "studies.S6.interference"),  # a level twice
        (("+studies.S6.levels=3",), "studies.S6.levels"),                       # unknown key
        (("studies.S6.collapse_domains=[math,chess]",), "studies.S6.collapse_domains"),
        (("studies.S6.external_domains=[math,ifeval]",), "studies.S6.collapse_domains"),   # code not distilled
        (("studies.S6.teacher=teacher_x",), "studies.S6"),
        (("studies.S6.smooth_window=2",), "studies.S6.smooth_window"),
        (("+studies.S6.distill_budgets=[4,2]",), "studies.S6.distill_budgets"),        # not ascending
        (("+studies.S6.distill_budgets=[3,6]",), "studies.S6.distill_budgets"),        # 3: no evaluation point
        (("+studies.S6.distill_budgets=[2,4]", "studies.S6.distill_steps=4"), "studies.S6.distill_steps"),
    ],
)
def test_bad_map_configs_fail_naming_the_key(overrides, key):
    """A study's own keys are checked as the plan is built (plan.check_studies), before any job exists."""
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        build_plan(smoke_map(*overrides))


def test_the_distillation_runs_the_largest_budget_once():
    """distill_budgets: one distillation per cell and seed, of the largest budget; the entry lists them all."""
    plan = build_plan(smoke_map("+studies.S6.distill_budgets=[2,6]"))
    entry = plan.report_spec["studies"]["S6"]
    assert entry["distill_budgets"] == [2, 6]
    assert {plan.jobs[c["distill"]].config["method"]["steps"] for c in entry["cells"]} == {6}
    assert len(plan.jobs) == len(build_plan(smoke_map()).jobs)   # no extra run per budget
    assert build_plan(smoke_map()).report_spec["studies"]["S6"]["distill_budgets"] == [4]   # the OPD method's steps


def test_tiny_map_needs_three_levels_of_each_knob():
    with pytest.raises(ConfigError, match=r"studies\.S6\.thinking_fraction.*at least 3 levels"):
        build_plan(compose(["profile=tiny-map", "studies.S6.thinking_fraction=[1.0,0.0]"], CONF))


# ----------------------------------------------------------------------------------------- table from run data
def _rows(run: str, seed: int, points: list[tuple[float, dict[str, float]]]) -> list[dict]:
    sets = {"math": ["amc", "aime"], "code": ["lcb"]}
    return [{"run": run, "study": "S6", "method": "x", "train_domains": "x", "seed": seed, "step": 10 * i,
             "cumulative_flops": flops, "eval_domain": d, "eval_set": s, "accuracy": acc, "mean_response_length": 9.0}
            for i, (flops, accs) in enumerate(points) for d, acc in accs.items() for s in sets[d]]


def _cell_runs(cell: dict, seed: int, cheap: bool, collapse: bool) -> list[dict]:
    """Joint GRPO rises to 0.5; the experts cost 100 each; the distillation reaches 0.5 (``cheap``) or never; on the
    3-point trailing smoothed curves joint GRPO reaches 0.5 at 2000 FLOPs and the distillation at 200, so the savings
    are 1 - (200 + 200) / 2000. The external OPD keeps its step-0 accuracy or loses it (``collapse``)."""
    both = lambda x: {"math": x, "code": x}  # noqa: E731
    joint = [(0, both(0.2)), (500, both(0.35)), (1000, both(0.5)), (1500, both(0.5)), (2000, both(0.5))]
    distill = [(0, both(0.2)), (50, both(0.45)), (100, both(0.5)), (150, both(0.5)), (200, both(0.5))]
    expert = [(0, both(0.2)), (100, both(0.5))]
    ext_final = 0.02 if collapse else 0.3 + 0.01 * seed
    external = [(0, both(0.3)), (100, both(ext_final))]
    rows = _rows(cell["joint"], seed, joint) + _rows(cell["external"], seed, external)
    rows += _rows(cell["distill"], seed, distill if cheap else [(f, both(0.25)) for f, _ in distill])
    for e in cell["experts"]:
        rows += _rows(e, seed, expert)
    return rows


def synthetic_map(seeds: int = 3) -> tuple[list[dict], pd.DataFrame]:
    """The smoke map's spec entries for ``seeds`` seeds, and curves where consolidation pays only at interference
    0.5 and the external-teacher OPD collapses only the base student (thinking fraction 0)."""
    spec = build_plan(smoke_map(f"seeds={list(range(seeds))}")).report_spec["studies"]["S6"]
    instances = spec["seeds"] if seeds > 1 else [spec]
    rows = []
    for seed, inst in enumerate(instances):
        for cell in inst["cells"]:
            rows += _cell_runs(cell, seed, cheap=cell["interference"] > 0, collapse=cell["thinking_fraction"] == 0)
    return instances, pd.DataFrame(rows, columns=CURVE_COLUMNS)


def test_the_map_table_has_one_row_per_cell_with_intervals():
    instances, curves = synthetic_map()
    frame = map_frame(instances, curves, {})
    assert len(frame) == 4
    by = {(r["thinking_fraction"], r["interference"]): r for _, r in frame.iterrows()}
    paid = by[(1.0, 0.5)]
    assert paid["savings"] == pytest.approx(1 - 400 / 2000) and paid["matched"] == "3/3" and paid["savings_sign"] == "positive"
    # the distillation never reaches joint GRPO's 0.5: each seed's savings are at most 1 - (200 + 200) / 2000, a
    # bound that does not settle the sign
    never = by[(1.0, 0.0)]
    assert never["matched"] == "0/3" and never["savings_sign"] == "inconclusive"
    assert never["readings"] == ", ".join(["<= 80.0%"] * 3)
    assert by[(0.0, 0.0)]["collapse"] == "math+code" and by[(1.0, 0.0)]["collapse"] == "none"
    kept = by[(1.0, 0.5)]
    assert kept["math_base"] == pytest.approx(0.3) and kept["math_final"] == pytest.approx(0.31)
    assert kept["math_final_lo"] < 0.31 < kept["math_final_hi"]   # three seeds: a real interval
    assert by[(0.0, 0.5)]["retention"] == pytest.approx(0.02 / 0.3)
    text = map_markdown(frame, instances[0])
    table = [line for line in text.splitlines() if line.startswith("| ") and "interference" not in line]
    assert len(table) == 4 and "+80.0%" in text and "math+code" in text


def test_each_budget_reads_the_distillation_cut_at_its_step():
    """Budgets 10 and 40 on the synthetic curves (evaluations every 10 steps, 50 FLOPs apart): at 40 the whole run,
    as without budgets; at 10 the distillation's cut curve (0.2, 0.45: 0.2, 0.325 smoothed) never reaches joint GRPO's
    0.5, so each seed gives the bound 1 - (200 + 50) / 2000."""
    instances, curves = synthetic_map()
    whole = map_frame(instances, curves, {})
    for inst in instances:
        inst["distill_budgets"] = [10, 40]
    frame = map_frame(instances, curves, {})
    assert len(frame) == 2 * len(whole) and list(frame["distill_steps"][:2]) == [10, 40]
    by = {(r["thinking_fraction"], r["interference"], r["distill_steps"]): r for _, r in frame.iterrows()}
    assert by[(1.0, 0.5, 40)]["savings"] == pytest.approx(1 - 400 / 2000)
    assert by[(1.0, 0.5, 10)]["readings"] == ", ".join(["<= 87.5%"] * 3)
    assert by[(1.0, 0.5, 10)]["collapse"] == by[(1.0, 0.5, 40)]["collapse"]
    text = map_markdown(frame, instances[0])
    assert len([line for line in text.splitlines() if line.startswith("| 0.5 | 1 | 10 |")]) == 1
    fig = map_figure(frame, instances[0])
    assert len(fig.axes) == 6   # a savings map per budget, the collapse map, and their colour bars
    # a cell with no mean shows every seed's reading, one per line, so three bounds fit the cell's width
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert any(label.startswith("\n".join(["<= 87.5%"] * 3) + "\n") for label in labels), labels


def test_one_seed_gives_values_without_intervals():
    instances, curves = synthetic_map(seeds=1)
    frame = map_frame(instances, curves, {})
    assert (frame["savings_lo"].dropna() == frame["savings"].dropna()).all()
    assert "indicative" in map_markdown(frame, instances[0])


def test_the_figure_and_tables_come_through_the_study_hooks(tmp_path):
    instances, curves = synthetic_map()
    tables = REPORTS["S6"].tables(instances, curves, {})
    assert set(tables) == {"map"} and len(tables["map"][0]) == 4
    fig = map_figure(tables["map"][0], instances[0])
    assert len(fig.axes) == 4   # two heat maps and their colour bars
    fig.savefig(tmp_path / "map.png")
    assert (tmp_path / "map.png").stat().st_size > 10_000
