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

The profiling forward is vLLM's ``profile_run``: ``max_num_batched_tokens`` tokens through the model and a sampler
pass over ``max_num_seqs`` rows of full-vocabulary float32 logits. Its peak is estimated here from the MLP's
intermediate tensors (the largest per-layer activations) and the sampler's logit copies; vLLM measures it.
``NON_TORCH_BYTES`` stands for what vLLM counts as non-torch memory during that run (cuBLAS workspaces, NCCL
buffers): an assumption, not a measurement, until a GPU pilot records vLLM's own log line ("Available KV cache
memory").
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
#: Memory vLLM counts as non-torch during its profiling run (ours, an assumption; see the module docstring).
NON_TORCH_BYTES = 0.5 * GIB
#: Sampler copies of the profiling run's logits (logits, probabilities, log-probabilities), float32.
SAMPLER_COPIES = 3
#: vLLM's CUDA graph estimate per decoder layer (0.52 GiB over Qwen3-8B's 36 layers; module docstring).
CUDAGRAPH_BYTES_PER_LAYER = 0.52 * GIB / 36


def kv_row_bytes(s: Shape, max_model_len: int, dtype_bytes: int = 2) -> float:
    """vLLM's ``max_memory_usage_bytes`` summed over layers: the KV cache of one ``max_model_len`` row
    (:func:`opdgrpo.cost.memory_model.kv_cache_bytes`) in whole blocks."""
    return kv_cache_bytes(s, 1, BLOCK * math.ceil(max_model_len / BLOCK), dtype_bytes)


@dataclass(frozen=True)
class EngineStart:
    """One engine's memory at start, per GPU, in bytes; ``rows_at_once``: rows of ``max_model_len`` its pool holds."""

    share: float                 # gpu_memory_utilization x the device's memory
    weights: float
    profile_peak: float          # the profiling forward and sampler pass, plus non-torch memory
    pool: float                  # what is left for the KV cache
    row: float                   # one row of max_model_len
    max_model_len: int
    cudagraph: float = 0.0       # vLLM's CUDA graph estimate, taken from the pool (0 under enforce_eager)
    max_seqs: int = 1 << 30      # max_num_seqs: rows the scheduler runs at once at most

    @property
    def starts(self) -> bool:
        return self.pool >= self.row + self.row / math.ceil(self.max_model_len / BLOCK)   # + the null block

    @property
    def rows_at_once(self) -> int:
        return max(0, min(int(self.pool // self.row), self.max_seqs))


def engine_start(s: Shape, *, gpu_bytes: float, settings: Mapping[str, Any], max_model_len: int,
                 dtype_bytes: int = 2) -> EngineStart:
    """The engine's start on one ``gpu_bytes`` device with ``settings`` (``train.vllm`` and, for jobs that only
    sample, ``train.vllm_alone`` over it)."""
    big = gpu_bytes >= 70 * GIB
    share = float(settings.get("gpu_memory_utilization", 0.9)) * gpu_bytes
    tokens = int(settings.get("max_num_batched_tokens") or DEFAULT_BATCHED_TOKENS[big])
    seqs = int(settings.get("max_num_seqs") or DEFAULT_MAX_SEQS[big])
    weights = dtype_bytes * params(s)
    forward = tokens * (3 * s.intermediate + 4 * s.hidden) * dtype_bytes   # gate/up outputs and the residual stream
    sampler = SAMPLER_COPIES * seqs * s.vocab * 4
    peak = forward + sampler + NON_TORCH_BYTES
    graphs = 0.0 if settings.get("enforce_eager") else CUDAGRAPH_BYTES_PER_LAYER * s.layers
    return EngineStart(share, weights, peak, share - weights - peak - graphs,
                       kv_row_bytes(s, max_model_len, dtype_bytes), int(max_model_len), graphs, seqs)


def decode_seconds(start: EngineStart, rows: int, longest: int, mean: float, tbps: float,
                   efficiency: float = 1.0) -> float:
    """The time to decode ``rows`` rows (``mean`` new tokens on average, up to ``longest``) on one engine: vLLM
    batches continuously, so the decode takes at least the longest row's steps and at least the steps that
    ``rows_at_once`` rows at a time need for all the tokens; each step reads the weights and those rows' KV cache
    (at half the row, its mean over the decode) from memory at ``tbps`` x ``efficiency`` (the share of the
    datasheet bandwidth a decode step achieves: ``hardware.decode_efficiency``; 1 gives the bound). Prefill and the
    sampler's work are left out: decode dominates at thousands of new tokens."""
    at_once = max(1, min(rows, start.rows_at_once))
    steps = max(float(longest), rows * mean / at_once)
    return steps * (start.weights + at_once * start.row / 2) / (tbps * 1e12 * efficiency)
