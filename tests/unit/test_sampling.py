"""The rollout sampler: agrees with HF generate, handles padding and EOS, counts the FLOPs it computed."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen3Config, Qwen3ForCausalLM

from opdgrpo.train import flops
from opdgrpo.train.sampling import Rollouts, sample

PAD, EOS = 0, 1
SHAPES = {
    "gqa": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
                intermediate_size=96, vocab_size=200, tie_word_embeddings=False),
    "head_dim": dict(hidden_size=48, num_attention_heads=2, num_key_value_heads=1, head_dim=32, num_hidden_layers=1,
                     intermediate_size=64, vocab_size=120, tie_word_embeddings=True),
}


def make_model(name: str = "gqa", eos_bias: float = 0.0) -> torch.nn.Module:
    """A random eager Qwen3 (float32: HF's eager attention gives NaN on left padding in float64). A larger
    init than the default spreads the logits so greedy ties cannot flip with the batch layout; ``eos_bias``
    adds an LM-head bias on EOS so rows stop early."""
    torch.manual_seed(0)
    config = Qwen3Config(**SHAPES[name], pad_token_id=PAD, eos_token_id=EOS, bos_token_id=EOS,
                         initializer_range=0.1, attn_implementation="eager")
    model = Qwen3ForCausalLM(config).eval()
    if eos_bias:
        bias = torch.zeros(config.vocab_size)
        bias[EOS] = eos_bias
        model.lm_head.bias = torch.nn.Parameter(bias)
    return model


def make_prompts(lengths: list[int], vocab: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lengths]


LENGTHS = [3, 7, 5, 1, 4, 4, 6, 2]


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def run(model, prompts, max_new_tokens=8, **kwargs) -> Rollouts:
    return sample(model, prompts, max_new_tokens=max_new_tokens, eos_token_id=EOS, pad_token_id=PAD, **kwargs)


def check_consistent(r: Rollouts, prompts: list[list[int]], max_new_tokens: int) -> None:
    batch, width = len(prompts), max(map(len, prompts))
    steps = r.completion_mask.shape[1]
    assert r.prompt_len == width and 1 <= steps <= max_new_tokens
    assert r.sequences.shape == r.attention_mask.shape == (batch, width + steps)
    ids, mask = left_pad(prompts)
    assert torch.equal(r.sequences[:, :width], ids)
    assert torch.equal(r.attention_mask, torch.cat([mask, r.completion_mask.long()], dim=1))
    for row in range(batch):
        keep = r.completion_mask[row]
        n = int(keep.sum())
        assert keep[:n].all() and not keep[n:].any()  # a prefix
        generated = r.sequences[row, width:].tolist()
        assert all(t == PAD for t in generated[n:])
        ended = n > 0 and generated[n - 1] == EOS
        assert bool(r.finished[row]) == ended
        assert EOS not in generated[: n - 1]
        assert r.completions[row] == generated[: n - 1 if ended else n]
        if not ended:
            assert n == max_new_tokens
    if r.finished.all():
        assert steps == max(len(c) for c in r.completions) + 1
    else:
        assert steps == max_new_tokens


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("eos_bias", [0.0, 1.0, 2.0])
def test_greedy_matches_generate(name, eos_bias):
    model = make_model(name, eos_bias)
    prompts = make_prompts(LENGTHS, model.config.vocab_size)
    r = run(model, prompts, temperature=0)
    ids, mask = left_pad(prompts)
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=PAD,
                              eos_token_id=EOS)
    assert torch.equal(r.sequences, expected)
    check_consistent(r, prompts, 8)


def test_early_stopping_is_exercised():
    """The EOS bias of 2 stops some rows but not all: the compaction path runs in the test above."""
    model = make_model("gqa", 2.0)
    r = run(model, make_prompts(LENGTHS, model.config.vocab_size), temperature=0)
    assert r.finished.any() and not r.finished.all()
    assert len({len(c) for c in r.completions}) > 1


@pytest.mark.parametrize("eos_bias", [0.0, 1.5])
def test_left_padding(eos_bias):
    model = make_model("gqa", eos_bias)
    prompts = make_prompts(LENGTHS, model.config.vocab_size)
    batched = run(model, prompts, temperature=0)
    for row, prompt in enumerate(prompts):
        alone = run(model, [prompt], temperature=0)
        assert alone.completions[0] == batched.completions[row]
        assert bool(alone.finished[0]) == bool(batched.finished[row])


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("eos_bias,seed", [(-50.0, 0), (3.0, 1), (4.0, 2), (5.0, 3)])
def test_flops_match_counter(name, eos_bias, seed):
    model = make_model(name, eos_bias)
    prompts = make_prompts(LENGTHS * 2, model.config.vocab_size, seed)
    with FlopCounterMode(display=False) as counter:
        r = run(model, prompts, max_new_tokens=10, generator=torch.Generator().manual_seed(seed))
    measured = counter.get_total_flops()
    assert abs(r.flops - measured) / measured < 0.01
    # Prefill of the whole padded block, then one token per row still running after each step.
    fed = (r.completion_mask.sum(dim=1) - 1).clamp(min=0)
    assert r.tokens_computed == len(prompts) * r.prompt_len + int(fed.sum())
    # Exactly: decode step t feeds the rows whose completion is longer than t, against P + t cached positions.
    lengths = r.completion_mask.sum(dim=1)
    expected = flops.prefill_flops(model.config, len(prompts), r.prompt_len) + sum(
        flops.decode_step_flops(model.config, int((lengths > t).sum()), r.prompt_len + t)
        for t in range(1, r.completion_mask.shape[1])
    )
    assert r.flops == pytest.approx(expected, rel=1e-12)
    if eos_bias < 0:  # EOS is never drawn, so nobody stops: exactly generate's cost
        assert not r.finished.any()
        assert r.flops == flops.generate_flops(model.config, len(prompts), r.prompt_len, 10)


def test_all_rows_stop_at_once():
    model = make_model("gqa", 50.0)  # EOS always
    prompts = make_prompts(LENGTHS, model.config.vocab_size)
    r = run(model, prompts, generator=torch.Generator().manual_seed(0))
    assert r.finished.all() and r.completions == [[]] * len(prompts)
    assert r.sequences.shape == (len(prompts), r.prompt_len + 1)
    assert r.flops == flops.prefill_flops(model.config, len(prompts), r.prompt_len)
    assert r.tokens_computed == len(prompts) * r.prompt_len
    check_consistent(r, prompts, 8)


@pytest.mark.parametrize("eos_bias", [0.0, 3.0])
def test_sampled_rollouts_are_consistent(eos_bias):
    model = make_model("gqa", eos_bias)
    prompts = make_prompts(LENGTHS * 4, model.config.vocab_size)
    r = run(model, prompts, max_new_tokens=12, generator=torch.Generator().manual_seed(5))
    check_consistent(r, prompts, 12)
    if eos_bias:
        assert r.finished.any() and not r.finished.all()


def test_same_seed_same_samples():
    model = make_model("gqa", 2.5)
    prompts = make_prompts(LENGTHS * 2, model.config.vocab_size)
    a, b, c = (run(model, prompts, generator=torch.Generator().manual_seed(s)) for s in (7, 7, 8))
    assert torch.equal(a.sequences, b.sequences) and a.flops == b.flops
    assert not torch.equal(a.sequences, c.sequences)
    assert a.sequences[:, a.prompt_len:].unique().numel() > 20  # really sampled, not greedy


def test_truncation_to_one_token_is_greedy():
    model = make_model("gqa", 1.0)
    prompts = make_prompts(LENGTHS, model.config.vocab_size)
    greedy = run(model, prompts, temperature=0).sequences
    g = torch.Generator().manual_seed(0)
    assert torch.equal(run(model, prompts, top_k=1, generator=g).sequences, greedy)
    assert torch.equal(run(model, prompts, top_p=1e-6, generator=g).sequences, greedy)


def first_token_samples(model, prompt, n, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Empirical first-token frequencies over ``n`` samples, and the model's next-token distribution."""
    r = run(model, [prompt] * n, max_new_tokens=1, generator=torch.Generator().manual_seed(0), **kwargs)
    counts = torch.bincount(r.sequences[:, -1], minlength=model.config.vocab_size).float()
    with torch.no_grad():
        probs = model(torch.tensor([prompt])).logits[0, -1].softmax(-1)
    return counts / n, probs


def test_samples_follow_full_distribution():
    """No hidden top-k: tokens come from the whole softmax (transformers' generate defaults to top_k=50)."""
    model = make_model("head_dim")  # vocab 120
    prompt = make_prompts([5], model.config.vocab_size)[0]
    freq, probs = first_token_samples(model, prompt, 20000)
    assert 0.5 * (freq - probs).abs().sum() < 0.04  # total variation: about 0.025 from sampling noise
    top50 = torch.zeros_like(probs).scatter(0, probs.topk(50).indices, 1.0)
    assert freq[top50 == 0].sum() > 0.2  # a top-50 truncation would put nothing there


def test_top_k_and_temperature():
    model = make_model("head_dim")
    prompt = make_prompts([5], model.config.vocab_size)[0]
    freq, probs = first_token_samples(model, prompt, 3000, top_k=5)
    top = probs.topk(5).indices
    assert freq[top].sum() == 1.0
    target = torch.zeros_like(probs)
    target[top] = probs[top] / probs[top].sum()
    assert 0.5 * (freq - target).abs().sum() < 0.05
    freq, probs = first_token_samples(model, prompt, 3000, top_p=0.3)
    sorted_probs, order = probs.sort(descending=True)
    size = int((sorted_probs.cumsum(0) < 0.3).sum()) + 1  # smallest prefix holding 30% of the mass
    nucleus = order[:size]
    assert freq[nucleus].sum() == 1.0 and (freq[nucleus] > 0).all()
    freq, probs = first_token_samples(model, prompt, 20000, temperature=0.5)
    with torch.no_grad():
        sharp = (model(torch.tensor([prompt])).logits[0, -1] / 0.5).softmax(-1)
    assert 0.5 * (freq - sharp).abs().sum() < 0.04
    assert 0.5 * (freq - probs).abs().sum() > 0.15  # the temperature did change the distribution


def test_rejects_bad_arguments():
    model = make_model("gqa")
    with pytest.raises(ValueError):
        run(model, [[5, 6], []])
    with pytest.raises(ValueError):
        run(model, [[5, 6]], max_new_tokens=0)


@pytest.mark.parametrize("eos_bias,seed", [(-50.0, 0), (4.0, 1)])
def test_olmo3_sampler_flops_match_counter_past_the_window(eos_bias, seed):
    """Our sampler on a random Olmo-3 whose window (6) the rows outgrow: the sliding layers' cache keeps window - 1
    positions and finished rows leave it, and the ledger's count is what the counter sees."""
    from transformers import Olmo3Config, Olmo3ForCausalLM

    torch.manual_seed(0)
    config = Olmo3Config(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
                         intermediate_size=80, vocab_size=150, sliding_window=6, pad_token_id=PAD, eos_token_id=EOS,
                         bos_token_id=EOS, initializer_range=0.1, attn_implementation="eager")
    model = Olmo3ForCausalLM(config).eval()
    bias = torch.zeros(config.vocab_size)
    bias[EOS] = eos_bias
    model.lm_head.bias = torch.nn.Parameter(bias)
    prompts = make_prompts(LENGTHS, config.vocab_size, seed)
    with FlopCounterMode(display=False) as counter:
        r = run(model, prompts, max_new_tokens=10, generator=torch.Generator().manual_seed(seed))
    assert r.prompt_len + r.completion_mask.shape[1] > config.sliding_window
    assert r.flops == counter.get_total_flops()
    check_consistent(r, prompts, 10)
