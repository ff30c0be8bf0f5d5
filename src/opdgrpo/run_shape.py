"""A run's shape: the steps, rows, shards, mini-batches and passes of its steps, and the caps that cut them, with
every default in one place.

The trainer (:mod:`opdgrpo.train.loop`), the cost model (:mod:`opdgrpo.cost.model`) and the planner (:mod:`opdgrpo.cost.resources`)
all read this record, built from the run's config, so the rules they apply (how many shards a step has, whether a
step makes an old-policy pass, which strategy shares the student) cannot drift apart. Torch-free: the planners import
it without torch's start-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

#: ``train.distributed`` when unset: how several processes share the student (one process needs no strategy).
DEFAULT_DISTRIBUTED = "ddp"
#: ``train.logit_chunk_tokens`` when unset: response positions whose full-vocabulary logits exist at once.
DEFAULT_CHUNK_TOKENS = 4096


def check_budget(value: Any, key: str) -> int | None:
    """``value`` as a token budget: None, or an int >= 1 (a bool is not an int here); else ValueError naming ``key``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"config key `{key}` must be a positive integer (tokens) or null, got {value!r}")
    return value


def chunk_tokens(train: Mapping[str, Any]) -> int:
    """``train.logit_chunk_tokens`` (schema: an integer >= 1), or the default."""
    return int(train.get("logit_chunk_tokens") or DEFAULT_CHUNK_TOKENS)


def evaluation_count(run_cfg: Mapping[str, Any]) -> int:
    """Held-out evaluations a run makes, as the trainer's loop makes them: at step 0, every ``train.eval_every``
    steps before the last, and the final one (``ceil(steps / eval_every) + 1``). The one count the cost model and the
    scheduler read."""
    steps, every = int(run_cfg["method"]["steps"]), int(run_cfg["train"].get("eval_every") or 0)
    return (math.ceil(steps / every) if every else 0) + 1


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
    precision: str               # as configured (auto, bf16, fp32); the trainer resolves it on its device
    distributed: str             # how processes share the student: ddp (the default), fsdp, none
    nonfinite: str               # what a non-finite step does: stop or skip
    max_skips: int

    @classmethod
    def of(cls, run_cfg: Mapping[str, Any], world: int = 1) -> RunShape:
        """The shape of the run ``run_cfg`` (a plan's run config: ``train`` and ``method`` blocks) on ``world``
        processes; ValueError naming the key when its shards cannot be dealt evenly."""
        train, method = run_cfg["train"], run_cfg["method"]
        minibatches = int(method.get("minibatches", 1))   # GRPO's knobs; 1 where the method has none
        prompts = int(train["prompts_per_step"])
        shards = int(train.get("micro_batches") or world * minibatches)
        if shards % (world * minibatches) or prompts % shards:
            raise ValueError(f"config key `train.micro_batches` ({shards}) must be a multiple of the number of processes "
                             f"({world}) times `method.minibatches` ({minibatches}) and divide "
                             f"`train.prompts_per_step` ({prompts})")
        per_prompt = method["group_size"] if method["name"] == "grpo" else method["rollouts_per_prompt"]
        return cls(steps=int(method["steps"]), eval_every=int(train["eval_every"]),
                   checkpoint_every=int(train["checkpoint_every"]), prompts_per_step=prompts,
                   rows_per_prompt=int(per_prompt), mix=str(train.get("mix") or "balanced"), world=int(world), shards=shards, minibatches=minibatches,
                   updates_per_batch=int(method.get("updates_per_batch", 1)),
                   reference=float(method.get("beta") or 0.0) > 0, logit_chunk_tokens=chunk_tokens(train),
                   microbatch_tokens=check_budget(train.get("max_tokens_per_microbatch"), "train.max_tokens_per_microbatch"),
                   precision=str(train.get("precision", "fp32")), distributed=str(train.get("distributed") or DEFAULT_DISTRIBUTED),
                   nonfinite=str(train.get("nonfinite", "stop")), max_skips=int(train.get("max_nonfinite_skips", 3)))

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
