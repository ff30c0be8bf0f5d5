"""`opdgrpo resources`' time and the settings it gives the rules: evaluation rows per benchmark, thinking lengths for
the thinking models only, base jobs over their GPUs, the refusals of a job over its runtime or its allocation chain,
the cost lines, the memory the planner used to leave out, the stop settings, and the site settings check."""

from __future__ import annotations

import pytest

from opdgrpo.config import ConfigError, compose
from opdgrpo.cost import resources
from opdgrpo.cost.memory_model import GIB, Shape, params
from opdgrpo.cost.model import architecture
from opdgrpo.plan.build import build_plan


@pytest.fixture(scope="module")
def paper():
    cfg = compose(["profile=paper"])
    plan = build_plan(cfg)
    return cfg, plan, {e.job: e for e in resources.estimate_jobs(cfg, plan)}


def _estimates(*overrides):
    cfg = compose(["profile=paper", *overrides])
    plan = build_plan(cfg)
    return cfg, plan, {e.job: e for e in resources.estimate_jobs(cfg, plan)}


def test_a_base_evaluation_counts_each_sets_prompts_times_its_own_k(paper):
    """pretrain.eval.max_prompts (200) bounds each set, and each set samples its own k: AIME x16, AMC and LiveCodeBench
    x4, IFEval and MMLU-Pro x1: 2,220 rows, not 6 sets x 200 = 1,200."""
    cfg, _, estimates = paper
    sets = {s.label: (s.prompts, s.k) for s in estimates["base-qwen3_32b"].sets}
    assert sets == {"math.aime24": (30, 16), "math.aime25": (30, 16), "math.amc23": (40, 4), "code.lcb_v6": (175, 4),
                    "ifeval.ifeval": (200, 1), "knowledge.mmlu_pro": (200, 1)}
    assert sum(s.rows for s in estimates["base-qwen3_32b"].sets) == 2220
    text = resources.summary(cfg, list(estimates.values()))
    assert "| math.aime24 | 30 | 16 | 480 |" in text and "| total | | | 2,220 |" in text
    assert "| knowledge.mmlu_pro | 12,032 | 1 | 12,032 |" in text   # a training run's evaluations: every set in full


def test_thinking_lengths_price_the_thinking_models_only(paper):
    """The Qwen3 teachers (sampling.enable_thinking) answer at cost_model.thinking's lengths; the base students at
    response_tokens; S2's thinking teacher at its thinking length, its student not; S1b's GRPO of the 8B teacher (a
    thinking student) rolls out longer than the same GRPO of the base student."""
    cfg, plan, estimates = paper
    thinking = cfg["cost_model"]["thinking"]
    teacher = {s.label: s.response for s in estimates["base-qwen3_32b"].sets}
    student = {s.label: s.response for s in estimates["base-student"].sets}
    assert teacher["math.aime24"] == thinking["math"] and teacher["code.lcb_v6"] == thinking["code"]
    assert teacher["ifeval.ifeval"] == thinking["ifeval"] and teacher["knowledge.mmlu_pro"] == thinking["knowledge"]
    assert set(student.values()) == {cfg["cost_model"]["response_tokens"]}
    assert estimates["base-qwen3_32b"].hours_high > 5 * estimates["base-qwen3_8b"].hours_high
    s2 = next(e for e in estimates.values() if e.kind == "difficulty")
    assert s2.sets[0].response == thinking["math"]   # the teacher's pool, sampled last
    s1b = estimates["grpo-qwen3_8b-code-s0"]
    flat = compose(["profile=paper", "cost_model.thinking.code=2048"])   # the base students' length
    assert resources.train_estimate(flat, plan.jobs[s1b.job], plan.jobs, resources.Hardware.of(flat)).costs[
        "rollouts"][0] < 0.95 * s1b.costs["rollouts"][0]


def test_a_base_job_splits_each_set_over_its_gpus(paper):
    """One engine per GPU, each set's rows in contiguous shares: eight GPUs take about an eighth of the hours (the
    start-ups do not shrink). The engines read the weights onto their GPUs and the job's own model is built on
    `meta`, so no process holds a host copy; under the own sampler (`hf`) each process reads the model whole."""
    _, _, estimates = paper
    _, _, one = _estimates("resources.base.gpu=1", "resources.base.runtime=10000", "resources.base.mem_mb=100000")
    eight, single = estimates["base-qwen3_32b"], one["base-qwen3_32b"]
    assert eight.gpus == 8 and single.gpus == 1
    assert eight.costs["evaluation"][1] == pytest.approx(single.costs["evaluation"][1] / 8, rel=0.05)
    assert eight.costs["start-ups"] == single.costs["start-ups"]
    assert eight.host == single.host == 0
    cfg = compose(["profile=paper", "train.engine=hf", "~train.vllm", "~train.vllm_alone", "methods.grpo.engine_is_cap=null"])
    hf = {e.job: e for e in resources.estimate_jobs(cfg, build_plan(cfg))}["base-qwen3_32b"]
    assert hf.gpus == 8 and round(hf.host / GIB) == 488


def test_a_job_over_its_runtime_is_refused_naming_the_job_the_prediction_and_the_key(capsys):
    cfg = compose(["profile=paper", "resources.base.runtime=120"])
    with pytest.raises(ConfigError, match=r"job `base-qwen3_32b`: \d+\.\d h predicted \(high end\) > "
                                          r"resources\.base\.runtime \(2 h\).*a higher resources\.base\.runtime"):
        resources.refuse_unfit(cfg, build_plan(cfg))
    assert resources.main(["--profile", "paper", "resources.base.runtime=120"]) == 1
    assert "resources.base.runtime" in capsys.readouterr().err


def test_a_training_job_over_its_allocation_chain_is_refused(capsys):
    """A run resumes over allocations; one that needs more than resources.train.allocations is refused, and one
    allocation's start-up and warning lead count against it."""
    cfg = compose(["profile=paper", "resources.train.allocations=1"])
    with pytest.raises(ConfigError, match=r"job `opd-qwen3_8b-math\+code\+ifeval\+knowledge-s0`: \d+\.\d h predicted \(high end\) needs \d+ "
                                          r"allocations of resources\.train\.runtime \(48 h.*> "
                                          r"resources\.train\.allocations \(1\); change: a higher "
                                          r"resources\.train\.allocations"):
        resources.refuse_unfit(cfg, build_plan(cfg))
    assert resources.main(["--profile", "paper", "resources.train.runtime=300"]) == 1
    assert "resources.train.allocations (11)" in capsys.readouterr().err


def test_the_shipped_profiles_pass(paper, capsys):
    """The paper profile plans every job within its runtime or allocations, with margin for its base jobs; the CPU
    profiles (no hardware block) and the rehearsal and pilot still plan."""
    cfg, plan, estimates = paper
    resources.refuse_unfit(cfg, plan)
    base = [e for e in estimates.values() if e.kind == "base"]
    assert max(e.hours_high for e in base) * 1.25 < cfg["resources"]["base"]["runtime"] / 60
    assert max(e.attempts for e in estimates.values()) <= cfg["resources"]["train"]["allocations"]
    for profile in ("smoke", "tiny", "rehearsal", "pilot"):
        assert resources.main(["--profile", profile]) == 0, profile
    capsys.readouterr()


def test_the_summary_has_a_line_per_cost_and_they_add_up(paper):
    cfg, _, estimates = paper
    text = resources.summary(cfg, list(estimates.values()))
    lines = [line for line in text.splitlines() if line.startswith("- ") and "GPU-hours" in line]
    for cost in ("rollouts", "training passes", "teachers", "evaluation", "solve rates", "code scoring",
                 "checkpoints", "start-ups"):
        assert any(line.startswith(f"- {cost}") for line in lines), cost
    assert len(lines) == 8
    low = sum(sum(c[0] for c in e.costs.values()) * e.gpus for e in estimates.values())
    assert low == pytest.approx(sum(e.hours * e.gpus for e in estimates.values()))
    s1 = estimates["opd-qwen3_32b-code-s0"]
    assert s1.costs["code scoring"][0] > 0 and s1.costs["checkpoints"][0] > 0 and s1.costs["start-ups"][0] > 0
    assert "code scoring" not in estimates["grpo-student-math-s0"].costs or \
        estimates["grpo-student-math-s0"].costs["code scoring"] == (0.0, 0.0)


def test_the_memory_the_planner_used_to_leave_out(paper):
    """An H100 reports 79.19 GiB, not 80; vLLM takes its CUDA graph estimate from the KV pool; the OPD training pass
    holds the 32B teacher's MLP intermediates of a 49,152-token micro-batch (7 GiB) beside the student's
    activations; level-1 sleep pins each engine's weights in host memory, level 2 none."""
    cfg, plan, estimates = paper
    hw = resources.Hardware.of(cfg)
    assert hw.device_bytes == pytest.approx(79.19 * GIB) and hw.budget == pytest.approx(0.9 * 79.19 * GIB)
    assert resources.Hardware.of(compose(["profile=paper", "+hardware.reported_gib=78"])).device_bytes == 78 * GIB
    engine = estimates["base-qwen3_32b"].engine
    assert engine.pool == pytest.approx(engine.share - engine.weights - engine.profile_peak - engine.cudagraph)
    eager = compose(["profile=paper", "+train.vllm_alone.enforce_eager=true"])
    assert resources.estimate_jobs(eager, build_plan(eager))[4].engine.cudagraph == 0
    opd, grpo = estimates["opd-qwen3_32b-code-s0"], estimates["grpo-student-code-s0"]
    teacher = Shape.of(architecture(cfg, "qwen3_32b"))
    temporaries = 3 * 49152 * teacher.intermediate * 2
    assert temporaries / GIB == pytest.approx(7.03, abs=0.01)
    backward = 4 * 49152 * Shape.of(architecture(cfg, "student")).intermediate * 2   # the student's, in both passes
    kept = 49152 * teacher.hidden * 2 + 4096 * teacher.vocab * 4   # the teacher's last hidden states, a logit chunk
    assert opd.phases["training pass"] - grpo.phases["training pass"] == pytest.approx(temporaries - backward + kept)
    student = params(Shape.of(architecture(cfg, "student")))
    level1 = compose(["profile=paper", "+train.vllm.sleep_level=1"])
    jobs = build_plan(level1).jobs
    pinned = resources.train_estimate(level1, jobs["grpo-student-code-s0"], jobs, hw)
    assert pinned.host_steady - grpo.host_steady == pytest.approx(8 * 2 * student)
    with pytest.raises(ConfigError, match="sleep_level"):
        compose(["profile=paper", "+train.vllm.sleep_level=3"])


def test_stop_settings_with_and_without_hardware(paper):
    """Per training, base and difficulty job: the SLURM warning lead and the process group's timeout, from the
    phases (never below torch's NCCL default), overridable per kind; without hardware, 120 s and 1,800 s."""
    cfg, plan, estimates = paper
    stops = resources.stop_settings(cfg, plan, list(estimates.values()))
    kinds = {j.id: j.kind for j in plan.jobs.values()}
    assert set(stops) == {j for j, k in kinds.items() if k in ("train", "base", "difficulty")}
    assert all(s.collective_timeout_s >= 600 and s.signal_lead_s >= 120 and s.why for s in stops.values())
    s1 = stops["opd-qwen3_32b-code-s0"]
    assert s1.signal_lead_s > 300 and "checkpoint save" in s1.why
    assert stops["base-qwen3_32b"].collective_timeout_s > 3600 and "evaluation share" in stops["base-qwen3_32b"].why
    own = compose(["profile=paper", "+resources.train.signal_lead_s=999", "+resources.base.collective_timeout_s=77"])
    mine = resources.stop_settings(own, build_plan(own))
    assert mine["opd-qwen3_32b-code-s0"].signal_lead_s == 999 and "resources.train.signal_lead_s" in \
        mine["opd-qwen3_32b-code-s0"].why
    assert mine["base-qwen3_32b"].collective_timeout_s == 77
    tiny = compose(["profile=tiny"])
    plain = resources.stop_settings(tiny, build_plan(tiny))
    assert plain and {(s.signal_lead_s, s.collective_timeout_s) for s in plain.values()} == {(120, 1800)}


def test_site_settings_are_named_before_anything_is_submitted():
    from opdgrpo.cost.site import read_profile, site_settings_problems

    profile = read_profile("workflow/profiles/slurm/config.yaml")
    problems = site_settings_problems(profile)
    assert len(problems) == 2 and "slurm_partition" in problems[0] and "slurm_account" in problems[1]
    edited = {**profile, "default-resources": {**profile["default-resources"], "slurm_partition": "gpu",
                                               "slurm_account": "lab"}}
    assert site_settings_problems(edited) == []
    assert site_settings_problems({"executor": "local"}) == []
    assert site_settings_problems({**edited, "default-resources": ["slurm_partition=gpu", "slurm_account=lab"]}) == []
    cfg = compose(["profile=paper"])
    assert site_settings_problems(edited, cfg) == []   # the shipped retries grant the planned allocations
    fewer = {**edited, "preemptible-retries": 3}
    assert any("preemptible-retries (3)" in p and "resources.train.allocations (11)" in p
               for p in site_settings_problems(fewer, cfg))
