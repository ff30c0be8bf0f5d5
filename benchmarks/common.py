"""Shared pieces of the benchmarks: the tiny world they run on, run configs, timing and markdown output.

Every benchmark is a plain script (``python benchmarks/X.py``). This module puts ``src/`` on the path so they run
from a checkout without installing the package, and finds or builds the models they need:

* ``--world DIR``: a tiny world already pretrained by the DAG (``results/tiny/base``: ``tokenizer/`` and
  ``<model>/checkpoint``). Trained models stop at EOS after a few tokens, as real rollouts do.
* otherwise the tiny profile's tokenizer and architectures (``conf/model/tiny_*.yaml``) built from scratch with a
  fixed seed: random weights, so completions mostly run to ``max_new_tokens``.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

DEFAULT_WORLD = REPO / "results" / "tiny" / "base"


# --------------------------------------------------------------------------------------------------------------------
# the machine


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def versions() -> dict[str, str]:
    import torch
    import transformers

    found = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import trl

        found["trl"] = trl.__version__
    except ImportError:
        pass
    return found


def commit() -> str:
    """The checkout's commit (``+`` when it has uncommitted changes), so a figure names the code it measured."""
    import subprocess

    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+" if dirty else "")


def machine_line(threads: int, device: str = "cpu") -> str:
    """One markdown line naming the date, the machine, the software and the commit, for the README."""
    where = f"{os.cpu_count()} CPUs ({cpu_model()})"
    if device != "cpu":
        import torch

        where += f", {torch.cuda.get_device_name(0)}"
    soft = ", ".join(f"{k} {v}" for k, v in versions().items())
    date = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    return f"{date}; commit {commit()}; {where}; torch threads {threads}; {soft}"


def set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(int(threads))


# --------------------------------------------------------------------------------------------------------------------
# statistics and output


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> str:
    """``min-max`` of the timed repetitions, so a reader sees how noisy the machine was."""
    return f"{min(values):.3g}-{max(values):.3g}" if values else "-"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def interleave(rounds: int, warmup: int, contenders: dict[str, Callable[[], dict[str, float]]]) -> dict[str, list[dict]]:
    """Run each contender once per round, alternating which goes first, and keep the rounds after ``warmup``.

    A contender returns a dict of measurements (at least ``seconds``). Alternating the order cancels drift on a
    shared machine (another job starting or stopping) between the contenders of a round.
    """
    names = list(contenders)
    kept: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            result = contenders[name]()
            if r >= warmup:
                kept[name].append(result)
    return kept


# --------------------------------------------------------------------------------------------------------------------
# the tiny world


@dataclass
class World:
    """Where the benchmark's tokenizer and models live, and how they were made."""

    tokenizer: Path
    models: dict[str, Path]  # role (student, teacher_m, teacher_l) -> Hugging Face checkpoint directory
    source: str  # "trained (DIR)" or "random init (seed 0)"


def tiny_config(results_dir: str | Path) -> dict[str, Any]:
    """The tiny profile composed from ``conf/`` (the default profile: the settings a user runs first)."""
    from opdgrpo.config import compose

    return compose(["profile=tiny", f"results_dir={results_dir}"], REPO / "conf")


def load_world(world: str | None, roles: Sequence[str], scratch: Path) -> World:
    """A trained world from ``world`` (or ``results/tiny/base`` when it is there), else one built from scratch.

    ``world="random"`` forces models built from scratch even when a trained world exists.
    """
    path = None if world == "random" else Path(world) if world else DEFAULT_WORLD
    if path is not None and (path / "tokenizer" / "tokenizer.json").is_file():
        missing = [r for r in roles if not (path / r / "checkpoint" / "config.json").is_file()]
        if missing:
            raise SystemExit(f"--world {path}: no checkpoint for {missing} (expected {path}/<role>/checkpoint)")
        return World(path / "tokenizer", {r: path / r / "checkpoint" for r in roles}, f"trained ({path})")
    if world not in (None, "random"):
        raise SystemExit(f"--world {world}: no tokenizer/tokenizer.json there; pass a pretrained tiny world "
                         "(results/<profile>/base) or `random`")
    return build_random_world(roles, scratch)


def build_random_world(roles: Sequence[str], scratch: Path) -> World:
    """The tiny profile's tokenizer and models with random weights, saved like the DAG's checkpoints."""
    from opdgrpo.train.models import build_model
    from opdgrpo.train.tokenizer import build_tokenizer, save_tokenizer

    cfg = tiny_config(scratch / "results")
    tok_dir = scratch / "tokenizer"
    tokenizer = build_tokenizer(cfg["domains"], cfg["tokenizer"]["vocab_size"], cfg["tokenizer"]["samples_per_domain"])
    save_tokenizer(tokenizer, tok_dir)
    models = {}
    for role in roles:
        model = build_model(cfg["models"][role], len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed=0)
        out = scratch / role / "checkpoint"
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        models[role] = out
    return World(tok_dir, models, "random init (seed 0)")


def run_config(kind: str, world: World, scratch: Path, *, teacher: str = "teacher_l", domain: str = "math",
               overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The tiny profile's resolved config of a ``kind`` (grpo/opd) run on ``domain``, pointed at ``world``.

    ``overrides``: dotted keys (``train.prompts_per_step``, ``method.lr``, ``domains.math.heldout.amc.size``) set on
    the run config after it is resolved; an unknown key is an error (a typo would silently benchmark the default).
    """
    from opdgrpo import schema
    from opdgrpo.plan.build import build_plan

    plan = build_plan(tiny_config(scratch / "results"))
    run_id = f"grpo-student-{domain}-s0" if kind == "grpo" else f"opd-{teacher}-{domain}-s0"
    if run_id not in plan.jobs:
        raise SystemExit(f"the tiny plan has no run {run_id}")
    import copy

    cfg = copy.deepcopy(plan.jobs[run_id].config)
    cfg["tokenizer"] = str(world.tokenizer)
    cfg["student"] = {"from": "benchmark", "path": str(world.models["student"])}
    if kind == "opd":
        cfg["teachers"] = {d: {"from": "benchmark", "path": str(world.models[teacher])} for d in cfg["train_domains"]}
    for key, value in (overrides or {}).items():
        node = cfg
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                raise SystemExit(f"run config has no key `{key}` (stops at `{part}`)")
            node = node[part]
        if leaf not in node and not key.startswith("train."):
            raise SystemExit(schema.renamed(key, run_config=True) or f"run config has no key `{key}`")
        node[leaf] = value
    return cfg


def fresh_dir(parent: Path, prefix: str) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


# --------------------------------------------------------------------------------------------------------------------
# ours against a TRL trainer, step for step


def quiet() -> None:
    """Silence progress bars and deprecation chatter so the tables stay readable."""
    import logging
    import warnings

    import transformers

    warnings.filterwarnings("ignore", category=FutureWarning)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("opdgrpo").setLevel(logging.WARNING)


def ours_block(cfg: dict[str, Any], steps: int, scratch: Path) -> list[dict[str, float]]:
    """One call of our trainer (``opdgrpo.train.loop.train``, what the DAG runs) for ``steps`` steps from the base
    student; one record per step from its ledger: ``wall_s`` (sampling to optimiser step, evaluation excluded),
    completion tokens (EOS included), mean response length and the step's FLOPs."""
    import copy
    import json
    import shutil

    from opdgrpo.train.loop import train

    cfg = copy.deepcopy(cfg)
    cfg["method"]["steps"] = steps
    run_dir = fresh_dir(scratch, "ours-")
    try:
        train(cfg, run_dir)
        records = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return [{"seconds": r["wall_s"], "tokens": r["tokens"]["completion"], "length": r["mean_response_length"],
             "flops": r["step_flops"]} for r in records]


def block_interleaver(steps: int, run_ours: Callable[[], None], trl_results: list[dict], trl_tokens: list[int],
                      reset: Callable[[], None] | None = None):
    """A ``TrainerCallback`` that times each TRL step (``on_step_begin`` to ``on_step_end``: generation, scoring,
    loss, backward and optimiser step) and runs one block of ours between TRL's blocks of ``steps`` steps, ours
    first in odd rounds. The first step of each TRL block is a warm-up and is not kept. ``trl_tokens`` is filled
    by the caller during a step (completion tokens) and cleared here. ``reset`` runs before each TRL block (untimed):
    back to the base weights and a fresh optimiser state, as each block of ours starts from the base student."""
    import time

    from transformers import TrainerCallback

    class Interleave(TrainerCallback):
        started = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            block, pos = divmod(state.global_step, steps)
            if pos == 0 and block % 2 == 1:
                run_ours()
            if pos == 0 and reset is not None:
                reset()
            trl_tokens.clear()
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            seconds = time.perf_counter() - self.started
            block, pos = divmod(state.global_step - 1, steps)
            if pos > 0:
                trl_results.append({"seconds": seconds, "tokens": sum(trl_tokens)})
            if pos == steps - 1 and block % 2 == 0:
                run_ours()

    return Interleave()


def drop_printer(trainer) -> None:
    """TRL prints its metrics dict at the end of training when tqdm is off; the tables say what matters."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)


def compare(results: dict[str, list[dict]], labels: dict[str, str], batch: int) -> tuple[str, dict[str, dict]]:
    """The markdown table of two or more trainers' step timings, and the medians behind it."""
    rows, summary = [], {}
    for name, label in labels.items():
        secs = [r["seconds"] for r in results[name]]
        toks = [r["tokens"] for r in results[name]]
        s, t = median(secs), median(toks)
        summary[name] = {"s_per_step": s, "tokens_per_s": t / s, "seqs_per_s": batch / s, "tokens_per_step": t,
                         "steps": len(secs)}
        rows.append([label, len(secs), f"{s:.3f}", spread(secs), f"{t / batch:.1f}", f"{t / s:,.0f}", f"{batch / s:,.0f}"])
    headers = ["trainer", "timed steps", "s/step (median)", "range", "completion tokens/seq", "tokens/s", "seqs/s"]
    return table(headers, rows), summary


def paired_ratios(slow: list[dict], fast: list[dict], per_block: int) -> list[float]:
    """``slow`` s/step over ``fast`` s/step, block by block (the blocks ran next to each other, so each ratio saw
    about the same load on the shared machine); medians within a block."""
    blocks = min(len(slow), len(fast)) // per_block
    return [median(r["seconds"] for r in slow[i * per_block:(i + 1) * per_block])
            / median(r["seconds"] for r in fast[i * per_block:(i + 1) * per_block]) for i in range(blocks)]


def ratio_line(summary: dict[str, dict], results: dict[str, list[dict]], per_block: int) -> tuple[str, dict[str, Any]]:
    """The headline: ours over TRL as a ratio of medians, and the median of the per-block ratios with their range."""
    ratio = summary["trl"]["s_per_step"] / summary["ours"]["s_per_step"]
    tok_ratio = summary["ours"]["tokens_per_s"] / summary["trl"]["tokens_per_s"]
    blocks = paired_ratios(results["trl"], results["ours"], per_block)
    line = (f"**ours / TRL: {ratio:.2f}x step throughput (ratio of median s/step), {tok_ratio:.2f}x completion "
            f"tokens/s; per interleaved block pair: median {median(blocks):.2f}x (range {spread(blocks)}, "
            f"{len(blocks)} pairs)**")
    return line, {"ratio": ratio, "token_ratio": tok_ratio, "block_ratios": blocks}
