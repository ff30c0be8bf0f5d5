"""Verifiers on right, wrong and malformed answers; pools disjoint from held-out sets; the tokenizer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from opdgrpo.config import compose
from opdgrpo.domains import build_domain
from opdgrpo.domains.math import evaluate, extract_answer
from opdgrpo.train.tokenizer import build_tokenizer

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(scope="module")
def cfg():
    return compose(["profile=smoke"], CONF)   # not the working directory's conf/


@pytest.fixture(scope="module")
def math_domain(cfg):
    return build_domain(cfg["domains"]["math"])


@pytest.fixture(scope="module")
def code_domain(cfg):
    return build_domain(cfg["domains"]["code"])


def test_math_precedence_and_steps():
    value, steps = evaluate([2, 3, 4, 1], ["+", "*", "-"])
    assert value == 2 + 3 * 4 - 1 == 13
    assert steps == ["3*4=12", "2+12=14", "14-1=13"]


@pytest.mark.parametrize("text,expected", [("16", 16), ("7*3=21 21-5=16", 16), ("-3", -3), ("so 4 then 12", 12), ("", None), ("no digits", None)])
def test_math_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_math_verifier_right_wrong_malformed(math_domain):
    task = math_domain.training_pool()[0]
    brief, thinking = math_domain.demonstration(task, "brief"), math_domain.demonstration(task, "thinking")
    wrong = str(task.answer + 1)
    assert math_domain.score([task] * 5, [brief, thinking, wrong, "", "=*="]) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_math_heldout_disjoint_from_training_and_pretraining(math_domain):
    train = {t.prompt for t in math_domain.training_pool()}
    held = {t.prompt for tasks in math_domain.heldout_sets().values() for t in tasks}
    assert held and not train & held
    rng = random.Random(0)
    assert not {math_domain.pretraining_task(rng).prompt for _ in range(3000)} & held


def test_math_pool_too_large_is_a_clear_error(cfg):
    bad = dict(cfg["domains"]["math"], train={"operators": 1, "size": 10_000})
    with pytest.raises(ValueError, match="distinct 1-operator expressions"):
        build_domain(bad).training_pool()


def test_code_verifier_right_wrong_malformed(code_domain):
    task = code_domain.training_pool()[0]
    right = [code_domain.demonstration(task, "brief"), code_domain.demonstration(task, "thinking")]
    visible_only = " return {" + ", ".join(f"{x}: {v}" for x, v in task.meta["values"].items() if x in code_domain.visible_x) + "}[x]"
    wrong = [" return x", " return (", "garbage text", visible_only, " while True: pass"]
    assert code_domain.score([task] * 7, right + wrong) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_code_thinking_demonstrations_work_every_function_out():
    """The tiny world's families, the quadratic with a slope included: a teacher's demonstration of every function
    passes the hidden tests and works the constants out from the visible values (never the bare expression, which
    would teach recall, not the skill the held-out functions need)."""
    domain = build_domain(compose(["profile=tiny"], CONF)["domains"]["code"])
    tasks = domain.training_pool() + [t for tasks in domain.heldout_sets().values() for t in tasks]
    assert any("x*x*" in t.meta["expression"] and "+" in t.meta["expression"] for t in tasks)
    assert domain.score(tasks, [domain.demonstration(t, "thinking") for t in tasks]) == [1.0] * len(tasks)
    for t in tasks:
        steps = domain._demonstration(t, "thinking")
        assert "\n" in steps and steps.rstrip().endswith(("x*a+b", "x*x*a", "x*x+b", "x*x*a+b")), (t.meta, steps)


def test_a_family_the_demonstrations_do_not_know_is_a_clear_error(cfg):
    with pytest.raises(ValueError, match=r"domains\.code\.families.*x\*x\*a\+b"):
        build_domain(dict(cfg["domains"]["code"], families=["x*{a}+{b}", "{b}-x*x"]))


def test_code_fraction_reward(cfg):
    domain = build_domain(dict(cfg["domains"]["code"], reward="fraction"))
    task = domain.training_pool()[0]
    expr = task.meta["expression"]
    # right on the hidden inputs 3 and 4 only (of 3, 4, 5, 7, 10): 2/5
    partial = f" return ({expr}) if x < 5 else -999"
    assert domain.score([task, task, task], [" return " + expr, partial, " return -999"]) == [1.0, 0.4, 0.0]


def test_code_heldout_disjoint(code_domain):
    train = {t.meta["expression"] for t in code_domain.training_pool()}
    held = {t.meta["expression"] for tasks in code_domain.heldout_sets().values() for t in tasks}
    assert held and not train & held


def test_code_rl_share_is_never_pretrained(cfg):
    """``rl_fraction``: RL's training pool is its own hashed share, disjoint from held-out and from every function
    pretraining shows; without it RL trains on the pretraining functions (the default)."""
    domain = build_domain(dict(cfg["domains"]["code"], rl_fraction=0.25))
    train = {t.meta["expression"] for t in domain.training_pool()}
    held = {t.meta["expression"] for tasks in domain.heldout_sets().values() for t in tasks}
    rng = random.Random(0)
    pretrained = {domain.pretraining_task(rng).meta["expression"] for _ in range(3000)}
    assert train and held and pretrained
    assert not train & held and not train & pretrained and not held & pretrained
    default = build_domain(cfg["domains"]["code"])
    assert {t.meta["expression"] for t in default.training_pool()} >= pretrained
    with pytest.raises(ValueError, match=r"domains\.code\.rl_fraction"):
        build_domain(dict(cfg["domains"]["code"], rl_fraction=0.75))


def test_unknown_domain_kind_names_it(cfg):
    with pytest.raises(ValueError, match="unknown kind 'poetry'"):
        build_domain(dict(cfg["domains"]["math"], kind="poetry"))


def test_tokenizer_round_trip_and_size(cfg):
    tok = build_tokenizer(cfg["domains"], 256, samples_per_domain=200)
    assert len(tok) == 256
    for domain_cfg in cfg["domains"].values():
        domain = build_domain(domain_cfg)
        task = domain.training_pool()[1]
        for style in ("brief", "thinking"):
            text = task.prompt + domain.demonstration(task, style)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert tok.decode(ids) == text
            # prompt tokens are a prefix of prompt+answer tokens: sampling continues the same ids
            assert ids[: len(tok(task.prompt, add_special_tokens=False)["input_ids"])] == tok(task.prompt, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in tok("calc 1+2=3 x*a+b", add_special_tokens=False)["input_ids"]
