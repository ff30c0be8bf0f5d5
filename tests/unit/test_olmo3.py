"""The Olmo-3 student: its conf block against transformers' Olmo3Config, any study planned with it (its own
tokenizer, its prompt format, teachers of its family only), and the cost model's use of its sliding windows."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import Olmo3Config

from opdgrpo.config import ConfigError, compose
from opdgrpo.cost import model as cost
from opdgrpo.plan.build import build_plan
from opdgrpo.train import flops as F

REPO = Path(__file__).resolve().parents[2]
OLMO = ["+studies.S1.student=student_olmo3", "studies.S1.teachers=[olmo3_7b_think]"]


def paper(tmp_path, *overrides):
    return compose(["profile=paper", f"results_dir={tmp_path}", *overrides], REPO / "conf")


def test_conf_block_is_olmo3_7b(tmp_path):
    """The conf's architecture is what Olmo3Config builds for 32 layers (3 sliding : 1 full), and 7.3B parameters."""
    block = paper(tmp_path)["models"]["student_olmo3"]
    config = Olmo3Config(**{k: block[k] for k in (*cost.ARCH_KEYS, *cost.WINDOW_KEYS, "vocab_size", "tie_word_embeddings")})
    assert config.layer_types == Olmo3Config(num_hidden_layers=32).layer_types == block["layer_types"]
    assert block["layer_types"].count("full_attention") == 8 and not config.tie_word_embeddings
    assert 7.2e9 < F.params_count(config) < 7.4e9
    assert block["path"] == "allenai/Olmo-3-1025-7B"    # the base checkpoint, as the paper's students are


def test_any_study_plans_with_the_olmo3_student(tmp_path):
    plan = build_plan(paper(tmp_path, *OLMO, "+studies.S3.student=student_olmo3"))
    ids = set(plan.jobs)
    assert {"grpo-student_olmo3-code-s0", "opd-olmo3_7b_think-into_student_olmo3-code-s0"} <= ids   # S1
    assert any(i.startswith("grpo-student_olmo3-math") for i in ids)                                 # S3's teacher
    opd = plan.jobs["opd-olmo3_7b_think-into_student_olmo3-code-s0"]
    tok = plan.jobs["tokenizer-student_olmo3"]
    assert opd.config["tokenizer"] == tok.out_dir and tok.id in opd.upstream
    assert tok.config["tokenizer"]["path"] == "allenai/Olmo-3-1025-7B"
    assert plan.jobs["base-olmo3_7b_think"].config["tokenizer"] == tok.out_dir    # one tokenizer job for the family
    assert {k: opd.config["train"][k] for k in ("chat_template", "stop_tokens")} == {"chat_template": False, "stop_tokens": []}
    qwen = plan.jobs["grpo-student-code-s0"] if "grpo-student-code-s0" in ids else next(
        j for j in plan.runs() if j.config["student"]["from"] == "base:student")
    assert qwen.config["tokenizer"] == plan.jobs["tokenizer"].out_dir and qwen.config["train"]["stop_tokens"] == ["<|im_end|>"]


def test_a_teacher_of_another_tokenizer_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="different tokenizers"):
        build_plan(paper(tmp_path, "+studies.S1.student=student_olmo3"))    # S1's Qwen3 teachers
    with pytest.raises(ConfigError, match="different tokenizers"):
        build_plan(paper(tmp_path, "studies.S2.student=student_olmo3"))     # S2's Qwen3-4B teacher


def test_cost_model_uses_the_sliding_windows(tmp_path):
    cfg = paper(tmp_path, *OLMO)
    arch = cost.architecture(cfg, "student_olmo3")
    assert arch.sliding_window == 4096 and arch.layer_types.count("sliding_attention") == 24
    dense = cost.architecture(cfg, "student_olmo3")
    del dense.layer_types
    # Rows within the window: the dense formulas. Past it: decoding is cheaper, training passes are not (eager).
    assert cost.decode_flops(arch, 8, 512, 3000) == cost.decode_flops(dense, 8, 512, 3000)
    assert cost.decode_flops(arch, 8, 1500, 8192) < cost.decode_flops(dense, 8, 1500, 8192)
    assert F.train_flops(arch, 8, 9692) == F.train_flops(dense, 8, 9692)
    exact = F.generate_flops(arch, 2, 4000, 300) - F.prefill_flops(arch, 2, 4000)
    assert cost.decode_flops(arch, 2, 4000, 300) == pytest.approx(exact, rel=1e-12)
    est = {e.run: e for e in cost.estimate_plan(cfg)}
    grpo = est["grpo-student_olmo3-code-s0"]
    assert grpo.student == "student_olmo3" and grpo.flops["rollout"] > 0 and grpo.flops["teacher"] == 0
    assert est["opd-olmo3_7b_think-into_student_olmo3-code-s0"].flops["teacher"] > 0


def test_olmo3_tokenizer_fixture_stops_at_endoftext(tmp_path):
    """Offline stand-in for the Dolma2 tokenizer (EOS ``<|endoftext|>``, pad ``<|pad|>``, no chat template): the
    tokenizer job saves it from ``models.student_olmo3.tokenizer``, and the student's prompt format encodes plain
    prompts and stops at EOS only. The real ids (100257, 100277) need the download; this checks the wiring."""
    from opdgrpo.stages.hub_models import save_hub_tokenizer
    from opdgrpo.train.rollout import PromptFormat
    from opdgrpo.train.tokenizer import build_tokenizer, load_tokenizer

    smoke = compose(["profile=smoke"], REPO / "conf")
    tok = build_tokenizer(smoke["domains"], 256, 300)
    tok.add_special_tokens({"eos_token": "<|endoftext|>", "pad_token": "<|pad|>"})
    tok.chat_template = None
    tok.save_pretrained(tmp_path / "dolma2")
    plan = build_plan(paper(tmp_path, *OLMO, f"models.student_olmo3.tokenizer.path={tmp_path / 'dolma2'}",
                            f"models.olmo3_7b_think.tokenizer.path={tmp_path / 'dolma2'}"))
    job = plan.jobs["tokenizer-student_olmo3"]
    save_hub_tokenizer(job.config["tokenizer"], Path(job.out_dir))
    saved = load_tokenizer(Path(job.out_dir))
    fmt = PromptFormat.from_config(plan.jobs["opd-olmo3_7b_think-into_student_olmo3-code-s0"].config["train"])
    assert fmt.stop_ids(saved) == [saved.convert_tokens_to_ids("<|endoftext|>")] == [saved.eos_token_id]
    assert saved.pad_token == "<|pad|>" and not fmt.chat_template
