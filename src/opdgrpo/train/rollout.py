"""From tasks to sampled completions and back: the glue between domains, tokenizer and sampler."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Mapping, Sequence

import torch

from opdgrpo import schema
from opdgrpo.domains import Domain, Task
from opdgrpo.train.sampling import Rollouts, sample
from opdgrpo.train.stops import stop_strings_for


@dataclass
class ScoredRollouts:
    tasks: list[Task]
    rollouts: Rollouts
    texts: list[str]
    rewards: torch.Tensor          # (B,) float

    @property
    def response_lengths(self) -> list[int]:
        return [len(c) for c in self.rollouts.completions]


@dataclass(frozen=True)
class PromptFormat:
    """How a task's prompt becomes tokens, and which tokens end a completion.

    The tiny world feeds the raw prompt. Chat models (the paper profile) get the prompt as one user turn through the
    tokenizer's own chat template (``train.chat_template: true``), optionally with Qwen3's thinking switch
    (``enable_thinking``), and stop at the end of their turn (``stop_tokens``, e.g. ``<|im_end|>``) as well as at EOS.
    Base models also stop at their domain's stop strings (``stop_strings: true``, :mod:`opdgrpo.train.stops`), before
    they write a next question of their own; chat models end their turn instead.
    """

    chat_template: bool = False
    enable_thinking: bool | None = None
    stop_tokens: tuple[str, ...] = ()
    stop_strings: bool = False

    @classmethod
    def from_config(cls, block: Mapping) -> "PromptFormat":
        """From a ``train`` block or a model's prompt format: a key it leaves out takes the train schema's default."""
        s = {k: block.get(k, schema.default("train", k)) for k in ("chat_template", "enable_thinking", "stop_tokens",
                                                                  "stop_strings")}
        thinking = s["enable_thinking"]
        return cls(bool(s["chat_template"]), None if thinking is None else bool(thinking),
                   tuple(s["stop_tokens"] or ()), bool(s["stop_strings"]))

    def stop_ids(self, tokenizer) -> list[int]:
        ids = [tokenizer.eos_token_id]
        for token in self.stop_tokens:
            tid = tokenizer.convert_tokens_to_ids(token)
            if tid is None or tid == tokenizer.unk_token_id:
                raise ValueError(f"config key `train.stop_tokens`: {token!r} is not a token of the tokenizer")
            ids.append(int(tid))
        return list(dict.fromkeys(ids))


def encode_prompts(tokenizer, tasks: Sequence[Task], fmt: PromptFormat = PromptFormat()) -> list[list[int]]:
    """Token ids of each task's prompt. Each distinct prompt is encoded once, all in one batch call: a GRPO group
    or an avg@k evaluation repeats every prompt k times, and one tokenizer call per row cost more than the sampling
    of short completions (same ids as encoding row by row)."""
    prompts = [t.prompt for t in tasks]
    unique = list(dict.fromkeys(prompts))
    if not fmt.chat_template:
        texts = unique
    else:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("config key `train.chat_template` is true but the tokenizer has no chat template")
        extra = {} if fmt.enable_thinking is None else {"enable_thinking": fmt.enable_thinking}
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                               add_generation_prompt=True, **extra) for p in unique]
    ids = dict(zip(unique, tokenizer(texts, add_special_tokens=False)["input_ids"]))
    return [list(ids[p]) for p in prompts]


def score(domains: Mapping[str, Domain], tasks: Sequence[Task], texts: Sequence[str]) -> torch.Tensor:
    """Rewards in task order; each domain's verifier scores its own rows in one batch."""
    rewards = torch.zeros(len(tasks))
    for name in {t.domain for t in tasks}:
        rows = [i for i, t in enumerate(tasks) if t.domain == name]
        values = domains[name].score([tasks[i] for i in rows], [texts[i] for i in rows])
        rewards[rows] = torch.tensor(values, dtype=torch.float32)
    return rewards


def sample_and_score(model, tokenizer, domains: Mapping[str, Domain], tasks: Sequence[Task], *, max_new_tokens: int,
                     temperature: float, generator: torch.Generator, with_rewards: bool = True,
                     fmt: PromptFormat = PromptFormat(), top_p: float = 1.0, top_k: int = 0,
                     engine=None, engine_logprobs: bool = False) -> ScoredRollouts:
    """Sample completions of ``tasks`` and score them. ``engine`` (:mod:`opdgrpo.train.engines`) samples; None: the
    project's own sampler on ``model`` (the ``hf`` engine). ``engine_logprobs``: a training rollout, which asks the
    engine for its own log-probs (the mismatch metric, GRPO's importance weights); evaluation and S2 do not."""
    # None: the hf engine's own call (its rollouts carry no engine log-probs)
    draw = partial(engine.sample, logprobs=engine_logprobs) if engine is not None else partial(sample, model)
    strings = stop_strings_for(domains, tasks, fmt.stop_strings, tokenizer)
    rollouts = draw(
        encode_prompts(tokenizer, tasks, fmt),
        max_new_tokens=max_new_tokens,
        eos_token_id=fmt.stop_ids(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        generator=generator,
        **({} if strings is None else {"stop_strings": strings}),
    )
    texts = tokenizer.batch_decode(rollouts.completions, skip_special_tokens=True)
    if rollouts.text_ends is not None:   # a row cut at a stop string: its text ends where the stop string starts
        texts = [t if end is None else t[:end] for t, end in zip(texts, rollouts.text_ends)]
    rewards = score(domains, tasks, texts) if with_rewards else torch.full((len(tasks),), float("nan"))
    return ScoredRollouts(list(tasks), rollouts, texts, rewards)
