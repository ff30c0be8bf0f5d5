"""The base-model stage of the tiny world: supervised pretraining on synthetic demonstrations.

The student learns to answer mostly briefly (like a base model: partial accuracy, so GRPO has signal,
with a few step-by-step answers in its data); teachers learn to answer step by step (like Qwen3 thinking
models). Their FLOPs are logged in the
ledger with ``counted: false``: as in the paper, pretraining is not post-training compute.
"""

from __future__ import annotations

import math
import os
import random
import time
from pathlib import Path
from typing import Any

import torch

from opdgrpo import gpu_slots, schema
from opdgrpo.domains import build_domain
from opdgrpo.progress import Progress, clock
from opdgrpo.runio import append_jsonl, rewrite_jsonl, write_json, write_yaml
from opdgrpo.train import flops as flop_formulas
from opdgrpo.train import numerics
from opdgrpo.train.engines import checkpoint_engine
from opdgrpo.train.evaluation import evaluate, heldout_for
from opdgrpo.train.finished import checkpoint_record
from opdgrpo.train.models import autocast, build_model, parameter_count
from opdgrpo.train.peak import run_peak
from opdgrpo.train.precision import configured as configured_precision
from opdgrpo.train.precision import resolve as resolve_precision
from opdgrpo.train.rollout import PromptFormat
from opdgrpo.train.tokenizer import load_tokenizer


def lr_at(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Linear warm-up then cosine decay to ``min_ratio``; a multiplier of the base learning rate."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def demonstration_batch(tokenizer, domains, thinking_fraction: float, batch_size: int, rng: random.Random):
    """Right-padded (input_ids, attention_mask, labels) with the loss on the answer and its EOS only.

    Each row's domain is drawn with weight ``domains.<name>.pretrain_weight`` (default 1): arithmetic needs
    far more examples than function synthesis before a tiny model gets partial accuracy. A row shows a
    step-by-step answer with probability ``thinking_fraction``, else a brief one: like a real base model,
    the student has seen some reasoning traces, so distilling a thinking teacher has a mode to pull on.
    """
    names = sorted(domains)
    weights = [float(getattr(domains[n], "cfg", {}).get("pretrain_weight", 1.0)) for n in names]
    prompts, answers = [], []
    for _ in range(batch_size):   # the draws first, in the order they always had; then one tokenizer call per side
        domain = domains[rng.choices(names, weights)[0]]
        task = domain.pretraining_task(rng)
        style = "thinking" if rng.random() < thinking_fraction else "brief"
        prompts.append(task.prompt)
        answers.append(domain.demonstration(task, style))
    rows, labels = [], []
    encoded = zip(tokenizer(prompts, add_special_tokens=False)["input_ids"], tokenizer(answers, add_special_tokens=False)["input_ids"])
    for prompt, answer in encoded:
        answer = list(answer) + [tokenizer.eos_token_id]
        rows.append(list(prompt) + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    label_ids = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
    return input_ids, attention, label_ids


def pretrain(cfg: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    torch.set_num_threads(int(cfg["threads"]))
    # The tokenizer's batch calls (Rust, rayon) would otherwise use every core of a machine Snakemake already fills
    # with one-thread jobs; a value set by the user wins.
    os.environ.setdefault("RAYON_NUM_THREADS", str(int(cfg["threads"])))
    started = time.time()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_yaml(out_dir / "config.yaml", cfg)
    ledger_path = out_dir / "ledger.jsonl"
    ledger_path.unlink(missing_ok=True)
    model_cfg, pre = cfg["model"], cfg["pretrain"]
    thinking, steps = float(model_cfg["pretrain"]["thinking_fraction"]), int(model_cfg["pretrain"]["steps"])
    if not 0.0 <= thinking <= 1.0:
        raise ValueError(f"config key `models.{cfg['name']}.pretrain.thinking_fraction` must be in [0, 1], got {thinking}")
    tokenizer = load_tokenizer(Path(cfg["tokenizer"]))
    domains = {name: build_domain(d) for name, d in cfg["domains"].items()}
    model = build_model(model_cfg, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed=int(cfg["seed"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(pre["lr"]), betas=(0.9, 0.95), weight_decay=0.01)
    rng = random.Random(f"pretrain-{cfg['name']}-{cfg['seed']}")
    total_flops, loop_wall = 0.0, 0.0
    precision = resolve_precision(configured_precision(pre, "pretrain.precision"), "cpu", "pretrain.precision")
    peak = run_peak(precision)   # MFU's denominator, measured before the loop
    model.train()
    progress = Progress(f"base-{cfg['name']}", steps)
    for step in range(steps):
        t0 = time.time()
        scale = lr_at(step, steps, int(pre["warmup_steps"]), float(pre["min_lr_ratio"]))
        for group in optimizer.param_groups:
            group["lr"] = float(pre["lr"]) * scale
        input_ids, attention, labels = demonstration_batch(tokenizer, domains, thinking, int(pre["batch_size"]), rng)
        with autocast(precision):
            loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step_flops = flop_formulas.train_flops(model.config, *input_ids.shape)
        total_flops += step_flops
        loss_value = loss.item()
        wall = max(time.time() - t0, 1e-9)
        loop_wall += wall
        progress.step(step + 1, {"loss": loss_value, "lr": optimizer.param_groups[0]["lr"], "flops": total_flops}, wall)
        if step % int(pre["log_every"]) == 0 or step == steps - 1:
            append_jsonl(ledger_path, {"step": step, "loss": loss_value, "flops": {"train": step_flops},
                                       "cumulative_flops": total_flops, "counted": False, "wall_s": round(wall, 3),
                                       "achieved_flops_per_s": step_flops / wall})
    eval_cfg = schema.with_defaults(pre["eval"], "config.schema.yaml#/$defs/pretrain", "eval")
    heldout = heldout_for(domains, sorted(domains), eval_cfg["max_prompts"])
    model.save_pretrained(out_dir / "checkpoint")   # before the evaluation: a vLLM engine samples from it
    tokenizer.save_pretrained(out_dir / "checkpoint")
    max_new_tokens = int((model_cfg.get("sampling") or {}).get("max_new_tokens", eval_cfg["max_new_tokens"]))
    tasks = [t for sets in heldout.values() for s in sets.values() for t in s]
    with autocast(precision), checkpoint_engine(cfg, out_dir / "checkpoint", model, tokenizer=tokenizer, tasks=tasks,
                                                fmt=PromptFormat(), max_new_tokens=max_new_tokens) as engine:
        results, eval_flops = evaluate(model, tokenizer, domains, heldout, k=int(eval_cfg["k"]),
                                       temperature=float(eval_cfg["temperature"]), max_new_tokens=max_new_tokens,
                                       batch_size=int(eval_cfg["batch_size"]), seed=int(cfg["seed"]),
                                       max_batch_tokens=eval_cfg["max_batch_tokens"],
                                       budget_key="pretrain.eval.max_batch_tokens", engine=engine)
    rewrite_jsonl(out_dir / "evals.jsonl", [{"step": steps, "cumulative_flops": 0.0, "eval_flops": eval_flops, "results": results}])
    summary = {
        "model": cfg["name"], "thinking_fraction": thinking, "steps": steps, "parameters": parameter_count(model),
        "pretrain_flops": total_flops, "counted": False, "final_loss": loss.item(), "heldout": results,
        "wall_s": round(time.time() - started, 1),
        # Achieved training FLOP/s of the pretraining loop (its final evaluation excluded) and MFU against the peak.
        "train_wall_s": round(loop_wall, 3), "achieved_flops_per_s": total_flops / loop_wall if loop_wall else None,
        "mfu": total_flops / loop_wall / peak["flops_per_s"] if loop_wall else None, "peak": {**peak, "processes": 1},
        "numerics": numerics.report(),   # the machine's fingerprint, which exact fast paths ran, the precision chosen
        "checkpoint": checkpoint_record(out_dir / "checkpoint", hash_contents=True),   # what downstream runs check
    }
    gpu_slots.record_into(summary)   # on a machine: the GPU slots the job ran on (opdgrpo.launch)
    write_json(out_dir / "done.json", summary)
    progress.event("done", {"steps": steps, "wall": clock(summary["wall_s"]), "loss": summary["final_loss"],
                            **{f"{r['eval_domain']}/{r['eval_set']}": round(r["accuracy"], 4) for r in results}})
    return summary
