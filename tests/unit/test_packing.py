"""Token-budget batches (src/opdgrpo/packing.py): training micro-batches packed under
``train.max_tokens_per_microbatch`` and sampling batches under ``*.max_batch_tokens``."""

from __future__ import annotations

import logging
import random

import pytest

from opdgrpo import packing, schema
from opdgrpo.packing import check_budget, pack_rows, split_to, token_batches


def _cost(group: list[int], prompts: list[int], responses: list[int]) -> int:
    return len(group) * (max(prompts[r] for r in group) + max(responses[r] for r in group))


@pytest.mark.parametrize("seed", range(5))
def test_packing_respects_the_cap_and_covers_every_row_once(seed):
    rng = random.Random(seed)
    prompts = [rng.randint(1, 40) for _ in range(64)]
    responses = [rng.randint(1, 200) for _ in range(64)]
    cap = 1024
    groups = pack_rows(prompts, responses, cap)
    assert sorted(r for g in groups for r in g) == list(range(64))
    assert all(_cost(g, prompts, responses) <= cap for g in groups)
    # packed tensors hold fewer padded tokens than one batch of every row
    assert sum(_cost(g, prompts, responses) for g in groups) <= _cost(list(range(64)), prompts, responses)
    # greedy over the sorted order is as few as possible for that order: no two neighbours fit together
    assert all(_cost(a + b, prompts, responses) > cap for a, b in zip(groups, groups[1:]))


def test_packing_is_deterministic_and_sorted_by_length():
    prompts, responses = [5, 5, 5, 5], [9, 1, 9, 3]
    assert pack_rows(prompts, responses, 1000) == [[1, 3, 0, 2]]
    assert pack_rows(prompts, responses, 28) == [[1, 3], [0, 2]]


def test_a_row_over_the_cap_runs_alone_with_one_warning(caplog, monkeypatch):
    monkeypatch.setattr(packing, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="opdgrpo.packing"):
        groups = pack_rows([4, 4, 4], [2, 50, 60], 20)
        pack_rows([4], [70], 20)
    assert groups == [[0], [1], [2]]
    warnings = [r for r in caplog.records if "train.max_tokens_per_microbatch" in r.getMessage()]
    assert len(warnings) == 1


def test_split_reaches_the_count_within_the_cap():
    prompts, responses = [2] * 10, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    groups = pack_rows(prompts, responses, 60)
    for count in range(len(groups), 11):
        more = split_to(groups, count)
        assert len(more) == count and all(more)
        assert sorted(r for g in more for r in g) == list(range(10))
        assert max(_cost(g, prompts, responses) for g in more) <= 60
    with pytest.raises(ValueError):
        split_to(groups, 11)


def test_token_batches_without_a_budget_are_the_row_batches():
    assert token_batches([3] * 10, 8, 4, None) == [(0, 4), (4, 8), (8, 10)]
    assert token_batches([], 8, 4, None) == []


def test_token_batches_keep_the_kv_cache_within_the_budget():
    rng = random.Random(0)
    prompts = [rng.randint(1, 30) for _ in range(100)]
    batches = token_batches(prompts, 64, 16, 600)
    assert batches[0][0] == 0 and batches[-1][1] == 100
    assert all(a[1] == b[0] for a, b in zip(batches, batches[1:]))   # consecutive, in order
    for start, end in batches:
        assert 0 < end - start <= 16
        assert (end - start) * (max(prompts[start:end]) + 64) <= 600
    # a row too long for the budget runs alone
    assert token_batches([5, 100, 5], 10, 8, 50) == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.parametrize("value", [0, -3, 2.5, "1024", True])
def test_bad_budgets_name_the_key(value):
    with pytest.raises(ValueError, match="train.max_tokens_per_microbatch"):
        check_budget(value, "train.max_tokens_per_microbatch")
    train = {"prompts_per_step": 1, "max_new_tokens": 1, "temperature": 1.0, "eval_every": 1, "checkpoint_every": 1,
             "eval": {"k": 1, "temperature": 0.0, "batch_size": 1}}
    with pytest.raises(ValueError, match="train.max_tokens_per_microbatch"):
        schema.validate({**train, "max_tokens_per_microbatch": value}, "train", where="train")
    with pytest.raises(ValueError, match="train.eval.max_batch_tokens"):
        schema.validate({**train, "eval": {**train["eval"], "max_batch_tokens": value}}, "train", where="train")
    schema.validate({**train, "max_tokens_per_microbatch": None, "eval": {**train["eval"], "max_batch_tokens": 64}},
                    "train", where="train")
