"""Run by tests/integration/test_fsdp.py under torchrun (2 gloo processes): one FSDP2 update of a tiny tied Qwen3
against the same update of an unsharded copy that every process computes over the whole batch (the sharded model
recomputes its layers in the backward: activation checkpointing; the copy does not).

Writes ``<out>/rank<r>.json`` with what the test checks: how often each decoder layer ran, the shards' partial gradient norms, the global norm
``clip_grad_norm`` returned, the full gradient's norm, the clipped gradients' and updated weights' largest
difference from the unsharded update, and the optimizer state's round trip through a checkpoint's layout.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor
from transformers import Qwen3Config, Qwen3ForCausalLM

from opdgrpo.train import fsdp
from opdgrpo.train.distributed import Workers
from opdgrpo.train.models import enable_activation_checkpointing


def _model() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, tie_word_embeddings=True)
    return Qwen3ForCausalLM(config)


def _optimizer(params) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


def _loss(model: torch.nn.Module, rows: torch.Tensor, total: int) -> torch.Tensor:
    """These rows' share of the whole batch's mean token loss (equal-length rows), as train.py normalises."""
    return model(input_ids=rows, labels=rows).loss * len(rows) / total


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float((a[k].detach().float() - b[k].detach().float()).abs().max()) for k in a)


def _optimizer_round_trip(workers: Workers, saved: dict) -> float:
    """Load ``saved`` (a checkpoint's optimizer state, sent to every process) into a fresh sharded model's optimizer
    and gather it again: the largest difference from ``saved`` (main process; 0 elsewhere)."""
    saved = workers.gather(saved)[0]
    model, optimizer = workers.prepare(_model(), _optimizer)
    workers.load_optimizer_state(model, optimizer, saved)
    again = workers.optimizer_state(model, optimizer)
    if not workers.is_main:
        return 0.0
    assert again["param_groups"] == saved["param_groups"], (again["param_groups"], saved["param_groups"])
    return max(_max_diff(again["state"][i], saved["state"][i]) for i in saved["state"])


def _mixed_precision(workers: Workers, batch: torch.Tensor) -> dict:
    """The paper profile's policy (weights gathered in bfloat16, gradients reduced in float32) under bf16 autocast, as
    train.py runs it, against one process's float32 weights under the same autocast: the dtypes the forward sees and
    the master shards and gradients keep, and the gradients' relative error (norm of the difference over the norm)."""
    from torch.distributed.device_mesh import init_device_mesh

    model = _model()
    reference = copy.deepcopy(model)
    fsdp.shard(model, init_device_mesh("cpu", (workers.world,)), fsdp.Policy(torch.bfloat16, torch.float32))
    seen: list[torch.dtype] = []
    fsdp.decoder_layers(model)[0].mlp.down_proj.register_forward_pre_hook(lambda m, _: seen.append(m.weight.dtype))
    half = len(batch) // workers.world
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (_loss(model, batch[workers.rank * half: (workers.rank + 1) * half], len(batch)) * workers.world).backward()
        for rows in batch.split(half):
            _loss(reference, rows, len(batch)).backward()
    difference = torch.cat([(_full(p.grad) - r.grad).flatten() for p, r in zip(model.parameters(), reference.parameters())])
    size = torch.cat([r.grad.flatten() for r in reference.parameters()])
    master = next(model.parameters())
    return {"gathered_dtype": str(seen[0]), "master_dtype": str(master.dtype), "grad_dtype": str(master.grad.dtype),
            "bf16_grad_relative_error": float(difference.norm() / size.norm())}


def main(out: Path) -> None:
    torch.set_num_threads(1)
    workers = Workers("fsdp", cpu=True, policy=fsdp.Policy(torch.float32, torch.float32))
    model = _model()
    reference = copy.deepcopy(model)
    enable_activation_checkpointing(model)   # the sharded model recomputes its layers; the reference keeps activations
    model, optimizer = workers.prepare(model, _optimizer)
    # Each layer's MLP runs inside the checkpointed forward (the layer's own hooks, FSDP's, stay outside it).
    calls = [0] * len(fsdp.decoder_layers(model))
    for i, layer in enumerate(fsdp.decoder_layers(model)):
        layer.mlp.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    reference_optimizer = _optimizer(reference.parameters())
    batch = torch.randint(0, 96, (4, 10), generator=torch.Generator().manual_seed(1))
    half = len(batch) // workers.world
    mine = batch[workers.rank * half: (workers.rank + 1) * half]
    (_loss(model, mine, len(batch)) * workers.world).backward()      # train.py's scaling: FSDP averages
    layer_calls = list(calls)   # 2 each: the forward, and its recompute in the backward
    for rows in batch.split(half):
        _loss(reference, rows, len(batch)).backward()

    grads = {n: p.grad for n, p in model.named_parameters()}
    partial = float(torch.linalg.vector_norm(torch.stack([g.to_local().norm() for g in grads.values()])))
    partials = workers.gather(partial)
    full_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in reference.parameters()])))
    # Between every shard's partial norm and the full gradient's norm: clipping by a partial norm would not clip.
    max_norm = (max(partials) + full_norm) / 2
    norm = workers.clip_grad_norm(model, max_norm)
    torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
    clipped = {n: _full(g) for n, g in grads.items()}
    grad_diff = _max_diff(clipped, {n: p.grad for n, p in reference.named_parameters()})

    initial = {n: p.detach().clone() for n, p in reference.named_parameters()}
    optimizer.step()
    reference_optimizer.step()
    with workers.full_params(model) as replica:
        weight_diff = _max_diff(dict(replica.named_parameters()), dict(reference.named_parameters()))
        replica_tied = fsdp.tied(replica)
    checkpoint = workers.state_dict(model)
    saved = workers.optimizer_state(model, optimizer)
    result = {
        "rank": workers.rank, "partial_norms": partials, "full_norm": full_norm, "max_norm": max_norm,
        "clip_norm": float(norm), "norm_type": type(norm).__name__, "grad_diff": grad_diff, "weight_diff": weight_diff,
        "tied": fsdp.tied(model), "layer_calls": layer_calls, "replica_tied": replica_tied,
        "update_size": _max_diff(dict(reference.named_parameters()), initial),
    }
    if workers.is_main:
        reference_state = reference_optimizer.state_dict()
        whole = reference.state_dict()
        result["checkpoint_left_out"] = sorted(set(whole) - set(checkpoint))   # the tied LM head (its embedding's)
        result["checkpoint_diff"] = _max_diff(checkpoint, {name: whole[name] for name in checkpoint})
        result["optimizer_keys_match"] = sorted(saved["state"]) == sorted(reference_state["state"])
        result["optimizer_diff"] = max(_max_diff(saved["state"][i], reference_state["state"][i]) for i in saved["state"])
    result["optimizer_round_trip_diff"] = _optimizer_round_trip(workers, saved)
    result.update(_mixed_precision(workers, batch))
    (out / f"rank{workers.rank}.json").write_text(json.dumps(result, indent=1))
    workers.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
