"""Turn the composed config into the list of jobs and the report spec: each ``studies.<name>`` block is checked
and planned by the registered study of that name (:mod:`opdgrpo.plan.studies`) through a :class:`~opdgrpo.plan.planner.Planner`.
"""

from __future__ import annotations

from typing import Any

from opdgrpo import schema
from opdgrpo.config import ConfigError
from opdgrpo.plan.planner import Plan, Planner
from opdgrpo.plan.studies import REGISTRY
from opdgrpo.plan.studies.base import SeedEntries


def build_plan(cfg: dict[str, Any]) -> Plan:
    """All jobs for the composed config, with the report spec that ties runs to studies.

    Each ``studies.<name>`` block is planned by the registered study of that name (:mod:`opdgrpo.plan.studies`), once
    per seed; its report-spec entry is the study's own, or ``{"title", "seeds": [entry, ...]}`` for several seeds.
    """
    check_studies(cfg)
    planner = Planner(cfg)
    studies: dict[str, Any] = {}
    for name, scfg in cfg["studies"].items():
        study = REGISTRY[name]
        per_seed = [study.plan(planner, scfg, seed) for seed in cfg["seeds"]]
        studies[name] = per_seed[0] if len(per_seed) == 1 else SeedEntries(title=scfg["title"], seeds=per_seed)
    for model in cfg["models"]:  # every model's base stage runs, so teachers can be compared to the student
        planner.base(model)
    runs = [
        {
            "run": j.id,
            "studies": j.studies,
            "method": j.config["method"]["name"],
            "label": j.label,
            "train_domains": j.config["train_domains"],
            "seed": j.config["seed"],
        }
        for j in planner.jobs.values() if j.kind == "train"
    ]
    spec = {"profile": cfg["profile"], "runs": runs, "studies": studies,
            "base_models": {j.label: j.out_dir for j in planner.jobs.values() if j.kind == "base"}}
    return Plan(planner.root, planner.jobs, spec, dict(planner.variants))


def check_studies(cfg: dict[str, Any]) -> None:
    """Each ``studies.<name>`` block against its study: a known name, the study's own schema, no key it does not
    read (a key that would do nothing fails naming it), then the study's rules across keys. Before any job is built."""
    for name, block in cfg["studies"].items():
        study = REGISTRY.get(name)
        if study is None:
            raise ConfigError(f"config key `studies.{name}`: unknown study; known studies: {sorted(REGISTRY)}")
        if study.schema:
            try:
                schema.check(block, study.schema, where=f"studies.{name}")
            except schema.SchemaError as err:
                raise ConfigError(str(err)) from None
        read = study.read_keys()
        unread = sorted(set(block) - read) if read is not None else []
        if unread:
            raise ConfigError(f"config key `studies.{name}.{unread[0]}` does nothing: study {name} reads only "
                              f"{', '.join(sorted(read - {'name', 'title'}))} (besides name and title)")
        study.validate(cfg)
