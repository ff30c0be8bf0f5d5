"""Rollout generation: our sampler (``opdgrpo.train.sampling.sample``) against ``model.generate``.

Same model, same left-padded prompts (a GRPO-shaped batch: ``--prompts`` math prompts x ``--group`` copies,
512 sequences by default), same settings: sampling from the full distribution (temperature 1, ``top_k=0``,
``top_p=1.0``), the same ``max_new_tokens``, pad and EOS ids, KV cache, no gradient, the same autocast.
Generated tokens are counted the same way for both: the tokens of each row up to and including its first EOS.
The two run in alternating order each round; the first round is a warm-up.

    python benchmarks/sampler_vs_generate.py [--world results/tiny/base|random] [--models student teacher_l]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import common


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", help="pretrained tiny world (default: results/tiny/base if present) or `random`")
    p.add_argument("--models", nargs="+", default=["student", "teacher_l"], help="tiny roles to sample from")
    p.add_argument("--prompts", type=int, default=64, help="distinct prompts")
    p.add_argument("--group", type=int, default=8, help="copies of each prompt (batch = prompts x group)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="completion cap (tiny profile: 32)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="bf16",
                   help="bf16 autocast (the tiny profile's rollouts) or fp32, for both")
    p.add_argument("--threads", type=int, default=1, help="torch threads (tiny profile: 1 per job)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per model (after one warm-up round)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--json", type=Path, help="also write the measurements here")
    return p.parse_args()


def generated_tokens(completion_ids, eos_ids: list[int]) -> int:
    """Tokens up to and including each row's first EOS (the whole row when it has none)."""
    import torch

    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    before = is_eos.long().cumsum(-1) - is_eos.long()
    return int((before == 0).sum())


def main() -> None:
    args = parse_args()
    import torch

    from opdgrpo.domains import build_domain
    from opdgrpo.train.models import autocast, load_model
    from opdgrpo.train.rollout import encode_prompts
    from opdgrpo.train.sampling import sample
    from opdgrpo.train.tokenizer import load_tokenizer

    common.quiet()
    common.set_threads(args.threads)
    scratch = Path(tempfile.mkdtemp(prefix="bench-sampler-"))
    world = common.load_world(args.world, args.models, scratch)
    tokenizer = load_tokenizer(world.tokenizer)
    cfg = common.tiny_config(scratch / "results")
    pool = build_domain(cfg["domains"]["math"]).training_pool()[: args.prompts]
    prompts = [ids for ids in encode_prompts(tokenizer, pool) for _ in range(args.group)]
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    device = torch.device(args.device)
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)

    rows, summary = [], {}
    for role in args.models:
        model = load_model(world.models[role], trainable=False).eval().to(device)
        seed = {"n": 0}

        def ours() -> dict[str, float]:
            generator = torch.Generator(device=device).manual_seed(seed["n"])
            seed["n"] += 1
            start = time.perf_counter()
            with autocast(args.precision, device.type):
                out = sample(model, prompts, max_new_tokens=args.max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                             temperature=1.0, top_k=0, top_p=1.0, generator=generator)
            seconds = time.perf_counter() - start
            return {"seconds": seconds, "tokens": generated_tokens(out.sequences[:, out.prompt_len:], [eos])}

        def hf() -> dict[str, float]:
            torch.manual_seed(seed["n"])
            seed["n"] += 1
            start = time.perf_counter()
            with torch.no_grad(), autocast(args.precision, device.type):
                out = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=True, temperature=1.0,
                                     top_k=0, top_p=1.0, max_new_tokens=args.max_new_tokens, pad_token_id=pad,
                                     eos_token_id=eos)
            seconds = time.perf_counter() - start
            return {"seconds": seconds, "tokens": generated_tokens(out[:, width:], [eos])}

        kept = common.interleave(args.rounds, 1, {"ours": ours, "generate": hf})
        summary[role] = {}
        for name, label in (("ours", "ours (sampling.sample)"), ("generate", "model.generate")):
            secs = [r["seconds"] for r in kept[name]]
            toks = [r["tokens"] for r in kept[name]]
            tps = [t / s for t, s in zip(toks, secs)]
            summary[role][name] = {"tokens_per_s": common.median(tps), "s_per_batch": common.median(secs),
                                   "tokens_per_seq": common.median(toks) / len(prompts)}
            rows.append([role, label, f"{common.median(secs):.3f}", common.spread(secs),
                         f"{common.median(toks) / len(prompts):.1f}", f"{common.median(tps):,.0f}"])
        summary[role]["ratio"] = summary[role]["ours"]["tokens_per_s"] / summary[role]["generate"]["tokens_per_s"]
        # Each round ran both back to back: their ratio saw about the same load on the shared machine.
        summary[role]["round_ratios"] = [(o["tokens"] / o["seconds"]) / (g["tokens"] / g["seconds"])
                                         for o, g in zip(kept["ours"], kept["generate"])]

    shutil.rmtree(scratch, ignore_errors=True)
    print(f"### Rollouts: our sampler vs model.generate ({common.machine_line(args.threads, args.device)})\n")
    print(f"models: {world.source}; {args.prompts} prompts x {args.group} = {len(prompts)} sequences, max "
          f"{args.max_new_tokens} new tokens, temperature 1, top_k 0, top_p 1, {args.precision}, {args.device}; "
          f"medians of {args.rounds} interleaved rounds after a warm-up\n")
    print(common.table(["model", "sampler", "s/batch (median)", "range", "generated tokens/seq", "tokens/s (median)"], rows))
    print()
    for role in args.models:
        rounds = summary[role]["round_ratios"]
        print(f"**{role}: ours / generate = {summary[role]['ratio']:.2f}x tokens/s (ratio of medians); per round: median "
              f"{common.median(rounds):.2f}x (range {common.spread(rounds)})**")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "summary": summary}, indent=1,
                                        default=str))


if __name__ == "__main__":
    main()
