"""The folded bf16 attention of opdgrpo.inference against eager attention on 300 random shapes (minutes on 2 cores)."""

from __future__ import annotations

import torch

from opdgrpo.models import autocast


def test_folded_attention_matches_eager_on_random_bf16_shapes():
    """The folded multiply against ``eager_attention_forward`` itself, on 300 random shapes: GQA ratios 1-8, head
    dims 8-128, one-row decode steps and longer prefills, masked prefixes (3000 shapes passed when written)."""
    import random
    import types

    from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

    from opdgrpo.inference import eager_attention_no_grad

    rng = random.Random(0)
    for _ in range(300):
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
