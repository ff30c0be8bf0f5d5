"""A GRPO step of ours (``opdgrpo.train.loop.train``, the trainer the DAG runs) against TRL's ``GRPOTrainer``.

Both train the same tiny student on the same prompts (the tiny profile's math pool, in the order our trainer
draws them), group size 8, the same completion cap, temperature 1 with the full distribution, the same loss
(PPO-clipped, token-mean over the batch = TRL's ``loss_type="dapo"``, no KL term), the same advantages
((r - mean) / (std + 1e-4) per group), the same verifier as reward, gradient clipping at 1.0 and the same
``torch.optim.AdamW`` (lr, betas, no weight decay, constant lr). Steps run in blocks that alternate between the
two (the machine is shared and noisy); the first step of every block is a warm-up and is dropped. A step is
timed from sampling to the optimiser step: our ledger's ``wall_s``; TRL's from ``on_step_begin`` to
``on_step_end``. Tokens per second counts completion tokens up to and including EOS, as both trainers train on.

    python benchmarks/grpo_vs_trl.py [--world results/tiny/base|random] [--precision fp32|bf16] [--rounds 3]

Needs ``trl`` (``pip install -e '.[bench]'``); it is never a runtime dependency of the package.
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
    p.add_argument("--prompts", type=int, help="prompts per step (default: the tiny profile's train.prompts_per_step)")
    p.add_argument("--group", type=int, default=8, help="completions per prompt (group size)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="completion cap (tiny profile: 32)")
    p.add_argument("--lr", type=float, default=2e-4, help="AdamW learning rate (tiny profile's GRPO: 2e-4)")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="bf16 autocast for both (TRL: bf16=True, which on CPU autocasts its generation and training "
                        "forwards too), fp32 for both, or auto (the tiny profile's train.precision): what "
                        "opdgrpo.train.precision picks on this CPU, for both")
    p.add_argument("--threads", type=int, default=1, help="torch threads for both (tiny profile: 1 per job)")
    p.add_argument("--rounds", type=int, default=5, help="blocks per trainer")
    p.add_argument("--steps", type=int, default=4, help="steps per block; the first of each is a warm-up")
    p.add_argument("--json", type=Path, help="also write the measurements here")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    import torch
    from datasets import Dataset

    try:
        import trl
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as err:
        raise SystemExit(f"this benchmark needs trl ({err}): pip install -e '.[bench]'") from None
    common.quiet()
    common.set_threads(args.threads)
    from opdgrpo.train.precision import resolve

    args.precision = resolve(args.precision)   # both trainers run what our trainer would run here

    scratch = Path(tempfile.mkdtemp(prefix="bench-grpo-"))
    args.prompts = args.prompts or int(common.tiny_config(scratch / "results")["train"]["prompts_per_step"])
    world = common.load_world(args.world, ["student"], scratch)
    small_eval = {"domains.math.heldout.amc.size": 4, "domains.math.heldout.aime.size": 4}
    cfg = common.run_config("grpo", world, scratch, overrides={
        "threads": args.threads, "train.prompts_per_step": args.prompts, "train.max_new_tokens": args.max_new_tokens,
        "train.temperature": 1.0, "train.precision": args.precision, "train.eval_every": 10**6,
        "train.checkpoint_every": 10**6, "train.eval": {"k": 1, "temperature": 1.0, "batch_size": 64},
        "method.group_size": args.group, "method.lr": args.lr, "method.aggregation": "token-mean",
        "method.beta": 0.0, "method.scale_by_std": True, "method.warmup_steps": 0, **small_eval})
    method = cfg["method"]

    # The prompts our trainer draws in a block's steps, in order: TRL walks the same list without shuffling.
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
    assert tokenizer(tasks[0].prompt)["input_ids"] == tokenizer(tasks[0].prompt, add_special_tokens=False)["input_ids"], \
        "the tokenizer adds special tokens: TRL's prompts would differ from ours"
    dataset = Dataset.from_dict({"prompt": [t.prompt for t in tasks], "task": list(range(len(tasks)))})

    trl_counts: list[int] = []

    def reward(prompts, completions, completion_ids, task, **_):
        """Our verifier on TRL's completions (decoded the same way: special tokens skipped)."""
        trl_counts.append(sum(len(ids) for ids in completion_ids))
        return domain.score([tasks[i] for i in task], completions)

    model = load_model(world.models["student"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=tuple(method["betas"]),
                                  weight_decay=float(method["weight_decay"]))
    trl_args = GRPOConfig(
        output_dir=str(scratch / "trl"), max_steps=args.rounds * args.steps, per_device_train_batch_size=args.prompts * args.group,
        gradient_accumulation_steps=1, num_generations=args.group, max_completion_length=args.max_new_tokens,
        temperature=1.0, top_p=1.0, top_k=0, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=float(method["grad_clip"]), beta=0.0, epsilon=float(method["clip_eps"]), loss_type="dapo",
        scale_rewards="group", num_iterations=1, gradient_checkpointing=False, bf16=args.precision == "bf16",
        use_cpu=True, shuffle_dataset=False, logging_steps=10**6, save_strategy="no", report_to=[],
        disable_tqdm=True, seed=int(cfg["seed"]), dataloader_num_workers=0,
    )

    results: dict[str, list[dict]] = {"ours": [], "trl": []}

    def run_ours() -> None:
        results["ours"].extend(common.ours_block(cfg, args.steps, scratch)[1:])  # the first step is a warm-up

    base_state = {k: v.clone() for k, v in model.state_dict().items()}

    def reset() -> None:
        model.load_state_dict(base_state)
        optimizer.state.clear()

    callback = common.block_interleaver(args.steps, run_ours, results["trl"], trl_counts, reset)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=trl_args, train_dataset=dataset,
                          processing_class=tokenizer, optimizers=(optimizer, None), callbacks=[callback])
    common.drop_printer(trainer)
    trainer.train()
    shutil.rmtree(scratch, ignore_errors=True)

    batch = args.prompts * args.group
    text, summary = common.compare(results, {"ours": "ours (opdgrpo.train.loop)", "trl": f"TRL {trl.__version__} GRPOTrainer"}, batch)
    line, ratios = common.ratio_line(summary, results, args.steps - 1)
    print(f"### GRPO step: ours vs TRL ({common.machine_line(args.threads)})\n")
    print(f"student: {world.source}; {args.prompts} prompts x {args.group} completions = {batch} sequences per step, "
          f"max {args.max_new_tokens} new tokens, {args.precision}, {args.threads} thread(s); medians of "
          f"{args.rounds} interleaved blocks x {args.steps - 1} timed steps\n")
    print(text)
    print(f"\n{line}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "summary": summary, **ratios,
                                         "raw": results}, indent=1, default=str))


if __name__ == "__main__":
    main()
