"""Token-budget batches (src/opdgrpo/train/packing.py): training micro-batches packed under
``train.max_tokens_per_microbatch`` and sampling batches under ``*.max_batch_tokens``."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from opdgrpo import schema
from opdgrpo.train import packing
from opdgrpo.train.packing import check_budget, pack_rows, split_to, token_batches


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
    with caplog.at_level(logging.WARNING, logger="opdgrpo.train.packing"):
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


# --------------------------------------------------------------------------------------------------------------------
# Repacking sampled shards (src/opdgrpo/train/microbatch.py)

PAD = 0


def _shard(prompts: list[list[int]], responses: list[list[int]], first: int):
    """A sampled shard as the sampler lays it out: left-padded prompts, responses padded after their end."""
    from opdgrpo.domains import Task
    from opdgrpo.train.objectives import Shard
    from opdgrpo.train.rollout import ScoredRollouts
    from opdgrpo.train.sampling import Rollouts

    P, T = max(map(len, prompts)), max(map(len, responses))
    seqs = torch.full((len(prompts), P + T), PAD, dtype=torch.long)
    attn = torch.zeros_like(seqs)
    mask = torch.zeros((len(prompts), T), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        seqs[i, P - len(p): P + len(r)] = torch.tensor(p + r)
        attn[i, P - len(p): P + len(r)] = 1
        mask[i, : len(r)] = True
    rollouts = Rollouts(seqs, attn, mask, P, [r[:-1] for r in responses], torch.ones(len(prompts), dtype=torch.bool), 0.0, 0)
    tasks = [Task("math", f"prompt {first + i}", None) for i in range(len(prompts))]
    rewards = torch.tensor([float((first + i) % 2) for i in range(len(prompts))])
    return Shard(tasks, ScoredRollouts(tasks, rollouts, [f"text {first + i}" for i in range(len(prompts))], rewards))


def _rows(seed: int, n: int) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    return ([[rng.randint(2, 60) for _ in range(rng.randint(1, 6))] for _ in range(n)],
            [[rng.randint(2, 60) for _ in range(rng.randint(1, 12))] for _ in range(n)])


def test_repack_keeps_every_row_and_its_values_within_the_cap():
    """Rows of two sampled shards repacked: each row exactly once with its tokens, reward, text and advantage; each
    micro-batch within the cap; as many micro-batches as ``agree`` asks (another process packed more)."""
    from opdgrpo.train.microbatch import repack

    shards = [_shard(*_rows(s, 8), first=8 * s) for s in range(2)]
    advantages = {id(s): torch.arange(8, dtype=torch.float32) + 100 * i for i, s in enumerate(shards)}
    asked: list[int] = []

    def agree(count: int) -> int:
        asked.append(count)
        return count + 2

    packed = repack(shards, 40, agree, PAD, lambda s: advantages[id(s)])
    assert len(packed) == asked[0] + 2
    seen = {}
    for m in packed:
        assert m.sequences.numel() <= 40 or m.sequences.shape[0] == 1
        for i, task in enumerate(m.tasks):
            seen[task.prompt] = (m.sequences[i][m.attention_mask[i].bool()].tolist(), float(m.scored.rewards[i]),
                                 m.scored.texts[i], float(m.advantages[i]), m.mask[i].sum().item())
    assert len(seen) == 16
    for s, shard in enumerate(shards):
        for i, task in enumerate(shard.tasks):
            tokens, reward, text, advantage, n = seen[task.prompt]
            assert tokens == shard.sequences[i][shard.attention_mask[i].bool()].tolist()
            assert (reward, text, advantage, n) == (float(shard.scored.rewards[i]), shard.scored.texts[i],
                                                   float(advantages[id(shard)][i]), shard.mask[i].sum().item())


def test_repacked_rows_have_the_same_log_probs():
    """A row's response log-probs do not depend on the rows packed with it (padding is masked, positions kept)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from opdgrpo.train.losses import token_logprobs
    from opdgrpo.train.microbatch import repack
    from opdgrpo.train.objectives import position_ids

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, pad_token_id=PAD, attn_implementation="eager")
    model = Qwen3ForCausalLM(config).eval()

    def logprobs(shard) -> dict[str, list[float]]:
        attn = shard.attention_mask
        with torch.no_grad():
            logits = model(input_ids=shard.sequences, attention_mask=attn, position_ids=position_ids(attn),
                           logits_to_keep=shard.new_tokens + 1).logits[:, :-1]
        lp = token_logprobs(logits, shard.targets)
        return {t.prompt: lp[i][shard.mask[i]] for i, t in enumerate(shard.tasks)}

    shards = [_shard(*_rows(s, 6), first=6 * s) for s in range(2)]
    before = {k: v for s in shards for k, v in logprobs(s).items()}
    after = {k: v for m in repack(shards, 50, lambda c: c, PAD, lambda s: None) for k, v in logprobs(m).items()}
    assert before.keys() == after.keys()
    for k in before:
        torch.testing.assert_close(after[k], before[k], rtol=1e-5, atol=1e-5)
