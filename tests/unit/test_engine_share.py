"""vLLM 0.32's own start-up arithmetic (opdgrpo.cost.engine_memory): what the profiling run's sampler pass keeps, the
fixed point of max_num_seqs and the pool, what a sleeping engine pins in host memory, and the decode bound."""

from __future__ import annotations

import pytest

from opdgrpo.config import compose
from opdgrpo.cost import engine_memory as em
from opdgrpo.cost import resources
from opdgrpo.cost.memory_model import GIB, Shape, params
from opdgrpo.plan.build import build_plan

TOY = Shape(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=1000, tied=True)


@pytest.fixture(scope="module")
def paper():
    cfg = compose(["profile=paper"])
    plan = build_plan(cfg)
    return cfg, plan, {e.job: e for e in resources.estimate_jobs(cfg, plan)}


# -- vLLM's start-up arithmetic ---------------------------------------------------------------------------------------

def test_the_sampler_pass_keeps_the_logits_three_float32_copies_and_the_triton_scratch():
    """_dummy_sampler_run: bf16 logits held by the caller, Sampler.forward's float32 copy, forward_native's
    probabilities and exponential noise (+ its log-softmax under processed_logprobs), and the Triton top-k/top-p
    kernel's scratch rows (the rows rounded up to a power of two, at most one per SM)."""
    v = TOY.vocab
    assert em.sampler_peak_bytes(TOY, 3, processed=False) == 3 * v * (2 + 12) + 4 * v * 4
    assert em.sampler_peak_bytes(TOY, 3, processed=True) == 3 * v * (2 + 16) + 4 * v * 4
    assert em.sampler_peak_bytes(TOY, 1, processed=False) == v * 14 + v * 4
    assert em.sampler_peak_bytes(TOY, 1024, processed=False) == 1024 * v * 14 + em.TRITON_SCRATCH_ROWS * v * 4


def test_the_profiling_peak_is_the_forward_or_the_sampler_pass_whichever_is_larger():
    """profile_run frees the forward's intermediates before the sampler pass; its output hidden states stay."""
    forward = 100 * (3 * TOY.intermediate + 4 * TOY.hidden) * 2
    assert em.profile_peak_bytes(TOY, 100, 1, False) == forward + em.NON_TORCH_BYTES   # one row: the forward's
    many = em.profile_peak_bytes(TOY, 100, 4096, False)
    assert many == 100 * TOY.hidden * 2 + em.sampler_peak_bytes(TOY, 4096, False) + em.NON_TORCH_BYTES


def test_max_num_seqs_is_the_fixed_point_of_the_rows_and_the_sampler_pass(paper):
    """The plan's max_num_seqs is the most rows of max_model_len the pool holds after a sampler pass over that many
    rows (found by bisection; the pool shrinks as the rows grow): one more would not fit, and a brute-force search
    agrees. vLLM's default 1024 leaves the same share fewer rows."""
    cfg, _, _ = paper
    from opdgrpo.cost.model import architecture

    hw = resources.Hardware.of(cfg)
    for model, share in (("student", 0.62), ("student_8b", 0.63), ("qwen3_32b", 0.9)):
        shape = Shape.of(architecture(cfg, model))
        settings = {"gpu_memory_utilization": share}
        n = em.fitted_seqs(shape, gpu_bytes=hw.device_bytes, settings=settings, max_model_len=9692)

        def start(k):
            return em.engine_start(shape, gpu_bytes=hw.device_bytes, settings={**settings, "max_num_seqs": k},
                                   max_model_len=9692)

        assert start(n).holds(n) and start(n).rows_at_once == n
        assert not start(n + 1).holds(n + 1)
        assert n == max(k for k in range(1, 200) if start(k).holds(k))
        assert start(1024).rows_at_once <= n


def test_rows_at_once_leave_the_null_block():
    row = 1000.0
    start = em.EngineStart(share=0, weights=0, profile_peak=0, pool=3 * row, row=row, max_model_len=16 * 10)
    assert start.rows_at_once == 2 and start.holds(2) and not start.holds(3)


def test_a_sleeping_engine_pins_its_runtime_and_graph_pools_at_every_level():
    """CuMemBackend.suspend offloads the `runtime` and `cudagraph` pools at levels 1 and 2, the weights at 1 only."""
    start = em.engine_start(TOY, gpu_bytes=80 * GIB, settings={"max_num_seqs": 8, "max_num_batched_tokens": 512},
                            max_model_len=160)
    runtime = 8 * 10 * 4 + 512 * 8   # the block table (8 rows of 10 int32 block ids) and the slot mapping
    assert em.pinned_while_asleep(start, 2) == pytest.approx(start.cudagraph + runtime)
    assert em.pinned_while_asleep(start, 1) == pytest.approx(start.cudagraph + runtime + 2 * params(TOY))
    eager = em.engine_start(TOY, gpu_bytes=80 * GIB, settings={"max_num_seqs": 8, "enforce_eager": True,
                                                                "max_num_batched_tokens": 512}, max_model_len=160)
    assert em.pinned_while_asleep(eager, 2) == runtime


def test_decode_reads_each_tokens_kv_once_and_the_weights_each_step():
    """A row that has finished reads nothing while the longest one goes on: 10 rows of mean 100 tokens, the longest
    1000, all at once: 1000 steps of the weights and 1000 tokens' KV (half a row each)."""
    many = em.EngineStart(share=0, weights=1e9, profile_peak=0, pool=1e6, row=1.0, max_model_len=1000)
    assert em.decode_seconds(many, rows=10, longest=1000, mean=100, tbps=1.0) == pytest.approx((1000 * 1e9 + 500) / 1e12)
    # in waves of 2 rows: 500 steps, the same tokens' KV
    two = em.EngineStart(share=0, weights=1e9, profile_peak=0, pool=2.5, row=1.0, max_model_len=1000)
    assert em.decode_seconds(two, rows=10, longest=100, mean=100, tbps=1.0) == pytest.approx((500 * 1e9 + 500) / 1e12)
