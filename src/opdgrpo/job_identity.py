"""A job's identity is what changes its result: the keys that only change how it runs travel beside its config.

Snakemake reruns a job when its params change, and a job's params are its resolved config. Four ``train`` keys
change no step of a run: what happens after a non-finite step (a run stopped by one is the same run under either
setting up to that step), where its numbers are also sent (``report_to``), and whether activations are recomputed
in the backward (``activation_checkpointing``: the same arithmetic, tests/integration/test_fsdp.py). They leave the
config the rules hash (so turning tracking on does not rerun a finished DAG) and reach each job through one
environment variable that the rules export and :func:`with_runtime` reads back. A resumed checkpoint is matched
without them too (:func:`opdgrpo.train.checkpoint.run_identity`).

A rename is not a change of result: the identity keeps the name a key had when results were made
(:data:`opdgrpo.schema.RENAMED_KEYS`, :func:`canonical_names`), so renaming a key reruns no finished job and a
checkpoint written before the rename still resumes. The rules pass the identity to the job, which reads the keys back
by their current names (:func:`with_runtime`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping

from opdgrpo import schema

#: ``train`` keys that change how a job runs, not what it computes.
RUNTIME_KEYS = ("nonfinite", "max_nonfinite_skips", "report_to", "activation_checkpointing")
#: The environment variable that carries them to the jobs, as JSON.
ENV = "OPDGRPO_TRAIN_RUNTIME"
#: The DAG's precision record (``<results>/<profile>/precision.json``), exported to every job by the rules: ``auto``
#: is decided once per DAG, by the first job that needs it (:mod:`opdgrpo.train.precision`), not in each job's config.
PRECISION_RECORD_ENV = "OPDGRPO_PRECISION_RECORD"


#: Keys of a data set block (``domains.<d>.train``, ``domains.<d>.heldout.<set>``) that only the planner reads.
PLANNER_KEYS = ("expected_rows",)


def identity(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` without the runtime keys and the planner-only keys (what Snakemake hashes as the job's params; no job
    reads the planner's keys, so they are dropped, not passed); renamed keys by their old names (:func:`canonical_names`)."""
    out = canonical_names(cfg)
    if isinstance(out.get("train"), Mapping):
        out["train"] = {k: v for k, v in out["train"].items() if k not in RUNTIME_KEYS}
    if isinstance(out.get("domains"), Mapping):
        out["domains"] = {name: _without_planner_keys(d) for name, d in out["domains"].items()}
    return out


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
