"""Shared by tests/unit/test_logit_chunks.py and benchmarks/opd_memory.py: a random Qwen3 student and teacher with
a large vocabulary, a shard of long rows, and the OPD loss computed the old way (full-vocabulary logits of the whole
shard, as ``main`` did before ``train.logit_chunk_tokens``) and the new way (chunks of positions)."""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from opdgrpo.domains import Task
from opdgrpo.train.inference import FrozenForward
from opdgrpo.train.logit_chunks import reduced_forward
from opdgrpo.train.losses import topk_reverse_kl
from opdgrpo.train.models import autocast
from opdgrpo.train.objectives import GRPOObjective, OPDObjective, Shard, position_ids
from opdgrpo.train.rollout import ScoredRollouts
from opdgrpo.train.sampling import Rollouts

METHOD = {"name": "opd", "rollouts_per_prompt": 1, "aggregation": "token-mean", "kl_top_k": 16}
GRPO = {"name": "grpo", "group_size": 2, "aggregation": "token-mean", "scale_by_std": True, "clip_eps": 0.2,
        "clip_eps_high": None}
PROMPT = 4


def model(vocab: int, seed: int, hidden: int = 64, layers: int = 1) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, tie_word_embeddings=True,
                         max_position_embeddings=8192)
    config._attn_implementation = "eager"
    return Qwen3ForCausalLM(config)


def shard(rows: int, response: int, vocab: int, seed: int = 0) -> Shard:
    """``rows`` rows of a ``PROMPT``-token prompt and ``response`` response tokens, the last rows shorter."""
    g = torch.Generator().manual_seed(seed)
    sequences = torch.randint(3, vocab, (rows, PROMPT + response), generator=g)
    completion = torch.ones(rows, response, dtype=torch.bool)
    for r in range(rows):
        completion[r, response - r:] = False if r else True
    rollouts = Rollouts(sequences=sequences, attention_mask=torch.ones_like(sequences), completion_mask=completion,
                        prompt_len=PROMPT, completions=[[0] * response] * rows,
                        finished=torch.zeros(rows, dtype=torch.bool), flops=0.0, tokens_computed=0)
    tasks = [Task(domain="math", prompt="p", answer="a") for _ in range(rows)]
    rewards = (torch.arange(rows) % 2).float()
    return Shard(tasks, ScoredRollouts(tasks, rollouts, [""] * rows, rewards))


def _inputs(s: Shard) -> dict:
    attn = s.attention_mask
    return {"input_ids": s.sequences, "attention_mask": attn, "position_ids": position_ids(attn),
            "logits_to_keep": s.new_tokens + 1}


def unchecked(t: torch.Tensor, *_: object) -> torch.Tensor:
    return t


def old_opd(student, teacher, s: Shard, precision: str = "bf16") -> tuple[torch.Tensor, dict]:
    """``main``'s OPD loss and backward: the student's full logits, every teacher logit of the shard upcast to
    float32, then :func:`topk_reverse_kl`."""
    inputs = _inputs(s)
    with autocast(precision, "cpu"):
        logits = student(**inputs).logits[:, :-1]
    with torch.no_grad(), autocast(precision, "cpu"):
        out = FrozenForward(teacher)(inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"],
                                     inputs["logits_to_keep"])
        teacher_logits = torch.empty_like(logits, dtype=torch.float32)
        teacher_logits[:] = out[:, :-1, : logits.shape[-1]].float()
    loss, metrics = topk_reverse_kl(logits, teacher_logits, s.mask, k=METHOD["kl_top_k"])
    loss.backward()
    return loss.detach(), metrics


def new_opd(student, teacher, s: Shard, chunk: int, precision: str = "bf16") -> tuple[torch.Tensor, dict]:
    """The trainer's chunked OPD path (``train._forward_and_loss`` with several chunks) and its backward."""
    objective = OPDObjective(METHOD, {"math": teacher}, precision, chunk)
    reduce, extras = objective.student_reduce(s, unchecked)
    with autocast(precision, "cpu"):
        reduced = reduced_forward(student, reduce, extras, chunk, **_inputs(s))
    loss, metrics = objective.loss_from(reduced, s, None, unchecked, {"teacher": 0.0}, student.config.vocab_size)
    loss.backward()
    return loss.detach(), metrics


def teacher_part(teacher, s: Shard, top_ids: torch.Tensor, chunk: int | None, precision: str = "bf16") -> torch.Tensor:
    """The teacher's logits at the student's top-k ids: old (``chunk`` None: full logits of the shard, upcast) or new."""
    if chunk is None:
        inputs = _inputs(s)
        with torch.no_grad(), autocast(precision, "cpu"):
            out = FrozenForward(teacher)(inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"],
                                         inputs["logits_to_keep"])
            full = torch.empty(out.shape[0], out.shape[1] - 1, out.shape[2], dtype=torch.float32)
            full[:] = out[:, :-1].float()
            return full.gather(-1, top_ids)
    objective = OPDObjective(METHOD, {"math": teacher}, precision, chunk)
    return objective.teacher_topk(top_ids, teacher.config.vocab_size, s, unchecked, {"teacher": 0.0})


def old_grpo(student, s: Shard, precision: str = "bf16") -> tuple[torch.Tensor, dict]:
    with autocast(precision, "cpu"):
        logits = student(**_inputs(s)).logits[:, :-1]
    loss, metrics = GRPOObjective(GRPO).loss(logits, s, None, unchecked, {})
    loss.backward()
    return loss.detach(), metrics


def new_grpo(student, s: Shard, chunk: int, precision: str = "bf16") -> tuple[torch.Tensor, dict]:
    objective = GRPOObjective(GRPO)
    reduce, extras = objective.student_reduce(s, unchecked)
    with autocast(precision, "cpu"):
        reduced = reduced_forward(student, reduce, extras, chunk, **_inputs(s))
    loss, metrics = objective.loss_from(reduced, s, None, unchecked, {}, student.config.vocab_size)
    loss.backward()
    return loss.detach(), metrics


def decoder_only(student, s: Shard, precision: str = "bf16") -> torch.Tensor:
    """The student's forward and backward with its LM head replaced by a sum of the hidden states: what a step
    holds whatever the loss (weights' gradients, the decoder's activations), the baseline the loss's extra memory
    is measured against."""
    from opdgrpo.train.logit_chunks import reducing_head

    with autocast(precision, "cpu"), reducing_head(student, lambda h, head: (h[:, :-1].float().sum(-1),)):
        (total,) = student(**_inputs(s)).logits
    loss = total.sum()
    loss.backward()
    return loss.detach()
