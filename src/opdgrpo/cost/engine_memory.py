"""What a vLLM engine checks as it starts, computed before any job runs (``opdgrpo resources``).

vLLM 0.32 refuses to start in two cases, and a job that would be refused should never be queued:

1. **Free memory** (``vllm.v1.worker.utils.request_memory``): the device must have ``gpu_memory_utilization x
   total`` free when the engine starts. Beside a trainer, what the trainer already holds counts against it.
2. **One row of ``max_model_len``** (``vllm.v1.core.kv_cache_utils.check_enough_kv_cache_memory``): the KV pool, which
   is the engine's share minus its weights and the peak of its profiling forward, must hold the KV cache of one
   sequence of ``max_model_len`` tokens (in blocks of 16 positions, plus the null block the pool keeps back).

The pool is also short of vLLM's CUDA graph estimate: vLLM 0.32 captures its decode graphs once in a throw-away
pool at start (``GPUModelRunner.profile_cudagraph_memory``: 51 PIECEWISE sizes up to 512 tokens, and FULL decode
sizes) and, by default (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1``, the default since v0.21), subtracts that
estimate from the KV cache (``Worker.determine_available_memory``: requested - non-KV memory - the estimate); none
under ``enforce_eager``. The planner's figure is :data:`CUDAGRAPH_BYTES_PER_LAYER` per decoder layer, from
vLLM's own log of Qwen3-8B (36 layers): "Estimated CUDA graph memory: 0.52 GiB total"
(https://github.com/LMCache/LMCache/issues/3430); piecewise graphs are captured per layer.

Past the start, the pool sets how many rows of the job's longest length decode at once; a sampling call with more
rows than that waits for free blocks or preempts (recomputes) rows, so the rollout's wall time is bound by waves of
that many rows.

The profiling run is vLLM's ``GPUModelRunner.profile_run``: a forward of ``max_num_batched_tokens`` tokens, then,
with the forward's output hidden states still held and its intermediates freed, ``_dummy_sampler_run``: a sampler
pass over ``max_num_seqs`` rows of full-vocabulary logits with top-k and top-p set. vLLM measures the larger of the
two peaks (:func:`profile_peak_bytes`); the forward's is estimated here from the MLP's intermediate tensors (the
largest per-layer activations), the sampler's from what vLLM 0.32's code keeps at once (:func:`sampler_peak_bytes`).
``NON_TORCH_BYTES`` stands for what vLLM counts as non-torch memory during that run (cuBLAS workspaces, NCCL
buffers): an assumption, not a measurement, until a GPU pilot records vLLM's own log line ("Available KV cache
memory").

``max_num_seqs`` enters the pool twice: it caps the rows the scheduler runs at once, and it sizes the sampler pass of
the profiling run, whose peak the pool loses. :func:`fitted_seqs` solves the two together: the most rows of
``max_model_len`` that fit in the pool left by a profiling run over that many rows.

What a sleeping engine keeps in host memory (:func:`pinned_while_asleep`): vLLM's ``CuMemBackend.suspend`` offloads
the allocator's ``runtime`` and ``cudagraph`` pools at every sleep level, the weights too at level 1
(``CuMemAllocator.sleep`` copies each offloaded allocation into a pinned CPU tensor; the rest is discarded).

What the slow sampler costs per decode step (:func:`sampler_step_extra`): under ``processed_logprobs`` vLLM binds its
CUDA sampler to ``TopKTopPSampler.forward_native`` for every request of the engine, evaluation's included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from opdgrpo.cost.memory_model import GIB, Shape, kv_cache_bytes, params

#: vLLM's KV block (positions per block) on GPUs.
BLOCK = 16
#: vLLM's offline (``LLM`` class) defaults on a GPU of 70 GB or more that is not an A100 (``EngineArgs``):
#: tokens per scheduler step and rows at once; on smaller GPUs 8192 and 256.
DEFAULT_BATCHED_TOKENS = {True: 16384, False: 8192}
DEFAULT_MAX_SEQS = {True: 1024, False: 256}
#: vLLM's own default share of a GPU (``gpu_memory_utilization``).
DEFAULT_SHARE = 0.9
#: Memory vLLM counts as non-torch during its profiling run (ours, an assumption; see the module docstring).
NON_TORCH_BYTES = 0.5 * GIB
#: Rows of the Triton top-k/top-p kernel's scratch buffer at most (``apply_top_k_top_p_triton``: one float32
#: vocabulary row per program, as many programs as rows up to the device's SMs, the rows rounded up to a power of
#: two): 132, the SMs of an H100 or H200 SXM.
TRITON_SCRATCH_ROWS = 132
#: vLLM's CUDA graph estimate per decoder layer (0.52 GiB over Qwen3-8B's 36 layers; module docstring).
CUDAGRAPH_BYTES_PER_LAYER = 0.52 * GIB / 36
#: Passes of a GPU radix sort over 32-bit keys (8-bit digits).
RADIX_PASSES = 4
#: The slow sampler's top-k/top-p, priced as a full sort of each row's float32 logits with their int64 indices: each
#: radix pass reads and writes both at the memory bandwidth (96 bytes per vocabulary entry). Ours, and an upper bound
#: for vLLM 0.32 on CUDA, whose ``forward_native`` runs the pivot-based Triton kernel (several reads of each row, no
#: sort; ``logits.sort`` runs only where Triton is missing); FlashInfer's rejection sampling, the fast path, is priced
#: at nothing.
SORT_BYTES_PER_ENTRY = RADIX_PASSES * 2 * (4 + 8)
#: The log-softmax ``processed_logprobs`` computes in ``forward_native`` at every step whether or not a request asks
#: for log-probs: a float32 row read and written (8 bytes per vocabulary entry).
LOG_SOFTMAX_BYTES_PER_ENTRY = 2 * 4
#: Seconds per seeded row per decode step (ours): ``random_sample`` draws each seeded request's noise in a Python
#: loop (``q[i].exponential_(generator=...)``: one kernel launch from Python per row), on the CPU while the GPU waits.
SEEDED_ROW_SECONDS = 10e-6


def kv_row_bytes(s: Shape, max_model_len: int, dtype_bytes: int = 2) -> float:
    """vLLM's ``max_memory_usage_bytes`` summed over layers: the KV cache of one ``max_model_len`` row
    (:func:`opdgrpo.cost.memory_model.kv_cache_bytes`) in whole blocks."""
    return kv_cache_bytes(s, 1, BLOCK * math.ceil(max_model_len / BLOCK), dtype_bytes)


def processed_logprobs(temperature: float, engine_is_cap: float | None) -> bool:
    """Whether a training job's engine runs under vLLM's ``processed_logprobs``, as the engine chooses its
    ``logprobs_mode``: only where its rollouts sample at a temperature other than 1 (``train.temperature``) and GRPO
    weights its terms by the engine's log-probs (``methods.grpo.engine_is_cap``), which must then be of the tempered
    distribution; at temperature 1 vLLM's raw log-probs are that distribution's. A job that only samples asks for
    none. Why it matters: the mode binds vLLM's CUDA sampler to ``forward_native`` (:func:`step_extra`). The engine's
    own rule (:func:`opdgrpo.train.engines.vllm_engine.rollout_logprobs_mode`) decides."""
    from opdgrpo.train.engines.vllm_engine import PROCESSED_LOGPROBS, rollout_logprobs_mode

    return rollout_logprobs_mode(temperature, engine_is_cap) == PROCESSED_LOGPROBS


def sampler_peak_bytes(s: Shape, seqs: int, processed: bool, dtype_bytes: int = 2) -> float:
    """The peak of vLLM 0.32's ``_dummy_sampler_run`` over ``seqs`` rows (``max_num_seqs``), with top-k and top-p
    set as the dummy metadata sets them: the model's logits in its dtype, held by the caller; ``Sampler.forward``'s
    float32 copy; ``forward_native``'s probabilities and ``random_sample``'s exponential noise (float32 each); under
    ``processed_logprobs`` also the float32 log-softmax ``forward_native`` returns; and the Triton top-k/top-p
    kernel's scratch rows. Under the raw modes the pass runs twice, FlashInfer's ``forward_cuda`` (a masked copy of
    the logits and their probabilities) and then ``forward_native`` with a per-request generator, one after the
    other: the peak is one pass's, three float32 copies."""
    copies = 4 if processed else 3
    scratch = min(1 << max(seqs - 1, 0).bit_length(), TRITON_SCRATCH_ROWS)
    return seqs * s.vocab * (dtype_bytes + 4 * copies) + scratch * s.vocab * 4


def profile_peak_bytes(s: Shape, tokens: int, seqs: int, processed: bool, dtype_bytes: int = 2) -> float:
    """vLLM's profiling peak beside its weights: the forward of ``tokens`` tokens (the MLP's gate/up outputs and
    the residual stream), or the sampler pass with the forward's output hidden states still held, whichever is
    larger (``profile_run`` frees the forward's intermediates before ``_dummy_sampler_run``), plus the non-torch
    memory."""
    forward = tokens * (3 * s.intermediate + 4 * s.hidden) * dtype_bytes
    held = tokens * s.hidden * dtype_bytes
    return max(forward, held + sampler_peak_bytes(s, seqs, processed, dtype_bytes)) + NON_TORCH_BYTES


@dataclass(frozen=True)
class EngineStart:
    """One engine's memory at start, per GPU, in bytes; ``rows_at_once``: rows of ``max_model_len`` its pool holds."""

    share: float                 # gpu_memory_utilization x the device's memory
    weights: float
    profile_peak: float          # the profiling forward or sampler pass, plus non-torch memory
    pool: float                  # what is left for the KV cache
    row: float                   # one row of max_model_len
    max_model_len: int
    cudagraph: float = 0.0       # vLLM's CUDA graph estimate, taken from the pool (0 under enforce_eager)
    max_seqs: int = 1 << 30      # max_num_seqs: rows the scheduler runs at once at most
    batched_tokens: int = 0      # max_num_batched_tokens

    @property
    def null_block(self) -> float:
        """The block vLLM's pool keeps back (the bytes of one of a row's blocks)."""
        return self.row / math.ceil(self.max_model_len / BLOCK)

    @property
    def starts(self) -> bool:
        return self.holds(1)

    def holds(self, rows: int) -> bool:
        """Whether the pool holds ``rows`` rows of ``max_model_len`` beside the null block."""
        return self.pool >= rows * self.row + self.null_block

    @property
    def rows_at_once(self) -> int:
        return max(0, min(int((self.pool - self.null_block) // self.row), self.max_seqs))


def engine_start(s: Shape, *, gpu_bytes: float, settings: Mapping[str, Any], max_model_len: int,
                 dtype_bytes: int = 2, processed: bool = False) -> EngineStart:
    """The engine's start on one ``gpu_bytes`` device with ``settings`` (``train.vllm`` and, for jobs that only
    sample, ``train.vllm_alone`` over it, with the plan's share and ``max_num_seqs`` where it chose them);
    ``processed``: the engine runs under ``processed_logprobs`` (:func:`processed_logprobs`)."""
    big = gpu_bytes >= 70 * GIB
    share = float(settings.get("gpu_memory_utilization") or DEFAULT_SHARE) * gpu_bytes
    tokens = int(settings.get("max_num_batched_tokens") or DEFAULT_BATCHED_TOKENS[big])
    seqs = int(settings.get("max_num_seqs") or DEFAULT_MAX_SEQS[big])
    weights = dtype_bytes * params(s)
    peak = profile_peak_bytes(s, tokens, seqs, processed, dtype_bytes)
    graphs = 0.0 if settings.get("enforce_eager") else CUDAGRAPH_BYTES_PER_LAYER * s.layers
    return EngineStart(share, weights, peak, share - weights - peak - graphs,
                       kv_row_bytes(s, max_model_len, dtype_bytes), int(max_model_len), graphs, seqs, tokens)


def fitted_seqs(s: Shape, *, gpu_bytes: float, settings: Mapping[str, Any], max_model_len: int,
                dtype_bytes: int = 2, processed: bool = False) -> int:
    """The ``max_num_seqs`` that matches the pool: the most rows ``n`` of ``max_model_len`` the pool holds when the
    profiling run's sampler pass is over ``n`` rows, and never more than vLLM's own default for the device. The pool
    shrinks as ``n`` grows (the sampler's peak) while the rows need more of it, so the rows that fit are the ones up
    to one ``n``, found by bisection; 1 where not even one row fits (the engine is then refused as vLLM would refuse
    it). Why match them: vLLM's default (1024 on an 80 GB GPU) admits rows the pool cannot hold at
    ``max_model_len``, and its sampler pass over that many rows is profiling peak the pool loses."""
    def holds(n: int) -> bool:
        return engine_start(s, gpu_bytes=gpu_bytes, settings={**settings, "max_num_seqs": n},
                            max_model_len=max_model_len, dtype_bytes=dtype_bytes, processed=processed).holds(n)

    one = engine_start(s, gpu_bytes=gpu_bytes, settings={**settings, "max_num_seqs": 1}, max_model_len=max_model_len,
                       dtype_bytes=dtype_bytes, processed=processed)
    low, high = 1, max(1, min(int((one.pool - one.null_block) // one.row), DEFAULT_MAX_SEQS[gpu_bytes >= 70 * GIB]))
    while low < high:   # holds(low) or low == 1; the answer is in [low, high]
        mid = (low + high + 1) // 2
        low, high = (mid, high) if holds(mid) else (low, mid - 1)
    return low


def pinned_while_asleep(start: EngineStart, level: int) -> float:
    """Host bytes one sleeping engine pins: at every level its ``cudagraph`` pool (the CUDA graph estimate stands for
    it) and its ``runtime`` pool (the input batch's buffers: the block table, ``max_num_seqs`` rows of int32 block
    ids, and the slot mapping, int64 per batched token; the rest is per-request scalars), and at level 1 its weights
    too (``CuMemBackend.suspend``). Each sleep copies them to fresh pinned tensors, freed at the wake into PyTorch's
    pinned-memory cache, which keeps them: the host holds them for the whole job."""
    runtime = start.max_seqs * math.ceil(start.max_model_len / BLOCK) * 4 + start.batched_tokens * 8
    return start.cudagraph + runtime + (start.weights if level == 1 else 0.0)


@dataclass(frozen=True)
class StepExtra:
    """What a decode step of the slow sampler adds per row: bytes moved at the memory bandwidth, and CPU seconds."""

    bytes_per_row: float = 0.0
    seconds_per_row: float = 0.0


def step_extra(s: Shape, *, processed: bool, seeded: bool, top_k_top_p: bool, asks_logprobs: bool) -> StepExtra:
    """The slow sampler's cost per row and decode step, against vLLM's fast path (a stated assumption: the module's
    constants). ``forward_native`` runs instead of FlashInfer when the engine is under ``processed_logprobs`` or a
    request carries its own seed (``forward_cuda`` falls back for generators); it matters only where the sampling
    cuts the distribution (``top_k_top_p``), where it costs a sort of the row. ``processed_logprobs`` also computes a
    log-softmax at every step, which only a call that asks no log-probs would not have computed; a seeded row draws
    its noise in a Python loop."""
    native = processed or seeded
    entries = (SORT_BYTES_PER_ENTRY if native and top_k_top_p else 0) + \
        (LOG_SOFTMAX_BYTES_PER_ENTRY if processed and not asks_logprobs else 0)
    return StepExtra(entries * s.vocab, SEEDED_ROW_SECONDS if seeded else 0.0)


def decode_seconds(start: EngineStart, rows: int, longest: int, mean: float, tbps: float,
                   efficiency: float = 1.0, extra: StepExtra | None = None) -> float:
    """The time to decode ``rows`` rows (``mean`` new tokens on average, up to ``longest``) on one engine, from
    memory traffic at ``tbps`` x ``efficiency`` (the share of the datasheet bandwidth a decode step achieves:
    ``hardware.decode_efficiency``; 1 gives the bound). vLLM batches continuously, so the decode takes at least the
    longest row's steps and at least the steps that ``rows_at_once`` rows at a time need for all the tokens; every
    step reads the weights once. Every decoded token also reads its row's KV cache (priced at half a row of
    ``max_model_len``, the mean over a decode to that length) and, on the slow sampler, ``extra`` per row
    (:func:`step_extra`): those count per token, so a row that has finished reads nothing while the longest one
    goes on. Prefill and the fast sampler's work are left out: decode dominates at thousands of new tokens."""
    at_once = max(1, min(rows, start.rows_at_once))
    steps = max(float(longest), rows * mean / at_once)
    tokens = rows * mean
    extra = extra or StepExtra()
    moved = steps * start.weights + tokens * (start.row / 2 + extra.bytes_per_row)
    return moved / (tbps * 1e12 * efficiency) + tokens * extra.seconds_per_row
