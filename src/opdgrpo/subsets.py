"""Difficulty subsets of S2, without torch: the binning rule (see :mod:`opdgrpo.stages.difficulty` for the rule in words),
the subset names the planner needs before any model has run, and reading a subset back for training.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from .domains.base import stable_fraction
from .runio import IN_DOMAIN_SET


def _equal_cuts(items: list[int], n: int) -> list[list[int]]:
    """``items`` (already ordered) cut into ``n`` consecutive groups whose sizes differ by at most one."""
    size, extra = divmod(len(items), n)
    groups, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        groups.append(items[start:end])
        start = end
    return groups


def bin_by_rates(prompts: Sequence[str], student_rates: Sequence[float], teacher_rates: Sequence[float],
                 student_bins: int, teacher_bins: int) -> dict[str, list[int]]:
    """Subset name -> indices into ``prompts``, by the rank rule of the module docstring."""
    if not len(prompts) == len(student_rates) == len(teacher_rates):
        raise ValueError("bin_by_rates: prompts, student_rates and teacher_rates must have the same length")
    if student_bins < 1 or teacher_bins < 1:
        raise ValueError(f"bin_by_rates: bin counts must be >= 1, got {student_bins} x {teacher_bins}")
    if len(prompts) < student_bins * teacher_bins:
        raise ValueError(f"bin_by_rates: {len(prompts)} prompts cannot fill {student_bins} x {teacher_bins} subsets")
    tie = [stable_fraction(p, salt="s2-bins") for p in prompts]
    by_student = sorted(range(len(prompts)), key=lambda i: (student_rates[i], tie[i]))
    subsets: dict[str, list[int]] = {}
    for i, group in enumerate(_equal_cuts(by_student, student_bins)):
        by_teacher = sorted(group, key=lambda j: (teacher_rates[j], tie[j]))
        for j, cut in enumerate(_equal_cuts(by_teacher, teacher_bins)):
            subsets[f"s{i}t{j}"] = sorted(cut)
    return subsets


def subset_names(student_bins: int, teacher_bins: int) -> list[str]:
    """The subset names :func:`bin_by_rates` produces, in order (the planner needs them before any run)."""
    return [f"s{i}t{j}" for i in range(student_bins) for j in range(teacher_bins)]


def load_subset(path: Path, name: str) -> dict[str, Any]:
    """One subset of a ``subsets.json``, or an error naming the file and the subsets it has."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no subsets file; run the S2 difficulty job first")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err}); rerun the S2 difficulty job") from err
    subsets = data.get("subsets") if isinstance(data, dict) else None
    if not isinstance(subsets, dict):
        raise ValueError(f"{path}: missing key 'subsets' (subset name -> prompts); rerun the S2 difficulty job")
    if name not in subsets:
        raise KeyError(f"{path}: no subset {name!r}; it has {sorted(subsets)}")
    subset = subsets[name]
    prompts = subset.get("prompts") if isinstance(subset, dict) else None
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"{path}: subset {name!r} is missing key 'prompts' (a list of prompt strings); rerun the S2 difficulty job")
    if not prompts:
        raise ValueError(f"{path}: subset {name!r} has no prompts (an empty data set); rerun the S2 difficulty job with a larger "
                         "`studies.S2.pool_size` or fewer bins")
    return subset


def restrict_to_subset(pools: dict[str, list], heldout: dict[str, dict[str, list]], spec: dict[str, Any]) -> dict[str, Any]:
    """Train on one S2 subset only, and score its prompts as the ``in_domain`` eval set (the paper's in-domain
    accuracy). Changes ``pools`` and ``heldout`` in place; returns the subset's size and solve rates, which
    ``done.json`` keeps so the report can rank subsets."""
    domain = spec["domain"]
    subset = load_subset(Path(spec["file"]), spec["subset"])
    wanted = subset["prompts"]
    by_prompt = {t.prompt: t for t in pools[domain]}
    missing = [p for p in wanted if p not in by_prompt]
    if missing:
        raise ValueError(f"{spec['file']}: subset {spec['subset']} has {len(missing)} prompts outside the {domain} training pool "
                         f"(e.g. {missing[0]!r}); the domain config changed since the subsets were made: rerun the difficulty job")
    pools[domain] = [by_prompt[p] for p in wanted]
    heldout.setdefault(domain, {})[IN_DOMAIN_SET] = pools[domain][: int(spec.get("eval_size") or len(wanted))]
    return {"subset": spec["subset"], "size": len(wanted),
            **{k: v for k, v in subset.items() if k.endswith("_rate") or k.endswith("_range")}}
