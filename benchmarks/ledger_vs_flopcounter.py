"""The analytic FLOP ledger (``opdgrpo.train.flops``) against ``torch.utils.flop_counter.FlopCounterMode``.

Over a grid of dense decoder configs (Qwen3 with GQA, MQA and full multi-head attention, tied and untied LM heads,
``head_dim`` unequal to ``hidden / heads``; one Llama config) built with random weights and eager attention:

* forward: ``forward_flops`` against one counted forward, for several batch sizes, lengths and ``logits_to_keep``;
* forward+backward: ``train_flops`` against a counted forward and ``backward()``;
* cached generation with our sampler: the ``flops`` it reports (``prefill_flops`` + ``decode_step_flops`` per step,
  the rows that stopped dropped) against the counted call, with left-padded prompts of unequal lengths and many
  stop ids so rows end at different steps;
* cached generation with ``model.generate`` forced to ``max_new_tokens`` (``min_new_tokens``): ``generate_flops``.

Prints each kind's worst relative error and the overall worst (the ledger's target: under 1%).

    python benchmarks/ledger_vs_flopcounter.py [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import common

#: (name, model type, config). Vocabularies are small so the grid runs in seconds; the formulas are linear in it.
CONFIGS = [
    ("qwen3 tiny student", "qwen3", dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=32, vocab_size=384, tie_word_embeddings=True)),
    ("qwen3 GQA 6/2, head_dim 24 != 96/6, untied", "qwen3", dict(hidden_size=96, intermediate_size=200, num_hidden_layers=3,
                                          num_attention_heads=6, num_key_value_heads=2, head_dim=24, vocab_size=500,
                                          tie_word_embeddings=False)),
    ("qwen3 MHA 4/4, head_dim 64 != 128/4, untied", "qwen3", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=4, head_dim=64, vocab_size=1000,
                                          tie_word_embeddings=False)),
    ("qwen3 MQA 8/1, head_dim 16 != 64/8, tied", "qwen3", dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                          num_attention_heads=8, num_key_value_heads=1, head_dim=16, vocab_size=300,
                                          tie_word_embeddings=True)),
    ("llama GQA 4/2, untied", "llama", dict(hidden_size=128, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, vocab_size=640, tie_word_embeddings=False)),
]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 3, 8])
    p.add_argument("--lengths", type=int, nargs="+", default=[1, 7, 33])
    p.add_argument("--logits-to-keep", type=int, nargs="+", default=[0, 1, 5], help="0: all positions")
    p.add_argument("--new-tokens", type=int, nargs="+", default=[1, 6, 17], help="generation lengths")
    p.add_argument("--quick", action="store_true", help="one batch size and length per config")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, help="also write every case here")
    return p.parse_args()


def build(kind: str, arch: dict):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_cls, model_cls = (Qwen3Config, Qwen3ForCausalLM) if kind == "qwen3" else (LlamaConfig, LlamaForCausalLM)
    config = config_cls(pad_token_id=0, eos_token_id=1, bos_token_id=1, max_position_embeddings=256, **arch)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return model_cls(config).float()


def counted(fn) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


def main() -> None:
    args = parse_args()
    import torch

    from opdgrpo.train import flops as F
    from opdgrpo.train.sampling import sample

    common.set_threads(args.threads)
    common.quiet()
    batches, lengths = (args.batches[-1:], args.lengths[-1:]) if args.quick else (args.batches, args.lengths)
    cases = []

    def record(kind: str, name: str, shape: str, ledger: float, counter: float) -> None:
        cases.append({"kind": kind, "config": name, "shape": shape, "ledger": ledger, "counter": counter,
                      "rel_error": abs(ledger - counter) / counter})

    for name, kind, arch in CONFIGS:
        model = build(kind, arch)
        config, vocab = model.config, arch["vocab_size"]
        gen = torch.Generator().manual_seed(0)
        for b, length in itertools.product(batches, lengths):
            ids = torch.randint(2, vocab, (b, length), generator=gen)
            for keep in args.logits_to_keep:
                if keep > length:
                    continue
                with torch.no_grad():
                    c = counted(lambda: model(input_ids=ids, logits_to_keep=keep))
                record("forward", name, f"B={b} L={length} logits_to_keep={keep or 'all'}",
                       F.forward_flops(config, b, length, logits_positions=keep or None), c)
            keep = min(5, length)

            def train_pass():
                model.zero_grad(set_to_none=True)
                model(input_ids=ids, logits_to_keep=keep).logits.float().sum().backward()

            record("forward+backward", name, f"B={b} L={length} logits_to_keep={keep}",
                   F.train_flops(config, b, length, logits_positions=keep), counted(train_pass))
        model.eval()
        for b, new in itertools.product(batches, args.new_tokens):
            # Unequal prompt lengths (left padding) and one stop id in eight, so rows end at different steps.
            prompts = [torch.randint(2, vocab, (3 + (i * 5) % 11,), generator=gen).tolist() for i in range(b)]
            stops = list(range(2, vocab, 8))
            out = {}

            def run_sampler():
                out["r"] = sample(model, prompts, max_new_tokens=new, eos_token_id=stops, pad_token_id=0,
                                  generator=torch.Generator().manual_seed(1))

            c = counted(run_sampler)
            ro = out["r"]
            record("sampler (cached)", name, f"B={b} P={ro.prompt_len} new<={new} decoded={ro.sequences.shape[1] - ro.prompt_len} "
                   f"finished={int(ro.finished.sum())}/{b}", ro.flops, c)
            width = max(len(p) for p in prompts)
            input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
            mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
            with torch.no_grad():
                c = counted(lambda: model.generate(input_ids=input_ids, attention_mask=mask, do_sample=True, top_k=0,
                                                   top_p=1.0, max_new_tokens=new, min_new_tokens=new, pad_token_id=0,
                                                   eos_token_id=1))
            record("model.generate (cached)", name, f"B={b} P={width} new={new}", F.generate_flops(config, b, width, new), c)

    rows = []
    for kind in dict.fromkeys(c["kind"] for c in cases):
        mine = [c for c in cases if c["kind"] == kind]
        worst = max(mine, key=lambda c: c["rel_error"])
        where = "every case exact" if worst["rel_error"] == 0 else f"{worst['config']}: {worst['shape']}"
        rows.append([kind, len(mine), f"{worst['rel_error']:.2e}", where,
                     f"{worst['ledger']:.4g} / {worst['counter']:.4g}"])
    overall = max(c["rel_error"] for c in cases)
    print(f"### FLOP ledger vs FlopCounterMode ({common.machine_line(args.threads)})\n")
    print(f"{len(CONFIGS)} configs (eager attention, fp32), batch sizes {batches}, lengths {lengths}, logits_to_keep "
          f"{args.logits_to_keep} (0 = all), generation lengths {args.new_tokens}\n")
    print(common.table(["call", "cases", "worst relative error", "worst case", "ledger / counter"], rows))
    print(f"\n**worst relative error over all {len(cases)} cases: {overall:.2e} ({'within' if overall < 0.01 else 'ABOVE'} "
          f"the 1% target)**")
    if args.json:
        args.json.write_text(json.dumps(cases, indent=1))
    if overall >= 0.01:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
