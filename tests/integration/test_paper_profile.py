"""The paper profile's code path, offline: hub tokenizer and models through from_pretrained, chat template, hub data
sets, real verifiers, trained end to end on tiny Qwen3 models saved in Hugging Face format and on the fixtures with
the hub's schemas. (Its plan: tests/unit/test_config_plan.py; its DAG in Snakemake: tests/e2e/test_snakemake_cli.py.)"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from opdgrpo.config import compose
from opdgrpo.plan.build import build_plan
from opdgrpo.runio import read_jsonl

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "hub"

#: hub source -> the fixture with its schema (same load_dataset call; configs become data_files)
FIXTURE_SOURCES = {
    "TIGER-Lab/MMLU-Pro": {"path": str(FIXTURES / "mmlu_pro")},
    "cais/mmlu": {"path": str(FIXTURES / "mmlu"), "name": None, "data_files": {"auxiliary_train": "all/auxiliary_train-*.parquet"}},
    "google/IFEval": {"path": str(FIXTURES / "ifeval")},
    "allenai/RLVR-IFeval": {"path": str(FIXTURES / "rlvr_ifeval")},
    "agentica-org/DeepCoder-Preview-Dataset": {"path": str(FIXTURES / "agentica-org__DeepCoder-Preview-Dataset")},
    "lighteval/code_generation_lite": {"path": str(FIXTURES / "lighteval__code_generation_lite")},
    "HuggingFaceH4/aime_2024": {"path": str(FIXTURES / "HuggingFaceH4__aime_2024")},
    "math-ai/aime25": {"path": str(FIXTURES / "math-ai__aime25")},
    "math-ai/amc23": {"path": str(FIXTURES / "math-ai__amc23")},
    "open-r1/DAPO-Math-17k-Processed": {"path": str(FIXTURES / "open-r1__DAPO-Math-17k-Processed")},
}



def offline_paper_config(root: Path, models: dict[str, str] | None = None, domains: tuple[str, ...] | None = None) -> dict:
    """The paper profile with every hub data set replaced by its fixture and, optionally, models by local dirs."""
    cfg = compose(["profile=paper", f"results_dir={root}"], REPO / "conf")
    for name in list(cfg["domains"]):
        if domains is not None and name not in domains:
            del cfg["domains"][name]
            continue
        dcfg = cfg["domains"][name]
        for block in [dcfg["train"], *dcfg["heldout"].values()]:
            hub = block["source"]["path"]
            if hub in FIXTURE_SOURCES:
                block["source"] = {**block["source"], **FIXTURE_SOURCES[hub]}
    for name, path in (models or {}).items():
        cfg["models"][name].update({"path": path, "dtype": "float32"})
    return cfg


# -- the paper code path end to end, on tiny models in Hugging Face format ---------------------------------------

@pytest.fixture(scope="module")
def tiny_hub_models(tmp_path_factory) -> dict[str, str]:
    """A student and a teacher saved like hub checkpoints: Qwen3 architecture, a tokenizer with a chat template
    and the chat special tokens, loadable with from_pretrained / AutoTokenizer."""
    from opdgrpo.train.models import build_model
    from opdgrpo.train.tokenizer import CHAT_TEMPLATE, CHAT_TOKENS, build_tokenizer

    smoke = compose(["profile=smoke"], REPO / "conf")
    tok = build_tokenizer(smoke["domains"], 256, 300)
    tok.add_special_tokens({"additional_special_tokens": CHAT_TOKENS})
    tok.chat_template = CHAT_TEMPLATE
    root = tmp_path_factory.mktemp("hub_models")
    paths = {}
    for name, arch, seed in (("student", smoke["models"]["student"], 0), ("teacher", smoke["models"]["teacher_m"], 1)):
        model = build_model(arch, len(tok), tok.pad_token_id, tok.eos_token_id, seed)
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        paths[name] = str(root / name)
    return paths


def _tiny_paper_config(root: Path, models: dict[str, str], domains: tuple[str, ...]) -> dict:
    cfg = offline_paper_config(root, {"student": models["student"], "qwen3_8b": models["teacher"]}, domains)
    cfg["models"] = {k: cfg["models"][k] for k in ("student", "qwen3_8b")}
    cfg["tokenizer"]["path"] = models["student"]
    cfg["threads"] = 1
    cfg["pretrain"]["eval"].update({"max_prompts": 2, "max_new_tokens": 8, "batch_size": 16})
    cfg["train"].update({"prompts_per_step": 2, "max_new_tokens": 8, "micro_batches": 2, "eval_every": 1,
                         "checkpoint_every": 1, "precision": "fp32",
                         "engine": "hf"})   # the paper profile's vLLM engine: tests/integration/test_vllm_engine.py
    cfg["train"]["eval"].update({"batch_size": 64})
    for d in cfg["domains"].values():
        for name, spec in d["heldout"].items():
            spec.update({"size": 3, "k": 2})
    cfg["methods"]["grpo"].update({"steps": 2, "group_size": 4, "engine_is_cap": None})   # acts under vllm only
    cfg["methods"]["grpo"].pop("domain_steps")   # the paper's per-expert budgets: every run here takes 2 steps
    cfg["methods"]["opd"].update({"steps": 2})
    names = list(domains)
    cfg["studies"] = {"S5": {**cfg["studies"]["S5"], "domains": names},
                      "S5b": {**cfg["studies"]["S5b"], "domains": names, "teacher": "qwen3_8b"}}
    return cfg


def _run_cli(command: str, job) -> None:
    done = subprocess.run([sys.executable, "-m", "opdgrpo.cli", command, "--out", job.out_dir,
                           "--config-json", json.dumps(job.config)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]


PAPER_DOMAINS = ("math", "code", "ifeval", "knowledge")


def test_paper_code_path_trains_end_to_end(tiny_hub_models, tmp_path):
    from opdgrpo.train.loop import train
    from opdgrpo.train.tokenizer import load_tokenizer

    cfg = _tiny_paper_config(tmp_path / "results", tiny_hub_models, PAPER_DOMAINS)
    plan = build_plan(cfg)
    _run_cli("tokenizer", plan.jobs["tokenizer"])
    for model in ("student", "qwen3_8b"):
        _run_cli("pretrain", plan.jobs[f"base-{model}"])
        base = Path(plan.jobs[f"base-{model}"].out_dir)
        assert (base / "checkpoint").is_symlink()                      # linked, not copied or trained
        summary = json.loads((base / "done.json").read_text())
        assert summary["source"] == "hub" and summary["counted"] is False and summary["heldout"]

    tok = load_tokenizer(Path(plan.jobs["tokenizer"].out_dir))
    assert tok.chat_template and tok.convert_tokens_to_ids("<|im_end|>") != tok.unk_token_id
    grpo = plan.jobs["grpo-student-math-s0"]
    opd = plan.jobs[f"opd-qwen3_8b-{'+'.join(PAPER_DOMAINS)}-s0"]
    for job in (grpo, opd):
        summary = train(copy.deepcopy(job.config), Path(job.out_dir))
        ledger = read_jsonl(Path(job.out_dir) / "ledger.jsonl")
        assert [r["step"] for r in ledger] == [0, 1] and summary["steps"] == 2
        assert all(r["flops"]["rollout"] > 0 and r["flops"]["train"] > 0 for r in ledger)
        assert (ledger[0]["flops"]["teacher"] > 0) == (job is opd)
        evals = read_jsonl(Path(job.out_dir) / "evals.jsonl")
        assert [e["step"] for e in evals] == [0, 1, 2]
        for result in evals[-1]["results"]:
            assert result["k"] == 2 and set(result["pass_at_k"]) == {"pass@1", "pass@2"}
            assert 0.0 <= result["accuracy"] <= 1.0
        ifeval = [r for r in evals[-1]["results"] if r["eval_domain"] == "ifeval"]
        if ifeval:
            assert set(ifeval[0]["metrics"]) >= {"prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose"}
        # the checkpoint loads with from_pretrained like any hub model
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(str(Path(job.out_dir) / "checkpoint"))


def test_chat_template_formats_prompts_and_stops_at_end_of_turn(tiny_hub_models):
    from opdgrpo.domains import Task
    from opdgrpo.train.rollout import PromptFormat, encode_prompts
    from opdgrpo.train.tokenizer import load_tokenizer

    tok = load_tokenizer(Path(tiny_hub_models["student"]))
    fmt = PromptFormat(chat_template=True, enable_thinking=False, stop_tokens=("<|im_end|>",))
    ids = encode_prompts(tok, [Task("math", "What is 2+2?", "4")], fmt)[0]
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>user\nWhat is 2+2?<|im_end|>") and text.endswith("<think>\n\n</think>\n\n")
    assert fmt.stop_ids(tok) == [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]
    with pytest.raises(ValueError, match="train.stop_tokens"):
        PromptFormat(stop_tokens=("<|nope|>",)).stop_ids(tok)
