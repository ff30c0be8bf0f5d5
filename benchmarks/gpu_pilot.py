"""GPU pilot: 2 GRPO steps and 2 OPD steps of the project's own trainer step on randomly initialised Qwen3-4B
(student) and Qwen3-8B (OPD teacher) shapes, on one GPU, in under 8 minutes; peak memory, seconds per step,
generation and training tokens/s and MFU to a JSON file and a markdown table.

What runs, and what is the project's code. Each step is ``opdgrpo.train._step``, the function the trainer's loop
calls: the student samples with ``opdgrpo.sampling.sample`` (through ``opdgrpo.rollout.sample_and_score`` and
``opdgrpo.inference.choose_path``), then per shard the training forward through ``opdgrpo.logit_chunks``, the GRPO or
OPD objective (``opdgrpo.objectives``/``losses``; OPD's bf16 teacher through ``inference.FrozenForward``), the
backward, and the update as the trainer does it (``Workers.clip_grad_norm``, AdamW); FLOPs are the ledger's
(``opdgrpo.flops`` via ``step_stats.StepStats.ledger_line``), MFU divides them by ``opdgrpo.peak.matmul_peak`` (a
bf16 8192^3 matmul on the GPU) and by the GPU's nominal dense bf16 peak (H200/H100: 989 TFLOP/s). Settings are
the paper profile's (``conf/profile/paper.yaml``): bf16 autocast, sdpa attention, float32 master weights and AdamW
state, the teacher in bfloat16, activation checkpointing, logit chunks of 4096 positions, one update per batch.

What is not ``opdgrpo.train.train``: ``train()`` loads its models and tokenizer from disk (``from_pretrained``; the
Qwen tokenizer is a hub download), builds verifiable domains, evaluates held-out sets and writes checkpoints (16 GB of
float32 4B weights plus AdamW state: minutes of disk I/O). So the pilot builds the ``Run`` that ``train._setup``
would (the same calls: ``Workers.prepare``, ``enable_activation_checkpointing``, ``build_objective``, ``RunShape.of``,
``matmul_peak``) around models built in place on the GPU with ``opdgrpo.models.build_model`` (random init, no
downloads), a tokenizer that writes token ids as words (the sampler's interface: encode, decode, pad and EOS ids)
and one synthetic domain. Its reward is a deterministic function of the sampled tokens (the share of even token ids
in the completion), so GRPO's group advantages are non-zero and its backward and update do real work.

Random models never stop: EOS is an id outside the vocabulary, so every row runs to ``--max-new-tokens`` (the
ledger counts what was computed either way). Phase times (sampling and scoring; training forward, loss, backward
and update) come from timers wrapped around ``train._sample`` and ``train._train_minibatch`` (with a CUDA
synchronize), not from a copy of them.

    timeout 480 python benchmarks/gpu_pilot.py                      # one GPU: 8 prompts x 8 = 64 sequences, 1024 new tokens
    python benchmarks/gpu_pilot.py --cpu-smoke --json /tmp/p.json    # toy shapes on CPU, under a minute on 2 cores

Exit status: 0 when every stage finished; 2 when the device is missing (nothing ran); 3 when ``--max-seconds``
stopped it (the JSON holds what finished); 4 when a run ran out of device memory, 5 when one failed otherwise
(recorded with its traceback; the other runs still ran).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import common

REPO = common.REPO
#: conf/model keys that are not Qwen3Config's.
NOT_ARCH = {"name", "source", "path", "revision", "attn_implementation", "dtype", "pretrain"}
#: Dense bf16 tensor-core peaks (no sparsity), FLOP/s, by a substring of ``torch.cuda.get_device_name``.
NOMINAL_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}
#: Toy shapes for --cpu-smoke: the 4B/8B pair's structure (GQA, tied student head, untied teacher head, larger
#: teacher), a few layers and hidden 64.
TOY = {
    "toy_student": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "tie_word_embeddings": True},
    "toy_teacher": {"hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 3, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 512, "tie_word_embeddings": False},
}
PRESETS = {
    "gpu": {"device": "cuda", "student": "qwen3_4b_base", "teacher": "qwen3_8b_base", "prompts": 8, "group": 8,
            "prompt_tokens": 256, "max_new_tokens": 1024, "micro_batches": 1, "logit_chunk_tokens": 4096,
            "max_seconds": 420, "threads": 8},
    "cpu": {"device": "cpu", "student": "toy_student", "teacher": "toy_teacher", "prompts": 2, "group": 8,
            "prompt_tokens": 12, "max_new_tokens": 16, "micro_batches": 2, "logit_chunk_tokens": 64,
            "max_seconds": 120, "threads": 2},
}
#: Assumed for the plan's time estimate only (nothing measured on a GPU yet): a decode step of a 36-layer model
#: through transformers' forward is bound by Python and kernel launches, not by FLOPs or HBM.
ASSUMED_DECODE_S, ASSUMED_TRAIN_MFU = 0.040, 0.30


class TimeGuard(RuntimeError):
    """``--max-seconds`` ran out (or the next step would not fit in what is left)."""


# --------------------------------------------------------------------------------------------------------------------
# Arguments and the plan


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="gpu")
    p.add_argument("--cpu-smoke", action="store_true", help="same as --preset cpu: toy shapes on the CPU")
    p.add_argument("--device", help="cuda or cpu (default: the preset's)")
    p.add_argument("--methods", nargs="+", choices=("grpo", "opd"), default=["grpo", "opd"])
    p.add_argument("--steps", type=int, default=2, help="steps per method (each is timed and reported)")
    p.add_argument("--prompts", type=int, help="prompts per step (x --group sequences)")
    p.add_argument("--group", type=int, help="GRPO group size = OPD rollouts per prompt (paper: 8)")
    p.add_argument("--prompt-tokens", type=int, help="longest prompt; prompts are random ids of half to full length")
    p.add_argument("--max-new-tokens", type=int, help="every row generates exactly this many (no EOS can be sampled)")
    p.add_argument("--micro-batches", type=int, help="train.micro_batches: shards per step (each sampled and trained "
                                                    "as one batch)")
    p.add_argument("--logit-chunk-tokens", type=int, help="train.logit_chunk_tokens")
    p.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                   help="train.precision (auto: bf16 on a GPU; on a CPU as opdgrpo.precision measures)")
    p.add_argument("--attn", default="sdpa", choices=("sdpa", "eager", "flash_attention_2"), help="train.attn_implementation")
    p.add_argument("--lr", type=float, default=1e-6, help="the paper profile's")
    p.add_argument("--max-seconds", type=float, help="time guard over the whole script (GPU default 420 of the 480 a "
                                                     "`timeout 480` allows)")
    p.add_argument("--threads", type=int)
    p.add_argument("--nominal-peak-tflops", type=float, help="dense bf16 peak of the device (default: by its name)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=REPO / "results" / "gpu_pilot.json")
    p.add_argument("--plan-only", action="store_true", help="print the plan (FLOPs, memory and time estimates) and stop")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.preset = "cpu"
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def architecture(name: str) -> dict[str, Any]:
    """A model's shape: ``conf/model/<name>.yaml``'s architecture keys, or a toy shape."""
    if name in TOY:
        return dict(TOY[name])
    import yaml

    block = yaml.safe_load((REPO / "conf" / "model" / f"{name}.yaml").read_text())
    return {k: v for k, v in block.items() if k not in NOT_ARCH}


def memory_estimate(student, teacher, rows: int, tokens: int, chunk: int, opd: bool) -> dict[str, float]:
    """GiB the largest pieces of a step hold on the device: an estimate for the plan, not a measurement.

    Pieces: the student's float32 weights, AdamW moments and gradients; its bf16 weight copies (autocast's cache,
    held through a forward); the OPD teacher's bf16 weights; the rollout's KV cache (bf16 keys and values); the layer
    inputs activation checkpointing keeps (the float32 residual stream); one layer's activations recomputed in the
    backward (rough); one chunk of full-vocabulary logits (bf16, float32, their gradient). ``forward_peak``: at the end
    of the training forward (gradients freed by ``zero_grad``); ``backward_peak``: an upper bound at its start (every
    gradient counted with every checkpointed input, which the backward frees layer by layer); ``optimizer_step_peak``:
    during AdamW's step."""
    from opdgrpo import flops as F

    gib, n = 2**30, F.params_count(student)
    kv = 2 * student.num_hidden_layers * student.num_key_value_heads * student.head_dim * 2
    layer = 4 * (6 * student.hidden_size + 3 * student.intermediate_size)
    out = {"student_weights_and_adamw": 12 * n / gib, "student_gradients": 4 * n / gib, "student_bf16_casts": 2 * n / gib,
           "teacher_weights": 2 * F.params_count(teacher) / gib if opd else 0.0,
           "kv_cache_bf16": rows * tokens * kv / gib,
           "checkpointed_layer_inputs": rows * tokens * student.num_hidden_layers * student.hidden_size * 4 / gib,
           "one_layer_recompute": rows * tokens * layer / gib, "logit_chunk": chunk * student.vocab_size * 10 / gib}
    held = out["student_weights_and_adamw"] + out["teacher_weights"]
    out["rollout_peak"] = held + out["student_bf16_casts"] + out["kv_cache_bf16"]
    out["forward_peak"] = held + out["student_bf16_casts"] + out["checkpointed_layer_inputs"] + out["logit_chunk"]
    out["backward_peak"] = held + out["student_gradients"] + out["checkpointed_layer_inputs"] + out["one_layer_recompute"] \
        + out["logit_chunk"]
    # AdamW's multi-tensor step on a GPU makes one float32 temporary the size of the weights (the moments' sqrt)
    out["optimizer_step_peak"] = held + out["student_gradients"] + 4 * n / gib
    out["training_peak"] = max(out["rollout_peak"], out["forward_peak"], out["backward_peak"], out["optimizer_step_peak"])
    return {k: float(f"{v:.3g}") for k, v in out.items()}


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """What will run, the ledger's FLOPs per step and a rough time estimate (before anything is built)."""
    from transformers import Qwen3Config

    from opdgrpo import flops as F

    sequences, prompt, new = args.prompts * args.group, args.prompt_tokens, args.max_new_tokens
    student, teacher = Qwen3Config(**architecture(args.student)), Qwen3Config(**architecture(args.teacher))
    rollout = F.generate_flops(student, sequences, prompt, new)
    train = F.train_flops(student, sequences, prompt + new, logits_positions=new + 1)
    teach = F.forward_flops(teacher, sequences, prompt + new, logits_positions=new + 1)
    decode_steps = args.micro_batches * new * args.steps * len(args.methods)
    nominal = NOMINAL_BF16["H200"]
    estimate = decode_steps * ASSUMED_DECODE_S + args.steps * (
        train * len(args.methods) + teach * ("opd" in args.methods)) / (ASSUMED_TRAIN_MFU * nominal)
    return {"sequences": sequences, "prompts": args.prompts, "group": args.group, "prompt_tokens_max": prompt,
            "max_new_tokens": new, "micro_batches": args.micro_batches, "rows_per_shard": sequences // args.micro_batches,
            "steps": args.steps, "methods": args.methods, "student": args.student, "teacher": args.teacher,
            "student_parameters": F.params_count(student), "teacher_parameters": F.params_count(teacher),
            "precision": args.precision, "attn_implementation": args.attn, "param_dtype": "float32",
            "teacher_dtype": "bfloat16", "activation_checkpointing": args.activation_checkpointing,
            "logit_chunk_tokens": args.logit_chunk_tokens, "lr": args.lr, "max_seconds": args.max_seconds,
            "ledger_flops_per_step_at_full_prompts": {"rollout": rollout, "train": train, "teacher (opd)": teach},
            "memory_estimate_gib": memory_estimate(student, teacher, sequences // args.micro_batches, prompt + new,
                                                   min(args.logit_chunk_tokens, sequences * new), "opd" in args.methods),
            "h200_estimate_s": {"decode_steps": decode_steps, "assumed_decode_step_s": ASSUMED_DECODE_S,
                                "assumed_train_mfu": ASSUMED_TRAIN_MFU, "steps_total_s": round(estimate, 1)}}


def print_plan(p: dict[str, Any]) -> None:
    print(f"gpu pilot plan: {', '.join(p['methods'])} x {p['steps']} steps; student {p['student']} "
          f"({p['student_parameters'] / 1e9:.3g} B params, float32 master weights + AdamW), OPD teacher {p['teacher']} "
          f"({p['teacher_parameters'] / 1e9:.3g} B, bfloat16, frozen)")
    print(f"  {p['prompts']} prompts x {p['group']} = {p['sequences']} sequences per step, prompts up to "
          f"{p['prompt_tokens_max']} tokens, exactly {p['max_new_tokens']} new tokens per row (EOS never sampled); "
          f"{p['micro_batches']} shard(s) of {p['rows_per_shard']} rows (each shard is sampled as one batch)")
    print(f"  {p['precision']} autocast, {p['attn_implementation']} attention, activation checkpointing "
          f"{'on' if p['activation_checkpointing'] else 'off'}, logit chunks of {p['logit_chunk_tokens']} positions; "
          f"time guard {p['max_seconds']} s")
    fl, est, mem = p["ledger_flops_per_step_at_full_prompts"], p["h200_estimate_s"], p["memory_estimate_gib"]
    print(f"  ledger FLOPs per step (prompts at full length): rollout {fl['rollout']:.3g}, train {fl['train']:.3g}, "
          f"OPD teacher {fl['teacher (opd)']:.3g}")
    print(f"  rough H200 estimate of the steps alone: {est['decode_steps']} decode steps x {est['assumed_decode_step_s']} s "
          f"+ training at {est['assumed_train_mfu']:.0%} MFU = {est['steps_total_s']} s (model builds and the peak "
          "probe come on top)")
    print(f"  memory estimate (GiB): {mem}", flush=True)


# --------------------------------------------------------------------------------------------------------------------
# The synthetic world: tokenizer, domain, models


class IdTokenizer:
    """What the sampler's glue (``opdgrpo.rollout``) reads of a tokenizer, for text that is token ids as words.

    Pad is id 0; EOS is ``vocab`` (an id the model cannot sample, so every row runs to ``max_new_tokens``)."""

    unk_token_id = None

    def __init__(self, vocab: int):
        self.pad_token_id, self.eos_token_id = 0, vocab

    def __call__(self, texts: list[str], add_special_tokens: bool = False) -> dict[str, list[list[int]]]:
        return {"input_ids": [[int(w) for w in t.split()] for t in texts]}

    def batch_decode(self, rows: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return [" ".join(map(str, r)) for r in rows]


class SyntheticDomain:
    """Random prompts of random length; reward = the share of even token ids in the completion (deterministic in
    the sampled tokens, different between a group's samples, so GRPO's advantages are non-zero)."""

    name = "synthetic"

    def __init__(self, vocab: int, size: int, prompt_tokens: int, seed: int):
        from opdgrpo.domains import Task

        rng = random.Random(seed)
        self.pool = []
        for i in range(size):
            ids = [rng.randrange(1, vocab) for _ in range(rng.randint(max(1, prompt_tokens // 2), prompt_tokens))]
            self.pool.append(Task(self.name, " ".join(map(str, ids)), None, {"index": i}))

    def training_pool(self) -> list:
        return list(self.pool)

    def score(self, tasks, completions: list[str]) -> list[float]:
        out = []
        for text in completions:
            ids = [int(w) for w in text.split()]
            out.append(sum(1 for t in ids if t % 2 == 0) / len(ids) if ids else 0.0)
        return out


@contextlib.contextmanager
def default_dtype(dtype) -> Iterator[None]:
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build(name: str, device, dtype, attn: str, seed: int, trainable: bool):
    """``opdgrpo.models.build_model`` with ``name``'s shape, initialised directly on ``device`` in ``dtype`` (a 4B
    model built on the host would take minutes), switched to ``attn`` attention."""
    import torch

    from opdgrpo.models import build_model

    arch = architecture(name)
    vocab = arch.pop("vocab_size")
    with torch.device(device), default_dtype(dtype):
        model = build_model(arch, vocab, pad_token_id=0, eos_token_id=vocab - 1, seed=seed)
    model.config._attn_implementation = attn
    model.train(trainable)
    if not trainable:
        model.requires_grad_(False)
    return model


# --------------------------------------------------------------------------------------------------------------------
# One method's run: the Run that train._setup would build, then train._step


def run_config(args: argparse.Namespace, method: str) -> dict[str, Any]:
    import yaml

    m = yaml.safe_load((REPO / "conf" / "method" / f"{method}.yaml").read_text())
    m.update(steps=args.steps, lr=args.lr, **({"group_size": args.group} if method == "grpo" else
                                             {"rollouts_per_prompt": args.group}))
    return {"run_id": f"gpu-pilot-{method}", "seed": args.seed, "threads": args.threads, "method": m,
            "train": {"prompts_per_step": args.prompts, "max_new_tokens": args.max_new_tokens, "temperature": 1.0,
                      "eval_every": 10**9, "checkpoint_every": 10**9, "precision": args.precision,
                      "micro_batches": args.micro_batches, "logit_chunk_tokens": args.logit_chunk_tokens,
                      "attn_implementation": args.attn, "param_dtype": "float32", "teacher_dtype": "bfloat16",
                      "activation_checkpointing": args.activation_checkpointing}}


def make_run(args: argparse.Namespace, method: str, workers, peak: dict[str, Any], scratch: Path):
    """``train.Run`` as ``train._setup`` builds it, on the synthetic world; returns (run, {domain: teacher})."""
    import torch

    from opdgrpo import train as T
    from opdgrpo.batching import domain_counts
    from opdgrpo.models import enable_activation_checkpointing
    from opdgrpo.objectives import build_objective
    from opdgrpo.precision import resolve as resolve_precision
    from opdgrpo.rollout import PromptFormat
    from opdgrpo.run_shape import RunShape

    cfg = run_config(args, method)
    shape = RunShape.of(cfg, workers.world)
    precision = resolve_precision(shape.precision, workers.device)
    vocab = architecture(args.student)["vocab_size"]
    domain = SyntheticDomain(vocab, args.prompts * args.steps, args.prompt_tokens, args.seed)
    pools = {domain.name: domain.training_pool()}
    teachers = {}
    if method == "opd":
        teacher = build(args.teacher, workers.device, torch.bfloat16, args.attn, args.seed + 1, trainable=False)
        teachers = {domain.name: workers.prepare_frozen(teacher.eval())}
    student = build(args.student, workers.device, torch.float32, args.attn, args.seed, trainable=True)
    if args.activation_checkpointing:
        enable_activation_checkpointing(student)
    objective = build_objective(cfg["method"], teachers, precision, temperature=1.0,
                                chunk_tokens=shape.logit_chunk_tokens)
    method_cfg = cfg["method"]
    model, optimizer = workers.prepare(student, lambda params: torch.optim.AdamW(
        params, lr=float(method_cfg["lr"]), betas=tuple(method_cfg["betas"]), weight_decay=float(method_cfg["weight_decay"])))
    run = T.Run(cfg, scratch, workers, IdTokenizer(vocab), {domain.name: domain}, pools, {},
                domain_counts(pools, shape.prompts_per_step, "balanced"), PromptFormat(), student, model,
                optimizer, objective, "gpu-pilot", peak, None, shape=shape, precision=precision)
    return run, teachers


@contextlib.contextmanager
def phase_timers(device, out: dict[str, Any]) -> Iterator[None]:
    """Time ``train._sample`` and ``train._train_minibatch`` (summed per step) and their peak memory: CUDA's
    allocator peak (reset as each phase starts), or on a CPU :func:`opdgrpo.memprobe.peak_bytes` (bytes the phase
    allocated beyond what was held when it started)."""
    import torch

    from opdgrpo import train as T
    from opdgrpo.memprobe import peak_bytes

    cuda = device.type == "cuda"
    originals = {"sample": T._sample, "train": T._train_minibatch}

    def wrap(phase: str, fn: Callable) -> Callable:
        def timed(*a, **k):
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            if cuda:
                result = fn(*a, **k)
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated()
            else:
                peak, result = peak_bytes(lambda: fn(*a, **k))
            out["seconds"][phase] = out["seconds"].get(phase, 0.0) + time.perf_counter() - t0
            out["peak"][phase] = max(out["peak"].get(phase, 0), int(peak))
            return result
        return timed

    T._sample, T._train_minibatch = wrap("sample", T._sample), wrap("train", T._train_minibatch)
    try:
        yield
    finally:
        T._sample, T._train_minibatch = originals["sample"], originals["train"]


def step_record(run, step: int, stats, wall: float, phases: dict[str, Any], peaks: dict[str, float | None]) -> dict[str, Any]:
    """The step's ledger line (the trainer's own, ``StepStats.ledger_line``) and the pilot's rates."""
    line = stats.ledger_line(step, sum(stats.flops.values()), run.optimizer.param_groups[0]["lr"], wall,
                             losses=run.shape.shards * run.shape.updates_per_batch)
    if stats.skipped:
        raise RuntimeError(f"step {step} was skipped: non-finite {stats.skipped}")
    sample_s, train_s = phases["seconds"].get("sample", 0.0), phases["seconds"].get("train", 0.0)
    fl, tokens = line["flops"], line["tokens"]
    achieved = line["step_flops"] / wall
    trained = fl["train"] + fl["teacher"] + fl["old_policy"]

    def mfu(flops_per_s: float, peak: float | None) -> float | None:
        return flops_per_s / peak if peak else None

    sequences = run.shape.rows_per_step
    return {"step": step, "sequences": sequences, "sequence_tokens": tokens["train"] / sequences,
            "new_tokens_per_row": tokens["completion"] / sequences, "seconds": wall,
            "phase_seconds": {"sample_and_score": sample_s, "train_and_update": train_s,
                              "other": max(wall - sample_s - train_s, 0.0)},
            "generated_tokens": tokens["completion"], "generation_tokens_per_s": tokens["completion"] / sample_s,
            "training_tokens_per_s": tokens["train"] / train_s, "achieved_flops_per_s": achieved,
            "mfu_measured_peak": mfu(achieved, peaks["measured"]), "mfu_nominal_peak": mfu(achieved, peaks["nominal"]),
            "rollout_mfu_measured_peak": mfu(fl["rollout"] / sample_s, peaks["measured"]),
            "train_mfu_measured_peak": mfu(trained / train_s, peaks["measured"]),
            "peak_memory_bytes": max(phases["peak"].values()), "phase_peak_memory_bytes": dict(phases["peak"]),
            "ledger": line}


# --------------------------------------------------------------------------------------------------------------------
# The whole pilot


class Pilot:
    """Runs the methods one after another under the time guard, writing the JSON after every step."""

    def __init__(self, args: argparse.Namespace, started: float):
        self.args, self.started = args, started
        self.result: dict[str, Any] = {"schema": "opdgrpo.gpu_pilot/1", "status": "running", "preset": args.preset,
                                       "commit": common.commit(), "versions": common.versions(), "runs": []}
        self.longest_step = 0.0

    def elapsed(self) -> float:
        return time.time() - self.started

    def write(self) -> None:
        self.result["wall_seconds"] = round(self.elapsed(), 2)
        self.args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result, indent=1, default=float))
        os.replace(tmp, self.args.json)

    def check_time(self, what: str, needs: float = 0.0) -> None:
        left = self.args.max_seconds - self.elapsed()
        if left <= needs:
            raise TimeGuard(f"time guard: {self.elapsed():.0f} s of --max-seconds {self.args.max_seconds:g} used; "
                            f"{what} (about {needs:.0f} s) would not finish in the {max(left, 0):.0f} s left")

    def setup(self) -> Any:
        import torch

        from opdgrpo.distributed import Workers
        from opdgrpo.peak import run_peak
        from opdgrpo.precision import resolve

        torch.set_num_threads(int(self.args.threads))
        workers = Workers("none", cpu=self.args.device == "cpu")
        device = workers.device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else common.cpu_model()
        nominal = self.args.nominal_peak_tflops * 1e12 if self.args.nominal_peak_tflops else next(
            (v for k, v in NOMINAL_BF16.items() if device.type == "cuda" and k in name), None)
        self.args.precision = resolve(self.args.precision, device)   # the run's arithmetic, before it is described
        measured = run_peak(self.args.precision, device=device)
        self.peaks = {"measured": measured["flops_per_s"], "nominal": nominal}
        self.result["device"] = {"type": device.type, "name": name, "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                                 "memory_bytes": torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None}
        self.result["peak"] = {"measured": measured, "nominal_flops_per_s": nominal,
                               "nominal_source": "dense bf16 tensor-core peak of the device's datasheet" if nominal else
                               "none (CPU, or a GPU the table does not name: pass --nominal-peak-tflops)"}
        total = self.result["device"]["memory_bytes"]
        need = self.result.get("plan", {}).get("memory_estimate_gib", {}).get("training_peak", 0.0)
        if total and need * 2**30 > 0.95 * total:
            print(f"  warning: the memory estimate ({need:.0f} GiB) is above 95% of the device's {total / 2**30:.0f} GiB; "
                  "an out-of-memory run is recorded and the next one still runs (try --micro-batches 2 or fewer "
                  "--max-new-tokens)", flush=True)
        self.result["peak_memory_kind"] = (
            "torch.cuda.max_memory_allocated: everything allocated on the device at the phase's peak (weights, "
            "optimizer state, activations, KV cache)" if device.type == "cuda" else
            "opdgrpo.memprobe.peak_bytes: bytes the phase allocated beyond what it started with (weights, optimizer "
            "state and, for training, the rollouts excluded); state_bytes_after_step has the weights and optimizer state")
        return workers

    def run_method(self, method: str, workers, scratch: Path) -> None:
        import torch

        from opdgrpo import train as T

        cuda = workers.device.type == "cuda"
        record: dict[str, Any] = {"method": method, "student": self.args.student,
                                  "teacher": self.args.teacher if method == "opd" else None, "status": "running", "steps": []}
        self.result["runs"].append(record)
        self.check_time(f"building the {method} run", needs=0.0)
        t0 = time.time()
        try:
            run, teachers = make_run(self.args, method, workers, self.peaks, scratch)
            if cuda:
                torch.cuda.synchronize()
            record.update(self._sizes(run, teachers), build_seconds=round(time.time() - t0, 2))
            self.write()
            print(f"  {method}: models built in {record['build_seconds']} s ({self.elapsed():.0f} s elapsed)", flush=True)
            for step in range(self.args.steps):
                self.check_time(f"{method} step {step}", needs=self.longest_step)
                phases: dict[str, Any] = {"seconds": {}, "peak": {}}
                with phase_timers(workers.device, phases):
                    t1 = time.perf_counter()
                    stats = T._step(run, step)
                    if cuda:
                        torch.cuda.synchronize()
                    wall = time.perf_counter() - t1
                self.longest_step = max(self.longest_step, wall)
                record["steps"].append(step_record(run, step, stats, wall, phases, self.peaks))
                record["state_bytes_after_step"] = self._state_bytes(run, teachers)
                self.write()
                print(f"  {method} step {step}: {wall:.2f} s ({self.elapsed():.0f} s elapsed)", flush=True)
            record["status"] = "ok"
        except TimeGuard:
            raise
        except torch.OutOfMemoryError as err:
            record["status"] = f"out of device memory: {str(err).splitlines()[0]}"
            self.result["failed"] = 4
            print(f"  {method}: {record['status']}", file=sys.stderr, flush=True)
        except Exception as err:   # recorded, and the next method still runs: a lent GPU's minutes are few
            import traceback

            record["status"] = f"error: {type(err).__name__}: {err}"
            record["traceback"] = traceback.format_exc()
            self.result["failed"] = self.result.get("failed") or 5
            print(f"  {method}: {record['status']}\n{record['traceback']}", file=sys.stderr, flush=True)
        finally:
            run = teachers = None
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()

    @staticmethod
    def _sizes(run, teachers: dict) -> dict[str, Any]:
        from opdgrpo.models import parameter_count

        teacher = next(iter(teachers.values()), None)
        return {"student_parameters": parameter_count(run.student),
                "teacher_parameters": parameter_count(teacher) if teacher is not None else None}

    @staticmethod
    def _state_bytes(run, teachers: dict) -> dict[str, int]:
        """Bytes of the weights, gradients and AdamW state held after a step (what a step starts from)."""
        def nbytes(tensors) -> int:
            return sum(t.numel() * t.element_size() for t in tensors)

        optimizer = [v for s in run.optimizer.state.values() for v in s.values() if hasattr(v, "element_size")]
        teacher_bytes = sum(nbytes(t.parameters()) for t in {id(t): t for t in teachers.values()}.values())
        return {"student_weights": nbytes(run.student.parameters()), "optimizer_state": nbytes(optimizer),
                "teacher_weights": teacher_bytes}


def count(n: int) -> str:
    return next(f"{n / d:.3g} {u}" for d, u in ((1e9, "B"), (1e6, "M"), (1e3, "K"), (1, "")) if n >= d or d == 1)


def size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def table(result: dict[str, Any]) -> str:
    rows = []
    for r in result["runs"]:
        models = r["student"] + (f" <- {r['teacher']}" if r.get("teacher") else "")
        params = count(r.get("student_parameters", 0)) + (
            f" + {count(r['teacher_parameters'])}" if r.get("teacher_parameters") else "")
        if not r["steps"]:
            rows.append([r["method"], models, params, "-", r["status"]] + ["-"] * 8)
        for s in r["steps"]:
            shape = f"{s['sequences']} x {s['sequence_tokens']:.0f}"
            nominal = s["mfu_nominal_peak"]
            rows.append([r["method"], models, params, shape, s["step"], f"{s['seconds']:.2f}",
                         f"{s['phase_seconds']['sample_and_score']:.2f} / {s['phase_seconds']['train_and_update']:.2f}",
                         f"{s['generation_tokens_per_s']:,.0f}", f"{s['training_tokens_per_s']:,.0f}",
                         size(s["peak_memory_bytes"]), f"{s['ledger']['step_flops']:.3g}",
                         f"{100 * s['mfu_measured_peak']:.1f}%", "-" if nominal is None else f"{100 * nominal:.1f}%"])
    headers = ["method", "student <- teacher", "params", "seqs x (prompt+new) tokens", "step", "s/step", "sample / train s",
               "gen tok/s", "train tok/s", "peak mem", "ledger FLOPs", "MFU (measured peak)", "MFU (nominal)"]
    return common.table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    args = parse_args(argv)
    # before torch is imported: fewer fragmented blocks when the step's activations come and go next to 80 GB of state
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    common.quiet()
    p = plan(args)
    print_plan(p)
    if args.plan_only:
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu pilot: --device cuda (the gpu preset's) but no CUDA device is visible; nothing ran. "
              "Use --cpu-smoke for the toy shapes on the CPU.", file=sys.stderr)
        return 2
    pilot = Pilot(args, started)
    pilot.result["plan"] = p

    def alarm(signum, frame):
        raise TimeGuard(f"time guard: --max-seconds {args.max_seconds:g} reached during a stage")

    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(max(1, math.ceil(args.max_seconds - pilot.elapsed())))
    code = 0
    try:
        pilot.check_time("setting up (the peak probe)")
        workers = pilot.setup()
        import tempfile

        with tempfile.TemporaryDirectory(prefix="gpu-pilot-") as scratch:
            for method in args.methods:
                pilot.run_method(method, workers, Path(scratch))
        code = pilot.result.get("failed", 0)
        pilot.result["status"] = "complete" if not code else "incomplete: " + "; ".join(
            f"{r['method']} {r['status']}" for r in pilot.result["runs"] if r["status"] != "ok")
    except TimeGuard as err:
        signal.alarm(0)
        for r in pilot.result["runs"]:
            if r["status"] == "running":
                r["status"] = f"stopped: {err}"
        pilot.result["status"] = f"stopped: {err}"
        print(f"gpu pilot: {err}; the JSON holds what finished", file=sys.stderr)
        code = 3
    finally:
        signal.alarm(0)
        pilot.write()
    print()
    print(f"### GPU pilot ({pilot.result.get('device', {}).get('name', '?')}, preset {args.preset}; "
          f"{pilot.result['wall_seconds']} s wall in all)\n")
    print(table(pilot.result))
    print(f"\nJSON: {args.json} (status: {pilot.result['status']})")
    return code


if __name__ == "__main__":
    sys.exit(main())
