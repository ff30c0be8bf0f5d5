"""Sampling engines: ``train.engine: vllm`` (a vLLM engine in this process) against ``hf`` (the project's sampler).

Same model, same prompts (a GRPO-shaped batch: ``--prompts`` x ``--group`` copies), the same settings through the
same call (:meth:`opdgrpo.train.engines.Engine.sample`): temperature 1, full distribution, ``--max-new-tokens``, EOS.
Generated tokens are counted alike (the completion mask: up to and including each row's stop token). The two run
interleaved, alternating which goes first; the first round is a warm-up. Also timed once: starting the engine and
one in-memory weight sync (what a training step adds).

Two shapes:

- ``--shapes tiny`` (default, CPU now): the tiny student, pretrained (``--world``) or random, with its tokenizer and
  math prompts. On CPU vLLM's per-step overheads dominate a 0.8 M-parameter model; this measures the engine path.
- ``--shapes qwen3-1.7b`` / ``qwen3-4b`` (for a GPU later): a random model of that architecture (bf16, random token
  prompts of ``--prompt-tokens``), ``--device cuda``; run with e.g. ``--prompts 64 --group 8 --max-new-tokens 1024``.
  Random weights rarely emit EOS: rows run to ``--max-new-tokens``, which measures decode speed without early stops.

    python benchmarks/engine_vs_hf.py [--world results/tiny/base|random] [--shapes tiny] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import common

#: Architectures of ``--shapes`` other than tiny (Qwen3's published configs; vocabulary 151,936).
SHAPES = {
    "qwen3-1.7b": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True},
    "qwen3-4b": {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True},
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", help="pretrained tiny world (default: results/tiny/base if present) or `random`")
    p.add_argument("--shapes", choices=["tiny", *SHAPES], default="tiny", help="the tiny student, or a random hub-sized model")
    p.add_argument("--prompts", type=int, default=16, help="distinct prompts")
    p.add_argument("--group", type=int, default=8, help="copies of each prompt (batch = prompts x group)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="completion cap (tiny profile: 32)")
    p.add_argument("--prompt-tokens", type=int, default=256, help="prompt length of the hub-sized shapes (random ids)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (both engines)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (after one warm-up round)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--json", type=Path, help="also write the measurements here")
    return p.parse_args()


def tiny_inputs(args, scratch: Path):
    """(checkpoint dir, tokenizer, prompt ids, eos, pad, source) of the tiny student and math prompts."""
    from opdgrpo.domains import build_domain
    from opdgrpo.train.rollout import encode_prompts
    from opdgrpo.train.tokenizer import load_tokenizer

    world = common.load_world(args.world, ["student"], scratch)
    tokenizer = load_tokenizer(world.tokenizer)
    pool = build_domain(common.tiny_config(scratch / "results")["domains"]["math"]).training_pool()[: args.prompts]
    prompts = [ids for ids in encode_prompts(tokenizer, pool) for _ in range(args.group)]
    return world.models["student"], tokenizer, prompts, tokenizer.eos_token_id, tokenizer.pad_token_id, world.source


def hub_shaped_inputs(args, scratch: Path):
    """A random model of ``--shapes``'s architecture saved in bf16 with a tiny tokenizer copy, and random prompts."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from opdgrpo.train.tokenizer import load_tokenizer

    world = common.build_random_world(["student"], scratch)
    tokenizer = load_tokenizer(world.tokenizer)
    config = Qwen3Config(vocab_size=151936, max_position_embeddings=args.prompt_tokens + args.max_new_tokens + 8,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **SHAPES[args.shapes])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    out = scratch / "hub_shaped"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    generator = torch.Generator().manual_seed(0)
    distinct = torch.randint(10, len(tokenizer), (args.prompts, args.prompt_tokens), generator=generator).tolist()
    prompts = [p for p in distinct for _ in range(args.group)]
    return out, tokenizer, prompts, tokenizer.eos_token_id, tokenizer.pad_token_id, f"random {args.shapes} (bf16)"


def main() -> None:
    args = parse_args()
    import torch

    from opdgrpo.train.engines import HFEngine, build_engine
    from opdgrpo.train.models import load_model

    common.quiet()
    common.set_threads(args.threads)
    scratch = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    checkpoint, tokenizer, prompts, eos, pad, source = (tiny_inputs if args.shapes == "tiny" else hub_shaped_inputs)(args, scratch)
    dtype = torch.float32 if args.shapes == "tiny" else torch.bfloat16
    attention = "eager" if args.shapes == "tiny" else "sdpa"
    model = load_model(checkpoint, dtype=dtype, trainable=False, attn_implementation=attention).eval().to(args.device)

    start = time.perf_counter()
    max_len = max(len(p) for p in prompts) + args.max_new_tokens
    vllm = build_engine("vllm", model, tokenizer, scratch=scratch / "engine", settings={}, max_len=max_len, seed=0)
    startup = time.perf_counter() - start
    start = time.perf_counter()
    vllm.sync(model, version="bench")
    sync = time.perf_counter() - start
    engines = {"hf": HFEngine(model), "vllm": vllm}
    seed = {"n": 0}

    def contender(name: str):
        def run() -> dict[str, float]:
            generator = torch.Generator(device=args.device if name == "hf" else "cpu").manual_seed(seed["n"])
            seed["n"] += 1
            start = time.perf_counter()
            out = engines[name].sample(prompts, max_new_tokens=args.max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                                       temperature=1.0, top_k=0, top_p=1.0, generator=generator)
            seconds = time.perf_counter() - start
            return {"seconds": seconds, "tokens": int(out.completion_mask.sum())}
        return run

    kept = common.interleave(args.rounds, 1, {name: contender(name) for name in engines})
    rows, summary = [], {"engine_start_s": startup, "weight_sync_s": sync}
    for name, label in (("hf", "hf (opdgrpo.train.sampling.sample)"), ("vllm", "vllm (in process)")):
        secs = [r["seconds"] for r in kept[name]]
        tps = [r["tokens"] / r["seconds"] for r in kept[name]]
        summary[name] = {"tokens_per_s": common.median(tps), "s_per_batch": common.median(secs),
                         "tokens_per_seq": common.median([r["tokens"] for r in kept[name]]) / len(prompts)}
        rows.append([label, f"{common.median(secs):.3f}", common.spread(secs), f"{summary[name]['tokens_per_seq']:.1f}",
                     f"{common.median(tps):,.0f}"])
    summary["ratio"] = summary["vllm"]["tokens_per_s"] / summary["hf"]["tokens_per_s"]
    shutil.rmtree(scratch, ignore_errors=True)

    print(f"### Sampling engines: vLLM vs the project's sampler ({common.machine_line(args.threads, args.device)})\n")
    print(f"model: {source}; {args.prompts} prompts x {args.group} = {len(prompts)} sequences, max {args.max_new_tokens} "
          f"new tokens, temperature 1, full distribution, {args.device}; medians of {args.rounds} interleaved rounds "
          f"after a warm-up; vLLM {_vllm_version()} ({os.environ.get('VLLM_CPU_KVCACHE_SPACE', '-')} GiB CPU KV cache)\n")
    print(common.table(["engine", "s/batch (median)", "range", "generated tokens/seq", "tokens/s (median)"], rows))
    print(f"\n**vllm / hf = {summary['ratio']:.2f}x tokens/s**; engine start {startup:.1f} s, one in-memory weight sync "
          f"{sync * 1000:.0f} ms")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "summary": summary}, indent=1, default=str))


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


if __name__ == "__main__":
    main()
