"""Inverting the cost model: which run sizes reproduce the paper's EFLOP figures with the Qwen3 architectures.

The paper gives totals (PAPER.md) but not the steps, batch sizes or lengths behind them; with the ledger's formulas
(:func:`opdgrpo.cost.step_flops`) and assumed prompt/response lengths this module solves for the tokens, sequences
and steps that each figure buys, and for the response length that fits a figure into a given number of sequences.
FLOPs are linear in sequences at fixed lengths, so the first is a division; the second is a bisection (FLOPs grow
monotonically with the length).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from .cost import Lengths, step_flops

#: Qwen3 architectures (config.json of the Hugging Face checkpoints; Base and thinking models share them).
#: The paper profile reads the same numbers from conf/model/qwen3_*.yaml; these serve the analysis only.
QWEN3: dict[str, dict[str, Any]] = {
    "qwen3_1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "qwen3_4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "qwen3_8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    "qwen3_14b": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    "qwen3_32b": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
}


def arch(name: str) -> SimpleNamespace:
    if name not in QWEN3:
        raise KeyError(f"unknown architecture {name!r}; known: {sorted(QWEN3)}")
    return SimpleNamespace(**QWEN3[name])


def sequence_flops(student: str, teacher: str | None, prompt_tokens: float, response_tokens: float,
                   padded_response_tokens: float | None = None) -> dict[str, float]:
    """FLOPs of one training sequence (one row of a step), by component: the cost model with a batch of one.

    ``padded_response_tokens`` (default: the response itself, i.e. no padding waste) is the decode length every
    row's training and teacher forward runs over in the ledger's accounting.
    """
    padded = response_tokens if padded_response_tokens is None else padded_response_tokens
    cap = max(padded, response_tokens)
    # ``response`` here counts the generated tokens (EOS included): the figures' lengths are generated tokens.
    lengths = {"d": Lengths(prompt_tokens, prompt_tokens, response_tokens - 1, padded)}
    teachers = {"d": arch(teacher)} if teacher else None
    return step_flops(arch(student), {"d": 1}, lengths, cap, teachers)


def sequences_for(budget: float, student: str, teacher: str | None, prompt_tokens: float, response_tokens: float,
                  padded_response_tokens: float | None = None) -> float:
    """Training sequences (prompt + response each) that cost ``budget`` FLOPs at these lengths."""
    return budget / sum(sequence_flops(student, teacher, prompt_tokens, response_tokens, padded_response_tokens).values())


def response_for(budget: float, student: str, teacher: str | None, prompt_tokens: float, sequences: float,
                 high: float = 1 << 20) -> float | None:
    """The (unpadded) response length at which ``sequences`` sequences cost ``budget``: None if beyond ``high``,
    0 if even one generated token per sequence costs more."""
    cost = lambda r: sequences * sum(sequence_flops(student, teacher, prompt_tokens, r).values())  # noqa: E731
    lo, hi = 1.0, float(high)
    if cost(hi) < budget:
        return None
    if cost(lo) > budget:
        return 0.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cost(mid) < budget else (lo, mid)
        if hi - lo < 0.5:
            break
    return (lo + hi) / 2


@dataclass(frozen=True)
class Figure:
    label: str
    eflop: float
    student: str
    teacher: str | None     # None: GRPO; the student's own architecture for self/expert teachers


#: The paper's figures (PAPER.md). S1's student is Qwen3-4B-Base; S3-S5's student is not stated, so they are
#: solved for both the 1.7B and the 4B student; their teachers (self-teacher, experts) share the student's shape.
FIGURES = [
    Figure("S1 GRPO, code", 0.6, "qwen3_4b", None),
    Figure("S1 OPD, 8B teacher", 45.7, "qwen3_4b", "qwen3_8b"),
    Figure("S1 OPD, 32B teacher", 68.7, "qwen3_4b", "qwen3_32b"),
    *(f for s in ("qwen3_1.7b", "qwen3_4b") for f in (
        Figure("S3 self-teacher OPD, n=1", 0.2, s, s),
        Figure("S3 GRPO to the same accuracy", 10.1, s, None),
        Figure("S4 GRPO experts (2)", 10.7, s, None),
        Figure("S4 distillation", 0.55, s, s),
        Figure("S4 joint GRPO (implied)", 19.4, s, None),
        Figure("S5 GRPO experts (4)", 14.4, s, None),
        Figure("S5 distillation", 1.15, s, s),
        Figure("S5 joint GRPO (implied)", 22.7, s, None),
    )),
]


def length_sweep(prompt_tokens: float = 256, responses: tuple[float, ...] = (1024, 2048, 4096, 8192, 16384)) -> str:
    """S1's three figures at several response lengths: generated tokens (millions) each figure buys, and what
    padding every row's forwards to twice its length (the ledger's accounting when the longest row in a step runs
    to a cap of 2x the mean) multiplies a sequence's cost by."""
    s1 = FIGURES[:3]
    lines = ["| generated tokens / sequence | " + " | ".join(f"{f.label}: M tokens" for f in s1)
             + " | padded to 2x: cost factor (GRPO, OPD 8B, OPD 32B) |", "|---|" + "---|" * (len(s1) + 1)]
    for r in responses:
        cells = [f"{f.eflop * 1e18 / sum(sequence_flops(f.student, f.teacher, prompt_tokens, r).values()) * r / 1e6:,.1f}"
                 for f in s1]
        factors = [sum(sequence_flops(f.student, f.teacher, prompt_tokens, r, 2 * r).values())
                   / sum(sequence_flops(f.student, f.teacher, prompt_tokens, r).values()) for f in s1]
        lines.append(f"| {r:g} | " + " | ".join(cells) + " | " + ", ".join(f"{x:.2f}" for x in factors) + " |")
    return "\n".join(lines)


def paper_analysis(prompt_tokens: float = 256, response_tokens: float = 4096, sequences_per_step: int = 512,
                   steps: int = 100) -> str:
    """A markdown table: per figure, the FLOPs of one sequence, the sequences/tokens/steps the figure buys, and the
    response length that would fit it into ``steps`` steps of ``sequences_per_step`` sequences."""
    head = (f"Lengths: {prompt_tokens:g} prompt + {response_tokens:g} generated tokens per sequence, no padding waste; "
            f"steps at {sequences_per_step} sequences/step.\n\n"
            f"| figure | EFLOP | student | teacher | TFLOP / sequence | sequences | generated tokens | steps | "
            f"response length for {steps} x {sequences_per_step} sequences |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for f in FIGURES:
        budget = f.eflop * 1e18
        per_seq = sum(sequence_flops(f.student, f.teacher, prompt_tokens, response_tokens).values())
        seqs = budget / per_seq
        fit = response_for(budget, f.student, f.teacher, prompt_tokens, steps * sequences_per_step)
        fit_text = "> 1M" if fit is None else "< 1" if fit == 0 else f"{fit:,.0f}"
        lines.append(f"| {f.label} | {f.eflop:g} | {f.student} | {f.teacher or '-'} | {per_seq / 1e12:.1f} | {seqs:,.0f} | "
                     f"{seqs * response_tokens:.3g} | {seqs / sequences_per_step:,.1f} | {fit_text} |")
    lines += ["", f"S1 at other lengths ({prompt_tokens:g} prompt tokens):", "", length_sweep(prompt_tokens)]
    return "\n".join(lines)
