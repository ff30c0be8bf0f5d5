"""One run across several processes (one per GPU; or CPU processes with gloo in the tests).

The trainer stays one loop; this module is the few collective operations it needs. A run started by
``accelerate launch --num_processes N`` or ``torchrun --nproc_per_node N`` gets N workers; a plain ``python`` start
gets one, and every collective is then the identity, so the single-process path computes exactly what it did before
this module existed, whatever ``train.distributed`` says.

How a step is split (see ``opdgrpo.train.loop``): the step's prompts are cut into ``train.micro_batches`` shards (default:
one per process). Shard ``s`` is sampled with its own generator seeded by (seed, step, s), and worker ``r`` takes the
shards ``s`` with ``s % N == r``, so what is sampled does not depend on how many processes share the work. Losses
are normalised by the *global* token (or sequence) count, and each worker's loss is scaled by N before DDP's
all-reduce (or FSDP's reduce-scatter) averages the gradients: the update equals the single-process update over the
same shards, with gradient accumulation over the shards a worker holds.

``train.distributed: ddp`` replicates the student (accelerate's DDP); ``fsdp`` shards it with FSDP2
(:mod:`opdgrpo.train.fsdp`: weights, gradients and optimizer state, per decoder layer); ``none`` refuses several processes.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from opdgrpo import schema
from opdgrpo.run_shape import train_settings
from opdgrpo.train import fsdp

log = logging.getLogger("opdgrpo.train.distributed")


def launched_by_torchrun() -> bool:
    """Whether torchrun started this process (it sets RANK, LOCAL_RANK and WORLD_SIZE; one process included)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


class Workers:
    """The processes of one run: rank, world size, device, how the trained model is shared, and the collectives the
    trainer uses.

    ``strategy`` (``train.distributed``): ``none`` (one process only), ``ddp`` (replicas; accelerate's DDP) or ``fsdp``
    (FSDP2 shards, :mod:`opdgrpo.train.fsdp`). One process trains the plain model under every strategy."""

    def __init__(self, strategy: str = "ddp", cpu: bool | None = None, policy: fsdp.Policy | None = None,
                 collective_timeout_s: float | None = None):
        """``collective_timeout_s``: how long a collective may wait for the slowest process before every process
        aborts (torch's default: 10 minutes under NCCL, 30 under gloo). The rules pass the plan's longest phase in
        which one process may wait for another (rank 0 writing a checkpoint while the others wait in a barrier,
        uneven code scoring or evaluation shares before a gather), with margin: :func:`opdgrpo.cost.resources.stop_settings`."""
        if strategy not in schema.allowed("train", "distributed"):
            raise ValueError(f"config key `train.distributed` must be one of {list(schema.allowed('train', 'distributed'))}, "
                             f"got {strategy!r}")
        started = int(os.environ.get("WORLD_SIZE", "1"))
        if strategy == "none" and started > 1:
            raise ValueError(f"config key `train.distributed: none` trains in one process, but {started} were started; "
                             "use `ddp` or `fsdp`, or start one process")
        from accelerate import Accelerator
        from accelerate.utils import InitProcessGroupKwargs

        # accelerate starts the process group (gloo on CPU, NCCL on GPUs), picks the device and wraps DDP; FSDP2 is
        # applied here directly (accelerate's FSDP plugin refuses CPU processes).
        handlers = ([InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=float(collective_timeout_s)))]
                    if collective_timeout_s else [])
        self.accelerator = Accelerator(cpu=(not torch.cuda.is_available()) if cpu is None else cpu, kwargs_handlers=handlers)
        self.strategy = strategy
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes
        self.device = self.accelerator.device
        self.is_main = self.accelerator.is_main_process
        # FSDP2 with several processes, or with one that torchrun started (the GPU pilot's one-GPU run of the path)
        self.sharded = strategy == "fsdp" and (self.world > 1 or launched_by_torchrun())
        self.policy = policy or fsdp.Policy()
        self._replica: torch.nn.Module | None = None   # FSDP: the plain model that samples
        self.engine_samples = False   # a vLLM engine samples: FSDP keeps no replica (the engine syncs from the shards)

    @classmethod
    def from_config(cls, train: Mapping[str, Any], collective_timeout_s: float | None = None) -> "Workers":
        """``train.distributed`` and ``train.engine`` (schema defaults where unset). The FSDP policy depends on the
        precision, which the job resolves on :attr:`device` once the workers exist: the trainer sets
        :attr:`policy` then (:class:`opdgrpo.train.fsdp.Policy`), before any model is sharded."""
        train = train_settings(train)
        workers = cls(str(train["distributed"]), collective_timeout_s=collective_timeout_s)
        workers.engine_samples = train["engine"] == "vllm"
        return workers

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def collective_timeout_s(self) -> float | None:
        """The timeout the default process group applies, read back from it (None with one process)."""
        if not (self.distributed and torch.distributed.is_initialized()):
            return None
        group = torch.distributed.distributed_c10d._get_default_group()
        timeout = getattr(getattr(group._get_backend(self.device), "options", None), "_timeout", None)
        return timeout.total_seconds() if timeout is not None else None

    def log_collectives(self, planned_s: float | None) -> None:
        """One line in the job's log (main process): the process count and the collective timeout in force."""
        if self.is_main and self.distributed:
            applied = self.collective_timeout_s()
            log.info("%d processes; collective timeout %s s (%s)", self.world, f"{applied:.0f}" if applied else "?",
                     f"planned: {planned_s:.0f} s" if planned_s else "torch's default: no --collective-timeout given")

    # -- models ---------------------------------------------------------------------------------------
    def prepare(self, model: torch.nn.Module, make_optimizer: Callable[[Iterator[torch.nn.Parameter]], torch.optim.Optimizer]
                ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """The model wrapped for the processes and its optimizer, built over what each process trains: the whole
        model (one process, DDP) or this process's shards (FSDP, so the optimizer state is sharded too)."""
        if not self.sharded:
            return self.accelerator.prepare(model, make_optimizer(model.parameters()))
        if not self.engine_samples:
            self._replica = fsdp.sampling_replica(model, self.policy.param_dtype)
        fsdp.shard(model, self.mesh, self.policy)
        return model, make_optimizer(model.parameters())

    def prepare_frozen(self, model: torch.nn.Module) -> torch.nn.Module:
        """A frozen model (an OPD teacher) on this process's device: under FSDP sharded as the student is
        (per decoder layer, then the whole model; forward gathers in ``train.fsdp.param_dtype``), with no
        optimizer and no gradients, so each process holds 1/N of it; otherwise the model itself (a replica).
        Sharded from host memory: ``fully_shard`` moves each unit's weights to the mesh's device as it shards that
        unit, so the device never holds more than one layer of the whole teacher."""
        if self.sharded:
            fsdp.shard(model.requires_grad_(False), self.mesh, self.policy)
            return model
        return model.to(self.device)

    @property
    def mesh(self):
        """The one-dimensional device mesh of all processes (FSDP), made once."""
        if getattr(self, "_mesh", None) is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(self.device.type, (self.world,))
        return self._mesh

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model itself (FSDP2 shards in place: the sharded model is the Hugging Face model)."""
        return model if self.sharded else self.accelerator.unwrap_model(model)

    @contextlib.contextmanager
    def full_params(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """A model with all its parameters present, for sampling outside the wrapper's forward. FSDP: the replica,
        refreshed from the shards (a collective: every process enters at the same point). FSDP with a vLLM engine:
        the sharded model itself, which only gives the engine its weights (gathered a parameter at a time,
        :meth:`opdgrpo.train.engines.vllm_engine.VLLMEngine.sync`) and the evaluation its device."""
        if self.sharded and self._replica is None:
            yield model
        elif self.sharded:
            fsdp.refresh(self._replica, model)
            yield self._replica
        else:
            yield self.unwrap(model)

    def no_sync(self, model: torch.nn.Module, skip: bool):
        """Skip the gradient all-reduce of this backward (``skip``: more local shards follow). FSDP reduce-scatters
        after every backward (see :mod:`opdgrpo.train.fsdp`)."""
        if not skip or not self.distributed or self.sharded:
            return contextlib.nullcontext()
        return self.accelerator.no_sync(model)

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> torch.Tensor:
        """Clip the gradients to ``max_norm`` by their global norm and return that norm (the same on every process)."""
        if self.sharded:
            return fsdp.clip_grad_norm_(model, max_norm)
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    def state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full model state, for a Hugging Face checkpoint (FSDP: a collective; the main process gets it)."""
        if self.sharded:
            return fsdp.full_model_state(model)
        return self.accelerator.get_state_dict(model, unwrap=True)

    def optimizer_state(self, model: torch.nn.Module, optimizer) -> dict[str, Any] | None:
        """The full optimizer state under FSDP (a collective; one process's layout, on the main process); None: use
        ``state_dict()``."""
        return fsdp.full_optimizer_state(model, optimizer) if self.sharded else None

    def load_optimizer_state(self, model: torch.nn.Module, optimizer, state: dict[str, Any]) -> None:
        if self.sharded:
            fsdp.load_optimizer_state(model, optimizer, state)
        else:
            optimizer.load_state_dict(state)

    # -- collectives (identity on one process) ---------------------------------------------------------
    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over processes, in float64 so FLOP counts stay exact."""
        if not self.distributed:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def max(self, value: int) -> int:
        """The largest ``value`` over processes (e.g. the micro-batches every process runs in an update)."""
        if not self.distributed:
            return int(value)
        t = torch.tensor([int(value)], dtype=torch.int64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t.item())

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

