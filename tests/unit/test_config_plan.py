"""Config composition, validation before any compute, and the plan's jobs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from opdgrpo.config import ConfigError, compose
from opdgrpo.plan.build import build_plan

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"


def plan_for(*overrides: str):
    return build_plan(compose(["profile=smoke", *overrides], CONF))


def test_default_profile_is_tiny():
    assert compose([], CONF)["profile"] == "tiny"


def test_plan_covers_every_study_and_shares_runs():
    plan = plan_for()
    assert set(plan.report_spec["studies"]) == {"S1", "S1b", "S2", "S3", "S4", "S5", "S5b"}
    expert = plan.jobs["grpo-student-math-s0"]
    assert set(expert.studies) >= {"S1", "S3", "S4", "S5"}
    distill = plan.jobs["opd-experts-math+code-s0"]
    assert {"grpo-student-math-s0", "grpo-student-code-s0"} <= set(distill.upstream)
    assert distill.config["teachers"]["math"]["path"].endswith("runs/grpo-student-math-s0/checkpoint")
    # S3's self-teacher is the student's own GRPO checkpoint, distilled into the base student
    self_teacher = plan.jobs["opd-self_n1-math-s0"]
    assert self_teacher.config["student"]["from"] == "base:student"
    assert self_teacher.config["method"]["rollouts_per_prompt"] == 1


def test_run_configs_hold_only_what_the_run_uses():
    plan = plan_for()
    grpo = plan.jobs["grpo-student-code-s0"].config
    assert grpo["method"]["name"] == "grpo" and "kl_top_k" not in grpo["method"]
    assert set(grpo["domains"]) == {"code"} and grpo["teachers"] == {}


def test_an_opd_edit_changes_only_opd_job_configs():
    before, after = plan_for(), plan_for("methods.opd.kl_top_k=8")
    changed = {j for j in before.jobs if before.jobs[j].config != after.jobs[j].config}
    assert changed == {j.id for j in before.runs() if j.config["method"]["name"] == "opd"}


@pytest.mark.parametrize(
    "override,message",
    [
        ("methods.grpo.group_size=1", "methods.grpo.group_size"),
        ("methods.opd.lr=0", "methods.opd.lr"),
        ("methods.grpo.lr=-1e-4", "methods.grpo.lr"),
        ("methods.opd.kl_top_k=100000", "methods.opd.kl_top_k"),
        ("methods.grpo.clip_eps_high=0.28", "methods.grpo.clip_eps_high"),   # acts only with several updates
        ("methods.grpo.updates_per_batch=0", "methods.grpo.updates_per_batch"),
        ("methods.grpo.beta=-0.1", "methods.grpo.beta"),
        ("train.eval.k=0", "train.eval.k"),
        ("seeds=[]", "seeds"),
        ("threads=two", "threads"),
        ("+studies.S9={title: x}", "studies.S9"),
        ("studies.S1.domains=[poetry]", "poetry"),
        ("studies.S1.teachers=[teacher_xl]", "teacher_xl"),
        ("studies.S2.pool_size=1", "studies.S2.pool_size"),
        ("studies.S2.teacher_bins=0", "studies.S2.teacher_bins"),
        ("studies.S2.low_teacher_subsets=9", "studies.S2.low_teacher_subsets"),
        ("studies.S5.domains=[math,poetry]", "poetry"),
        ("studies.S4.share_threshold=1.5", "studies.S4.share_threshold"),
        ("studies.S5.smooth_window=4", "studies.S5.smooth_window"),     # a centred window is odd
        ("studies.S1.smooth_window=0", "studies.S1.smooth_window"),
        ("studies.S3.tolerance_se=-1", "studies.S3.tolerance_se"),
        ("studies.S4.min_joint_gain_se=-1", "studies.S4.min_joint_gain_se"),
        ("+studies.S3.share_threshold=0.1", "studies.S3.share_threshold"),   # a consolidation key S3 never reads
        ("+studies.S1.tolerance=1", "studies.S1.tolerance"),
        ("+studies.S5b.student=teacher_m", "studies.S5b.student"),
        ("+studies.S2.pool=10", "studies.S2.pool"),                            # a typo of pool_size
        ("studies.S4.distill_eval_every=0", "studies.S4.distill_eval_every"),
        ("+domains.math.train.keep={level: [1]}", "domains.math.train.keep"),  # a tiny kind has no rows to keep
    ],
)
def test_bad_config_fails_early_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        plan_for(override)


@pytest.mark.parametrize("override,message", [
    ("domains.math.train.keep.level=[]", "domains.math.train.keep.level"),
    ("+domains.code.heldout.lcb.keep={difficulty: easy}", "domains.code.heldout.lcb.keep.difficulty"),
    ("domains.math.heldout.math.answer_format=latex", "domains.math.heldout.math.answer_format"),   # the kind's own check
    ("+domains.code.train.max_tests=0", "domains.code.train.max_tests"),
    ("+methods.grpo.domain_steps.poetry=3", "methods.grpo.domain_steps"),   # a null entry is the only unknown allowed
])
def test_bad_hub_keys_fail_when_the_config_is_composed(override, message):
    """Hub domains load their rows in the jobs, but each one is built when the config is composed, so its own keys
    (a `keep` block, MATH's answer format, a code set's limits) fail before anything is scheduled."""
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        build_plan(compose(["profile=node", override], CONF))


def test_unknown_profile_is_named():
    with pytest.raises(ConfigError, match="profile"):
        compose(["profile=huge"], CONF)


def test_plan_command_lists_jobs():
    out = subprocess.run([sys.executable, "-m", "opdgrpo.cli", "plan", "profile=smoke", "--conf-dir", str(CONF)],
                         capture_output=True, text=True, check=True).stdout
    assert "opd-experts-math+code-s0" in out and "tokenizer" in out


def test_s2_plans_one_selection_and_two_runs_per_subset():
    plan = plan_for()
    selection = plan.jobs["difficulty-math-teacher_m"]
    assert selection.kind == "difficulty" and {"base-student", "base-teacher_m"} <= set(selection.upstream)
    s2 = plan.report_spec["studies"]["S2"]
    assert [sub["name"] for sub in s2["subsets"]] == ["s0t0", "s0t1"]  # smoke: 1 x 2 bins
    grpo = plan.jobs[s2["subsets"][1]["grpo"]]
    assert selection.id in grpo.upstream
    assert grpo.config["train_subset"] == {"domain": "math", "subset": "s0t1", "eval_size": None,
                                           "file": f"{selection.out_dir}/subsets.json"}
    assert grpo.config["method"]["steps"] == 2 and grpo.config["train"]["eval_every"] == 2
    opd = plan.jobs[s2["subsets"][1]["opd"]]
    assert opd.config["teachers"]["math"]["from"] == "base:teacher_m"


def test_s5_shares_experts_with_s4_and_s5b_uses_one_teacher_everywhere():
    plan = plan_for()
    s4, s5 = plan.report_spec["studies"]["S4"], plan.report_spec["studies"]["S5"]
    assert set(s4["experts"]) < set(s5["experts"]) and len(s5["experts"]) == 4
    s5b = plan.jobs[plan.report_spec["studies"]["S5b"]["opd"]].config
    assert set(s5b["teachers"]) == {"math", "code", "ifeval", "knowledge"}
    assert {t["from"] for t in s5b["teachers"].values()} == {"base:teacher_m"}


def test_several_seeds_plan_every_run_per_seed():
    plan = plan_for("seeds=[0,1]")
    s1 = plan.report_spec["studies"]["S1"]
    assert len(s1["seeds"]) == 2 and "grpo-student-math-s1" in plan.jobs
    assert len(plan.by_kind("difficulty")) == 1  # the subsets are data: shared by every seed


def test_every_conf_study_has_a_registered_module():
    """Adding a study is one module in opdgrpo.plan.studies plus one conf/study/*.yaml: both must name the same studies."""
    import yaml

    from opdgrpo.plan.studies import REGISTRY

    names = {yaml.safe_load(path.read_text())["name"] for path in (CONF / "study").glob("*.yaml")}
    assert names == set(REGISTRY)


def test_paper_profile_plans_every_study_offline(tmp_path):
    cfg = compose(["profile=paper", f"results_dir={tmp_path}"], REPO / "conf")
    plan = build_plan(cfg)
    studies = {s for j in plan.runs() for s in j.studies}
    assert {"S1", "S1b", "S2", "S3", "S4", "S5", "S5b"} <= studies
    ids = set(plan.jobs)
    assert "opd-qwen3_32b-code-s0" in ids and "opd-qwen3_8b-code-s0" in ids          # S1's external teachers
    assert any(i.startswith("grpo-student_1p7b-math_") for i in ids)                   # S2 trains the 1.7B student
    assert "difficulty-math-into_student_1p7b-qwen3_4b" in ids
    assert plan.jobs["opd-experts-math+code+ifeval+knowledge-s0"].config["train"]["mix"] == "instance"
    assert cfg["models"]["qwen3_32b"]["path"] == "Qwen/Qwen3-32B"


def test_node_profile_plans_s3_and_s4_on_the_1p7b_student_with_three_seeds(tmp_path):
    """profile=node: the paper's S3 and S4 only, one student (no external teacher), the paper's other domains and
    models switched off (null), each run's steps and the distillation's own evaluation cadence."""
    cfg = compose(["profile=node", f"results_dir={tmp_path}"], REPO / "conf")
    assert set(cfg["studies"]) == {"S3", "S4"} and set(cfg["domains"]) == {"math", "code"}
    assert set(cfg["models"]) == {"student"} and cfg["models"]["student"]["path"] == "Qwen/Qwen3-1.7B-Base"
    plan = build_plan(cfg)
    assert [j.id for j in plan.jobs.values() if j.kind == "base"] == ["base-student"]
    steps = {j.id: (j.config["method"]["steps"], j.config["train"]["eval_every"]) for j in plan.runs()}
    for seed in (0, 1, 2):
        assert {k[:-3]: v for k, v in steps.items() if k.endswith(f"-s{seed}")} == {
            "grpo-student-math": (200, 10), "grpo-student-code": (60, 10), "grpo-student-math+code": (250, 10),
            "opd-self_n1-math": (200, 10), "opd-self_n8-math": (200, 10), "opd-experts-math+code": (19, 2)}
    assert len(steps) == 18
    teachers = plan.jobs["opd-experts-math+code-s1"].config["teachers"]
    assert {d: t["from"] for d, t in teachers.items()} == {"math": "run:grpo-student-math-s1",
                                                           "code": "run:grpo-student-code-s1"}
    # what `opdgrpo fetch --profile node` fetches: the student (its repo also serves the tokenizer) and three splits
    from opdgrpo.stages.fetch import used_items
    from opdgrpo.stages.hub_cache import config_items

    used = {(i.kind, i.path, i.spec.get("name"), i.spec.get("split")) for i in used_items(plan.jobs.values())}
    assert used == {("model", "Qwen/Qwen3-1.7B-Base", None, None),
                    ("dataset", "DigitalLearningGmbH/MATH-lighteval", "default", "train"),
                    ("dataset", "DigitalLearningGmbH/MATH-lighteval", "default", "test"),
                    ("dataset", "lighteval/code_generation_lite", "release_v6", "test")}
    assert {i.identity for i in config_items(cfg)} == {i.identity for i in used_items(plan.jobs.values())}


def test_s2_spreads_its_subsets_over_the_seeds_and_ranks_over_all_of_them():
    """tiny: 8 subsets over seeds 0, 1, 2 (3, 3 and 2 subsets); each seed's ranking names every subset's GRPO run."""
    plan = build_plan(compose(["profile=tiny"], CONF))
    per_seed = plan.report_spec["studies"]["S2"]["seeds"]
    trained = [[sub["name"] for sub in entry["subsets"]] for entry in per_seed]
    assert trained == [["s0t0", "s0t3", "s1t2"], ["s0t1", "s1t0", "s1t3"], ["s0t2", "s1t1"]]
    s2_runs = [j for j in plan.runs() if j.studies == ["S2"]]
    assert len(s2_runs) == 16 and all(j.id in plan.jobs for j in s2_runs)
    for seed, entry in enumerate(per_seed):
        assert all(sub["grpo"].endswith(f"-s{seed}") and sub["opd"].endswith(f"-s{seed}") for sub in entry["subsets"])
        assert [r["name"] for r in entry["ranking"]] == [f"s{i}t{j}" for i in range(2) for j in range(4)]
        assert all(r["run"] in plan.jobs for r in entry["ranking"])
    assert per_seed[0]["ranking"] == per_seed[2]["ranking"]


def test_s2_without_spreading_trains_every_subset_in_every_seed():
    plan = build_plan(compose(["profile=tiny", "studies.S2.spread_over_seeds=false"], CONF))
    assert all(len(entry["subsets"]) == 8 for entry in plan.report_spec["studies"]["S2"]["seeds"])
    assert len([j for j in plan.runs() if j.studies == ["S2"]]) == 48


def test_grpo_refuses_to_skip_scoring():
    """GRPO trains on the rewards: the key exists for OPD only, and the schema names it for GRPO."""
    with pytest.raises(ConfigError, match=r"score_rollouts"):
        compose(["profile=smoke", "+methods.grpo.score_rollouts=false"], CONF)


@pytest.mark.parametrize("profile", ["smoke", "tiny", "rehearsal", "paper", "node"])
def test_each_job_names_every_upstream_job_by_its_role(profile):
    """What the rules name as a job's inputs (Plan.inputs): every upstream job under one role, each role of a run
    the job that made the checkpoint or file its config reads."""
    plan = build_plan(compose([f"profile={profile}"], CONF))
    for job in plan.jobs.values():
        roles = plan.inputs(job.id)
        named = [d for done in roles.values() for d in done]
        assert sorted(set(named)) == sorted(plan.jobs[u].done for u in job.upstream), job.id
        if job.kind == "train":
            assert len(roles["student"]) == 1 and roles["tokenizer"], job.id
            assert bool(roles["teachers"]) == (job.config["method"]["name"] == "opd"), job.id
            assert bool(roles["selection"]) == bool(job.config.get("train_subset")), job.id
    experts = plan.inputs("opd-experts-math+code-s0")["teachers"] if profile == "rehearsal" else []
    assert profile != "rehearsal" or experts == [plan.jobs[r].done for r in ("grpo-student-math-s0", "grpo-student-code-s0")]


# -- defaults: one place (the schema), and a plain override of any key ---------------------------------------------

def _sample(value):
    """A valid non-default value for a key whose default is ``value``."""
    return {"fp32": "bf16", "balanced": "instance", "stop": "skip", "ddp": "fsdp", "eager": "sdpa", "hf": "hf",
            "float32": "bfloat16", "none": "[tensorboard]"}.get(value, value)


@pytest.mark.parametrize("profile", ["smoke", "tiny", "paper"])
def test_every_train_key_with_a_schema_default_takes_a_plain_override(profile):
    """conf/ names only what a profile sets; every other `train` key has its default in the schema, and
    `train.<key>=value` (no Hydra `+`) works in every profile, whether or not a conf file names the key."""
    from opdgrpo import schema

    defaults = schema.with_defaults({}, "train")
    assert {"precision", "engine", "distributed", "logit_chunk_tokens", "report_to"} <= set(defaults)
    own = schema.with_defaults(compose([f"profile={profile}"])["train"], "train")
    wanted = {}
    for key, value in defaults.items():
        if isinstance(value, (dict, list)) or value is None:
            continue   # free-form mappings and lists: set through their entries
        if key in ("distributed", "engine"):   # another one asks for settings of its own: the profile's own, plainly
            wanted[key] = str(own[key])
            continue
        wanted[key] = str(_sample(value)).lower() if isinstance(value, bool) else str(_sample(value))
    cfg = compose([f"profile={profile}", *(f"train.{key}={text}" for key, text in wanted.items())])   # one compose
    for key, text in wanted.items():
        assert str(cfg["train"][key]).lower().strip("[]'") == text.lower().strip("[]'"), key
    cfg = compose([f"profile={profile}", "train.engine=vllm", "train.vllm.gpu_memory_utilization=0.5"])   # an entry of a free-form mapping
    assert cfg["train"]["vllm"]["gpu_memory_utilization"] == 0.5


def test_a_misspelt_key_is_refused_naming_the_declared_one():
    """The schema's keys are also the hint: a key no conf file names is still suggested."""
    with pytest.raises(ConfigError, match=r"no key 'enigne' at train; did you mean \['engine'\]"):
        compose(["profile=smoke", "train.enigne=vllm"])


def test_no_reader_writes_a_default_of_its_own():
    """A default is written once, in the schema: the code reads `train`, `method`, `pretrain.eval` and a model's
    `sampling` keys through `train_settings`/`method_settings`/`schema.with_defaults`/`schema.default`,
    so `.get("<key>", <literal>)` or `.get("<key>") or <literal>` on a train key would be a second default that can
    drift."""
    import re

    src = REPO / "src" / "opdgrpo"
    from opdgrpo import schema

    declared = {**schema.with_defaults({}, "train"), **schema.with_defaults({}, "train", "eval"),
                **schema.with_defaults({}, "method.schema.yaml#/$defs/grpo"),
                **schema.with_defaults({}, "method.schema.yaml#/$defs/opd"),
                **schema.with_defaults({}, "config.schema.yaml#/$defs/pretrain", "eval"),
                **schema.with_defaults({}, "model", "sampling")}
    keys = "|".join(sorted(declared))
    literal = r"""(["'\d\[{]|True|False|None)"""   # `.get("key", <literal>)` or `.get("key") or <literal>`
    pattern = re.compile(r"""\.get\(["'](""" + keys + r""")["'](,\s*|\)\s*or\s*)""" + literal)
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in src.rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found
