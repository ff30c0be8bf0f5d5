"""The gradient-free fast paths (opdgrpo.train.inference) give exactly, bit for bit, what eager attention gives.

Every production forward goes through :func:`~opdgrpo.train.inference.choose_path`, which checks the fast paths against
the reference once per process and takes them only where they are exact on this machine; the tests do the same
first. Where a path the machine refused is called directly (``LeanQwen3`` on a machine where it was refused), the
test requires the logits to be close (a few bfloat16 units in the last place) rather than equal.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from opdgrpo.train.inference import LEAN, NAME, LeanQwen3, choose_path, fast_attention, sampling_cache
from opdgrpo.train.models import autocast

#: (heads, kv heads, head_dim, hidden): MHA, GQA 2:1 and 4:1, head_dim != hidden / heads (the tiny models' shapes).
SHAPES = [(4, 4, 16, 64), (4, 2, 32, 128), (8, 2, 16, 96), (4, 1, 48, 192), (8, 4, 32, 256)]


def _model(heads: int, kv: int, head_dim: int, hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=heads,
                         num_key_value_heads=kv, head_dim=head_dim, vocab_size=97, pad_token_id=0, eos_token_id=1,
                         initializer_range=0.1, attn_implementation="eager")
    return Qwen3ForCausalLM(config).eval()


def _batch(rows: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    lengths[0] = width
    ids = torch.randint(2, 97, (rows, width), generator=g)
    mask = (torch.arange(width)[None, :] >= width - lengths[:, None]).long()   # left padding
    return ids.masked_fill(mask == 0, 0), mask


def _decode(model, ids, mask, steps: int, fast: bool, tokens: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Prefill then ``steps`` cached decode steps feeding argmax tokens (or ``tokens``, to follow another run's
    choices); the logits of every forward. ``fast``: the model under :func:`fast_attention` with a
    :func:`sampling_cache`, once :func:`choose_path` has checked it."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = sampling_cache(model.config) if fast else DynamicCache(config=model.config)
    if fast:
        with torch.no_grad():
            choose_path(model)
    context = fast_attention(model) if fast else torch.no_grad()
    outs = []
    with torch.no_grad(), context:
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        outs.append(out.logits)
        pos = positions[:, -1:]
        for i in range(steps):
            token = out.logits[:, -1].argmax(-1, keepdim=True) if tokens is None else tokens[i]
            mask, pos = torch.cat([mask, torch.ones_like(token)], -1), pos + 1
            out = model(input_ids=token, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
            outs.append(out.logits)
    return outs


def _tokens(logits: list[torch.Tensor]) -> list[torch.Tensor]:
    """The argmax tokens a decode fed after each forward (for another path to follow)."""
    return [out[:, -1].argmax(-1, keepdim=True) for out in logits[:-1]]


def _same_or_close(model, precision: str, want: torch.Tensor, got: torch.Tensor, what: str) -> None:
    """Equal where this machine's check accepted LeanQwen3 for ``model``; within a few bf16 ulps where it refused."""
    with torch.no_grad(), autocast(precision):
        lean_here = choose_path(model) == LEAN
    if lean_here:
        assert torch.equal(want, got), f"{what}: logits differ"
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=2 ** -6 * float(want.abs().max()), msg=what)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"h{h}kv{k}d{d}" for h, k, d, _ in SHAPES])
def test_prefill_and_decode_logits_are_bitwise_eager(shape, precision):
    torch.set_num_threads(1)
    model = _model(*shape)
    for rows, width, seed in [(1, 5, 0), (7, 9, 1), (33, 13, 2)]:
        ids, mask = _batch(rows, width, seed)
        with autocast(precision):
            eager = _decode(model, ids, mask, steps=6, fast=False)
            fast = _decode(model, ids, mask, steps=6, fast=True)
        for step, (a, b) in enumerate(zip(eager, fast)):
            assert torch.equal(a, b), f"rows {rows} width {width} forward {step}: logits differ"


def test_teacher_style_forward_without_cache_is_bitwise_eager():
    model = _model(8, 2, 16, 96)
    ids, mask = _batch(16, 21, 3)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad(), autocast("bf16"):
        eager = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        with fast_attention(model):
            fast = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    assert torch.equal(eager, fast)


def test_with_gradients_it_is_eager_attention_forward_and_backward():
    model = _model(4, 2, 32, 128).train()
    ids, mask = _batch(8, 11, 4)

    def loss_and_grads(fast: bool):
        model.zero_grad(set_to_none=True)
        with autocast("bf16"), (fast_attention(model) if fast else torch.enable_grad()):
            loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    loss_a, grads_a = loss_and_grads(False)
    loss_b, grads_b = loss_and_grads(True)
    assert torch.equal(loss_a, loss_b)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))


def test_fast_attention_restores_the_model_and_skips_non_eager_models():
    model = _model(4, 2, 16, 64)
    with fast_attention(model):
        assert model.config._attn_implementation == NAME
    assert model.config._attn_implementation == "eager"
    with pytest.raises(RuntimeError), fast_attention(model):
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "eager"
    model.config._attn_implementation = "sdpa"
    with fast_attention(model):
        assert model.config._attn_implementation == "sdpa"


def test_sampling_cache_stores_keys_in_the_autocast_dtype_only_under_autocast():
    model = _model(4, 2, 16, 64)
    ids, mask = _batch(3, 6, 5)
    for precision, dtype in [("bf16", torch.bfloat16), ("fp32", torch.float32)]:
        cache = sampling_cache(model.config)
        with torch.no_grad(), autocast(precision):
            model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
        assert {layer.keys.dtype for layer in cache.layers} == {dtype}
        assert cache.get_seq_length() == 6


def test_folded_attention_matches_eager_on_random_bf16_shapes():
    """The folded multiply against ``eager_attention_forward`` itself, on 50 random shapes: GQA ratios 1-8, head
    dims 8-128, one-row decode steps and longer prefills, masked prefixes (3000 shapes passed when written; every job
    also checks its own layouts on 64 shapes before it takes the fold: ``opdgrpo.train.inference.choose_path``). 50, not
    100: bf16 is emulated on AVX2-only CPUs (33 s for 100 there)."""
    import random
    import types

    from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

    from opdgrpo.train.inference import eager_attention_no_grad

    rng = random.Random(0)
    for _ in range(50):
        kv, groups = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4, 8])
        dim, rows, q_len = rng.choice([8, 16, 24, 32, 48, 64, 128]), rng.choice([1, 2, 3, 7, 16]), rng.choice([1, 1, 2, 5, 17])
        length = q_len + rng.randint(0, 60)
        module = types.SimpleNamespace(num_key_value_groups=groups, training=False)
        q, k = torch.randn(rows, kv * groups, q_len, dim), torch.randn(rows, kv, length, dim)
        v = torch.randn(rows, kv, length, dim).bfloat16()
        mask = torch.zeros(rows, 1, q_len, length)
        mask[..., : rng.randint(0, length - 1)] = torch.finfo(torch.float32).min
        with torch.no_grad(), autocast("bf16"):
            a, _ = eager_attention_forward(module, q, k, v, mask, dim ** -0.5)
            b, _ = eager_attention_no_grad(module, q, k, v, mask, dim ** -0.5)
        assert torch.equal(a, b), dict(rows=rows, heads=kv * groups, kv=kv, q_len=q_len, length=length, dim=dim)


def _lean_decode(model, ids, mask, tokens: list[torch.Tensor]) -> list[torch.Tensor]:
    """:func:`_decode` through :class:`LeanQwen3` feeding ``tokens``: prefill logits of every position, then cached
    decode steps."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    outs = []
    with torch.no_grad():
        assert LeanQwen3.supports(model)
        lean = LeanQwen3(model)
        out = lean.forward(ids, positions, LeanQwen3.mask_bias(mask, ids.shape[1]), logits_to_keep=ids.shape[1])
        outs.append(out)
        pos = positions[:, -1:]
        for token in tokens:
            mask, pos = torch.cat([mask, torch.ones_like(token)], -1), pos + 1
            out = lean.forward(token, pos, LeanQwen3.mask_bias(mask, 1))
            outs.append(out)
    return outs


@pytest.mark.parametrize("shape", SHAPES, ids=[f"h{h}kv{k}d{d}" for h, k, d, _ in SHAPES])
def test_lean_forward_is_bitwise_the_models_own(shape):
    """LeanQwen3 against the model's own forward (eager attention, DynamicCache), prefill and decode logits: equal
    where this machine's check accepted it, close where it refused it."""
    torch.set_num_threads(1)
    model = _model(*shape)
    for rows, width, seed in [(1, 5, 0), (7, 9, 1), (33, 13, 2)]:
        ids, mask = _batch(rows, width, seed)
        with autocast("bf16"):
            eager = _decode(model, ids, mask, steps=6, fast=False)
            lean = _lean_decode(model, ids, mask, _tokens(eager))
        for step, (a, b) in enumerate(zip(eager, lean)):
            _same_or_close(model, "bf16", a, b, f"rows {rows} width {width} forward {step}")


def test_lean_forward_keeps_biases_and_drops_rows_like_the_cache():
    model = _model(4, 2, 16, 64)
    model.config.attention_bias = True
    for layer in model.model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj):
            proj.bias = torch.nn.Parameter(torch.randn(proj.out_features) * 0.1)
    model.lm_head.bias = torch.nn.Parameter(torch.randn(model.config.vocab_size))
    ids, mask = _batch(9, 7, 6)
    keep = torch.tensor([0, 2, 3, 8])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    token = torch.full((len(keep), 1), 5)
    step_mask = torch.cat([mask[keep], torch.ones_like(token)], -1)
    with torch.no_grad(), autocast("bf16"):
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        cache.batch_select_indices(keep)
        want = model(input_ids=token, attention_mask=step_mask, position_ids=positions[keep, -1:] + 1, cache=cache,
                      use_cache=True).logits
        lean = LeanQwen3(model)
        lean.forward(ids, positions, LeanQwen3.mask_bias(mask, ids.shape[1]))
        lean.select(keep)
        got = lean.forward(token, positions[keep, -1:] + 1, LeanQwen3.mask_bias(step_mask, 1))
    _same_or_close(model, "bf16", want, got, "decode step after dropping rows")


def test_lean_mask_is_the_eager_mask():
    from transformers.masking_utils import create_causal_mask

    model = _model(4, 2, 16, 64)
    ids, mask = _batch(5, 8, 7)
    embeds = model.model.embed_tokens(ids)
    want = create_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=mask, cache=None,
                              position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    assert torch.equal(want, LeanQwen3.mask_bias(mask, 8))


def test_lean_forward_only_where_it_reproduces_the_model():
    model = _model(4, 2, 16, 64)
    with torch.no_grad():
        with autocast("bf16"):
            assert LeanQwen3.supports(model)
        with autocast("fp32"):
            assert not LeanQwen3.supports(model)          # float32: the model's own forward
        with autocast("bf16"):
            model.config._attn_implementation = "sdpa"
            assert not LeanQwen3.supports(model)          # another attention kernel
            model.config._attn_implementation = "eager"
            model.train()
            assert not LeanQwen3.supports(model)          # dropout would apply
            model.eval()
    with autocast("bf16"):
        assert not LeanQwen3.supports(model)              # gradients: training forwards never take it


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_frozen_forward_is_the_teachers_own_forward(precision):
    """OPD's teacher forwards: LeanQwen3 under bf16 (weights cast once, reused across calls), the model under fp32."""
    from opdgrpo.train.inference import FrozenForward

    model = _model(8, 2, 16, 96)
    for p in model.parameters():
        p.requires_grad_(False)
    frozen = FrozenForward(model)
    for rows, width, seed in [(16, 21, 3), (5, 9, 4)]:
        ids, mask = _batch(rows, width, seed)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad(), autocast(precision):
            want = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=4).logits
            got = frozen(ids, mask, positions, logits_to_keep=4)
        assert torch.equal(want, got)
    assert (frozen.lean is not None) == (frozen.path == LEAN)
    assert precision == "bf16" or frozen.path != LEAN   # float32: never the lean forward
