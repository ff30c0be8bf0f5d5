"""The analytic FLOP ledger against torch's FlopCounterMode on tiny eager-attention models."""

from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from opdgrpo.train import flops

PAD, EOS = 0, 1

# Shapes: GQA (kv < heads); untied LM head; head_dim != hidden / heads (with GQA down to one kv head).
QWEN3_SHAPES = {
    "gqa": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
                intermediate_size=128, vocab_size=256, tie_word_embeddings=True),
    "untied": dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, head_dim=16, num_hidden_layers=1,
                   intermediate_size=80, vocab_size=100, tie_word_embeddings=False),
    "head_dim": dict(hidden_size=96, num_attention_heads=4, num_key_value_heads=1, head_dim=32, num_hidden_layers=3,
                     intermediate_size=160, vocab_size=400, tie_word_embeddings=True),
}


def make_model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(pad_token_id=PAD, eos_token_id=EOS, bos_token_id=EOS, attn_implementation="eager")
    if name == "llama":  # head_dim left to its default, hidden / heads
        config = LlamaConfig(hidden_size=48, num_attention_heads=3, num_hidden_layers=2, intermediate_size=64,
                             vocab_size=150, **common)
        return LlamaForCausalLM(config).eval()
    config = Qwen3Config(**QWEN3_SHAPES[name], **common)
    model = Qwen3ForCausalLM(config).eval()
    assert model.config._attn_implementation == "eager"
    return model


ALL = [*QWEN3_SHAPES, "llama"]


def counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def rel_err(analytic: float, measured: int) -> float:
    assert measured > 0
    return abs(analytic - measured) / measured


def test_shapes_are_what_the_tests_claim():
    gqa, untied, head_dim = (make_model(n) for n in QWEN3_SHAPES)
    assert gqa.config.num_key_value_heads < gqa.config.num_attention_heads
    assert gqa.lm_head.weight is gqa.model.embed_tokens.weight
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    assert head_dim.config.head_dim * head_dim.config.num_attention_heads != head_dim.config.hidden_size


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("batch,seq,logits_positions", [(1, 1, None), (3, 11, None), (2, 17, 1), (2, 9, 4)])
def test_forward_flops(name, batch, seq, logits_positions):
    model = make_model(name)
    x = torch.randint(2, model.config.vocab_size, (batch, seq))
    kwargs = {} if logits_positions is None else {"logits_to_keep": logits_positions}
    with torch.no_grad():
        measured = counted(lambda: model(x, **kwargs))
    assert rel_err(flops.forward_flops(model.config, batch, seq, logits_positions), measured) < 0.01


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("loss", ["sum", "ce"])
def test_train_flops(name, loss):
    model = make_model(name).train()
    x = torch.randint(2, model.config.vocab_size, (4, 13))

    def step():
        logits = model(x).logits
        if loss == "sum":
            value = logits.sum()
        else:
            value = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())
        value.backward()

    measured = counted(step)
    assert rel_err(flops.train_flops(model.config, 4, 13), measured) < 0.01
    assert flops.train_flops(model.config, 4, 13) == 3 * flops.forward_flops(model.config, 4, 13)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("batch,prompt_len,new_tokens", [(1, 1, 1), (3, 5, 1), (2, 4, 2), (3, 7, 9), (2, 12, 5)])
def test_generate_flops(name, batch, prompt_len, new_tokens):
    model = make_model(name)
    x = torch.randint(2, model.config.vocab_size, (batch, prompt_len))

    def run():
        return model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, pad_token_id=PAD, eos_token_id=EOS)

    with FlopCounterMode(display=False) as counter:
        out = run()
    assert out.shape == (batch, prompt_len + new_tokens)  # it could not stop early
    analytic = flops.generate_flops(model.config, batch, prompt_len, new_tokens)
    assert rel_err(analytic, counter.get_total_flops()) < 0.01


def test_generate_is_prefill_plus_decode_steps():
    config = make_model("gqa").config
    expected = flops.prefill_flops(config, 2, 6) + sum(flops.decode_step_flops(config, 2, 6 + t) for t in (1, 2, 3))
    assert flops.generate_flops(config, 2, 6, 4) == pytest.approx(expected)
    assert flops.generate_flops(config, 2, 6, 0) == 0.0


def test_prefill_and_decode_step_against_counter():
    from transformers import DynamicCache

    model = make_model("head_dim")
    x = torch.randint(2, model.config.vocab_size, (3, 8))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        prefill = counted(lambda: model(x, cache=cache, use_cache=True, logits_to_keep=1))
        step = counted(lambda: model(x[:, :1], cache=cache, use_cache=True, logits_to_keep=1))
    assert rel_err(flops.prefill_flops(model.config, 3, 8), prefill) < 0.01
    assert rel_err(flops.decode_step_flops(model.config, 3, 9), step) < 0.01


def test_attention_is_full_square_and_lm_head_scales_with_positions():
    config = make_model("untied").config
    h, v, heads, hd, layers = 32, 100, 2, 16, 1
    # Doubling the sequence: linear terms double, the attention term quadruples.
    attention = lambda seq: 4 * seq * seq * heads * hd * layers  # noqa: E731
    f1, f2 = flops.forward_flops(config, 1, 10, 0), flops.forward_flops(config, 1, 20, 0)
    assert f2 - 2 * f1 == pytest.approx(attention(20) - 2 * attention(10))
    assert flops.forward_flops(config, 1, 10, 3) - f1 == pytest.approx(3 * 2 * h * v)


def test_head_dim_defaults_to_hidden_over_heads():
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=120)
    implicit = SimpleNamespace(**base)
    explicit = SimpleNamespace(**base, num_key_value_heads=4, head_dim=16)
    assert flops.forward_flops(implicit, 2, 7) == flops.forward_flops(explicit, 2, 7)
    assert flops.forward_flops(SimpleNamespace(**base, head_dim=32), 2, 7) > flops.forward_flops(explicit, 2, 7)


@pytest.mark.parametrize("name", ALL)
def test_params_count(name):
    model = make_model(name)
    assert flops.params_count(model.config) == model.num_parameters()


# -- Olmo-3: sliding-window attention in 3 of every 4 layers, post-norm, q/k norms over the whole projections ---------
# The formulas were derived on one probe shape (hidden 64, 4 heads, 2 kv heads, head_dim 16, 4 layers, ffn 96,
# vocab 200, window 6). The three shapes below are not that one: MHA with an untied head (as Olmo-3-7B), GQA down to
# one kv head with head_dim != hidden / heads and two full layers in eight, and five layers (the pattern cut after
# one more sliding layer). Windows are wider than every row of the within-window tests.
OLMO3_SHAPES = {
    "olmo_mha": dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=3, num_hidden_layers=4,
                     intermediate_size=80, vocab_size=150, sliding_window=24, tie_word_embeddings=False),
    "olmo_gqa": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=24, num_hidden_layers=8,
                     intermediate_size=112, vocab_size=300, sliding_window=20, tie_word_embeddings=True),
    "olmo_5l": dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, head_dim=16, num_hidden_layers=5,
                    intermediate_size=64, vocab_size=100, sliding_window=18, tie_word_embeddings=False),
}


def make_olmo3(name: str, **changes) -> torch.nn.Module:
    from transformers import Olmo3Config, Olmo3ForCausalLM

    torch.manual_seed(0)
    config = Olmo3Config(**{**OLMO3_SHAPES[name], **changes}, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=EOS,
                         attn_implementation="eager")
    model = Olmo3ForCausalLM(config).eval()
    assert model.config._attn_implementation == "eager"
    return model


def test_olmo3_shapes_are_what_the_tests_claim():
    mha, gqa, five = (make_olmo3(n) for n in OLMO3_SHAPES)
    kinds = [m.config.layer_types for m in (mha, gqa, five)]
    assert kinds[0] == ["sliding_attention"] * 3 + ["full_attention"]
    assert kinds[1].count("full_attention") == 2 and kinds[2][-1] == "sliding_attention"
    assert mha.config.num_key_value_heads == mha.config.num_attention_heads
    assert mha.lm_head.weight is not mha.model.embed_tokens.weight
    assert gqa.config.head_dim * gqa.config.num_attention_heads != gqa.config.hidden_size


@pytest.mark.parametrize("name", OLMO3_SHAPES)
@pytest.mark.parametrize("batch,seq,logits_positions", [(1, 1, None), (3, 11, None), (2, 17, 1), (2, 9, 4)])
def test_olmo3_forward_flops(name, batch, seq, logits_positions):
    model = make_olmo3(name)
    assert seq <= model.config.sliding_window
    x = torch.randint(2, model.config.vocab_size, (batch, seq))
    kwargs = {} if logits_positions is None else {"logits_to_keep": logits_positions}
    with torch.no_grad():
        measured = counted(lambda: model(x, **kwargs))
    assert rel_err(flops.forward_flops(model.config, batch, seq, logits_positions), measured) < 0.01


@pytest.mark.parametrize("name", OLMO3_SHAPES)
def test_olmo3_train_flops(name):
    model = make_olmo3(name).train()
    x = torch.randint(2, model.config.vocab_size, (4, 13))

    def step():
        logits = model(x).logits
        torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten()).backward()

    assert rel_err(flops.train_flops(model.config, 4, 13), counted(step)) < 0.01


def _generate_counted(model, batch: int, prompt_len: int, new_tokens: int) -> int:
    x = torch.randint(2, model.config.vocab_size, (batch, prompt_len))
    with FlopCounterMode(display=False) as counter:
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=PAD, eos_token_id=EOS)
    assert out.shape == (batch, prompt_len + new_tokens)
    return counter.get_total_flops()


@pytest.mark.parametrize("name", OLMO3_SHAPES)
@pytest.mark.parametrize("batch,prompt_len,new_tokens", [(1, 1, 1), (3, 5, 1), (3, 7, 9), (2, 12, 5)])
def test_olmo3_generate_flops(name, batch, prompt_len, new_tokens):
    model = make_olmo3(name)
    assert prompt_len + new_tokens <= model.config.sliding_window
    measured = _generate_counted(model, batch, prompt_len, new_tokens)
    assert rel_err(flops.generate_flops(model.config, batch, prompt_len, new_tokens), measured) < 0.01


@pytest.mark.parametrize("name", OLMO3_SHAPES)
def test_olmo3_within_the_window_is_the_dense_formula(name):
    """Rows no longer than the window: a sliding layer costs what a full one does, in every formula."""
    model = make_olmo3(name)
    dense = SimpleNamespace(**{k: v for k, v in model.config.to_dict().items() if k not in ("layer_types",)})
    w = model.config.sliding_window
    assert flops.forward_flops(model.config, 2, w) == flops.forward_flops(dense, 2, w)
    assert flops.generate_flops(model.config, 2, w - 5, 5) == flops.generate_flops(dense, 2, w - 5, 5)
    assert flops.generate_flops(model.config, 2, w - 5, 7) < flops.generate_flops(dense, 2, w - 5, 7)


# Rows longer than the window: eager forwards (training, teacher, prefill) still multiply the whole L x L score
# matrix and mask it, so they cost what the dense formula says; cached decoding attends to min(context, window)
# keys in the sliding layers (transformers' DynamicSlidingWindowLayer keeps window - 1 positions).
@pytest.mark.parametrize("name", OLMO3_SHAPES)
def test_olmo3_past_the_window(name):
    model = make_olmo3(name)
    w = model.config.sliding_window
    x = torch.randint(2, model.config.vocab_size, (2, w + 9))
    with torch.no_grad():
        measured = counted(lambda: model(x))
    assert flops.forward_flops(model.config, 2, w + 9) == measured   # the full square, masked
    for prompt_len, new_tokens in [(w - 3, 10), (w + 4, 6)]:
        measured = _generate_counted(model, 2, prompt_len, new_tokens)
        assert flops.generate_flops(model.config, 2, prompt_len, new_tokens) == measured


@pytest.mark.parametrize("name", [*OLMO3_SHAPES, "gqa"])
def test_decode_steps_closed_form(name):
    config = make_olmo3(name).config if name in OLMO3_SHAPES else make_model(name).config
    for prompt_len, new_tokens in [(3, 1), (4, 9), (10, 30), (30, 12)]:
        exact = flops.generate_flops(config, 3, prompt_len, new_tokens) - flops.prefill_flops(config, 3, prompt_len)
        assert flops.decode_steps_flops(config, 3, prompt_len, new_tokens - 1) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize("name", OLMO3_SHAPES)
def test_olmo3_params_count(name):
    model = make_olmo3(name)
    assert flops.params_count(model.config) == model.num_parameters()
