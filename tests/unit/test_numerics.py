"""The numerics fingerprint's machine record, the fast-path mode, and the folded attention's gate on single attention
calls: on the machine at hand (whatever it decides there) and with the fold made inexact on purpose, which must be
refused. (Whole models, training runs and the fingerprint in another process: tests/integration/test_numerics_models.py.)
"""

from __future__ import annotations

import pytest
import torch

from opdgrpo.train import inference, numerics
from opdgrpo.train.models import autocast

pytestmark = pytest.mark.usefixtures("fresh_numerics")


def test_machine_names_the_cpu_and_its_vector_flags():
    m = numerics.machine()
    assert m["fingerprint"] == numerics.fingerprint() and m["torch"] == torch.__version__
    assert m["cpu"] and m["cpu_flags"]


def test_an_unknown_mode_is_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv(numerics.ENV, "fast")
    with pytest.raises(ValueError, match="OPDGRPO_FAST_PATHS"):
        numerics.mode()


def _attention_inputs(heads=4, kv=2, dim=16, rows=3, q_len=1, length=9):
    import types

    g = torch.Generator().manual_seed(0)
    module = types.SimpleNamespace(num_key_value_groups=heads // kv, training=False)
    q, k = torch.randn(rows, heads, q_len, dim, generator=g), torch.randn(rows, kv, length, dim, generator=g)
    v = torch.randn(rows, kv, length, dim, generator=g).bfloat16()
    return module, q, k, v, torch.zeros(rows, 1, q_len, length), dim ** -0.5


def _off_by_some_ulps(real):
    def fold(*args):
        out, weights = real(*args)
        return out * (1 + 2 ** -6), weights
    return fold


def test_an_inexact_fold_is_refused_and_eager_arithmetic_used(monkeypatch):
    monkeypatch.setattr(inference, "_folded_attention", _off_by_some_ulps(inference._folded_attention))
    args = _attention_inputs()
    with torch.no_grad(), autocast("bf16"):
        got, _ = inference.eager_attention_no_grad(*args)
        want, _ = inference.eager_attention_forward(*args)
    assert torch.equal(got, want)
    (decision,) = numerics.report()["fast_paths"]["folded_attention"].values()
    assert decision["used"] is False and decision["first_difference"] == {"rows": 1, "q_len": 1, "kv_len": 1}


def test_the_fold_is_used_here_only_where_the_sweep_found_it_exact():
    args = _attention_inputs()
    with torch.no_grad(), autocast("bf16"):
        got, _ = inference.eager_attention_no_grad(*args)
        want, _ = inference.eager_attention_forward(*args)
    assert torch.equal(got, want)   # either path: the same bits
    (decision,) = numerics.report()["fast_paths"]["folded_attention"].values()
    assert decision["used"] is ("first_difference" not in decision) and decision["shapes_checked"] > 0
