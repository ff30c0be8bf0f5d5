"""train.packed_row_tokens (src/opdgrpo/train/packed_rows.py): rows laid end to end give the padded forward's logits
at the response positions, hence its loss and gradients, up to float32 reordering; the packing is deterministic and
keeps its budget; the ledger's count is the packed forward's."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from opdgrpo.train import flops as flop_formulas
from opdgrpo.train.packed_rows import first_fit, pack, packed_flops, packed_logits, worth_packing


def _model(attention: str = "eager") -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                         tie_word_embeddings=True, attn_implementation=attention)
    return Qwen3ForCausalLM(config).float()


def _shard(prompts: list[int], responses: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A sampled shard's layout: prompts left-padded to the longest, responses right-padded to the longest."""
    g = torch.Generator().manual_seed(seed)
    p_max, r_max = max(prompts), max(responses)
    seqs = torch.zeros(len(prompts), p_max + r_max, dtype=torch.long)
    attn = torch.zeros_like(seqs)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        seqs[i, p_max - p:p_max + r] = torch.randint(3, 97, (p + r,), generator=g)
        attn[i, p_max - p:p_max + r] = 1
    return seqs, attn, p_max


def _padded_logits(model, seqs, attn, prompt_len):
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=seqs, attention_mask=attn, position_ids=pos,
                 logits_to_keep=seqs.shape[1] - prompt_len + 1).logits[:, :-1]


def _loss(logits, seqs, attn, prompt_len):
    targets, mask = seqs[:, prompt_len:], attn[:, prompt_len:].float()
    lp = torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1))[..., 0]
    return -(lp * mask).sum() / mask.sum()


def test_first_fit_is_deterministic_and_keeps_the_budget():
    lengths = [5, 9, 3, 9, 30, 1, 7]
    bins = first_fit(lengths, 12)
    assert bins == first_fit(lengths, 12)
    assert sorted(r for b in bins for r in b) == list(range(len(lengths)))
    for b in bins:
        assert sum(lengths[r] for r in b) <= 12 or len(b) == 1   # the 30-token row alone
    assert [4] in bins
    assert bins[1] == [1, 2]   # decreasing length, ties by index: 9 (row 1) first fits 3 (row 2) after it


def test_the_layout_holds_each_rows_tokens_positions_and_targets():
    seqs, attn, prompt_len = _shard([4, 6, 5, 6], [3, 1, 8, 5])
    packed = pack(seqs, attn, prompt_len, budget=16)
    assert packed.length <= 16 and packed.rows == 3
    flat_ids, flat_pos = packed.input_ids.reshape(-1), packed.position_ids.reshape(-1)
    mask = attn[:, prompt_len:].bool()
    targets = seqs[:, prompt_len:]
    # the position predicting each response token is followed, in its packed row, by that token
    assert torch.equal(flat_ids[packed.logit_index[mask] + 1], targets[mask])
    # and sits at the row's own position: prompt length - 1 + t
    p_lens = attn[:, :prompt_len].sum(-1)
    expected = (p_lens[:, None] - 1 + torch.arange(targets.shape[1])[None, :])
    assert torch.equal(flat_pos[packed.logit_index[mask]], expected[mask])
    assert sorted(packed.input_ids[packed.input_ids > 0].tolist()) == sorted(seqs[attn.bool()].tolist())


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("budget", [1, 24, 1000])
def test_packed_logits_loss_and_gradients_are_the_padded_ones(attention, budget):
    """Every budget (each row alone, a few per packed row, all in one): the response logits, the loss and every
    parameter's gradient equal the padded forward's up to float32 reordering."""
    model = _model(attention)
    seqs, attn, prompt_len = _shard([4, 7, 5, 7, 3, 6], [2, 9, 1, 4, 9, 3])
    mask = attn[:, prompt_len:].bool()
    padded = _padded_logits(model, seqs, attn, prompt_len)
    loss = _loss(padded, seqs, attn, prompt_len)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    layout = pack(seqs, attn, prompt_len, budget)
    packed = packed_logits(model, layout)
    assert packed.shape == padded.shape
    torch.testing.assert_close(packed[mask], padded[mask], rtol=1e-5, atol=1e-5)
    packed_loss = _loss(packed, seqs, attn, prompt_len)
    torch.testing.assert_close(packed_loss, loss, rtol=1e-6, atol=1e-6)
    packed_loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_ledger_counts_the_packed_forward_and_it_is_smaller_where_lengths_differ():
    model = _model()
    seqs, attn, prompt_len = _shard([8] * 16, [3] * 14 + [24, 20])
    layout = pack(seqs, attn, prompt_len, budget=64)
    response = seqs.shape[1] - prompt_len
    assert packed_flops(model.config, layout) == (
        flop_formulas.forward_flops(model.config, layout.rows, layout.length, logits_positions=0)
        + 2 * 16 * response * model.config.hidden_size * model.config.vocab_size)   # the head: response positions
    padded = flop_formulas.forward_flops(model.config, *seqs.shape, logits_positions=response + 1)
    assert layout.rows * layout.length < seqs.numel() / 2 and worth_packing(model.config, layout, tuple(seqs.shape))
    assert packed_flops(model.config, layout) < padded


def test_rows_of_one_length_are_not_worth_packing():
    """Three rows of one length under a budget of two: packed rows of 2 + 1 rows hold 4 rows' positions, not 3; and
    rows that do fill a packed row pay its longer attention for no padding removed."""
    model = _model()
    seqs, attn, prompt_len = _shard([5] * 3, [5] * 3)
    layout = pack(seqs, attn, prompt_len, budget=20)
    assert (layout.rows, layout.length) == (2, 20) and not worth_packing(model.config, layout, tuple(seqs.shape))
    seqs, attn, prompt_len = _shard([5] * 4, [5] * 4)
    layout = pack(seqs, attn, prompt_len, budget=20)
    assert (layout.rows, layout.length) == (2, 20) and not worth_packing(model.config, layout, tuple(seqs.shape))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_teachers_packed_forward_reduces_what_its_padded_forward_reduces(precision):
    """OPD's teacher forward (FrozenForward: the lean bfloat16 path, or the model's own forward in float32) over
    packed rows reduces the same per-position values as over the padded rows: within float32 reordering, and within
    bfloat16 rounding of the logits under bf16 (the packed multiplies have other shapes)."""
    from opdgrpo.train.inference import FrozenForward
    from opdgrpo.train.models import autocast

    model = _model().eval()
    seqs, attn, prompt_len = _shard([4, 7, 5, 7, 3, 6], [2, 9, 1, 4, 9, 3])
    keep = seqs.shape[1] - prompt_len + 1
    ids = torch.randint(0, 97, (seqs.shape[0], keep - 1, 3))

    def reduce(logits, top):
        return (logits.float().gather(-1, top),)

    forward = FrozenForward(model)
    with torch.no_grad(), autocast(precision, "cpu"):
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        (padded,) = forward.reduced(seqs, attn, pos, keep, reduce, (ids,), 4096)
        (packed,) = forward.reduced_packed(pack(seqs, attn, prompt_len, 24), reduce, (ids,), 4096)
        (chunked,) = forward.reduced_packed(pack(seqs, attn, prompt_len, 24), reduce, (ids,), 7)
    mask = attn[:, prompt_len:].bool()
    tol = {"fp32": 1e-5, "bf16": 5e-2}[precision]
    torch.testing.assert_close(packed[mask], padded[mask], rtol=tol, atol=tol)
    torch.testing.assert_close(chunked[mask], packed[mask], rtol=tol, atol=tol)
    assert forward.path is not None
