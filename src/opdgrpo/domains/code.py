"""Code: the tiny world's stand-in for LiveCodeBench.

The prompt shows a function's values at a few inputs, e.g. ``code 0:3 1:7 2:11`` and a newline. The
model writes the body of ``def f(x):``; the program is executed in the sandbox (:mod:`opdgrpo.sandbox.execution`)
against hidden inputs it never saw, so a memorised table of the visible values fails. A brief student
writes `` return x*4+3``; a thinking teacher writes code that works it out (``b=3``, ``a=7-b``,
``return x*a+b`` on separate lines). Reward: all hidden tests pass
(``reward: all``, as pass@1) or the fraction passed (``reward: fraction``).

Three disjoint shares of the functions, by a hash of each: ``heldout_fraction`` for the held-out set;
``rl_fraction`` (optional, 0 when absent: ``+domains.code.rl_fraction=0.25`` sets it) for RL's training pool, never
shown in pretraining; the rest for pretraining, and, when ``rl_fraction`` is 0, for RL too. With an RL share, RL
prompts are as new to the base model as held-out ones, so a gain on them is a skill that can carry to held-out
functions, not recall of functions pretraining showed (tried, it does not rescue the tiny world's code: docs/LOG.md, the probes of GRPO's experts).
"""

from __future__ import annotations

import random
from typing import Any, Mapping, Sequence

from opdgrpo.sandbox.execution import ProgramCheck, check_programs

from .base import SharedForm, Slip, Task, check_style, stable_fraction


def _linear(expr: str) -> bool:
    return "x*x" not in expr


class CodeDomain:
    """Functions of one integer from a few families; see ``conf/domain/code.yaml``."""

    #: the marks a shared-form response is wrapped in (base.SharedForm; stands for a fenced code block)
    SHARED_WRAP = "{}"

    def __init__(self, cfg: Mapping[str, Any]):
        self.name = str(cfg.get("name", "code"))
        self.cfg = cfg
        self.prefix = str(cfg["prompt_prefix"])
        self.shared = SharedForm.from_config(cfg, self.name, self.prefix, self.SHARED_WRAP)
        self.slip = Slip.from_config(cfg, self.name)
        if self.shared.strength > 0:   # shared/own-form accuracy per held-out set (evaluation's extra metrics)
            self.extra_metrics = self._shared_metrics
        self.visible_x = [int(x) for x in cfg["visible_x"]]
        self.hidden_x = [int(x) for x in cfg["hidden_x"]]
        self.reward = str(cfg["reward"])
        if self.reward not in ("all", "fraction"):
            raise ValueError(f"domain {self.name}: reward must be 'all' or 'fraction', got {self.reward!r}")
        self.sandbox = dict(cfg["sandbox"])
        self.rl_fraction = float(cfg.get("rl_fraction") or 0.0)
        self._space = self._instance_space()
        self._check_demonstrations()

    def _instance_space(self) -> list[tuple[str, str]]:
        """Every distinct function (expression, share: ``heldout``, ``rl`` or ``pretrain``), in a fixed order."""
        a_lo, a_hi = self.cfg["a_range"]
        b_lo, b_hi = self.cfg["b_range"]
        seen: dict[tuple, str] = {}
        for family in self.cfg["families"]:
            for a in range(int(a_lo), int(a_hi) + 1):
                for b in range(int(b_lo), int(b_hi) + 1):
                    expr = family.format(a=a, b=b)
                    signature = tuple(eval(expr, {}, {"x": x}) for x in self.visible_x + self.hidden_x)  # noqa: S307 - our own templates
                    seen.setdefault(signature, expr)
        heldout, rl = float(self.cfg["heldout_fraction"]), self.rl_fraction
        if rl < 0 or heldout + rl >= 1:
            raise ValueError(f"domain {self.name}: heldout_fraction + rl_fraction must leave a share for pretraining "
                             f"(got {heldout} + {rl}; config keys `domains.{self.name}.heldout_fraction`, "
                             f"`domains.{self.name}.rl_fraction`)")

        def share(expr: str) -> str:
            h = stable_fraction(expr, salt=self.name)
            return "heldout" if h < heldout else "rl" if h < heldout + rl else "pretrain"
        return [(expr, share(expr)) for expr in sorted(seen.values())]

    def _check_demonstrations(self) -> None:
        """The teachers' step-by-step demonstrations know a few shapes of function (``_demonstration``); a family
        outside them would be taught a wrong program in silence, so every function's is run here, once."""
        for expr, _ in self._space:
            task = self._task(expr)
            scope: dict[str, Any] = {}
            exec(self.program(self._demonstration(task, "thinking")), {}, scope)  # noqa: S102 - our own templates
            if any(scope["f"](x) != v for x, v in task.meta["values"].items()):
                raise ValueError(f"domain {self.name}: the teachers' step-by-step demonstration does not compute "
                                 f"{expr!r}; config key `domains.{self.name}.families` holds a family "
                                 f"`CodeDomain._demonstration` does not know (it knows linear ones, and x*x+b, "
                                 f"x*x*a and x*x*a+b while `domains.{self.name}.visible_x` starts 0, 1)")

    def _task(self, expr: str) -> Task:
        values = {x: eval(expr, {}, {"x": x}) for x in self.visible_x + self.hidden_x}  # noqa: S307
        shown = " ".join(f"{x}:{values[x]}" for x in self.visible_x)
        tests = tuple(((x,), values[x]) for x in self.hidden_x)
        return self.shared.apply(Task(self.name, f"{self.prefix}{shown}\n", tests, {"expression": expr, "values": values}))

    def _pool(self, part: str, size: int | None, seed: str) -> list[Task]:
        exprs = [e for e, r in self._space if r == part]
        if size is not None:
            if size > len(exprs):
                raise ValueError(
                    f"domain {self.name}: asked for {size} {'held-out' if part == 'heldout' else 'training'} functions but "
                    f"only {len(exprs)} exist; widen a_range/b_range/families or lower the size"
                )
            exprs = random.Random(seed).sample(exprs, size)
        return [self._task(e) for e in exprs]

    # -- the Domain interface -----------------------------------------------------------------
    def training_pool(self) -> list[Task]:
        part = "rl" if self.rl_fraction > 0 else "pretrain"
        return self._pool(part, self.cfg["train"].get("size"), f"{self.name}-train")

    def heldout_sets(self) -> dict[str, list[Task]]:
        return {
            name: self._pool("heldout", spec.get("size"), f"{self.name}-heldout-{name}")
            for name, spec in self.cfg["heldout"].items()
        }

    def pretraining_task(self, rng: random.Random) -> Task:
        while True:
            expr, part = rng.choice(self._space)
            if part == "pretrain":
                return self.shared.for_pretraining(self._task(expr), rng)

    def demonstration(self, task: Task, style: str) -> str:
        text = self._demonstration(task, style)
        if style == "brief":   # a slip: a stray name after the expression, a syntax error in the body
            text = self.slip.apply(task, text, ["y", "z", "n"])
        return self.shared.demonstration(task, text)

    def _demonstration(self, task: Task, style: str) -> str:
        check_style(style)
        expr, values = task.meta["expression"], task.meta["values"]
        if style == "brief":
            return f" return {expr}"
        x0, x1 = self.visible_x[0], self.visible_x[1]
        if _linear(expr):
            b = values[0] if x0 == 0 else None
            if b is not None and x1 == 1:
                return f" b={values[0]}\n a={values[1]}-b\n return x*a+b"
            return f" return {expr}"
        if expr.startswith("x*x*") and "+" in expr and (x0, x1) == (0, 1):   # x*x*a+b: b at 0, then a at 1
            return f" b={values[0]}\n a={values[1]}-b\n return x*x*a+b"
        if expr.startswith("x*x*"):
            return f" a={values[1]}\n return x*x*a"
        return f" b={values[0]}\n return x*x+b"

    def program(self, completion: str) -> str:
        return "def f(x):\n" + completion + "\n"

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        return self.shared.score(tasks, completions, self._verify)

    def _shared_metrics(self, tasks: Sequence[Task], completions: Sequence[str]) -> dict[str, float | None]:
        return self.shared.metrics(tasks, self.score(tasks, completions))

    def _verify(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        checks = [ProgramCheck(self.program(c), "f", t.answer) for t, c in zip(tasks, completions, strict=True)]
        outcomes = check_programs(
            checks,
            per_test_timeout_s=float(self.sandbox["per_test_timeout_s"]),
            batch_timeout_s=float(self.sandbox["batch_timeout_s"]),
            memory_mb=int(self.sandbox["memory_mb"]),
        )
        if self.reward == "all":
            return [float(o.all_passed) for o in outcomes]
        return [o.fraction for o in outcomes]
