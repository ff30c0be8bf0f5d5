"""``domains.<d>.pretrain_slip``: a share of the students' pretraining answers slips (one stray token of the
domain's own after the right answer), which each verifier reads as wrong; absent, the world is unchanged."""

from __future__ import annotations

import random

import pytest

from opdgrpo.config import ConfigError, compose
from opdgrpo.domains import build_domain
from opdgrpo.domains.base import Slip

KINDS = ("math", "code", "knowledge", "ifeval")


def _domains(*overrides: str) -> dict:
    """The smoke world (which slips, as tiny does) with no slip unless ``overrides`` set one."""
    cfg = compose(["profile=smoke", *(f"domains.{d}.pretrain_slip=0" for d in KINDS), *overrides])
    return {name: build_domain(cfg["domains"][name]) for name in KINDS}


def _pretraining(domain, n: int = 300) -> list:
    rng = random.Random(0)
    return [domain.pretraining_task(rng) for _ in range(n)]


def test_absent_or_zero_changes_no_demonstration():
    plain = {name: build_domain({k: v for k, v in cfg.items() if k != "pretrain_slip"})
             for name, cfg in compose(["profile=smoke"])["domains"].items() if name in KINDS}
    zero = _domains()
    for name in KINDS:
        tasks = _pretraining(plain[name])
        for style in ("brief", "thinking"):
            assert [plain[name].demonstration(t, style) for t in tasks] == \
                   [zero[name].demonstration(t, style) for t in tasks]


def test_a_slip_is_a_stray_token_after_the_right_answer_that_the_verifier_reads_as_wrong():
    plain, slipping = _domains(), _domains(*(f"domains.{d}.pretrain_slip=0.5" for d in KINDS))
    for name in KINDS:
        tasks = _pretraining(plain[name])
        clean = [plain[name].demonstration(t, "brief") for t in tasks]
        demos = [slipping[name].demonstration(t, "brief") for t in tasks]
        slipped = [i for i, (a, b) in enumerate(zip(clean, demos)) if a != b]
        assert 0.4 * len(tasks) < len(slipped) < 0.6 * len(tasks), name      # a hashed half of the prompts
        assert all(len(demos[i].split()) == len(clean[i].split()) + 1 for i in slipped), name   # one stray token
        right = plain[name].score(tasks, clean)
        wrong = slipping[name].score(tasks, demos)
        broken = [i for i in slipped if right[i] == 1.0 and wrong[i] == 0.0]
        if name == "ifeval":   # a stray word breaks only the constraints that see it (end=, words=, rep=, ...)
            assert len(broken) > 0.3 * len(slipped)
        else:
            assert len(broken) == sum(1 for i in slipped if right[i] == 1.0), name
        # the teachers' step-by-step answers never slip
        assert [slipping[name].demonstration(t, "thinking") for t in tasks] == \
               [plain[name].demonstration(t, "thinking") for t in tasks], name


def test_the_same_prompt_always_slips_the_same_way():
    domain = _domains("domains.math.pretrain_slip=0.5")["math"]
    tasks = _pretraining(domain, 50)
    assert [domain.demonstration(t, "brief") for t in tasks] == [domain.demonstration(t, "brief") for t in tasks]


@pytest.mark.parametrize("value", [1.0, -0.1, "x"])
def test_a_bad_rate_names_the_key(value):
    with pytest.raises(ConfigError, match="domains.code.pretrain_slip"):
        compose(["profile=smoke", f"domains.code.pretrain_slip={value}"])
    with pytest.raises(ValueError, match="pretrain_slip"):
        Slip.from_config({"pretrain_slip": True}, "code")


def test_a_hub_domain_refuses_it():
    with pytest.raises(ConfigError, match="domains.math.pretrain_slip.*no pretraining stage"):
        compose(["profile=paper", "+domains.math.pretrain_slip=0.3"])


def test_the_tiny_world_slips_half_of_every_domain_and_the_domain_files_none():
    tiny = compose(["profile=tiny"])["domains"]
    assert {d: tiny[d]["pretrain_slip"] for d in KINDS} == {d: 0.5 for d in KINDS}
    assert {d: domain.slip.rate for d, domain in _domains().items()} == {d: 0.0 for d in KINDS}
