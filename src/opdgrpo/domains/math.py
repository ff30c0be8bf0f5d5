"""Arithmetic: the tiny world's stand-in for competition math (AIME/AMC).

Prompts are expressions over single digits with ``+ - *`` and the usual precedence, e.g.
``calc 7*3-5=``. A base student answers briefly (``16``); a "thinking" teacher works step by step
(``7*3=21 21-5=16``). The verifier reads the last integer of the response, so either style
scores. Held-out sets reserve a hashed share of each instance space, so no held-out expression is ever
a training or pretraining prompt; the harder set uses more operators (a shifted distribution).
"""

from __future__ import annotations

import random
import re
from typing import Any, Mapping, Sequence

from .base import SharedForm, Slip, Task, check_style, stable_fraction

_LAST_INT = re.compile(r"-?\d+")
#: A math slip's stray tokens (:class:`~opdgrpo.domains.base.Slip`).
_DIGITS = tuple(str(d) for d in range(10))


def evaluate(operands: Sequence[int], operators: Sequence[str]) -> tuple[int, list[str]]:
    """Value of the expression and the worked steps a thinking teacher writes (``*`` first)."""
    values, ops, steps = list(operands), list(operators), []
    while "*" in ops:
        i = ops.index("*")
        result = values[i] * values[i + 1]
        steps.append(f"{values[i]}*{values[i + 1]}={result}")
        values[i : i + 2] = [result]
        del ops[i]
    while ops:
        a, b, op = values[0], values[1], ops[0]
        result = a + b if op == "+" else a - b
        steps.append(f"{a}{op}{b}={result}")
        values[:2] = [result]
        del ops[0]
    return values[0], steps


def expression(operands: Sequence[int], operators: Sequence[str]) -> str:
    parts = [str(operands[0])]
    for op, value in zip(operators, operands[1:]):
        parts += [op, str(value)]
    return "".join(parts)


def extract_answer(completion: str) -> int | None:
    """The last integer of the response, or None when it has none (malformed)."""
    found = _LAST_INT.findall(completion)
    return int(found[-1]) if found else None


class MathDomain:
    """Arithmetic expressions; see the module docstring and ``conf/domain/math.yaml``."""

    #: the marks a shared-form response is wrapped in (base.SharedForm; stands for math's boxed answer)
    SHARED_WRAP = "<>"

    def __init__(self, cfg: Mapping[str, Any]):
        self.name = str(cfg.get("name", "math"))
        self.cfg = cfg
        self.operand_max = int(cfg["operand_max"])
        self.operators = str(cfg["operators"])
        self.heldout_fraction = float(cfg["heldout_fraction"])
        self.prefix = str(cfg["prompt_prefix"])
        self.shared = SharedForm.from_config(cfg, self.name, self.prefix, self.SHARED_WRAP)
        if self.shared.strength > 0:   # shared/own-form accuracy per held-out set (evaluation's extra metrics)
            self.extra_metrics = self._shared_metrics
        self.slip = Slip.from_config(cfg, self.name)

    # -- instance space -----------------------------------------------------------------------
    def _random_instance(self, rng: random.Random, n_ops: int) -> tuple[list[int], list[str]]:
        operands = [rng.randint(0, self.operand_max) for _ in range(n_ops + 1)]
        operators = [rng.choice(self.operators) for _ in range(n_ops)]
        return operands, operators

    def _reserved(self, expr: str) -> bool:
        return stable_fraction(expr, salt=self.name) < self.heldout_fraction

    def _task(self, operands, operators) -> Task:
        expr = expression(operands, operators)
        value, steps = evaluate(operands, operators)
        return self.shared.apply(Task(self.name, f"{self.prefix}{expr}=", value, {"expression": expr, "steps": tuple(steps)}))

    def _draw(self, rng: random.Random, n_ops: int, reserved: bool) -> Task:
        while True:
            operands, operators = self._random_instance(rng, n_ops)
            if self._reserved(expression(operands, operators)) == reserved:
                return self._task(operands, operators)

    def _unique_pool(self, seed: str, n_ops: int, size: int, reserved: bool) -> list[Task]:
        rng, seen, pool = random.Random(seed), set(), []
        space = (self.operand_max + 1) ** (n_ops + 1) * len(self.operators) ** n_ops
        share = self.heldout_fraction if reserved else 1 - self.heldout_fraction
        if size > 0.9 * space * share:
            raise ValueError(
                f"domain {self.name}: asked for {size} distinct {n_ops}-operator expressions but only about "
                f"{int(space * share)} exist in that pool; lower the size or raise operand_max"
            )
        while len(pool) < size:
            task = self._draw(rng, n_ops, reserved)
            if task.prompt not in seen:
                seen.add(task.prompt)
                pool.append(task)
        return pool

    # -- the Domain interface -----------------------------------------------------------------
    def training_pool(self) -> list[Task]:
        train = self.cfg["train"]
        return self._unique_pool(f"{self.name}-train", int(train["operators"]), int(train["size"]), False)

    def heldout_sets(self) -> dict[str, list[Task]]:
        return {
            name: self._unique_pool(f"{self.name}-heldout-{name}", int(spec["operators"]), int(spec["size"]), True)
            for name, spec in self.cfg["heldout"].items()
        }

    def pretraining_task(self, rng: random.Random) -> Task:
        return self.shared.for_pretraining(self._draw(rng, rng.choice(list(self.cfg["pretrain_operators"])), reserved=False), rng)

    def demonstration(self, task: Task, style: str) -> str:
        check_style(style)
        if style == "brief":   # a slip: a stray digit after the answer (the verifier reads the last integer)
            text = self.slip.apply(task, str(task.answer), _DIGITS)
        else:
            text = " ".join(task.meta["steps"])
        return self.shared.demonstration(task, text)

    def _verify(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        return [float(extract_answer(c) == t.answer) for t, c in zip(tasks, completions, strict=True)]

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        return self.shared.score(tasks, completions, self._verify)

    def _shared_metrics(self, tasks: Sequence[Task], completions: Sequence[str]) -> dict[str, float | None]:
        return self.shared.metrics(tasks, self.score(tasks, completions))
