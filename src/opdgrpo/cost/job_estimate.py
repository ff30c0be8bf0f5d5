"""The planner's records: the ``hardware`` a profile is sized for, one job's estimate (memory per device, host
memory, and wall time cost by cost), and its engine's settings (:class:`EngineChoice`, chosen by
:mod:`opdgrpo.cost.engine_share`). Built by :mod:`opdgrpo.cost.resources` (training jobs) and
:mod:`opdgrpo.cost.sampling_jobs` (base evaluation, S2's solve rates); read by the refusals, the summary and
:mod:`opdgrpo.cost.stops`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from opdgrpo.cost.engine_memory import EngineStart
from opdgrpo.cost.gpus import reported_gib
from opdgrpo.cost.heldout import EvalSet
from opdgrpo.cost.memory_model import GIB

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

#: The share of the datasheet memory bandwidth a vLLM decode step achieves, where ``hardware.decode_efficiency`` is
#: unset: 0.65, fitted to vLLM serving Qwen3-8B on one H100 (818 tokens/s at 8 long sequences and 3,117 at 96,
#: against the bound of a step reading the weights and the rows' KV cache at 3.35 TB/s: docs/cost-model.md).
DECODE_EFFICIENCY = 0.65

#: What to change when a component is the one that does not fit, per component.
ADVICE = {
    "weights": "train.distributed=fsdp or more GPUs per run (resources.train.gpu)",
    "optimizer": "train.distributed=fsdp or more GPUs per run (resources.train.gpu)",
    "gradients": "train.distributed=fsdp or more GPUs per run (resources.train.gpu)",
    "teachers": "train.distributed=fsdp (teachers are sharded like the student) or a smaller teacher",
    "sampling": "more train.micro_batches (fewer rows per sampling call) or a lower train.max_new_tokens",
    "training pass": "a lower train.max_tokens_per_microbatch, train.activation_checkpointing=true, or a lower "
                     "train.logit_chunk_tokens",
    "evaluation": "a lower {eval_knob} (or batch_size beside it)",
    "vLLM engine": "a lower train.vllm.gpu_memory_utilization (the engine's share of a GPU beside the trainer), or "
                   "leave it unset: the plan then gives each job's engine what its trainer leaves",
    "vLLM engine alone": "a higher train.vllm_alone.gpu_memory_utilization, or a smaller model",
    "vLLM start": "a lower max_new_tokens (the engine's max_model_len is the longest prompt + max_new_tokens), a "
                  "lower max_num_batched_tokens/max_num_seqs in {settings} (vLLM's profiling peak), or a higher "
                  "{settings}.gpu_memory_utilization",
}

#: The batch knob of each kind of job's evaluation (the rows sampled at once).
EVAL_KNOBS = {"train": "train.eval.max_batch_tokens", "base": "pretrain.eval.max_batch_tokens",
              "difficulty": "studies.S2.max_batch_tokens"}

#: The cost lines of the summary, in order.
COSTS = ("rollouts", "training passes", "teachers", "evaluation", "solve rates", "code scoring", "checkpoints",
         "start-ups")


@dataclass(frozen=True)
class Hardware:
    """The ``hardware`` block: one GPU model and the throughput wall times are estimated from."""

    name: str
    memory_gib: float
    usable_fraction: float
    bf16_tflops: float
    train_mfu: float
    sampling_mfu: float
    memory_tbps: float | None = None
    reported_gib: float = 0.0               # what CUDA reports (opdgrpo.cost.gpus); 0: memory_gib
    decode_efficiency: float = DECODE_EFFICIENCY

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> Hardware | None:
        block = cfg.get("hardware")
        if not block:
            return None
        return cls(str(block["name"]), float(block["memory_gib"]), float(block["usable_fraction"]),
                   float(block["bf16_tflops"]), float(block["train_mfu"]), float(block["sampling_mfu"]),
                   float(block["memory_tbps"]) if block.get("memory_tbps") else None, reported_gib(block),
                   float(block.get("decode_efficiency") or DECODE_EFFICIENCY))

    @property
    def device_bytes(self) -> float:
        """The device's memory as CUDA reports it (vLLM's shares are fractions of this)."""
        return (self.reported_gib or self.memory_gib) * GIB

    @property
    def budget(self) -> float:
        return self.device_bytes * self.usable_fraction


@dataclass(frozen=True)
class EngineChoice:
    """One job's engine settings as the rules pass them: each value chosen by the plan, set by hand, or None (vLLM's
    default: the plan had no ``hardware`` to choose by, or the job runs on CPUs)."""

    gpu_memory_utilization: float | None
    max_num_seqs: int | None
    share_by_hand: bool = False
    seqs_by_hand: bool = False
    key: str = "train.vllm"           # the settings block the job's engine reads
    room: float = 0.0                 # bytes the plan found for the engine (where it chose the share)

    def label(self, name: str) -> str:
        """``0.62 (plan)``, ``0.35 (set)`` or ``-``, for the summary."""
        value = getattr(self, name)
        if value is None:
            return "-"
        by_hand = self.share_by_hand if name == "gpu_memory_utilization" else self.seqs_by_hand
        shown = f"{value:.2f}" if name == "gpu_memory_utilization" else str(value)
        return f"{shown} ({'set' if by_hand else 'plan'})"


@dataclass
class JobEstimate:
    job: str
    kind: str
    gpus: int
    static: dict[str, float]                       # bytes held for the whole job, per device
    phases: dict[str, float]                       # bytes of each phase, per device; the largest one is the peak
    host: float = 0.0                              # bytes of host memory per node while the models load
    host_resume: float = 0.0                       # the same on resume: the trainer state is held while they load
    host_steady: float = 0.0                       # after the load: the sleeping engines' pinned weights, a save
    engine: EngineStart | None = None              # vLLM's start-up memory (engine jobs on a device with hardware)
    engine_key: str = "train.vllm"                 # the settings block that engine reads
    engine_choice: EngineChoice | None = None      # its share and max_num_seqs, chosen or set (cost.engine_share)
    trainer_at_start: float = 0.0                  # what a colocated trainer holds when its engine starts
    costs: dict[str, tuple[float, float]] = field(default_factory=dict)   # wall hours (low, high) by cost
    sets: list[EvalSet] = field(default_factory=list)                     # what one evaluation samples
    attempts: int = 1                              # allocations the high end needs (training jobs resume)
    startup_h: tuple[float, float] = (0.0, 0.0)    # hours of one attempt's start (models, engine, resume)
    step_s: float = 0.0                            # a training step, high end (seconds)
    eval_s: float = 0.0                            # one evaluation, high end
    waits: dict[str, float] = field(default_factory=dict)   # seconds a rank may wait for another, by phase
    notes: list[str] = field(default_factory=list)
    gpus_from: str = ""                            # on a machine: "plan" (chosen per job) or "set" (by hand in conf)

    @property
    def hours(self) -> float | None:
        return sum(low for low, _ in self.costs.values()) if self.costs else None

    @property
    def hours_high(self) -> float | None:
        return sum(high for _, high in self.costs.values()) if self.costs else None

    @property
    def host_peak(self) -> float:
        return max(self.host, self.host_resume, self.host_steady)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get) if self.phases else "-"

    @property
    def peak(self) -> float:
        return sum(self.static.values()) + (max(self.phases.values()) if self.phases else 0.0)

    @property
    def share_planned(self) -> bool:
        """Whether the plan chose the engine's share (:mod:`opdgrpo.cost.engine_share`) rather than a user."""
        return self.engine_choice is not None and not self.engine_choice.share_by_hand

    def advice(self) -> str:
        """The knob of the largest contributor: its peak phase when that outweighs every static component. A share the
        plan chose is what the static memory left it, so the static memory is what to change then."""
        parts = dict(self.static)
        if not (self.share_planned and self.peak_phase.startswith("vLLM engine")) or not parts:
            parts[self.peak_phase] = self.phases.get(self.peak_phase, 0.0)
        return ADVICE[max(parts, key=parts.get)].format(eval_knob=EVAL_KNOBS[self.kind])

    def add(self, cost: str, low: float, high: float | None = None) -> None:
        """Add ``low`` (and ``high``, default the same) wall hours to ``cost``."""
        was = self.costs.get(cost, (0.0, 0.0))
        self.costs[cost] = (was[0] + low, was[1] + (low if high is None else max(low, high)))
