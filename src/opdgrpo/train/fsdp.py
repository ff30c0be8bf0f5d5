"""FSDP2 for the trained student (``train.distributed: fsdp`` with several processes): ``fully_shard`` per decoder
layer, then the whole model; gathered weights for sampling; full states for checkpoints; the global gradient norm.

How the model is sharded. Every decoder layer (the classes named in the model's ``_no_split_modules``: Qwen3's
``Qwen3DecoderLayer``) is one FSDP unit; the whole ``*ForCausalLM`` is the root unit and holds the rest: the
embedding, the final norm and the LM head. With tied embeddings (Qwen3-0.6B to 4B, the tiny students) the LM head's
weight *is* the embedding's parameter; both modules stay in the root unit, so that one parameter is sharded,
gathered, reduced and updated once, and the tie survives sharding (checked). Each process holds 1/N of every
parameter, of its gradient and of the optimizer state.

Precision (:class:`Policy`, ``train.fsdp``): the sharded master weights keep their dtype (``train.param_dtype``,
float32 at paper scale). Forward and backward gather them in ``param_dtype`` (bfloat16 at paper scale), one unit at
a time; gradients are reduce-scattered in ``reduce_dtype`` (float32) and accumulated into the float32 sharded
gradients. The gradients of a process's shards are reduced after each shard's backward (no ``no_sync``): skipping
the sync would accumulate the unsharded gradients in ``param_dtype``, bfloat16 at paper scale.

What is gathered when. Training forward: each layer's weights just before the layer runs, freed after it
(``reshard_after_forward``); the root unit (embedding, LM head, final norm) for the whole forward and backward.
Backward: each layer's weights again, then its gradient is reduce-scattered. Sampling (rollouts, evaluation) runs
outside the wrapper on a plain replica (:func:`sampling_replica`) refreshed before each sampling phase with one
all-gather per parameter (:func:`refresh`): processes then sample different numbers of tokens and batches with no
collective inside ``generate``. The replica costs ``param_dtype`` bytes per parameter on every process (8 GB for a
4B student in bfloat16), against 16 bytes per parameter for unsharded float32 weights, gradients and Adam moments;
an inference engine that holds its own copy would replace it. Checkpoints: the full model and optimizer state,
gathered onto the main process's CPU (:func:`full_model_state`, :func:`full_optimizer_state`).

Activation checkpointing (``train.activation_checkpointing``, :func:`opdgrpo.train.models.enable_activation_checkpointing`)
wraps each decoder layer's ``forward`` inside FSDP's hooks: the layer's weights, gathered again for its backward,
serve the recompute too (tests/integration/fsdp_worker.py counts the recomputes).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

#: Full states, gathered one tensor at a time onto the main process's CPU (the others get empty dicts).
FULL_ON_MAIN = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass(frozen=True)
class Policy:
    """FSDP2's mixed precision: the dtype forward and backward gather weights in, and the dtype gradients are reduced
    in (``MixedPrecisionPolicy(param_dtype, reduce_dtype)``)."""

    param_dtype: torch.dtype = torch.bfloat16
    reduce_dtype: torch.dtype = torch.float32

    @classmethod
    def from_config(cls, block: Mapping[str, Any], precision: str) -> "Policy":
        """``train.fsdp`` under the job's resolved ``precision`` (``bf16`` or ``fp32``, never ``auto``: the job
        resolves it once, :func:`opdgrpo.train.precision.resolve`); an unset ``param_dtype`` follows it (bfloat16 under
        bf16, float32 under fp32), an unset ``reduce_dtype`` is float32."""
        if precision not in ("bf16", "fp32"):
            raise ValueError(f"the FSDP policy needs the job's resolved precision (bf16 or fp32), got {precision!r}")
        default = "bfloat16" if precision == "bf16" else "float32"
        return cls(getattr(torch, str(block.get("param_dtype") or default)),
                   getattr(torch, str(block.get("reduce_dtype") or "float32")))


def tied(model: torch.nn.Module) -> bool:
    """Whether the LM head's weight is the input embedding's parameter."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and head.weight is embedding.weight


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that become FSDP units: those of the classes a Hugging Face model lists in ``_no_split_modules``."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    # by class or base class: a sharded layer is an ``FSDP<class>`` subclass of its class
    layers = [m for m in model.modules() if any(c.__name__ in names for c in type(m).__mro__)]
    if not layers:
        raise ValueError(f"{type(model).__name__}: no decoder layers to shard (no module of the classes in its "
                         f"`_no_split_modules`, {sorted(names)}); use `train.distributed: ddp`")
    return layers


def shard(model: torch.nn.Module, mesh: DeviceMesh, policy: Policy) -> None:
    """``fully_shard`` every decoder layer, then the whole model (in place: ``model`` becomes its FSDP2 subclass)."""
    was_tied = tied(model)
    mp = MixedPrecisionPolicy(param_dtype=policy.param_dtype, reduce_dtype=policy.reduce_dtype)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    if was_tied and not tied(model):
        raise RuntimeError(f"{type(model).__name__}: sharding untied the LM head from the input embedding")


def sampling_replica(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A plain, frozen copy of the (not yet sharded) model with its parameters in ``dtype``, the dtype the training
    forward gathers them in, so rollouts sample the distribution the loss sees; buffers (rotary frequencies) keep
    their dtype, as FSDP's mixed precision keeps them."""
    replica = copy.deepcopy(model)
    for parameter in replica.parameters():   # a tied parameter is listed once and stays shared
        parameter.data = parameter.data.to(dtype)
    return replica.requires_grad_(False)


@torch.no_grad()
def refresh(replica: torch.nn.Module, model: torch.nn.Module) -> None:
    """Copy the sharded model's current weights into the replica: one all-gather per parameter, in the same order on
    every process (a collective: every process calls it at the same point of the loop)."""
    target = dict(replica.named_parameters())
    for name, parameter in model.named_parameters():
        target[name].copy_(parameter.full_tensor() if isinstance(parameter, DTensor) else parameter)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full model state dict (Hugging Face names) on the main process's CPU; ``{}`` on the others. A tied
    parameter is kept under its first name only (``lm_head.weight`` goes), as ``save_pretrained`` keeps it from an
    unsharded model: the gathered copies no longer share storage, so it could not tell they are one."""
    state, again = get_model_state_dict(model, options=FULL_ON_MAIN), _second_names(model)
    return {name: tensor for name, tensor in state.items() if name not in again}


def _second_names(model: torch.nn.Module) -> set[str]:
    """The names under which a parameter is listed again (tied weights), after its first."""
    seen: set[int] = set()
    again = set()
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in seen:
            again.add(name)
        seen.add(id(parameter))
    return again


def _parameter_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimizer's parameters, in the order ``optimizer.state_dict()`` numbers them."""
    names = {id(p): name for name, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The full optimizer state on the main process's CPU (``{}`` on the others), laid out as one process's
    ``optimizer.state_dict()`` (parameters numbered in order), so a checkpoint resumes on any number of processes
    (tests/integration/fsdp_worker.py: the same keys and tensors as the unsharded optimizer's state)."""
    full = get_optimizer_state_dict(model, optimizer, options=FULL_ON_MAIN)
    if not full:
        return {}
    number = {name: i for i, name in enumerate(_parameter_names(model, optimizer))}
    return {"state": {number[name]: state for name, state in full["state"].items()},
            "param_groups": [{**group, "params": [number[name] for name in group["params"]]}
                             for group in full["param_groups"]]}


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a full optimizer state (one process's layout, present on every process) into the sharded optimizer:
    every process keeps its shard of each tensor."""
    names = _parameter_names(model, optimizer)
    named = {"state": {names[int(i)]: s for i, s in state["state"].items()},
             "param_groups": [{**group, "params": [names[int(i)] for i in group["params"]]}
                              for group in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, named, options=StateDictOptions(full_state_dict=True))
    for group in optimizer.param_groups:   # the loader hands tuples (AdamW's betas) back as lists
        for key, value in group.items():
            if key != "params" and isinstance(value, list):
                group[key] = tuple(value)


def clip_grad_norm_(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the sharded gradients by their *global* norm, and return it as a plain tensor (the same on every process).

    ``clip_grad_norm_`` over DTensor gradients reduces the shards' partial norms into the norm of the full gradient
    before it computes the clip coefficient (FSDP1's ``clip_grad_norm_`` on local shards would clip each process by its
    own partial norm)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm
