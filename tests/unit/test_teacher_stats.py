"""OPD's per-teacher diagnostics (src/opdgrpo/train/teacher_stats.py): token share, reverse KL and accuracy per
teacher against a hand computation on a constructed two-teacher batch, the same numbers whatever the batch's split
into micro-batches, updates and processes, and no ``teachers`` key without teachers.

The batch: vocabulary 3, ``kl_top_k`` 2, three response positions; the student's id 2 is far below its ids 0 and 1, so
its top-2 support is {0, 1} at every position. Each position is one of four cases (student and teacher logits at ids
0 and 1, both renormalised on the support; the teacher's id 2 is +50, which only a full-vocabulary KL would read):

    A: student (ln 3, 0), teacher (0, 0):     p = (3/4, 1/4), q = (1/2, 1/2): KL = 3/4 ln 3 - ln 2   = 0.130812
    B: student (0, 0),    teacher (0, 0):     KL = 0
    C: student (ln 3, 0), teacher (0, ln 3):  p = (3/4, 1/4), q = (1/4, 3/4): KL = 1/2 ln 3       = 0.549306
    D: student (0, 0),    teacher (ln 3, 0):  p = (1/2, 1/2), q = (3/4, 1/4): KL = 1/2 ln (4/3)   = 0.143841
    P: padding, student (0, 0) and teacher (20, -20) (a KL near 19.3 if it were read)

    row 0 math [A, C, B]   row 1 code [D, P, P]   row 2 math [C, C, P]   row 3 code [A, D, P]

math: 5 tokens, KL sum A + 3C + B = 9/4 ln 3 - ln 2 = 1.778730, mean 0.355746; code: 3 tokens, KL sum A + 2D =
ln 2 - 1/4 ln 3 = 0.418494, mean 0.139498; shares 5/8 and 3/8. The token-mean loss is their sum over 8 tokens,
2 ln 3 / 8 = ln 3 / 4 = 0.274653 = 5/8 x 0.355746 + 3/8 x 0.139498. Rewards: math rows 1 and 0 (accuracy 1/2), code
rows 1 and 1 (accuracy 1).
"""

from __future__ import annotations

import math

import pytest
import torch

from opdgrpo.domains import Task
from opdgrpo.train.objectives import OPDObjective, Shard
from opdgrpo.train.rollout import ScoredRollouts
from opdgrpo.train.sampling import Rollouts
from opdgrpo.train.step_stats import COMPONENTS, StepStats
from opdgrpo.train.teacher_stats import TeacherTotals

L3, L2 = math.log(3.0), math.log(2.0)
#: (student logits, teacher logits) over the vocabulary of 3 at each kind of position
CASES = {"A": ([L3, 0.0, -10.0], [0.0, 0.0, 50.0]), "B": ([0.0, 0.0, -10.0], [0.0, 0.0, 50.0]),
         "C": ([L3, 0.0, -10.0], [0.0, L3, 50.0]), "D": ([0.0, 0.0, -10.0], [L3, 0.0, 50.0]),
         "P": ([0.0, 0.0, -10.0], [20.0, -20.0, 50.0])}
ROWS = [("math", "ACB", 1.0), ("code", "DPP", 1.0), ("math", "CCP", 0.0), ("code", "ADP", 1.0)]
MATH_KL, CODE_KL = (9 / 4 * L3 - L2) / 5, (L2 - L3 / 4) / 3
METHOD = {"name": "opd", "rollouts_per_prompt": 1, "aggregation": "token-mean", "kl_top_k": 2}


def _batch(rows: list[tuple[str, str, float]]) -> tuple[torch.Tensor, torch.Tensor, Shard]:
    """Student logits ``(B, T, 3)``, teacher logits (each row's own teacher's), and the shard: a one-token prompt,
    then the row's response, padded after its last token (``P``)."""
    student = torch.tensor([[CASES[c][0] for c in kinds] for _, kinds, _ in rows], dtype=torch.float64)
    teacher = torch.tensor([[CASES[c][1] for c in kinds] for _, kinds, _ in rows], dtype=torch.float64)
    mask = torch.tensor([[c != "P" for c in kinds] for _, kinds, _ in rows])
    targets = torch.where(mask, 1, 0)
    sequences = torch.cat([torch.full((len(rows), 1), 2), targets], dim=1)
    attention = torch.cat([torch.ones(len(rows), 1, dtype=torch.long), mask.long()], dim=1)
    completions = [[1] * int(m.sum()) for m in mask]
    rollouts = Rollouts(sequences=sequences, attention_mask=attention, completion_mask=mask, prompt_len=1,
                        completions=completions, finished=torch.ones(len(rows), dtype=torch.bool), flops=0.0,
                        tokens_computed=0)
    tasks = [Task(domain=d, prompt="p", answer="a") for d, _, _ in rows]
    scored = ScoredRollouts(tasks, rollouts, ["" for _ in rows], torch.tensor([r for _, _, r in rows]))
    return student, teacher, Shard(tasks, scored)


def _objective(teacher: torch.Tensor) -> OPDObjective:
    """OPD with two teachers, each row's teacher logits given (``teacher``) instead of forwarded by a model."""
    opd = OPDObjective(METHOD, {"math": torch.nn.Linear(1, 1), "code": torch.nn.Linear(1, 1)}, "fp32")
    opd.teacher_topk = lambda top_ids, vocab, shard, check, flops: teacher.gather(-1, top_ids)
    return opd


def test_token_share_and_reverse_kl_per_teacher_by_hand() -> None:
    student, teacher, shard = _batch(ROWS)
    totals = TeacherTotals.of(("math", "code"))
    loss, metrics = _objective(teacher).loss(student, shard, None, lambda t, *_: t, {}, totals)
    totals.add_tokens(shard.tasks, shard.mask)
    totals.add_rollouts(shard.tasks, shard.scored.rewards)
    line = totals.ledger(scored=True)
    assert list(line) == ["math", "code"]
    assert (line["math"]["tokens"], line["code"]["tokens"]) == (5, 3)
    assert (line["math"]["token_share"], line["code"]["token_share"]) == (5 / 8, 3 / 8)
    assert line["math"]["reverse_kl"] == pytest.approx(MATH_KL, rel=1e-12)    # 0.355746
    assert line["code"]["reverse_kl"] == pytest.approx(CODE_KL, rel=1e-12)    # 0.139498
    assert (line["math"]["accuracy"], line["code"]["accuracy"]) == (0.5, 1.0)
    assert (line["math"]["rollouts"], line["code"]["rollouts"]) == (2, 2)
    # the teachers' KLs are the loss's own: the token-mean loss is their share-weighted sum, ln 3 / 4
    assert float(loss) == pytest.approx(L3 / 4, rel=1e-12) == metrics["kl"]
    assert sum(t["token_share"] * t["reverse_kl"] for t in line.values()) == pytest.approx(L3 / 4, rel=1e-12)
    # unscored rollouts (methods.opd.score_rollouts: false): accuracy null, never 0
    assert {d: t["accuracy"] for d, t in totals.ledger(scored=False).items()} == {"math": None, "code": None}


class _Recording:
    """A process's side of ``Workers.sum``: returns its own values and keeps them for the other process."""

    def __init__(self) -> None:
        self.calls: list[list[float]] = []

    def sum(self, values) -> list[float]:
        self.calls.append([float(v) for v in values])
        return self.calls[-1]


class _Adding:
    """The other process's side: its values plus the recorded process's, call by call (a two-process all-reduce)."""

    def __init__(self, other: _Recording) -> None:
        self.other = iter(other.calls)

    def sum(self, values) -> list[float]:
        return [float(a) + b for a, b in zip(values, next(self.other), strict=True)]


def _process(rows: list[tuple[str, str, float]], passes: int) -> StepStats:
    """One process's step over ``rows`` as one micro-batch trained in ``passes`` updates (tokens on the first)."""
    student, teacher, shard = _batch(rows)
    stats = StepStats.of(COMPONENTS, teachers=("math", "code"))
    stats.add_sampled(shard)
    opd = _objective(teacher)
    for epoch in range(passes):
        loss, metrics = opd.loss(student, shard, None, lambda t, *_: t, stats.flops, stats.teachers)
        stats.add_loss(loss, metrics)
        if epoch == 0:
            stats.add_trained(shard, teachers=True)
        stats.add_update(torch.tensor(1.0))
    return stats


def test_the_sums_add_up_over_micro_batches_updates_and_processes() -> None:
    """Row 0 on one process (3 tokens, all math) and rows 1-3 on another (5 tokens, padded to 2 positions), two
    updates each: the ledger's ``teachers`` are the one-batch hand values, where the step's ``metrics.kl``, a mean of
    the two micro-batches' means ((A + C + B) / 3 and (2D + 2C + A) / 5: 0.265064), is not the token mean."""
    one, two = _process(ROWS[:1], passes=2), _process([(d, k[:2], r) for d, k, r in ROWS[1:]], passes=2)
    recorded = _Recording()
    two.all_reduce(recorded)
    line = one.all_reduce(_Adding(recorded)).ledger_line(step=0, cumulative=0.0, lr=1.0, wall=1.0)
    teachers = line["teachers"]
    assert {d: (t["tokens"], t["token_share"]) for d, t in teachers.items()} == {"math": (5, 5 / 8), "code": (3, 3 / 8)}
    assert teachers["math"]["reverse_kl"] == pytest.approx(MATH_KL, rel=1e-12)
    assert teachers["code"]["reverse_kl"] == pytest.approx(CODE_KL, rel=1e-12)
    assert (teachers["math"]["accuracy"], teachers["code"]["accuracy"]) == (0.5, 1.0)
    assert sum(t["token_share"] * t["reverse_kl"] for t in teachers.values()) == pytest.approx(L3 / 4, rel=1e-12)
    assert line["metrics"]["kl"] == pytest.approx(((L3 / 2 + 3 / 4 * L3 - L2) / 3 + (math.log(4 / 3) + L3 + 3 / 4 * L3 - L2) / 5) / 2)
    assert line["metrics"]["kl"] != pytest.approx(L3 / 4, rel=1e-2)
    assert line["tokens"]["completion"] == 8


def test_one_teacher_gets_the_whole_share_and_a_domain_without_rows_gets_nulls() -> None:
    _, _, shard = _batch([("math", "ACB", 1.0), ("math", "DPP", 0.0)])
    single = TeacherTotals.of(("math",))
    single.add_tokens(shard.tasks, shard.mask)
    assert single.ledger(scored=True) == {"math": {"token_share": 1.0, "reverse_kl": None, "accuracy": None,
                                                   "tokens": 4, "rollouts": 0}}
    pair = TeacherTotals.of(("math", "code"))
    pair.add_tokens(shard.tasks, shard.mask)
    pair.add_rollouts(shard.tasks, shard.scored.rewards)
    assert pair.ledger(scored=True)["code"] == {"token_share": 0.0, "reverse_kl": None, "accuracy": None,
                                                "tokens": 0, "rollouts": 0}


def test_grpo_ledger_lines_have_no_teachers_key() -> None:
    line = StepStats(sequences=1, updates=1, grad_norm=0.0).ledger_line(step=0, cumulative=0.0, lr=1.0, wall=1.0)
    assert "teachers" not in line and StepStats.of(COMPONENTS).teachers is None


def test_a_row_without_a_teacher_is_named_with_its_config_key() -> None:
    _, _, shard = _batch([("math", "ACB", 1.0), ("code", "DPP", 0.0)])
    with pytest.raises(ValueError, match=r"domain\(s\) \['code'\] have no teacher \(config key `teachers`"):
        TeacherTotals.of(("math",)).add_tokens(shard.tasks, shard.mask)
    with pytest.raises(ValueError, match="config key `teachers`"):
        TeacherTotals.of(())
