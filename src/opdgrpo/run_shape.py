"""A run's shape and settings: the steps, rows, shards, mini-batches and passes of its steps, the caps that cut them,
its sampling parameters and its arithmetic, read once from its config with the schema's defaults.

The trainer (:mod:`opdgrpo.train.loop`), the cost model (:mod:`opdgrpo.cost.model`) and the planner (:mod:`opdgrpo.cost.resources`)
all read this record, built from the run's config, so the rules they apply (how many shards a step has, whether a
step makes an old-policy pass, which strategy shares the student, how many evaluations a run makes) cannot drift
apart. No default is written here: a key a config leaves out takes its schema's ``default``
(:func:`opdgrpo.schema.with_defaults`). Torch-free: the planners import it without torch's start-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from opdgrpo import schema

#: ``train.logit_chunk_tokens`` when unset: response positions whose full-vocabulary logits exist at once.
DEFAULT_CHUNK_TOKENS = schema.default("train", "logit_chunk_tokens")


def check_budget(value: Any, key: str) -> int | None:
    """``value`` as a token budget: None, or an int >= 1 (a bool is not an int here); else ValueError naming ``key``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"config key `{key}` must be a positive integer (tokens) or null, got {value!r}")
    return value


def train_settings(train: Mapping[str, Any]) -> dict[str, Any]:
    """A run's ``train`` block with every key it leaves out at the schema's default (``eval`` included): the one
    read of the block that every reader of a run's settings goes through."""
    out = schema.with_defaults(train, "train")
    if isinstance(out.get("eval"), Mapping):
        out["eval"] = schema.with_defaults(out["eval"], "train", "eval")
    return out


def method_settings(method: Mapping[str, Any]) -> dict[str, Any]:
    """A run's ``method`` block with every key it leaves out at its method's schema default
    (``method.schema.yaml#/$defs/<name>``, :func:`opdgrpo.schema.with_defaults`)."""
    return schema.with_defaults(method, f"method.schema.yaml#/$defs/{method['name']}")


def evaluation_count(run_cfg: Mapping[str, Any]) -> int:
    """Held-out evaluations a run makes (:func:`evaluations`), from its config."""
    return evaluations(int(run_cfg["method"]["steps"]), int(run_cfg["train"].get("eval_every") or 0))


def evaluations(steps: int, eval_every: int) -> int:
    """Held-out evaluations a run of ``steps`` makes, as the trainer's loop makes them: at step 0, every
    ``eval_every`` steps before the last, and the final one (``ceil(steps / eval_every) + 1``). The one count the
    trainer's shape, the cost model and the scheduler read."""
    return (math.ceil(steps / eval_every) if eval_every else 0) + 1


@dataclass(frozen=True)
class Sampling:
    """How a run samples: its rollouts (``train.temperature``, full distribution) or its held-out evaluation
    (``train.eval``: ``k`` samples per prompt, nucleus and top-k cuts, batches)."""

    temperature: float
    max_new_tokens: int
    top_p: float = 1.0
    top_k: int = 0
    k: int = 1
    batch_size: int | None = None
    max_batch_tokens: int | None = None


@dataclass(frozen=True)
class RunShape:
    """What one run's steps are made of, on ``world`` processes."""

    steps: int
    eval_every: int
    checkpoint_every: int
    prompts_per_step: int
    rows_per_prompt: int         # GRPO's group size, OPD's rollouts per prompt
    mix: str                     # how a multi-domain step splits its prompts: balanced (the default) or instance
    world: int                   # processes sharing the run
    shards: int                  # sampling shards per step (``train.micro_batches``), dealt round-robin to processes
    minibatches: int             # optimiser updates per pass over the batch (GRPO's ``minibatches``)
    updates_per_batch: int       # passes over the batch (GRPO's ``updates_per_batch``)
    reference: bool              # a frozen reference forward per step (``beta > 0``)
    logit_chunk_tokens: int
    microbatch_tokens: int | None   # ``train.max_tokens_per_microbatch``: packed training micro-batches
    packed_row_tokens: int | None   # ``train.packed_row_tokens``: the student's passes over rows laid end to end
    precision: str               # as configured (auto, bf16, fp32) until the trainer resolves it (:meth:`resolved`)
    distributed: str             # how processes share the student: ddp (the default), fsdp, none
    nonfinite: str               # what a non-finite step does: stop or skip
    max_skips: int
    engine: str                  # what samples: hf or vllm
    rollout: Sampling
    evaluation: Sampling
    settings: Mapping[str, Any] = field(compare=False, repr=False)   # the train block with its defaults, for the rest
    method: Mapping[str, Any] = field(compare=False, repr=False)     # the method block with its defaults

    @classmethod
    def of(cls, run_cfg: Mapping[str, Any], world: int = 1) -> RunShape:
        """The shape of the run ``run_cfg`` (a plan's run config: ``train`` and ``method`` blocks) on ``world``
        processes; ValueError naming the key when its shards cannot be dealt evenly."""
        train, method = train_settings(run_cfg["train"]), method_settings(run_cfg["method"])
        grpo = method["name"] == "grpo"   # GRPO's knobs; an OPD batch gets one update and has no reference model
        minibatches = int(method["minibatches"]) if grpo else 1
        prompts = int(train["prompts_per_step"])
        shards = int(train["micro_batches"] or world * minibatches)
        if shards % (world * minibatches) or prompts % shards:
            raise ValueError(f"config key `train.micro_batches` ({shards}) must be a multiple of the number of processes "
                             f"({world}) times `method.minibatches` ({minibatches}) and divide "
                             f"`train.prompts_per_step` ({prompts})")
        per_prompt = method["group_size"] if method["name"] == "grpo" else method["rollouts_per_prompt"]
        ev, new = train["eval"], int(train["max_new_tokens"])
        return cls(steps=int(method["steps"]), eval_every=int(train["eval_every"]),
                   checkpoint_every=int(train["checkpoint_every"]), prompts_per_step=prompts,
                   rows_per_prompt=int(per_prompt), mix=str(train["mix"]), world=int(world), shards=shards,
                   minibatches=minibatches, updates_per_batch=int(method["updates_per_batch"]) if grpo else 1,
                   reference=grpo and float(method["beta"]) > 0, logit_chunk_tokens=int(train["logit_chunk_tokens"]),
                   microbatch_tokens=check_budget(train["max_tokens_per_microbatch"], "train.max_tokens_per_microbatch"),
                   packed_row_tokens=check_budget(train["packed_row_tokens"], "train.packed_row_tokens"),
                   precision=str(train["precision"]), distributed=str(train["distributed"]),
                   nonfinite=str(train["nonfinite"]), max_skips=int(train["max_nonfinite_skips"]),
                   engine=str(train["engine"]), rollout=Sampling(float(train["temperature"]), new),
                   evaluation=Sampling(float(ev["temperature"]), new, float(ev["top_p"]), int(ev["top_k"]), int(ev["k"]),
                                       int(ev["batch_size"]), ev["max_batch_tokens"]),
                   settings=train, method=method)

    def resolved(self, precision: str) -> RunShape:
        """This shape with its precision as the job resolved it on its device (``bf16`` or ``fp32``): the trainer
        resolves ``auto`` once (:func:`opdgrpo.train.precision.resolve`) and every autocast reads the result."""
        return replace(self, precision=precision)

    @property
    def evaluations(self) -> int:
        """Held-out evaluations the run makes (:func:`evaluations`)."""
        return evaluations(self.steps, self.eval_every)

    @property
    def old_policy(self) -> bool:
        """A forward of the sampling policy before the first update: the batch gets more than one update."""
        return self.updates_per_batch * self.minibatches > 1

    @property
    def rows_per_step(self) -> int:
        return self.prompts_per_step * self.rows_per_prompt

    @property
    def rows_per_shard(self) -> int:
        return max(1, math.ceil(self.rows_per_step / self.shards))

    @property
    def sharded(self) -> bool:
        """FSDP shards the student's weights, gradients and optimizer state (only with several processes)."""
        return self.distributed == "fsdp" and self.world > 1

    @property
    def one_pass_per_shard(self) -> bool:
        """Each update is one shard trained as it was sampled: its own token count normalises its loss."""
        return self.shards == self.minibatches and self.microbatch_tokens is None

    def mine(self, rank: int) -> list[int]:
        """The shards of every step that process ``rank`` samples and trains."""
        return [s for s in range(self.shards) if s % self.world == rank]
