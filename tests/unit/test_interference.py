"""Domain interference (``domains.<name>.interference``; docs/method.md, "Domain interference").

At strength 0 the world is byte-identical to the one before the knob existed (pinned hashes of the pools, held-out
sets, pretraining draws and demonstrations, computed with the builders as they were); at strength s a hashed share
s of every pool takes the shared form (prefix ``ask ``, the response wrapped in the domain's own marks), and each
verifier scores its own convention right and every other domain's convention wrong on that same surface form;
pretraining shows the shared form in every domain's marks, so the base model does not know which domain wants which.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
import yaml

from opdgrpo.config import ConfigError, compose
from opdgrpo.domains import KINDS, build_domain
from opdgrpo.domains.base import SHARED_PREFIX, SHARED_WRAPS, is_shared
from opdgrpo.train.tokenizer import build_tokenizer

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("math", "code", "ifeval", "knowledge")
# sha256 prefixes of `_digest` over conf/domain/<name>.yaml, computed with the domain builders of commit 3a4745b
# (before the knob existed). A change here means strength 0 no longer reproduces today's world.
PINNED = {"math": "c2a0e460476b785c", "code": "4dc8116165922a1c", "ifeval": "df19028fa97dfb93",
          "knowledge": "4fc33f97c78388ff"}


def load(name: str, **change) -> dict:
    return {**yaml.safe_load((ROOT / "conf" / "domain" / f"{name}.yaml").read_text()), **change}


def _digest(domain) -> str:
    rng = random.Random(0)
    draws = [domain.pretraining_task(rng) for _ in range(200)]
    rows = [(t.prompt, repr(t.answer)) for t in domain.training_pool()]
    rows += [(s, t.prompt, repr(t.answer)) for s, ts in domain.heldout_sets().items() for t in ts]
    rows += [(t.prompt, domain.demonstration(t, "brief"), domain.demonstration(t, "thinking")) for t in draws]
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def _canonical(domain, prompt: str) -> str:
    return domain.prefix + prompt[len(SHARED_PREFIX):] if prompt.startswith(SHARED_PREFIX) else prompt


@pytest.fixture(scope="module")
def half():
    return {name: build_domain(load(name, interference=0.5)) for name in NAMES}


@pytest.fixture(scope="module")
def full():
    return {name: build_domain(load(name, interference=1.0)) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("change", [{}, {"interference": 0}, {"interference": 0.0}, {"interference": None}])
def test_strength_zero_is_the_old_world(name, change):
    domain = build_domain(load(name, **change))
    assert _digest(domain) == PINNED[name]
    assert not hasattr(domain, "extra_metrics")   # evals.jsonl keeps its old shape too


@pytest.mark.parametrize("name", NAMES)
def test_shared_share_follows_the_strength_and_keeps_the_instances(name, half):
    domain, old = half[name], build_domain(load(name))
    pools = {"train": domain.training_pool()} | domain.heldout_sets()
    old_pools = {"train": old.training_pool()} | old.heldout_sets()
    for key, tasks in pools.items():
        share = sum(map(is_shared, tasks)) / len(tasks)
        assert abs(share - 0.5) < 0.1, (key, share)
        assert all(t.prompt.startswith(SHARED_PREFIX) == is_shared(t) for t in tasks)
        # the knob changes the form of a prompt, never which instances a pool holds (nor the held-out split)
        assert [_canonical(domain, t.prompt) for t in tasks] == [t.prompt for t in old_pools[key]]
    rng = random.Random(1)
    draws = list({t.prompt: t for t in (domain.pretraining_task(rng) for _ in range(600))}.values())  # distinct prompts
    assert abs(sum(map(is_shared, draws)) / len(draws) - 0.5) < 0.1


@pytest.mark.parametrize("name", NAMES)
def test_heldout_stays_disjoint_from_training(name, half):
    from opdgrpo.domains import heldout_overlap

    domain = half[name]
    assert heldout_overlap(name, domain.training_pool(), domain.heldout_sets()) is None


def _rewrap(text: str, wrap: str) -> str:
    return wrap[0] + text[1:-1] + wrap[1]


@pytest.mark.parametrize("name", NAMES)
def test_own_convention_scores_and_every_other_domains_fails(name, full):
    domain = full[name]
    tasks = domain.training_pool()[:24] + next(iter(domain.heldout_sets().values()))[:8]
    assert all(is_shared(t) and t.prompt.startswith(SHARED_PREFIX) for t in tasks)
    for style in ("brief", "thinking"):
        demos = [domain.demonstration(t, style) for t in tasks]
        assert all(d[0] == domain.SHARED_WRAP[0] and d[-1] == domain.SHARED_WRAP[1] for d in demos)
        assert domain.score(tasks, demos) == [1.0] * len(tasks), style
        assert domain.score(tasks, [d[1:-1] for d in demos]) == [0.0] * len(tasks), "bare answer: the own form's convention"
        for other in NAMES:
            if other != name:
                wrong = [_rewrap(d, full[other].SHARED_WRAP) for d in demos]
                assert domain.score(tasks, wrong) == [0.0] * len(tasks), (style, other)


@pytest.mark.parametrize("name", NAMES)
def test_pretraining_shows_every_domains_marks_on_the_shared_form(name, full):
    """A base model sees the shared form answered in all four domains' marks (drawn uniformly), not which domain wants
    which; the pools' own demonstrations (used by tests and teachers' targets) keep the domain's marks."""
    from collections import Counter

    domain, rng = full[name], random.Random(2)
    demos = [domain.demonstration(domain.pretraining_task(rng), "brief") for _ in range(800)]
    opened = Counter(d[0] + d[-1] for d in demos)
    assert set(opened) == set(SHARED_WRAPS)
    assert all(abs(n / len(demos) - 1 / len(SHARED_WRAPS)) < 0.06 for n in opened.values()), opened
    assert {domain.demonstration(t, "brief")[0] for t in domain.training_pool()[:50]} == {domain.SHARED_WRAP[0]}


def test_the_shared_surface_form_is_one_for_every_domain(full):
    """Same prefix, distinct marks: the domain is told only by the prompt's content."""
    prompts = {name: d.training_pool()[0].prompt for name, d in full.items()}
    assert all(p.startswith(SHARED_PREFIX) for p in prompts.values())
    assert all(not p.startswith(d.prefix) for p, d in zip(prompts.values(), full.values()))
    assert {KINDS[load(n)["kind"]].SHARED_WRAP for n in NAMES} == set(SHARED_WRAPS)


def test_own_form_prompts_keep_their_convention(half):
    """Prompts in the domain's own form score as before (a wrapped math answer still reads its last integer, a
    wrapped code body does not run: the shared convention leaks into the own form as it would into real prompts)."""
    for name, domain in half.items():
        own = [t for t in domain.training_pool() if not is_shared(t)][:16]
        assert domain.score(own, [domain.demonstration(t, "brief") for t in own]) == [1.0] * len(own), name
    code = half["code"]
    own = [t for t in code.training_pool() if not is_shared(t)][:4]
    assert code.score(own, ["{" + code.demonstration(t, "brief") + "}" for t in own]) == [0.0] * 4


def test_extra_metrics_split_shared_and_own(half):
    domain = half["math"]
    tasks = domain.heldout_sets()["amc"][:40]
    answers = [domain.demonstration(t, "brief") if is_shared(t) else "x" for t in tasks]
    metrics = domain.extra_metrics(tasks, answers)
    assert metrics["shared_accuracy"] == 1.0 and metrics["own_accuracy"] == 0.0
    assert metrics["shared_share"] == sum(map(is_shared, tasks)) / len(tasks)


def test_ifeval_constraint_rates_need_the_wrapper(full):
    domain = full["ifeval"]
    tasks = domain.training_pool()[:10]
    wrapped = domain.constraint_rates(tasks, [domain.demonstration(t, "brief") for t in tasks])
    bare = domain.constraint_rates(tasks, [domain.demonstration(t, "brief")[1:-1] for t in tasks])
    assert set(wrapped.values()) == {1.0} and set(bare.values()) == {0.0}


def test_shared_form_fits_the_token_budget(full):
    tok = build_tokenizer({n: load(n, interference=1.0) for n in NAMES}, 384, samples_per_domain=500)
    rng = random.Random(0)
    for name, domain in full.items():
        tasks = domain.training_pool()[:200] + [domain.pretraining_task(rng) for _ in range(500)]
        thinking = max(len(tok(domain.demonstration(t, "thinking"), add_special_tokens=False)["input_ids"]) for t in tasks)
        assert thinking <= 30, name    # 32 new tokens in tiny, EOS included
        assert tok.unk_token_id not in tok(tasks[0].prompt + domain.demonstration(tasks[0], "thinking"))["input_ids"]


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_out_of_range_strength_names_the_key(value):
    with pytest.raises(ValueError, match="`interference`"):
        build_domain(load("math", interference=value))
    with pytest.raises(ConfigError, match=r"domains\.math\.interference"):
        compose(["profile=smoke", f"domains.math.interference={value}"], ROOT / "conf")


def test_a_hub_domain_refuses_interference():
    with pytest.raises(ConfigError, match=r"domains\.math\.interference.*no shared form"):
        compose(["profile=paper", "+domains.math.interference=0.5"], ROOT / "conf")


def test_smoke_composes_with_interference():
    cfg = compose(["profile=smoke", "domains.math.interference=0.5", "domains.code.interference=0.5"], ROOT / "conf")
    assert cfg["domains"]["math"]["interference"] == 0.5
