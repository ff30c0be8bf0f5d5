"""An OPD step of ours (``opdgrpo.train.loop.train``) against TRL's on-policy ``DistillationTrainer``.

TRL 1.x's ``DistillationTrainer`` (``trl.DistillationTrainer``, the successor of the experimental ``GKDTrainer``
with ``lmbda=1``) always trains on the student's own samples; ``beta=1.0`` makes its divergence the reverse
KL(student || teacher), the paper's objective. Both sides: the same tiny student and frozen teacher, the same
prompts in the same order (our trainer's draw; each prompt repeated ``--rollouts`` times for TRL, whose
distillation samples one completion per dataset row), the same completion cap, temperature 1 with the full
distribution, token-mean loss over the batch, gradient clipping at 1.0 and the same ``torch.optim.AdamW``.
Steps run in alternating blocks; the first step of a block is a warm-up and is dropped; each block starts from
the base student.

One setting cannot be matched: TRL's loss is the reverse KL over the *whole* vocabulary (computed from both
models' hidden states and LM heads in chunks), ours over the student's top-16 tokens, renormalised (the paper's
estimator; ``--kl-top-k V`` makes ours the full reverse KL too).

    python benchmarks/opd_vs_trl.py [--world results/tiny/base|random] [--teacher teacher_l] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import common


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", help="pretrained tiny world (default: results/tiny/base if present) or `random`")
    p.add_argument("--teacher", default="teacher_l", help="the frozen teacher (tiny roles: teacher_m, teacher_l)")
    p.add_argument("--prompts", type=int, help="prompts per step (default: the tiny profile's train.prompts_per_step)")
    p.add_argument("--rollouts", type=int, default=8, help="completions per prompt (tiny OPD default: 8)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="completion cap (tiny profile: 32)")
    p.add_argument("--kl-top-k", type=int, default=16, help="our OPD reverse KL's support size (the paper's 16)")
    p.add_argument("--lr", type=float, default=2e-4, help="AdamW learning rate (tiny profile's OPD: 2e-4)")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="bf16 autocast for both (TRL: bf16=True), fp32, or auto (the tiny profile's train.precision: "
                        "what opdgrpo.train.precision picks on this CPU, for both)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for both (tiny profile: 1 per job)")
    p.add_argument("--rounds", type=int, default=5, help="blocks per trainer")
    p.add_argument("--steps", type=int, default=4, help="steps per block; the first of each is a warm-up")
    p.add_argument("--trl-as-is", action="store_true",
                   help="with bf16: leave TRL's loss forwards in fp32 (TRL 1.16 calls the backbones outside accelerate's "
                        "autocast) instead of wrapping them in the bf16 autocast ours uses")
    p.add_argument("--json", type=Path, help="also write the measurements here")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    import torch
    from datasets import Dataset

    try:
        import trl
        from trl import DistillationConfig, DistillationTrainer
    except ImportError as err:
        raise SystemExit(f"this benchmark needs trl with DistillationTrainer ({err}): pip install -e '.[bench]'") from None
    common.quiet()
    common.set_threads(args.threads)
    from opdgrpo.train.precision import resolve

    args.precision = resolve(args.precision)   # both trainers run what our trainer would run here

    scratch = Path(tempfile.mkdtemp(prefix="bench-opd-"))
    args.prompts = args.prompts or int(common.tiny_config(scratch / "results")["train"]["prompts_per_step"])
    world = common.load_world(args.world, ["student", args.teacher], scratch)
    cfg = common.run_config("opd", world, scratch, teacher=args.teacher, overrides={
        "threads": args.threads, "train.prompts_per_step": args.prompts, "train.max_new_tokens": args.max_new_tokens,
        "train.temperature": 1.0, "train.precision": args.precision, "train.eval_every": 10**6,
        "train.checkpoint_every": 10**6, "train.eval": {"k": 1, "temperature": 1.0, "batch_size": 64},
        "method.rollouts_per_prompt": args.rollouts, "method.lr": args.lr, "method.kl_top_k": args.kl_top_k,
        "method.aggregation": "token-mean", "method.warmup_steps": 0,
        "domains.math.heldout.amc.size": 4, "domains.math.heldout.aime.size": 4})
    method = cfg["method"]

    from opdgrpo.domains import build_domain
    from opdgrpo.train.batching import batch_tasks, domain_counts
    from opdgrpo.train.models import load_model
    from opdgrpo.train.tokenizer import load_tokenizer

    domain = build_domain(cfg["domains"]["math"])
    pools = {"math": domain.training_pool()}
    counts = domain_counts(pools, args.prompts, "balanced")
    tasks = [t for s in range(args.steps) for t in batch_tasks(pools, counts, s, int(cfg["seed"]))]
    tokenizer = load_tokenizer(world.tokenizer)
    tokenizer.padding_side = "left"
    dataset = Dataset.from_dict({"prompt": [t.prompt for t in tasks for _ in range(args.rollouts)]})

    student = load_model(world.models["student"])
    teacher = load_model(world.models[args.teacher], trainable=False).eval()
    optimizer = torch.optim.AdamW(student.parameters(), lr=args.lr, betas=tuple(method["betas"]),
                                  weight_decay=float(method["weight_decay"]))
    batch = args.prompts * args.rollouts
    trl_args = DistillationConfig(
        output_dir=str(scratch / "trl"), max_steps=args.rounds * args.steps, per_device_train_batch_size=batch,
        gradient_accumulation_steps=1, max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        beta=1.0, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=float(method["grad_clip"]), gradient_checkpointing=False, bf16=args.precision == "bf16",
        use_cpu=True, shuffle_dataset=False, logging_steps=10**6, save_strategy="no", report_to=[], disable_tqdm=True,
        seed=int(cfg["seed"]), dataloader_num_workers=0,
    )

    results: dict[str, list[dict]] = {"ours": [], "trl": []}
    trl_counts: list[int] = []

    def run_ours() -> None:
        results["ours"].extend(common.ours_block(cfg, args.steps, scratch)[1:])  # the first step is a warm-up

    base_state = {k: v.clone() for k, v in student.state_dict().items()}

    def reset() -> None:
        student.load_state_dict(base_state)
        optimizer.state.clear()

    callback = common.block_interleaver(args.steps, run_ours, results["trl"], trl_counts, reset)
    trainer = DistillationTrainer(model=student, teacher_model=teacher, args=trl_args, train_dataset=dataset,
                                  processing_class=tokenizer, optimizers=(optimizer, None), callbacks=[callback])
    common.drop_printer(trainer)
    generate = trainer._generate_and_score_completions

    def counted(inputs):
        """TRL's own generation, with its completion tokens (EOS included) counted for the table."""
        out = generate(inputs)
        trl_counts.append(int(out["completion_mask"].sum()))
        return out

    trainer._generate_and_score_completions = counted
    autocast_fix = args.precision == "bf16" and not args.trl_as_is
    if autocast_fix:
        # TRL 1.16's DistillationTrainer runs the student and teacher backbones directly (not through the model's
        # forward that accelerate wraps in autocast), so with bf16=True on CPU only its generation is bf16. Ours
        # autocasts the training and teacher forwards too; give TRL the same autocast so both compute alike.
        compute_loss = trainer._compute_loss

        def autocast_loss(*a, **kw):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return compute_loss(*a, **kw)

        trainer._compute_loss = autocast_loss
    trainer.train()
    shutil.rmtree(scratch, ignore_errors=True)

    text, summary = common.compare(results, {"ours": f"ours (opdgrpo.train.loop, top-{args.kl_top_k} reverse KL)",
                                             "trl": f"TRL {trl.__version__} DistillationTrainer (beta=1, full-vocab reverse KL)"}, batch)
    line, ratios = common.ratio_line(summary, results, args.steps - 1)
    print(f"### OPD step: ours vs TRL ({common.machine_line(args.threads)})\n")
    print(f"student and {args.teacher}: {world.source}; {args.prompts} prompts x {args.rollouts} completions = {batch} "
          f"sequences per step, max {args.max_new_tokens} new tokens, {args.precision}, {args.threads} thread(s); "
          f"medians of {args.rounds} interleaved blocks x {args.steps - 1} timed steps"
          + ("; TRL's loss forwards wrapped in bf16 autocast like ours" if autocast_fix else
             "; TRL as is (its loss forwards in fp32)" if args.precision == "bf16" else "") + "\n")
    print(text)
    print(f"\n{line}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "summary": summary, **ratios,
                                         "raw": results}, indent=1, default=str))


if __name__ == "__main__":
    main()
