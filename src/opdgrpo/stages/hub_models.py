"""The base stage at paper scale: models and tokenizer come from the Hugging Face hub, already trained.

A model block with ``source: hub`` names a hub id (``Qwen/Qwen3-4B-Base``) or a local directory in ``path``, and
optionally a ``revision``. Its base job resolves that to a directory on disk (``huggingface_hub.snapshot_download``:
the weights are fetched once into the shared hub cache, or taken from a local copy), links
``base/<model>/checkpoint`` to it, and measures its held-out accuracy. Downstream runs then load
``base/<model>/checkpoint`` exactly as they load a checkpoint the pipeline trained, so every later stage is the same
code at every scale. Nothing here counts as post-training compute.

``source: random`` (the rehearsal profile and the GPU pilot) stands in for a hub checkpoint where none can be
downloaded: the base job writes a weightless hub-format directory (config, tokenizer, seed) from the block's
architecture keys, and links and evaluates it like a hub snapshot; every loader draws the weights from the seed
(:func:`opdgrpo.train.models.load_model`), and an engine that only samples it starts on vLLM's own random weights.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping

import torch

#: Files a model or tokenizer directory needs (no optimizer states, no original PyTorch .bin when safetensors exist).
MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]


def local_dir(path: str, where: str = "path") -> Path | None:
    """The local directory ``path`` names, or None for a hub id; a path that looks local (absolute, or starting with
    ``.``) but is no directory is an error naming ``where``."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local.resolve()
    if local.is_absolute() or path.startswith("."):
        raise ValueError(f"config key `{where}`: {path!r} is not a directory (a local model must be a directory "
                         f"saved with save_pretrained; a hub id looks like 'Qwen/Qwen3-4B-Base')")
    return None


def resolve(path: str, revision: str | None = None, where: str = "path") -> Path:
    """A local directory holding ``path`` (itself when it is one; else the hub snapshot, downloaded if missing)."""
    local = local_dir(path, where)
    if local is not None:
        return local
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(path, revision=revision, allow_patterns=MODEL_FILES))
    except Exception as err:
        raise ValueError(f"config key `{where}`: cannot fetch {path!r} (revision {revision or 'main'}) from the hub: "
                         f"{type(err).__name__}: {err}. Without network access, fill the hub cache on a node with "
                         f"network (`opdgrpo fetch --profile <profile>`) and set HF_HUB_OFFLINE=1, or set `{where}` "
                         f"to a local directory") from err


def save_hub_tokenizer(spec: Mapping[str, Any], out_dir: Path) -> int:
    """The run's tokenizer job at paper scale: the students' tokenizer, saved where every run reads it."""
    from transformers import AutoTokenizer

    source = resolve(str(spec["path"]), spec.get("revision"), "tokenizer.path")
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    return len(tokenizer)


def link_checkpoint(target: Path, out_dir: Path) -> Path:
    """``out_dir/checkpoint`` -> ``target``, replaced atomically (a rerun after a new revision relinks it)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    link, tmp = out_dir / "checkpoint", out_dir / "checkpoint.link"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp, target_is_directory=True)
    if link.is_dir() and not link.is_symlink():
        raise ValueError(f"{link} is a directory, not a link: it was made by another profile's pretraining; "
                         f"use another `results_dir` for the paper profile")
    os.replace(tmp, link)
    return link


def build_random(model_cfg: Mapping[str, Any], name: str, tokenizer_dir: Path, out_dir: Path) -> Path:
    """A ``source: random`` model as a weightless hub-format directory ``out_dir/random-init``: its config (dtype:
    the block's), generation config, the run's tokenizer and its seed (:data:`opdgrpo.train.models.RANDOM_INIT`). Whoever
    loads it draws the weights on its own device (:func:`opdgrpo.train.models.load_model`), so a 32B-shaped model costs no
    disk and no copy; a rerun writes the same files."""
    import shutil

    from transformers import GenerationConfig

    from opdgrpo.runio import write_json
    from opdgrpo.train.models import RANDOM_INIT, qwen3_config
    from opdgrpo.train.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    rows = int(model_cfg["vocab_size"])
    if rows < len(tokenizer):
        raise ValueError(f"config key `models.{name}.vocab_size` ({rows}) is smaller than the tokenizer's {len(tokenizer)} "
                         f"tokens: the embedding needs a row per token (hub models pad it above, as Qwen3's 151,936)")
    config = qwen3_config(model_cfg, rows, tokenizer.pad_token_id, tokenizer.eos_token_id)
    config.dtype = str(model_cfg.get("dtype") or "float32")   # what an engine on the directory runs in
    config.architectures = ["Qwen3ForCausalLM"]   # what vLLM reads to pick the model class
    target = out_dir / "random-init"
    shutil.rmtree(target, ignore_errors=True)
    config.save_pretrained(target)
    GenerationConfig(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                     bos_token_id=tokenizer.eos_token_id).save_pretrained(target)
    tokenizer.save_pretrained(target)
    write_json(target / RANDOM_INIT, {"seed": int(model_cfg["seed"]), "weights": "drawn by the loader (opdgrpo.train.models."
                                      "draw_weights): N(0, initializer_range) per matrix, RMSNorm gains 1"})
    return target.resolve()


def fetch_base(cfg: dict[str, Any], out_dir: Path, collective_timeout_s: float | None = None) -> dict[str, Any]:
    """The base job of a ``source: hub`` model (resolve) or a ``source: random`` one (build): link, evaluate
    held-out accuracy (not counted). Under torchrun (``resources.base.gpu`` processes, one per GPU) each process
    samples a contiguous share of every held-out set with its own engine and the shares are gathered in order
    (:func:`opdgrpo.train.evaluation.evaluate`); the main process writes."""
    from opdgrpo import gpu_slots
    from opdgrpo.runio import rewrite_jsonl, write_json, write_yaml
    from opdgrpo.train import numerics
    from opdgrpo.train.finished import checkpoint_record
    from opdgrpo.train.models import parameter_count

    started = time.time()
    torch.set_num_threads(int(cfg["threads"]))
    workers = _sampling_workers(collective_timeout_s)
    main = workers is None or workers.is_main
    model_cfg, name = cfg["model"], cfg["name"]
    if main:
        write_yaml(out_dir / "config.yaml", cfg)
        link_checkpoint(_materialise(cfg, out_dir), out_dir)
    if workers is not None:
        workers.barrier()   # the link exists before the other processes read it
    checkpoint = out_dir / "checkpoint"
    target = checkpoint.resolve()
    model, results, eval_flops, placement = _evaluate_base(cfg, checkpoint, workers)
    if not main:
        return {}
    rewrite_jsonl(out_dir / "evals.jsonl", [{"step": 0, "cumulative_flops": 0.0, "eval_flops": eval_flops, "results": results}])
    summary = {"model": name, "source": model_cfg.get("source", "hub"), "path": str(model_cfg.get("path", target)),
               "revision": model_cfg.get("revision"),
               "resolved": str(target), "parameters": parameter_count(model), "steps": 0, "counted": False,
               "heldout": results, "processes": 1 if workers is None else workers.world, "wall_s": round(time.time() - started, 1),
               "numerics": numerics.report()}
    if placement is not None:
        summary["engines"] = placement
    gpu_slots.record_into(summary)   # on a machine: the GPU slots the job ran on (opdgrpo.launch)
    # what downstream runs check and identify: the cache's content-addressed names, or a random model's settings
    summary["checkpoint"] = checkpoint_record(checkpoint, hash_contents=False, settings=dict(model_cfg))
    write_json(out_dir / "done.json", summary)
    return summary


def _sampling_workers(collective_timeout_s: float | None):
    """The job's processes when torchrun started several (one per GPU), else None (one process, no group)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    from opdgrpo.train.distributed import Workers

    workers = Workers("ddp", collective_timeout_s=collective_timeout_s)   # collectives only: no model is wrapped
    workers.log_collectives(collective_timeout_s)
    return workers


def _materialise(cfg: Mapping[str, Any], out_dir: Path) -> Path:
    """The model's directory: the hub snapshot (or local directory) resolved, or the random model's files written."""
    model_cfg, name = cfg["model"], cfg["name"]
    out_dir.mkdir(parents=True, exist_ok=True)
    if model_cfg.get("source") == "random":
        return build_random(model_cfg, name, Path(cfg["tokenizer"]), out_dir)
    return resolve(str(model_cfg["path"]), model_cfg.get("revision"), f"models.{name}.path")


def _evaluate_base(cfg: Mapping[str, Any], checkpoint: Path, workers) -> tuple[torch.nn.Module, list, float, Any]:
    """(the model, its held-out results, their FLOPs, where each process's engine ran or None). Under ``engine:
    vllm`` the engine samples and the model only gives the config and the count: it is built on ``meta`` (no weights
    read: a 32B checkpoint would take 61 GiB of host memory per process for nothing); under ``hf`` it samples, on
    this process's GPU where there is one."""
    from opdgrpo import schema
    from opdgrpo.domains import build_domain
    from opdgrpo.train.engines import checkpoint_engine
    from opdgrpo.train.evaluation import evaluate, heldout_for
    from opdgrpo.train.models import autocast, load_model
    from opdgrpo.train.precision import configured as configured_precision
    from opdgrpo.train.precision import resolve as resolve_precision
    from opdgrpo.train.rollout import PromptFormat
    from opdgrpo.train.tokenizer import load_tokenizer

    model_cfg = cfg["model"]
    engine_on = cfg.get("engine") == "vllm"
    device = workers.device if workers is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = load_model(checkpoint, dtype=getattr(torch, str(model_cfg.get("dtype") or "float32")), trainable=False,
                       attn_implementation=str(model_cfg.get("attn_implementation") or schema.default("model", "attn_implementation")),
                       device="meta" if engine_on else device)
    tokenizer = load_tokenizer(Path(cfg["tokenizer"]))
    domains = {d: build_domain(spec) for d, spec in cfg["domains"].items()}
    ev = schema.with_defaults(cfg["pretrain"]["eval"], "config.schema.yaml#/$defs/pretrain", "eval")
    sampling = schema.with_defaults(model_cfg.get("sampling") or {}, "model", "sampling")
    fmt = PromptFormat.from_config({**(cfg.get("prompt_format") or {}), **(model_cfg.get("prompt_format") or {}),   # its own family's
                                    **({"enable_thinking": sampling["enable_thinking"]} if "enable_thinking" in sampling else {})})
    if ev["max_prompts"] == 0:
        return model, [], 0.0, None
    heldout = heldout_for(domains, sorted(domains), ev["max_prompts"])
    max_new_tokens = int(sampling.get("max_new_tokens", ev["max_new_tokens"]))
    tasks = [t for sets in heldout.values() for s in sets.values() for t in s]
    precision = resolve_precision(configured_precision(cfg["pretrain"], "pretrain.precision"), device, "pretrain.precision")
    with autocast(precision, device.type), checkpoint_engine(cfg, checkpoint, model, tokenizer=tokenizer, tasks=tasks,
                                                             fmt=fmt, max_new_tokens=max_new_tokens) as engine:
        results, flops = evaluate(model, tokenizer, domains, heldout, k=int(ev["k"]),
                                  temperature=float(sampling.get("temperature", ev["temperature"])),
                                  top_p=float(sampling["top_p"]), top_k=int(sampling["top_k"]),
                                  max_new_tokens=max_new_tokens, batch_size=int(ev["batch_size"]),
                                  seed=int(cfg["seed"]), fmt=fmt, max_batch_tokens=ev["max_batch_tokens"],
                                  budget_key="pretrain.eval.max_batch_tokens", engine=engine, workers=workers)
        # where each process's engine ran (a collective: before the engine's teardown ends the process group)
        placement = getattr(engine, "placement", None)
        if placement is not None:
            placement = workers.gather(placement) if workers is not None else [placement]
    return model, results, flops, placement
