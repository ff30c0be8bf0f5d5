"""Instruction following and knowledge: checkers on right, wrong and malformed answers; every generated
task is answerable; held-out prompts never appear in training or pretraining; clear config errors; the
tokenizer keeps prompts and thinking answers short enough for 32 new tokens."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from opdgrpo.domains import Task, build_domain
from opdgrpo.domains.instructions import CONSTRAINT_KINDS, Constraint, check_constraints, constraint_passes, solve
from opdgrpo.domains.knowledge import extract_answer
from opdgrpo.train.tokenizer import build_tokenizer

CONF = Path(__file__).resolve().parents[2] / "conf" / "domain"
MALFORMED = ["", "  \n ", "=>", "12 + 3 ?!", "cat dog =>", "\x00\x01"]


def load(name: str) -> dict:
    return yaml.safe_load((CONF / f"{name}.yaml").read_text())


@pytest.fixture(scope="module")
def ifeval():
    return build_domain(load("ifeval"))


@pytest.fixture(scope="module")
def knowledge():
    return build_domain(load("knowledge"))


def all_tasks(domain) -> list[Task]:
    return domain.training_pool() + [t for tasks in domain.heldout_sets().values() for t in tasks]


# -- instruction following: checkers --------------------------------------------------------------
CASES = {  # constraint: (right answers, wrong answers)
    "lower": (Constraint("lower"), ["cat dog", "[cat, 3]"], ["Cat dog", "CAT"]),
    "upper": (Constraint("upper"), ["CAT DOG", "(SUN)"], ["CAT dog", "cat"]),
    "words": (Constraint("words", count=3), ["cat dog sun", "cat,dog|sun"], ["cat dog", "cat dog sun moon"]),
    "start": (Constraint("start", word="cat"), ["cat dog", "[CAT]"], ["dog cat", "scat dog"]),
    "end": (Constraint("end", word="cat"), ["dog cat", "(dog cat)"], ["cat dog", "dog cats"]),
    "has": (Constraint("has", word="cat"), ["dog CAT sun", "cat"], ["dog sun", "catdog"]),
    "not": (Constraint("not", word="cat"), ["dog sun", "catdog"], ["dog cat", "Cat"]),
    "rep": (Constraint("rep", word="cat", count=2), ["cat dog cat", "CAT CAT"], ["cat dog", "cat cat cat"]),
    "sep": (Constraint("sep", mark="|"), ["cat|dog", "[cat | dog | sun]"], ["cat dog|sun", "cat,dog", "cat"]),
    "wrap": (Constraint("wrap", mark="[]"), ["[cat dog]", " [cat] "], ["cat dog]", "(cat)", "[cat"]),
}


def test_every_constraint_kind_has_a_checker_case():
    assert sorted(CASES) == sorted(CONSTRAINT_KINDS)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_constraint_right_wrong_malformed(kind):
    constraint, right, wrong = CASES[kind]
    for text in right:
        assert check_constraints([constraint], text) == [True], text
        assert check_constraints([constraint], f"some notes {text} => {text}") == [True], text
    for text in wrong + MALFORMED:
        assert check_constraints([constraint], text) == [False], text
    # only the final segment after the last `=>` is checked
    assert check_constraints([constraint], f"{right[0]} => {wrong[0]}") == [False]


def test_unicode_and_very_long_answers():
    cat, three = Constraint("has", word="cat"), Constraint("words", count=3)
    assert check_constraints([cat, three, Constraint("upper")], "ÇAT ÑANDÚ 🐱") == [False, False, True]
    assert check_constraints([cat, three], "gato 猫 кот") == [False, True]
    long = "cat " * 50_000
    assert check_constraints([cat, three, Constraint("rep", word="cat", count=2)], long) == [True, False, False]
    assert check_constraints([three], "x" * 200_000 + " => cat dog sun") == [True]


def test_solve_rejects_contradictions():
    rng = random.Random(0)
    words = ["cat", "dog", "sun"]
    contradictions = [
        [Constraint("lower"), Constraint("upper")],
        [Constraint("has", word="cat"), Constraint("not", word="cat")],
        [Constraint("words", count=1), Constraint("sep", mark=",")],
        [Constraint("words", count=1), Constraint("start", word="cat"), Constraint("end", word="dog")],
        [Constraint("words", count=2), Constraint("rep", word="cat", count=3)],
        [Constraint("start", word="cat"), Constraint("not", word="cat")],
    ]
    for constraints in contradictions:
        assert solve(constraints, words, 4, rng) is None, constraints
    both = [Constraint("start", word="cat"), Constraint("end", word="cat"), Constraint("rep", word="cat", count=2)]
    assert solve(both, words, 4, rng) == "cat cat"


def test_score_and_constraint_rates(ifeval):
    task = Task("ifeval", "inst words=2 upper has=cat\n",
                (Constraint("words", count=2), Constraint("upper"), Constraint("has", word="cat")), {"brief": "CAT SUN"})
    completions = ["CAT SUN", "cat sun", "CAT SUN DOG", "", "2 words upper use cat => DOG CAT"]
    assert ifeval.score([task] * 5, completions) == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert constraint_passes(task, "cat sun") == [True, False, True]
    rates = ifeval.constraint_rates([task] * 5, completions)
    assert rates == {"has": 0.8, "upper": 0.6, "words": 0.6}


# -- instruction following: pools ------------------------------------------------------------------
def test_ifeval_demonstrations_score_on_every_task(ifeval):
    rng = random.Random(0)
    tasks = all_tasks(ifeval) + [ifeval.pretraining_task(rng) for _ in range(500)]
    for style in ("brief", "thinking"):
        assert ifeval.score(tasks, [ifeval.demonstration(t, style) for t in tasks]) == [1.0] * len(tasks), style


def test_ifeval_pool_shapes(ifeval):
    train, held = ifeval.training_pool(), ifeval.heldout_sets()["ifeval"]
    assert {len(t.answer) for t in train} == {1, 2} and {len(t.answer) for t in held} == {2, 3}
    assert all(t.prompt.startswith("inst ") and t.prompt.endswith("\n") for t in train + held)
    assert len({t.prompt for t in train}) == len(train)
    assert {c.kind for t in train for c in t.answer} == set(CONSTRAINT_KINDS)
    assert all(len({c.kind for c in t.answer}) == len(t.answer) for t in train + held)


def test_ifeval_heldout_disjoint_from_training_and_pretraining(ifeval):
    train = {t.prompt for t in ifeval.training_pool()}
    held = {t.prompt for tasks in ifeval.heldout_sets().values() for t in tasks}
    assert held and not train & held
    rng = random.Random(0)
    assert not {ifeval.pretraining_task(rng).prompt for _ in range(5000)} & held


def test_ifeval_pools_are_deterministic():
    first, second = build_domain(load("ifeval")), build_domain(load("ifeval"))
    assert first.training_pool() == second.training_pool()
    assert first.heldout_sets() == second.heldout_sets()


@pytest.mark.parametrize("change,key", [
    ({"constraint_kinds": ["lower", "bold"]}, "constraint_kinds"),
    ({"train": {"constraints": [1, 1], "size": 500}}, "train.size"),
    ({"heldout": {"ifeval": {"constraints": [2, 3], "size": 10**7}}}, "heldout.ifeval.size"),
    ({"train": {"constraints": [0, 2], "size": 10}}, "train.constraints"),
    ({"pretrain_constraints": [1, 11]}, "pretrain_constraints"),
    ({"separators": ["=", ","]}, "separators"),
    ({"wraps": ["["]}, "wraps"),
    ({"words": ["cat", "Dog", "sun"]}, "words"),
])
def test_ifeval_config_errors_name_the_key(change, key):
    with pytest.raises(ValueError, match=f"`{key}`"):
        domain = build_domain({**load("ifeval"), **change})
        domain.training_pool()
        domain.heldout_sets()
        domain.pretraining_task(random.Random(0))


# -- knowledge -------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("red", "red"), (" Red.", "red"), ("zaboli color red => red", "red"), ("b)", "b"), ("red => b", "b"),
    ("", None), ("=>", None), ("red =>", None), ("?!", None), ("ÇAT", "çat"),
])
def test_knowledge_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_knowledge_direct_right_wrong_malformed(knowledge):
    task = knowledge.training_pool()[0]
    wrong = next(v for v in ["red", "blue", "green"] if v != task.answer)
    completions = [knowledge.demonstration(task, "brief"), knowledge.demonstration(task, "thinking"), task.answer.upper() + ".",
                   wrong, f"{task.answer} => {wrong}", "ünïcödé ✓", task.answer * 10_000, *MALFORMED]
    assert knowledge.score([task] * len(completions), completions) == [1.0, 1.0, 1.0] + [0.0] * (len(completions) - 3)


def test_knowledge_choice_answer_is_the_letter(knowledge):
    task = knowledge.heldout_sets()["knowledge_mc"][0]
    value, letter = task.meta["value"], task.answer
    assert f"{letter}){value}" in task.prompt
    other = next(x for x in "abc" if x != letter)
    completions = [letter, f"{letter})", knowledge.demonstration(task, "thinking"), value, other, "", "a b c"]
    expected = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, float(letter == "c")]
    assert knowledge.score([task] * len(completions), completions) == expected
    assert {t.answer for t in knowledge.heldout_sets()["knowledge_mc"]} == {"a", "b", "c"}


def test_knowledge_demonstrations_score_on_every_task(knowledge):
    rng = random.Random(0)
    tasks = all_tasks(knowledge) + [knowledge.pretraining_task(rng) for _ in range(500)]
    for style in ("brief", "thinking"):
        assert knowledge.score(tasks, [knowledge.demonstration(t, style) for t in tasks]) == [1.0] * len(tasks), style


def test_knowledge_heldout_facts_are_pretrained_but_never_their_prompts(knowledge):
    train = knowledge.training_pool()
    held = knowledge.heldout_sets()
    held_prompts = {t.prompt for tasks in held.values() for t in tasks}
    held_pairs = {(t.meta["entity"], t.meta["relation"]) for t in held["knowledge"]}
    assert held_pairs == {(t.meta["entity"], t.meta["relation"]) for t in held["knowledge_mc"]}
    assert not held_pairs & {(t.meta["entity"], t.meta["relation"]) for t in train}
    assert not {t.prompt for t in train} & held_prompts
    rng = random.Random(0)
    pretraining = [knowledge.pretraining_task(rng) for _ in range(20_000)]
    assert not {t.prompt for t in pretraining} & held_prompts
    stated = {(t.meta["entity"], t.meta["relation"]) for t in pretraining if t.meta["phrasing"] == "statement"}
    assert held_pairs <= stated
    assert {t.meta["phrasing"] for t in pretraining} == {"statement", "direct", "choice"}


def test_knowledge_world_and_pools_are_deterministic():
    first, second = build_domain(load("knowledge")), build_domain(load("knowledge"))
    assert first.facts == second.facts and len(first.entities) == 64
    assert first.training_pool() == second.training_pool()
    assert first.heldout_sets() == second.heldout_sets()
    reseeded = build_domain({**load("knowledge"), "seed": 1})
    assert reseeded.facts != first.facts


@pytest.mark.parametrize("change,key", [
    ({"train": {"phrasing": "direct", "size": 10_000}}, "train.size"),
    ({"heldout": {"knowledge": {"phrasing": "statement"}}}, "heldout.knowledge.phrasing"),
    ({"choices": 9}, "choices"),
    ({"entities": 5000}, "entities"),
    ({"pretrain_phrasings": {"poem": 1}}, "pretrain_phrasings"),
    ({"syllables": ["za", False]}, "syllables"),
])
def test_knowledge_config_errors_name_the_key(change, key):
    with pytest.raises(ValueError, match=f"`{key}`"):
        domain = build_domain({**load("knowledge"), **change})
        domain.training_pool()
        domain.heldout_sets()


# -- tokenizer -------------------------------------------------------------------------------------
def test_prompts_and_thinking_fit_the_token_budget():
    cfgs = {name: load(name) for name in ("math", "code", "ifeval", "knowledge")}
    tok = build_tokenizer(cfgs, 384)

    def length(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    rng = random.Random(0)
    for name, cfg in cfgs.items():
        domain = build_domain(cfg)
        tasks = all_tasks(domain) + [domain.pretraining_task(rng) for _ in range(2000)]
        prompt = max(length(t.prompt) for t in tasks)
        thinking = max(length(domain.demonstration(t, "thinking")) for t in tasks)
        print(f"{name}: max prompt {prompt} tokens, max thinking demonstration {thinking} tokens")
        assert prompt <= 24 and thinking <= 28, name
        assert tok.unk_token_id not in tok(tasks[0].prompt + domain.demonstration(tasks[0], "thinking"))["input_ids"]
