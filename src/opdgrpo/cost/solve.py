"""Inverting the cost model: which run sizes reproduce the paper's EFLOP figures with the Qwen3 architectures.

The paper (arXiv 2611.08453) gives EFLOP totals but not the steps, batch sizes or lengths behind them; with the
ledger's formulas (:func:`opdgrpo.cost.model.step_flops`) and assumed prompt/response lengths this module solves for
the tokens, sequences and steps that each figure buys, and for the response length that fits a figure into a given
number of sequences. FLOPs are linear in sequences at fixed lengths, so the first is a division; the second is a
bisection (FLOPs grow monotonically with the length).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from opdgrpo.cost.model import Lengths, step_flops

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


#: The paper's EFLOP figures (arXiv 2611.08453; docs/cost-model.md, "The paper's figures, inverted"). S1's student
#: is Qwen3-4B-Base; S3-S5's student is not stated, so they are solved for both the 1.7B and the 4B student; their
#: teachers (self-teacher, experts) share the student's shape.
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


# -- the paper profile's step counts from the paper's budgets ------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    knob: str           # the config key that sets the run's steps
    run: str            # the paper profile's run (seed 0) whose FLOPs the figure is
    figure: str
    eflop: float
    margin: float       # the run goes this far past the figure: 1.25 where a peak or a crossing must lie inside the curve


#: The paper's figures as run budgets. S4's experts (10.7 EFLOP) are S3's math GRPO (10.1) plus S1's code GRPO (0.6):
#: the paper's experts read as those runs, so each expert is sized by its own figure; S5's two further experts share
#: the rest of its 14.4 evenly (the paper does not split it). OPD's steps serve S1's two teachers (the larger budget
#: sets them); S3's self-teacher OPD (0.2 EFLOP) runs as long, its match found on the way.
PAPER_BUDGETS = [
    Budget("methods.grpo.domain_steps.math", "grpo-student-math-s0", "S3: GRPO to the self-teacher's accuracy", 10.1, 1.0),
    Budget("methods.grpo.domain_steps.code", "grpo-student-code-s0", "S1: GRPO's peak on code (S4's experts less S3's)", 0.6, 1.0),
    Budget("methods.grpo.domain_steps.ifeval", "grpo-student-ifeval-s0", "S5's experts less S4's, half", 1.85, 1.0),
    Budget("methods.grpo.domain_steps.knowledge", "grpo-student-knowledge-s0", "S5's experts less S4's, half", 1.85, 1.0),
    Budget("methods.opd.steps", "opd-qwen3_32b-code-s0", "S1: OPD with the 32B teacher peaks", 68.7, 1.25),
    Budget("methods.opd.steps", "opd-qwen3_8b-code-s0", "S1: OPD with the 8B teacher peaks", 45.7, 1.25),
    Budget("studies.S4.joint_steps", "grpo-student-math+code-s0", "S4: joint GRPO matched (implied)", 19.4, 1.25),
    Budget("studies.S4.distill_steps", "opd-experts-math+code-s0", "S4: distillation of two experts", 0.55, 1.0),
    Budget("studies.S5.joint_steps", "grpo-student-math+code+ifeval+knowledge-s0", "S5: joint GRPO matched (implied)", 22.7, 1.25),
    Budget("studies.S5.distill_steps", "opd-experts-math+code+ifeval+knowledge-s0", "S5: distillation of four experts", 1.15, 1.0),
]


def solve_steps(cfg: Any, plan: Any) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Steps per knob (the most any of its figures needs) and one row per figure, from the cost model's FLOPs per
    step of the run the figure belongs to (:func:`opdgrpo.cost.model.estimate_run`)."""
    from opdgrpo.cost.model import estimate_run

    steps: dict[str, int] = {}
    rows = []
    for b in PAPER_BUDGETS:
        if b.run not in plan.jobs:
            raise KeyError(f"the paper profile plans no run `{b.run}` (figure: {b.figure})")
        est = estimate_run(cfg, plan.jobs[b.run], plan.jobs)
        per_step = est.total / est.steps
        need = max(1, round(b.eflop * b.margin * 1e18 / per_step))
        steps[b.knob] = max(steps.get(b.knob, 0), need)
        rows.append({"budget": b, "per_step": per_step, "need": need, "configured": est.steps})
    return steps, rows


def steps_table(steps: dict[str, int], rows: list[dict[str, Any]]) -> str:
    lines = ["| knob | run | paper's figure | EFLOP | x margin | EFLOP / step | steps needed | knob's steps | "
             "run's EFLOP at those steps | configured now |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r["budget"]
        lines.append(f"| `{b.knob}` | {b.run} | {b.figure} | {b.eflop:g} | {b.margin:g} | {r['per_step'] / 1e18:.4f} | "
                     f"{r['need']} | {steps[b.knob]} | {steps[b.knob] * r['per_step'] / 1e18:.3g} | {r['configured']} |")
    overrides = " ".join(f"{k}={v}" for k, v in steps.items())
    return "\n".join(lines) + f"\n\nAs overrides: {overrides}"
