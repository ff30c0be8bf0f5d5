"""A job's identity is what changes its result: the keys that only change how it runs travel beside its config.

Snakemake reruns a job when its params change, and a job's params are its resolved config. Four ``train`` keys
change no step of a run: what happens after a non-finite step (a run stopped by one is the same run under either
setting up to that step), where its numbers are also sent (``report_to``), and whether activations are recomputed
in the backward (``activation_checkpointing``: the same arithmetic, tests/integration/test_fsdp.py). They leave the
config the rules hash (so turning tracking on does not rerun a finished DAG) and reach each job through one
environment variable that the rules export and :func:`with_runtime` reads back. A resumed checkpoint is matched
without them too (:func:`opdgrpo.train.checkpoint.run_identity`).

Two keys of a vLLM engine's settings are runtime keys too, per job rather than shared: its share of the GPU and the
rows it runs at once (:data:`ENGINE_RUNTIME_KEYS`), which the plan chooses per job from its memory estimate
(:mod:`opdgrpo.cost.engine_share`). They change how much memory the engine takes and how many rows decode together,
not the distribution it samples. They leave the identity wherever they are set (``train.vllm``, ``train.vllm_alone``,
and a sampling job's own ``vllm`` block), so a changed estimate, or a value set by hand, reruns no job and resumes
any checkpoint. The rules export every job's values in one environment variable (:data:`ENGINE_ENV`, keyed by the
job's directory), outside the rules' shell text, whose change Snakemake counts as a code change; each job puts its own
back where its engine reads them (:func:`engine_settings_of`, :func:`with_engine_settings`).

A rename is not a change of result: the identity keeps the name a key had when results were made
(:data:`opdgrpo.schema.RENAMED_KEYS`, :func:`canonical_names`), so renaming a key reruns no finished job and a
checkpoint written before the rename still resumes. The rules pass the identity to the job, which reads the keys back
by their current names (:func:`with_runtime`).
"""

from __future__ import annotations

import json
import os
from pathlib import PurePath
from typing import Any, Iterable, Mapping

from opdgrpo import schema
from opdgrpo.errors import ConfigError

#: ``train`` keys that change how a job runs, not what it computes.
RUNTIME_KEYS = ("nonfinite", "max_nonfinite_skips", "report_to", "activation_checkpointing")
#: Keys of a vLLM engine's settings that change how it runs, not what it samples (module docstring).
ENGINE_RUNTIME_KEYS = ("gpu_memory_utilization", "max_num_seqs")
#: Where engine settings live in a job's config: a training job's ``train`` block, a sampling job's top level.
ENGINE_BLOCKS = (("train", "vllm"), ("train", "vllm_alone"), ("vllm",))
#: The environment variable that carries them to the jobs, as JSON.
ENV = "OPDGRPO_TRAIN_RUNTIME"
#: The environment variable that carries each job's :data:`ENGINE_RUNTIME_KEYS`, as JSON by job directory.
ENGINE_ENV = "OPDGRPO_ENGINE_SETTINGS"
#: The DAG's precision record (``<results>/<profile>/precision.json``), exported to every job by the rules: ``auto``
#: is decided once per DAG, by the first job that needs it (:mod:`opdgrpo.train.precision`), not in each job's config.
PRECISION_RECORD_ENV = "OPDGRPO_PRECISION_RECORD"


#: Keys of a data set block (``domains.<d>.train``, ``domains.<d>.heldout.<set>``) that only the planner reads.
PLANNER_KEYS = ("expected_rows",)


def identity(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` without the runtime keys and the planner-only keys (what Snakemake hashes as the job's params; no job
    reads the planner's keys, so they are dropped, not passed); renamed keys by their old names (:func:`canonical_names`)."""
    out = without_engine_runtime(canonical_names(cfg))
    if isinstance(out.get("train"), Mapping):
        out["train"] = {k: v for k, v in out["train"].items() if k not in RUNTIME_KEYS}
    if isinstance(out.get("domains"), Mapping):
        out["domains"] = {name: _without_planner_keys(d) for name, d in out["domains"].items()}
    return out


def without_engine_runtime(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` without :data:`ENGINE_RUNTIME_KEYS` in any engine block (:data:`ENGINE_BLOCKS`); copies only the
    mappings on the way, and a block left empty stays, empty (as a profile that sets no key of it writes it)."""
    out = dict(cfg)
    for path in ENGINE_BLOCKS:
        out = _without(out, list(path))
    return out


def _without(node: Mapping[str, Any], path: list[str]) -> dict[str, Any]:
    child = node.get(path[0])
    if not isinstance(child, Mapping):
        return dict(node)
    if len(path) == 1:
        return {**node, path[0]: {k: v for k, v in child.items() if k not in ENGINE_RUNTIME_KEYS}}
    return {**node, path[0]: _without(child, path[1:])}


def hand_set(settings: Mapping[str, Any], key: str) -> tuple[float | None, int | None]:
    """The share and ``max_num_seqs`` set in ``settings`` (the block ``key`` names), checked: ConfigError naming the
    key for a share outside (0, 1] or a ``max_num_seqs`` below 1."""
    share, seqs = settings.get("gpu_memory_utilization"), settings.get("max_num_seqs")
    if share is not None:
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < float(share) <= 1:
            raise ConfigError(f"config key `{key}.gpu_memory_utilization` must be a fraction of the GPU's memory in "
                              f"(0, 1], got {share!r}; leave it unset and the plan chooses it per job "
                              "(`opdgrpo resources` prints the choice)")
        share = float(share)
    if seqs is not None:
        if isinstance(seqs, bool) or not isinstance(seqs, int) or seqs < 1:
            raise ConfigError(f"config key `{key}.max_num_seqs` must be an integer of at least 1, got {seqs!r}; leave it "
                              "unset and the plan chooses it per job (`opdgrpo resources` prints the choice)")
    return share, seqs


def job_key(out_dir: Any) -> str:
    """How :data:`ENGINE_ENV` names a job: its output directory as its rule passes it (``--out``), normalised."""
    return str(PurePath(str(out_dir)))


def engine_settings_of(out_dir: Any, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The engine settings :data:`ENGINE_ENV` carries for the job writing to ``out_dir``; none without the variable
    (a job started by hand takes its config's)."""
    if ENGINE_ENV not in environ:
        return {}
    return dict(json.loads(environ[ENGINE_ENV]).get(job_key(out_dir)) or {})


def with_engine_settings(cfg: dict[str, Any], path: tuple[str, ...], values: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` with ``values`` (:data:`ENGINE_RUNTIME_KEYS` passed on the command line; None: not passed) in the
    engine block at ``path`` (a training job's ``("train", "vllm")``, a sampling job's ``("vllm",)``), where the job
    reads them. A config that carries another value of a key (a job started by hand with its full config) is an
    error naming the key: one of the two would be silently ignored."""
    given = {k: v for k, v in values.items() if v is not None}
    unknown = sorted(set(given) - set(ENGINE_RUNTIME_KEYS))
    if unknown:
        raise ValueError(f"not engine runtime keys: {unknown} (known: {list(ENGINE_RUNTIME_KEYS)})")
    if not given:
        return cfg
    parent: dict[str, Any] = cfg
    for name in path[:-1]:
        parent = parent[name]
    engine = dict(parent.get(path[-1]) or {})
    for key, value in given.items():
        if key in engine and engine[key] != value:
            raise ValueError(f"config key `{'.'.join(path)}.{key}` is {engine[key]!r} in the job's config and "
                             f"{value!r} on the command line: pass one of them")
    parent[path[-1]] = {**engine, **given}
    return cfg


def canonical_names(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A run config with each renamed key (:data:`opdgrpo.schema.RENAMED_KEYS`) spelt by its old name, in its place:
    what a job's identity and a checkpoint's resume hash see. ``cfg`` itself is left as it is."""
    return _respelt(cfg, to_old=True)


def current_names(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`canonical_names`: the config the rules pass (a job's identity) as the job reads it."""
    return _respelt(cfg, to_old=False)


def _respelt(cfg: Mapping[str, Any], to_old: bool) -> dict[str, Any]:
    out = dict(cfg)
    run_method = cfg["method"].get("name") if isinstance(cfg.get("method"), Mapping) else None
    for old, new, _, method in schema.renames(run_config=True):
        if method is None or method == run_method:
            *path, new_name = new.split(".")
            old_name = old.rsplit(".", 1)[-1]
            out = _spelt(out, path, *((new_name, old_name) if to_old else (old_name, new_name)))
    return out


def _spelt(node: Mapping[str, Any], path: list[str], name: str, spelling: str) -> dict[str, Any]:
    """``node`` with key ``name`` of the mapping at ``path`` spelt ``spelling``, in its place; copies only the
    mappings on the way."""
    if not path:
        return {(spelling if k == name else k): v for k, v in node.items()}
    child = node.get(path[0])
    return {**node, path[0]: _spelt(child, path[1:], name, spelling)} if isinstance(child, Mapping) else dict(node)


def _strip(spec: Any) -> Any:
    return {k: v for k, v in spec.items() if k not in PLANNER_KEYS} if isinstance(spec, Mapping) else spec


def _without_planner_keys(domain: Any) -> Any:
    if not isinstance(domain, Mapping):
        return domain
    out = dict(domain)
    if "train" in out:
        out["train"] = _strip(out["train"])
    if isinstance(out.get("heldout"), Mapping):
        out["heldout"] = {name: _strip(spec) for name, spec in out["heldout"].items()}
    return out


def runtime(configs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The runtime keys the jobs share, one value each; a job that sets another value is an error naming the key
    (one variable serves every job)."""
    out: dict[str, Any] = {}
    for cfg in configs:
        for key in RUNTIME_KEYS:
            if key not in (cfg.get("train") or {}):
                continue
            value = cfg["train"][key]
            if key in out and out[key] != value:
                raise ValueError(f"config key `train.{key}` differs between jobs ({out[key]!r}, {value!r}): it does "
                                 "not change a job's result, so all jobs share one value")
            out[key] = value
    return out


def with_runtime(cfg: dict[str, Any], environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The config the rules pass (a job's :func:`identity`) as the job reads it, where :data:`ENV` is set (the rules
    export it to every job): renamed keys by their current names (:func:`current_names`), and the runtime keys from
    :data:`ENV` where it lacks them; a config that has them (a job started by hand) keeps its own. Without :data:`ENV`
    the config is taken as written, so an old key name in it is an error naming the new one
    (:func:`opdgrpo.train.preflight.check_run_inputs`)."""
    if ENV not in environ:
        return cfg
    cfg = current_names(cfg)
    if isinstance(cfg.get("train"), dict):
        extra = json.loads(environ[ENV])
        cfg["train"] = {**{k: v for k, v in extra.items() if k in RUNTIME_KEYS}, **cfg["train"]}
    return cfg
