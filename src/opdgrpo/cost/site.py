"""Site settings a SLURM run cannot start without, checked before anything is submitted.

workflow/profiles/slurm/config.yaml ships placeholders (``slurm_partition: "EDIT-ME-partition"``,
``slurm_account: "EDIT-ME-account"``) that sbatch would only reject job by job, after the DAG was planned and the
first jobs submitted. :func:`site_settings_problems` names them at once; the Snakefile calls it when the executor is
slurm, with the workflow profile's settings as a mapping (the YAML, parsed: :func:`read_profile`). Given the
composed config too, it checks that the profile resubmits the training rules as often as the planner counted on
(``preemptible-retries`` + 1 >= ``resources.train.allocations``), so a run the planner passed is not cut short.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

#: Marks of a value the site has not edited yet.
PLACEHOLDER = "EDIT-ME"
#: Settings every SLURM job needs, in ``default-resources``.
SITE_KEYS = {"slurm_partition": "`sinfo -s` lists partitions",
             "slurm_account": "`sacctmgr show assoc user=$USER` lists accounts"}
#: The rules whose jobs resume from a checkpoint (resubmitted through ``preemptible-rules``).
TRAINING_RULES = ("grpo", "opd")


def read_profile(path: str | Path) -> dict[str, Any]:
    """A workflow profile's ``config.yaml`` as a mapping."""
    import yaml

    return dict(yaml.safe_load(Path(path).read_text()) or {})


def _resources(profile_config: Mapping[str, Any]) -> dict[str, Any]:
    """``default-resources`` as a mapping (a profile may also write it as a list of ``key=value``)."""
    raw = profile_config.get("default-resources") or {}
    if isinstance(raw, Mapping):
        return dict(raw)
    return dict(str(item).split("=", 1) for item in raw if "=" in str(item))


def site_settings_problems(profile_config: Mapping[str, Any], cfg: Mapping[str, Any] | None = None) -> list[str]:
    """One message per site setting of a SLURM workflow profile that is missing or still a placeholder, and, with
    ``cfg``, per training resubmission the plan counts on that the profile does not grant; [] when the profile's
    executor is not slurm."""
    executor = profile_config.get("executor")
    if executor is not None and executor != "slurm":
        return []
    resources, out = _resources(profile_config), []
    for key, hint in SITE_KEYS.items():
        value = str(resources.get(key) or "").strip().strip("'\"")
        if not value or PLACEHOLDER in value:
            out.append(f"workflow profile: default-resources.{key} is {value or 'unset'!r}: set your cluster's "
                       f"(--default-resources {key}=<name>, or edit the profile; {hint})")
    if cfg is not None:
        out += _retry_problems(profile_config, cfg)
    return out


def _retry_problems(profile_config: Mapping[str, Any], cfg: Mapping[str, Any]) -> list[str]:
    allocations = int(((cfg.get("resources") or {}).get("train") or {}).get("allocations") or 1)
    if allocations <= 1:
        return []
    retries = int(profile_config.get("preemptible-retries") or 0)
    rules = set(profile_config.get("preemptible-rules") or [])
    out = []
    if retries + 1 < allocations:
        out.append(f"workflow profile: preemptible-retries ({retries}) gives a training run {retries + 1} allocations; "
                   f"the plan counts on resources.train.allocations ({allocations}): raise preemptible-retries to "
                   f"{allocations - 1} (or lower resources.train.allocations, and opdgrpo resources checks the runs "
                   "still finish)")
    missing = [r for r in TRAINING_RULES if r not in rules]
    if missing:
        out.append(f"workflow profile: preemptible-rules lacks {missing}: those training runs would get no "
                   f"resubmission, and the plan counts on {allocations} allocations each")
    return out
