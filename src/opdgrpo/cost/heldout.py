"""What an evaluation samples, set by set, and how long the answers are: the rows every sampling estimate prices.

Rows. :func:`opdgrpo.train.evaluation.evaluate` samples each held-out set's prompts times that set's own ``k``
(``domains.<d>.heldout.<set>.k``, :func:`opdgrpo.domains.base.heldout_k`: AIME x16, AMC and LiveCodeBench x4,
IFEval and MMLU-Pro x1 in the paper profile), else the job's ``k``; a base evaluation first keeps the first
``pretrain.eval.max_prompts`` prompts of each set (:func:`opdgrpo.train.evaluation.heldout_for`). A set's prompts
are its ``size``, else its ``expected_rows`` (hub sets are not loaded to plan); one with neither is reported, not
guessed.

Lengths. A model samples in thinking mode when its conf block says so (``models.<m>.sampling.enable_thinking``,
the Qwen3 teachers) and the job does not switch it off (``train.enable_thinking: false``): its answers take the
``cost_model.thinking`` figure of their domain (near the cap for math and code, where Qwen3's thinking runs past
8,192 tokens on most competition problems); a base student takes the domain's ``response_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from opdgrpo.cost.model import cost_block, lengths_for


@dataclass(frozen=True)
class EvalSet:
    """One held-out set as a job samples it."""

    domain: str
    name: str
    prompts: int
    k: int
    response: float          # mean new tokens per answer assumed
    prompt: float            # mean prompt tokens

    @property
    def rows(self) -> int:
        return self.prompts * self.k

    @property
    def label(self) -> str:
        return f"{self.domain}.{self.name}"


def thinks(cfg: Mapping[str, Any], model: str, enable_thinking: Any = None) -> bool:
    """Whether ``models.<model>`` samples in thinking mode: its ``sampling.enable_thinking``, unless the job's
    prompt format switches thinking off (``enable_thinking: false``; null leaves the model's own default)."""
    sampling = ((cfg.get("models") or {}).get(model) or {}).get("sampling") or {}
    return bool(sampling.get("enable_thinking")) and enable_thinking is not False


def response_tokens(cfg: Mapping[str, Any], domain: str, cap: int, thinking: bool) -> float:
    """Mean new tokens of an answer in ``domain`` under a ``cap``: ``cost_model.thinking.<domain>`` for a thinking
    model (the cap where no figure is given), else the domain's ``response_tokens``; never above the cap."""
    block = cost_block(cfg)
    if thinking:
        return min(float(block["thinking"].get(domain, cap)), float(cap))
    return lengths_for(block, domain, cap).response


def thinking_block(cfg: Mapping[str, Any], domains: Sequence[str], cap: int) -> dict[str, Any]:
    """The ``cost_model`` block with each domain's mean response replaced by its thinking figure: what a training
    run whose student thinks (S1b's GRPO of a Qwen3 teacher) is priced with."""
    block = cost_block(cfg)
    per_domain = {d: dict(b) for d, b in block["per_domain"].items()}
    for d in domains:
        per_domain.setdefault(d, {})["response_tokens"] = response_tokens(cfg, d, cap, True)
    return {**block, "per_domain": per_domain}


def sets_of(cfg: Mapping[str, Any], domains: Mapping[str, Any], names: Sequence[str], *, k: int,
            max_prompts: int | None, cap: int, thinking: bool) -> tuple[list[EvalSet], list[str]]:
    """(the sets an evaluation over ``names`` samples, the sets it cannot count): each set's prompts (at most
    ``max_prompts`` where set; 0 samples nothing), its own k or ``k``, and the answers' mean length."""
    if max_prompts == 0:
        return [], []
    block = cost_block(cfg)
    out, unsized = [], []
    for d in names:
        for name, spec in ((domains[d] or {}).get("heldout") or {}).items():
            size = spec.get("size") or spec.get("expected_rows")
            if size is None:
                unsized.append(f"{d}.{name}")
                continue
            prompts = min(int(size), int(max_prompts)) if max_prompts else int(size)
            out.append(EvalSet(d, name, prompts, int(spec.get("k") or k), response_tokens(cfg, d, cap, thinking),
                               lengths_for(block, d, cap).prompt))
    return out, unsized


def base_sets(cfg: Mapping[str, Any], rc: Mapping[str, Any], thinking: bool) -> tuple[list[EvalSet], list[str]]:
    """A base job's evaluation (:func:`opdgrpo.stages.hub_models.fetch_base`): every domain's sets, the first
    ``pretrain.eval.max_prompts`` prompts of each, at the model's own ``max_new_tokens`` where its sampling block
    sets one."""
    ev = rc["pretrain"].get("eval") or {}
    cap = base_cap(cfg, rc)
    domains = rc.get("domains") or cfg["domains"]
    return sets_of(cfg, domains, sorted(domains), k=int(ev.get("k") or 1), max_prompts=ev.get("max_prompts"),
                   cap=cap, thinking=thinking)


def base_cap(cfg: Mapping[str, Any], rc: Mapping[str, Any]) -> int:
    """New tokens at most per answer of a base evaluation: the model's ``sampling.max_new_tokens``, else
    ``pretrain.eval.max_new_tokens``, else the training cap."""
    ev = rc["pretrain"].get("eval") or {}
    sampling = (rc.get("model") or {}).get("sampling") or {}
    return int(sampling.get("max_new_tokens") or ev.get("max_new_tokens") or cfg["train"]["max_new_tokens"])
