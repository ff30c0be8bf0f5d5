"""Sampling engines: what turns prompts' token ids into :class:`~opdgrpo.train.sampling.Rollouts` (``train.engine``).

Every place that samples (training rollouts, held-out evaluation, the base-model evaluation, S2's difficulty job)
calls an engine through :func:`opdgrpo.train.rollout.sample_and_score`, so the choice is made once, in config:

- ``hf``: the project's own KV-cache loop (:func:`opdgrpo.train.sampling.sample`) on the trainer's model itself; the
  tiny and smoke profiles use it (their results stay byte-identical to what they were before engines existed).
- ``vllm``: a vLLM ``LLM`` in the same process, colocated with the trainer (TRL's ``vllm_mode="colocate"``, verl's
  hybrid engine). It is built once from a saved copy of the model and then gets the trainer's weights in memory
  after each optimiser step (:meth:`~opdgrpo.train.engines.vllm_engine.VLLMEngine.sync`); see that module.

Both stop a base model's rows at their domain's stop strings by one rule (:mod:`opdgrpo.train.stops`), and both
return the same structure, with the engine's own per-token log-probs where a training rollout asks for them and the
engine has them (vLLM, by its ``logprobs_mode``): the trainer always recomputes the log-probs it trains on, and uses
the engine's only for the mismatch statistic and the optional truncated importance-sampling correction
(``method.engine_is_cap``). Evaluation and S2's solve rates ask for none.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Mapping, Protocol, Sequence

import torch

from opdgrpo import schema
from opdgrpo.train.sampling import Rollouts, sample
from opdgrpo.train.stops import StopStrings


class Engine(Protocol):
    """What the rollout and evaluation code calls; :func:`opdgrpo.train.sampling.sample`'s keywords, minus the model."""

    name: str
    #: True: the engine schedules its own batches (vLLM, by its KV-cache budget), so evaluation and S2's difficulty
    #: sampling hand it all of a set's prompts in one call; False: they batch by ``batch_size``/``max_batch_tokens``.
    schedules_batches: bool

    def sample(self, prompts: list[list[int]], *, max_new_tokens: int, eos_token_id: int | Sequence[int],
               pad_token_id: int, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
               generator: torch.Generator | None = None, stop_strings: StopStrings | None = None,
               logprobs: bool = False) -> Rollouts:
        """``logprobs``: a training rollout, which reads the engine's own log-probs where the engine has them."""

    def sync(self, model: torch.nn.Module, version: Any) -> None:
        """Make the engine sample from ``model``'s current weights (``version`` names them: a repeat is free)."""

    def close(self) -> None:
        """Free what the engine holds, now (a job ends, or the next model's engine starts)."""


class HFEngine:
    """The project's own sampler on the model itself: :func:`opdgrpo.train.sampling.sample`, unchanged."""

    name = "hf"
    schedules_batches = False

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def sample(self, prompts: list[list[int]], *, logprobs: bool = False, **kwargs) -> Rollouts:
        """The project's sampler; ``logprobs`` asks for nothing here (the sampler is the trainer's model itself)."""
        return sample(self.model, prompts, **kwargs)

    def sync(self, model: torch.nn.Module, version: Any = None) -> None:
        self.model = model   # the same weights, nothing to copy

    def close(self) -> None:
        """Nothing of its own to free: the model is the trainer's."""


def longest_row(tokenizer, tasks: Sequence[Any], fmt: Any, max_new_tokens: int) -> int:
    """The longest row a job can sample: its longest prompt as the sampler encodes it, plus ``max_new_tokens``
    (a vLLM engine's ``max_model_len``)."""
    from opdgrpo.train.rollout import encode_prompts

    unique = list({t.prompt: t for t in tasks}.values())
    return max((len(ids) for ids in encode_prompts(tokenizer, unique, fmt)), default=0) + int(max_new_tokens)


def build_engine(name: str, model: torch.nn.Module, tokenizer, *, scratch: Path | None, settings: Mapping[str, Any],
                 max_len: int = 0, seed: int = 0, logprobs_mode: str | None = None) -> Engine:
    """The engine ``train.engine`` names, for ``model``, in a process that also trains it. ``vllm`` saves
    ``model``'s config and ``tokenizer`` to ``scratch`` (vLLM starts from a directory), takes ``settings``
    (``train.vllm``: extra ``LLM`` arguments), ``max_len`` (the job's longest row, :func:`longest_row`) and
    ``logprobs_mode`` (the rollouts', :func:`~opdgrpo.train.engines.vllm_engine.rollout_logprobs_mode`), and starts
    on placeholder weights: the caller syncs ``model`` into it before its first sampling."""
    if name == "hf":
        return HFEngine(model)
    if name != "vllm":
        raise ValueError(f"config key `train.engine`: must be one of {list(schema.allowed('train', 'engine'))}, got {name!r}")
    from opdgrpo.train.engines.vllm_engine import VLLMEngine

    if scratch is None:
        raise ValueError("train.engine vllm needs a scratch directory for the model's config and tokenizer")
    if max_len <= 0:
        raise ValueError("train.engine vllm needs the job's longest row (max_len) to size the engine")
    return VLLMEngine.for_model(model, tokenizer, scratch, max_len=max_len, settings=settings, seed=seed,
                                logprobs_mode=logprobs_mode)


@contextlib.contextmanager
def checkpoint_engine(cfg: Mapping[str, Any], path: str | Path, model: torch.nn.Module, *, tokenizer,
                      tasks: Sequence[Any], fmt: Any, max_new_tokens: int) -> Iterator[Engine | None]:
    """For jobs that sample a saved model without training it (base-model evaluation, S2's difficulty job): None
    under ``engine: hf`` (or no key: the project's sampler on ``model``), else a vLLM engine on the checkpoint
    directory ``path`` itself (no copy), with the job's ``vllm`` settings, sized for the longest row of ``tasks``
    (:func:`longest_row`), awake throughout (no trainer shares its GPU) and shut down when the block ends: one
    engine at a time in this process (S2's job samples each model in a process of its own,
    :mod:`opdgrpo.stages.difficulty`). No request asks for log-probs (nothing here reads them), so the engine keeps
    vLLM's default ``logprobs_mode``. ``model`` gives the FLOP formulas' config. A weightless ``source: random``
    directory starts on vLLM's own random weights (``load_format="dummy"``): a random model of the same shape, not the
    same draw."""
    name = str(cfg.get("engine") or schema.default("train", "engine"))
    if name == "hf":
        yield None
        return
    if name != "vllm":
        raise ValueError(f"config key `train.engine`: must be one of {list(schema.allowed('train', 'engine'))}, got {name!r}")
    from opdgrpo.train.engines.vllm_engine import VLLMEngine
    from opdgrpo.train.models import is_random

    max_len = longest_row(tokenizer, tasks, fmt, max_new_tokens)
    device = next(model.parameters()).device
    with VLLMEngine(Path(path), model.config, max_len=max_len, settings=cfg.get("vllm") or schema.default("train", "vllm"),
                    seed=int(cfg.get("seed") or 0), device="cpu" if device.type == "meta" else device,
                    load_format="dummy" if is_random(path) else None) as engine:
        yield engine
