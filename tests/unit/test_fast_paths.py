"""Loops replaced by batch calls give what the loops gave: prompt encoding (plain and chat template), completions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from opdgrpo.domains import Task
from opdgrpo.train.rollout import PromptFormat, encode_prompts
from opdgrpo.train.tokenizer import load_tokenizer

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
            "<think>\n\n</think>\n\n{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The smoke profile's tokenizer, built and saved as its job builds it, then loaded back (no models needed)."""
    from opdgrpo.config import compose
    from opdgrpo.plan.build import build_plan
    from opdgrpo.train.tokenizer import build_tokenizer, save_tokenizer

    root = tmp_path_factory.mktemp("tokenizer")
    plan = build_plan(compose(["profile=smoke", f"results_dir={root}/results"], Path(__file__).resolve().parents[2] / "conf"))
    tc = plan.jobs["tokenizer"].config
    out = Path(plan.jobs["tokenizer"].out_dir)
    save_tokenizer(build_tokenizer(tc["domains"], tc["tokenizer"]["vocab_size"], tc["tokenizer"]["samples_per_domain"]), out)
    return load_tokenizer(out)


def _tasks() -> list[Task]:
    prompts = ["3+4*2=", "Write f(x) returning x+1.", "", "3+4*2=", " spaced  out ", "3+4*2=", "Écrire ünïcode"]
    return [Task(domain="math", prompt=p, answer="0") for p in prompts]


def test_plain_prompts_encode_as_one_call_per_row(tokenizer):
    tasks = _tasks()
    expected = [tokenizer(t.prompt, add_special_tokens=False)["input_ids"] for t in tasks]
    assert encode_prompts(tokenizer, tasks) == expected


@pytest.mark.parametrize("thinking", [None, True, False])
def test_chat_prompts_encode_as_one_call_per_row(tokenizer, thinking):
    tokenizer.chat_template = TEMPLATE
    try:
        tasks = _tasks()
        fmt = PromptFormat(chat_template=True, enable_thinking=thinking)
        extra = {} if thinking is None else {"enable_thinking": thinking}
        expected = [tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": t.prompt}], tokenize=False,
                                                            add_generation_prompt=True, **extra),
                              add_special_tokens=False)["input_ids"] for t in tasks]
        got = encode_prompts(tokenizer, tasks, fmt)
        assert got == expected
        assert got[0] is not got[3]   # repeated prompts get their own lists (callers may extend them)
    finally:
        tokenizer.chat_template = None


def test_chat_template_missing_is_an_error_naming_the_key(tokenizer):
    with pytest.raises(ValueError, match="train.chat_template"):
        encode_prompts(tokenizer, _tasks(), PromptFormat(chat_template=True))


def test_completions_are_the_tokens_before_the_first_stop():
    """The sampler's completions equal the row-by-row filter it replaced, on a model that stops at random steps."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from opdgrpo.train.sampling import sample

    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, vocab_size=12, pad_token_id=0, eos_token_id=1,
                         attn_implementation="eager")
    model = Qwen3ForCausalLM(config).eval()
    prompts = [[3, 4], [5], [6, 7, 8], [9, 10, 11, 2]] * 8
    r = sample(model, prompts, max_new_tokens=9, eos_token_id=[1, 2], pad_token_id=0,
               generator=torch.Generator().manual_seed(3))
    generated = r.sequences[:, r.prompt_len:]
    expected = [[t for t, keep in zip(row.tolist(), m.tolist()) if keep and t not in (1, 2)]
                for row, m in zip(generated, r.completion_mask)]
    assert r.completions == expected
    assert {len(c) for c in r.completions} != {0} and any(r.finished) and not all(r.finished)
