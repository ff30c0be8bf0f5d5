"""One run across several processes (one per GPU; or CPU processes with gloo in the tests), through ``accelerate``.

The trainer stays one loop; this module is the few collective operations it needs. A run started by
``accelerate launch --num_processes N`` or ``torchrun --nproc_per_node N`` gets N workers; a plain ``python`` start
gets one, and every collective is then the identity, so the single-process path computes exactly what it did before
this module existed.

How a step is split (see ``opdgrpo.train``): the step's prompts are cut into ``train.micro_batches`` shards (default:
one per process). Shard ``s`` is sampled with its own generator seeded by (seed, step, s), and worker ``r`` takes the
shards ``s`` with ``s % N == r``, so what is sampled does not depend on how many processes share the work. Losses
are normalised by the *global* token (or sequence) count, and each worker's loss is scaled by N before DDP averages
the gradients: the update equals the single-process update over the same shards, with gradient accumulation over
the shards a worker holds.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Sequence

import torch

from . import schema


class Workers:
    """The processes of one run: rank, world size, device, and the collectives the trainer uses."""

    def __init__(self, strategy: str = "ddp", cpu: bool | None = None):
        if strategy not in schema.allowed("train", "distributed"):
            raise ValueError(f"config key `train.distributed` must be one of {list(schema.allowed('train', 'distributed'))}, "
                             f"got {strategy!r}")
        from accelerate import Accelerator
        from accelerate.utils import FullyShardedDataParallelPlugin

        use_cpu = (not torch.cuda.is_available()) if cpu is None else cpu
        plugin = None
        # FSDP only where there is something to shard over, and only on GPUs (accelerate's FSDP needs an accelerator
        # device; the CPU tests run DDP): one process trains the plain model either way.
        if strategy == "fsdp" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            if use_cpu:
                raise ValueError("config key `train.distributed: fsdp` needs GPUs; on CPU processes use `ddp`")
            # Shard parameters, gradients and optimizer state over the processes (models that do not fit one GPU).
            # use_orig_params keeps parameter names, so the checkpoint is a plain Hugging Face state dict.
            plugin = FullyShardedDataParallelPlugin(fsdp_version=1, use_orig_params=True, sync_module_states=True,
                                                    state_dict_type="FULL_STATE_DICT", cpu_ram_efficient_loading=False)
        self.accelerator = Accelerator(cpu=use_cpu, fsdp_plugin=plugin)
        self.strategy = strategy
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes
        self.device = self.accelerator.device
        self.is_main = self.accelerator.is_main_process

    @property
    def distributed(self) -> bool:
        return self.world > 1

    # -- models ---------------------------------------------------------------------------------------
    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None):
        """Wrap the trained model (DDP or FSDP) and its optimizer; a single process gets them back on its device."""
        if optimizer is None:
            return self.accelerator.prepare(model)
        return self.accelerator.prepare(model, optimizer)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return self.accelerator.unwrap_model(model)

    @contextlib.contextmanager
    def full_params(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """The model with all its parameters present, for sampling outside the wrapper's forward (FSDP gathers them)."""
        if self.strategy == "fsdp" and self.distributed:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            with FSDP.summon_full_params(model, writeback=False, recurse=True):
                yield model.module
        else:
            yield self.unwrap(model)

    def no_sync(self, model: torch.nn.Module, skip: bool):
        """Skip the gradient all-reduce of this backward (``skip``: more local shards follow)."""
        return self.accelerator.no_sync(model) if skip and self.distributed else contextlib.nullcontext()

    def state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full model state (gathered on every process under FSDP), for a Hugging Face checkpoint."""
        return self.accelerator.get_state_dict(model, unwrap=True)

    def optimizer_state(self, model: torch.nn.Module, optimizer) -> dict[str, Any] | None:
        """The full optimizer state under FSDP (a collective; keyed by parameter name); None: use ``state_dict()``."""
        if self.strategy == "fsdp" and self.distributed:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            return FSDP.optim_state_dict(model, getattr(optimizer, "optimizer", optimizer))
        return None

    def load_optimizer_state(self, model: torch.nn.Module, optimizer, state: dict[str, Any]) -> None:
        if self.strategy == "fsdp" and self.distributed:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            inner = getattr(optimizer, "optimizer", optimizer)
            state = FSDP.optim_state_dict_to_load(model, inner, state)
        optimizer.load_state_dict(state)

    # -- collectives (identity on one process) ---------------------------------------------------------
    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over processes, in float64 so FLOP counts stay exact."""
        if not self.distributed:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def any(self, flag: bool) -> bool:
        """True on every process when it is true on one (agree before a collective that might not happen)."""
        if not self.distributed:
            return bool(flag)
        return self.sum([1.0 if flag else 0.0])[0] > 0

    def gather(self, obj: Any) -> list[Any]:
        """Every process's ``obj``, in rank order, on every process."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.distributed:
            self.accelerator.wait_for_everyone()

    def close(self) -> None:
        """Leave the process group (tests start several runs in one process group's lifetime)."""
        if self.distributed and torch.distributed.is_initialized():
            self.barrier()

