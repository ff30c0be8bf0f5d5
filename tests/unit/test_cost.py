"""The cost model (opdgrpo.cost.model): hand computations with the ledger's formulas, and real smoke-size ledgers."""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import pytest
from transformers import Qwen3Config

from opdgrpo.cli import main as cli_main
from opdgrpo.config import ConfigError, compose
from opdgrpo.cost import model as cost
from opdgrpo.plan.build import build_plan
from opdgrpo.train import flops as F

REPO = Path(__file__).resolve().parents[2]
ARCH = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim")


def smoke(tmp_path, *overrides, cost_model=None):
    """The smoke profile's config and plan; ``cost_model`` replaces whatever block the profile has (so the hand
    computations below hold whatever lengths conf/ assumes)."""
    cfg = compose(["profile=smoke", f"results_dir={tmp_path}/results", *overrides], REPO / "conf")
    if cost_model == {}:
        cfg.pop("cost_model", None)
    elif cost_model is not None:
        cfg["cost_model"] = cost_model
    return cfg, build_plan(cfg)


def qwen3(cfg, model):
    """The model as transformers builds it (models.build_model): the hand computation's config."""
    block = cfg["models"][model]
    return Qwen3Config(vocab_size=cfg["tokenizer"]["vocab_size"], **{k: block[k] for k in ARCH})


def test_decode_sum_is_generate_flops_exactly(tmp_path):
    cfg, _ = smoke(tmp_path)
    student = cost.architecture(cfg, "student")
    for rows, prompt, new in ((1, 1, 1), (16, 11, 7), (3, 40, 128)):
        hand = F.generate_flops(student, rows, prompt, new) - F.prefill_flops(student, rows, prompt)
        assert cost.decode_flops(student, rows, prompt, new) == pytest.approx(hand, rel=1e-12)
    # between integer lengths it lies between its neighbours
    mid = cost.decode_flops(student, 4, 10, 7.5)
    assert cost.decode_flops(student, 4, 10, 7) < mid < cost.decode_flops(student, 4, 10, 8)


def test_opd_run_prediction_equals_a_hand_computation(tmp_path):
    block = {"prompt_tokens": 9, "padded_prompt_tokens": 11, "response_tokens": 6, "padded_response_tokens": 12}
    cfg, plan = smoke(tmp_path, cost_model=block)
    job = plan.jobs["opd-teacher_m-math-s0"]
    est = cost.estimate_run(cfg, job, plan.jobs)
    s, t = qwen3(cfg, "student"), qwen3(cfg, "teacher_m")
    b = cfg["train"]["prompts_per_step"] * cfg["methods"]["opd"]["rollouts_per_prompt"]   # 4 x 4
    steps = cfg["methods"]["opd"]["steps"]
    # rollout: prefill of the 11-token block, then 6 tokens + EOS = 7 generated per row; forwards over 11 + 12
    rollout = F.generate_flops(s, b, 11, 7)
    train_ = F.train_flops(s, b, 23, logits_positions=13)
    teacher = F.forward_flops(t, b, 23, logits_positions=13)
    assert est.sequences_per_step == b == 16 and est.steps == steps
    assert est.flops["rollout"] == pytest.approx(steps * rollout, rel=1e-12)
    assert est.flops["train"] == pytest.approx(steps * train_, rel=1e-12)
    assert est.flops["teacher"] == pytest.approx(steps * teacher, rel=1e-12)
    assert est.total == pytest.approx(steps * (rollout + train_ + teacher), rel=1e-12)
    assert est.student == "student" and est.teachers == {"math": "teacher_m"}


def _opd_estimate(tmp_path, override: str):
    """Smoke's OPD math run estimated under ``override`` with prompts of 9 (padded 11) and responses of 6 (padded 12)
    tokens: (config, estimate, student and teacher architectures, rows per step, steps)."""
    block = {"prompt_tokens": 9, "padded_prompt_tokens": 11, "response_tokens": 6, "padded_response_tokens": 12}
    cfg, plan = smoke(tmp_path, override, cost_model=block)
    est = cost.estimate_run(cfg, plan.jobs["opd-teacher_m-math-s0"], plan.jobs)
    return cfg, est, qwen3(cfg, "student"), qwen3(cfg, "teacher_m"), 16, cfg["methods"]["opd"]["steps"]


def test_packed_training_passes_are_counted_at_the_mean_lengths(tmp_path):
    """Under train.max_tokens_per_microbatch rows are repacked by length: the passes count each row at its mean
    prompt + generated tokens (9 + 7) instead of the padded block (11 + 12); rollouts still decode the block."""
    cfg, est, s, t, b, steps = _opd_estimate(tmp_path, "+train.max_tokens_per_microbatch=64")
    assert est.flops["rollout"] == pytest.approx(steps * F.generate_flops(s, b, 11, 7), rel=1e-12)
    assert est.flops["train"] == pytest.approx(steps * F.train_flops(s, b, 16, logits_positions=8), rel=1e-12)
    assert est.flops["teacher"] == pytest.approx(steps * F.forward_flops(t, b, 16, logits_positions=8), rel=1e-12)


def test_packed_rows_count_the_students_and_teachers_passes_at_the_mean_lengths(tmp_path):
    """Under train.packed_row_tokens the student's passes (training, old policy) and the teachers' forwards run over
    rows laid end to end: they count each row at its mean lengths (9 + 7); the reference's forward keeps the padded
    block (11 + 12), as the trainer runs it."""
    cfg, est, s, t, b, steps = _opd_estimate(tmp_path, "train.packed_row_tokens=64")
    assert est.flops["rollout"] == pytest.approx(steps * F.generate_flops(s, b, 11, 7), rel=1e-12)
    assert est.flops["train"] == pytest.approx(steps * F.train_flops(s, b, 16, logits_positions=8), rel=1e-12)
    assert est.flops["teacher"] == pytest.approx(steps * F.forward_flops(t, b, 16, logits_positions=8), rel=1e-12)
    knobs = {"updates": 2, "old_policy": True, "reference": True}
    lengths = {"math": cost.Lengths(9, 11, 6, 12)}
    flops = cost.step_flops(s, {"math": b}, lengths, 16, None, knobs, student_packed=True)
    assert flops["old_policy"] == pytest.approx(F.forward_flops(s, b, 16, logits_positions=8), rel=1e-12)
    assert flops["reference"] == pytest.approx(F.forward_flops(s, b, 23, logits_positions=13), rel=1e-12)
    assert flops["train"] == pytest.approx(2 * F.train_flops(s, b, 16, logits_positions=8), rel=1e-12)


def test_multi_domain_distillation_routes_rows_to_each_experts_shape(tmp_path):
    block = {"prompt_tokens": 5, "per_domain": {
        "math": {"prompt_tokens": 8, "response_tokens": 3, "padded_response_tokens": 10},
        "code": {"prompt_tokens": 12, "padded_prompt_tokens": 14, "response_tokens": 9, "padded_response_tokens": 16}}}
    cfg, plan = smoke(tmp_path, cost_model=block)
    est = cost.estimate_run(cfg, plan.jobs["opd-experts-math+code-s0"], plan.jobs)
    s = qwen3(cfg, "student")
    per = cfg["methods"]["opd"]["rollouts_per_prompt"]
    rows = {"code": 2 * per, "math": 2 * per}     # balanced: 4 prompts split 2 + 2
    assert est.rows == rows
    block_p, decode = 14, 16                     # the batch's longest prompt block and decode length
    rollout = F.prefill_flops(s, 16, block_p)
    rollout += F.generate_flops(s, 8, block_p, 4) - F.prefill_flops(s, 8, block_p)       # math: 3 + EOS
    rollout += F.generate_flops(s, 8, block_p, 10) - F.prefill_flops(s, 8, block_p)      # code: 9 + EOS
    train_ = F.train_flops(s, 16, block_p + decode, logits_positions=decode + 1)
    teacher = 2 * F.forward_flops(s, 8, block_p + decode, logits_positions=decode + 1)    # experts: the student's shape
    steps = cfg["methods"]["opd"]["steps"]
    assert est.flops["rollout"] == pytest.approx(steps * rollout, rel=1e-12)
    assert est.flops["train"] == pytest.approx(steps * train_, rel=1e-12)
    assert est.flops["teacher"] == pytest.approx(steps * teacher, rel=1e-12)
    assert "grpo-student-math-s0 (student)" in est.teachers.values()


def test_instance_mix_splits_by_pool_size(tmp_path):
    cfg, plan = smoke(tmp_path, "train.mix=instance")
    job = plan.jobs["grpo-student-math+code+ifeval+knowledge-s0"]
    from opdgrpo.domains import build_domain
    from opdgrpo.train.batching import domain_counts

    pools = {d: build_domain(cfg["domains"][d]).training_pool() for d in job.config["train_domains"]}
    g = cfg["methods"]["grpo"]["group_size"]
    want = {d: n * g for d, n in domain_counts(pools, cfg["train"]["prompts_per_step"], "instance").items()}
    assert cost.rows_per_domain(job.config) == want


def test_lengths_defaults_and_errors(tmp_path):
    cfg, _ = smoke(tmp_path, cost_model={})
    block = cost.cost_block(cfg)                  # no cost_model block: the defaults
    L = cost.lengths_for(block, "math", 16)
    assert L == cost.Lengths(256.0, 256.0, 16.0, 16.0)   # null response and padding = max_new_tokens
    assert cost.generated_tokens(L, 16) == 16            # a row at the cap emits no EOS
    with pytest.raises(ConfigError, match=r"cost_model.respons_tokens"):
        cost.cost_block({**cfg, "cost_model": {"respons_tokens": 3}})
    with pytest.raises(ConfigError, match=r"cost_model.per_domain.chess"):
        cost.cost_block({**cfg, "cost_model": {"per_domain": {"chess": {}}}})
    with pytest.raises(ConfigError, match=r"cost_model.per_domain.math.prompt_tokens"):
        cost.cost_block({**cfg, "cost_model": {"per_domain": {"math": {"prompt_tokens": -1}}}})
    bad = copy.deepcopy(cfg)
    del bad["models"]["student"]["hidden_size"]
    with pytest.raises(ConfigError, match=r"models.student.*hidden_size"):
        cost.architecture(bad, "student")


def test_cli_table_csv_and_study_totals(tmp_path, capsys):
    out = tmp_path / "runs.csv"
    rc = cli_main(["flops", "estimate", "--profile", "smoke", f"results_dir={tmp_path}/results", "--conf-dir", str(REPO / "conf"),
                   "--csv", str(out), "++cost_model.prompt_tokens=10"])
    assert rc == 0
    text = capsys.readouterr().out
    cfg, plan = smoke(tmp_path, "++cost_model.prompt_tokens=10")
    rows = list(csv.DictReader(open(out)))
    assert [r["run"] for r in rows] == [j.id for j in plan.runs()]
    assert "| grpo-student-math-s0 | grpo | student | - |" in text and "savings 1 - pipeline / joint" in text
    by_run = {r["run"]: float(r["total_flops"]) for r in rows}
    s4 = plan.report_spec["studies"]["S4"]
    pipeline = sum(by_run[e] for e in s4["experts"]) + by_run[s4["distill"]]
    totals = {r.quantity: r.value for r in cost.study_totals(plan.report_spec, cost.estimate_plan(cfg, plan)) if r.study == "S4"}
    assert totals["savings 1 - pipeline / joint (full runs)"] == pytest.approx(100 * (1 - pipeline / by_run[s4["joint"]]))
    assert totals["pipeline = experts + distillation"] == pytest.approx(pipeline)


def test_paper_solver_inverts_the_cost_model():
    from opdgrpo.cost import solve as S

    # the architectures are the Qwen3 model cards' sizes (1.7B, 4.0B, 8.2B, 14.8B, 32.8B parameters)
    cards = {"qwen3_1.7b": 1.7e9, "qwen3_4b": 4.0e9, "qwen3_8b": 8.2e9, "qwen3_14b": 14.8e9, "qwen3_32b": 32.8e9}
    for name, size in cards.items():
        assert F.params_count(S.arch(name)) == pytest.approx(size, rel=0.025), name
    per_seq = sum(S.sequence_flops("qwen3_4b", "qwen3_8b", 256, 4096).values())
    seqs = S.sequences_for(45.7e18, "qwen3_4b", "qwen3_8b", 256, 4096)
    assert seqs * per_seq == pytest.approx(45.7e18)
    # the response length that fits 0.6 EFLOP of GRPO into 1000 sequences costs 0.6 EFLOP there
    r = S.response_for(0.6e18, "qwen3_4b", None, 256, 1000)
    assert 1000 * sum(S.sequence_flops("qwen3_4b", None, 256, r).values()) == pytest.approx(0.6e18, rel=1e-3)
    assert S.response_for(1e30, "qwen3_4b", None, 256, 1) is None and S.response_for(1.0, "qwen3_4b", None, 256, 1) == 0
    # a bigger teacher costs more per sequence; padding the forwards to twice the response costs more
    assert sum(S.sequence_flops("qwen3_4b", "qwen3_32b", 256, 4096).values()) > per_seq
    assert sum(S.sequence_flops("qwen3_4b", "qwen3_8b", 256, 4096, 8192).values()) > per_seq
    assert "S1 OPD, 32B teacher" in S.paper_analysis()


def test_grpo_knobs_add_their_passes_to_the_prediction(tmp_path):
    """Two updates per batch: two training passes and one old-policy forward; beta > 0: one reference forward (the
    student's shape); the table and CSV gain those columns only where some run has them."""
    block = {"prompt_tokens": 9, "padded_prompt_tokens": 11, "response_tokens": 6, "padded_response_tokens": 12}
    cfg, plan = smoke(tmp_path, "methods.grpo.updates_per_batch=2", "methods.grpo.beta=0.1", cost_model=block)
    job = plan.jobs["grpo-student-math-s0"]
    est = cost.estimate_run(cfg, job, plan.jobs)
    s = qwen3(cfg, "student")
    b = cfg["train"]["prompts_per_step"] * cfg["methods"]["grpo"]["group_size"]
    steps = cfg["methods"]["grpo"]["steps"]
    forward = F.forward_flops(s, b, 23, logits_positions=13)
    assert est.flops["train"] == pytest.approx(steps * 2 * F.train_flops(s, b, 23, logits_positions=13), rel=1e-12)
    assert est.flops["old_policy"] == pytest.approx(steps * forward, rel=1e-12)
    assert est.flops["reference"] == pytest.approx(steps * forward, rel=1e-12)
    assert "old_policy EFLOP" in cost.runs_table([est]) and "reference EFLOP" in cost.runs_table([est])
    default_cfg, default_plan = smoke(tmp_path, cost_model=block)
    plain = cost.estimate_run(default_cfg, default_plan.jobs["grpo-student-math-s0"], default_plan.jobs)
    assert plain.flops["old_policy"] == plain.flops["reference"] == 0
    assert "old_policy" not in cost.runs_table([plain])


def test_paper_profile_steps_are_what_the_papers_budgets_buy(capsys):
    """conf/profile/paper.yaml's step counts equal `opdgrpo flops solve --profile paper` at its cost model, and each
    figure's run, at those steps, spends at least the figure's budget (x its margin) within one step."""
    from omegaconf import OmegaConf

    from opdgrpo.cost.solve import solve_steps

    cfg = compose(["profile=paper"], REPO / "conf")
    plan = build_plan(cfg)
    steps, rows = solve_steps(cfg, plan)
    configured = {k: OmegaConf.select(OmegaConf.create(cfg), k) for k in steps}
    assert configured == steps, "paste `opdgrpo flops solve --profile paper`'s counts into conf/profile/paper.yaml"
    for r in rows:
        spent = r["configured"] * r["per_step"]
        assert spent >= r["budget"].eflop * r["budget"].margin * 1e18 - r["per_step"] / 2, r
    assert plan.jobs["grpo-student-math-s0"].config["method"]["steps"] == steps["methods.grpo.domain_steps.math"]
    assert "domain_steps" not in plan.jobs["grpo-student-math-s0"].config["method"]
    assert cli_main(["flops", "solve", "--profile", "paper"]) == 0
    assert "methods.grpo.domain_steps.code" in capsys.readouterr().out


def test_domain_steps_for_an_unknown_domain_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="methods.grpo.domain_steps"):
        smoke(tmp_path, "+methods.grpo.domain_steps={poetry: 3}")
