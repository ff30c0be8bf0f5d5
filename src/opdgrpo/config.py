"""Compose and validate the Hydra configuration (``conf/``), the single source of truth.

The Snakefile and the CLI both call :func:`compose`; nothing downstream reads ``conf/`` again: jobs
receive their resolved run config from the plan.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import OmegaConf

from .studies import REGISTRY


class ConfigError(ValueError):
    """A problem in the configuration, with the key that causes it and what would fix it."""


#: How a multi-domain batch is split between domains (``train.mix``, and a study's ``mix`` override).
MIXES = ("balanced", "instance")


def default_conf_dir() -> Path:
    return Path.cwd() / "conf"


def compose(overrides: Sequence[str] = (), conf_dir: Path | None = None) -> dict[str, Any]:
    """Compose ``conf/config.yaml`` with Hydra overrides (e.g. ``profile=smoke``) into a plain dict."""
    conf_dir = Path(conf_dir or default_conf_dir()).resolve()
    if not (conf_dir / "config.yaml").is_file():
        raise ConfigError(f"no config.yaml in {conf_dir}: run from the repository root or pass the conf directory")
    with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
        try:
            cfg = hydra_compose(config_name="config", overrides=list(overrides))
        except Exception as err:  # Hydra's own messages name the group/key; keep them, add where they came from
            hint = _override_hint(conf_dir, overrides)
            raise ConfigError(f"could not compose conf/ with overrides {list(overrides)}: {err}{hint}") from err
    resolved = OmegaConf.to_container(cfg, resolve=True)
    validate(resolved)
    check_results_dir(resolved["results_dir"])
    return resolved


def _override_hint(conf_dir: Path, overrides: Sequence[str]) -> str:
    """For an override whose key does not exist (a typo), the closest existing keys or config groups."""
    import difflib

    groups = sorted(p.name for p in conf_dir.iterdir() if p.is_dir())
    base = [o for o in overrides if o.split("=", 1)[0] in groups]  # e.g. the profile, which decides the keys
    try:
        cfg = OmegaConf.to_container(hydra_compose(config_name="config", overrides=base), resolve=False)
    except Exception:
        cfg = {}
    hints = []
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if override.startswith("+") or key in groups:
            continue
        if "@" in key:  # group@package: the group part is the one that can be misspelt
            group = key.split("@", 1)[0]
            if group not in groups:
                close = difflib.get_close_matches(group, groups, n=3)
                hints.append(f"`{key}`: no config group {group!r} (groups: {groups})" + (f"; did you mean {close}?" if close else ""))
            continue
        node, path = cfg, []
        for part in key.split("."):
            if not isinstance(node, dict):
                break
            if part not in node:
                candidates = list(dict.fromkeys([str(k) for k in node] + (groups if not path else [])))
                close = difflib.get_close_matches(part, candidates, n=3)
                where = ".".join(path) or "the top level"
                hints.append(f"`{key}`: no key {part!r} at {where}" + (f"; did you mean {close}?" if close else ""))
                break
            node, path = node[part], path + [part]
    return ("\n" + "\n".join(hints)) if hints else ""


def check_results_dir(results_dir: str) -> None:
    """Fail before any compute when nothing can be written under ``results_dir``.

    A writability probe, not a permission-bit check (root ignores those): the nearest existing ancestor of the
    directory (what ``mkdir -p`` would write into) must be a directory in which a temporary file can be created
    and removed. Catches a path under a regular file (``/etc/passwd/x``), a read-only filesystem, and (for
    non-root users) a directory without write permission. The directory itself is not created here.
    """
    path = Path(results_dir).expanduser().absolute()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(
            f"config key `results_dir` ({results_dir}) cannot be created: {probe} is a file, not a directory; "
            "pass `results_dir=<a writable directory>`"
        )
    try:
        fd, tmp = tempfile.mkstemp(dir=probe, prefix=".opdgrpo-write-probe-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as err:
        raise ConfigError(
            f"config key `results_dir` ({results_dir}) is not writable: cannot create a file in {probe} ({err.strerror}); "
            "pass `results_dir=<a writable directory>` or fix its permissions"
        ) from err


def require(cfg: dict[str, Any], dotted: str, kind: type | tuple[type, ...] | None = None) -> Any:
    """The value at a dotted key, or a ConfigError naming the key."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"missing config key `{dotted}`; add it to conf/ or pass `{dotted}=...`")
        node = node[part]
    if kind is not None and not isinstance(node, kind) or (kind in (int, float) and isinstance(node, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(f"config key `{dotted}` must be {names}, got {node!r}; fix it in conf/ or pass `{dotted}=<{names}>`")
    return node


def require_positive(cfg: dict[str, Any], dotted: str, number: type | tuple = (int, float)) -> None:
    """:func:`require`, and the value must be > 0 (also for a study's own checks, :mod:`opdgrpo.studies`)."""
    value = require(cfg, dotted, number)
    if value <= 0:
        raise ConfigError(f"config key `{dotted}` must be > 0, got {value!r}")


_positive = require_positive


def validate(cfg: dict[str, Any]) -> None:
    """Check the keys every stage relies on before any compute starts."""
    require(cfg, "profile", str)
    require(cfg, "results_dir", str)
    seeds = require(cfg, "seeds")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ConfigError(f"config key `seeds` must be a non-empty list of integers, got {seeds!r}; e.g. `seeds=[0,1,2]`")
    _positive(cfg, "threads", int)
    for name in require(cfg, "models", dict):
        source = cfg["models"][name].get("source", "scratch")
        if source not in ("scratch", "hub"):
            raise ConfigError(f"config key `models.{name}.source` must be 'scratch' (built and pretrained here) or 'hub' "
                              f"(from_pretrained), got {source!r}")
        if source == "hub":
            require(cfg, f"models.{name}.path", str)
            continue
        fraction = require(cfg, f"models.{name}.pretrain.thinking_fraction", (int, float))
        if not 0 <= fraction <= 1:
            raise ConfigError(f"config key `models.{name}.pretrain.thinking_fraction` must be in [0, 1] "
                              f"(the share of step-by-step demonstrations), got {fraction!r}")
        _positive(cfg, f"models.{name}.pretrain.steps", int)
    _validate_domains(cfg)
    for key in ("prompts_per_step", "max_new_tokens", "eval_every", "checkpoint_every"):
        _positive(cfg, f"train.{key}", int)
    if "mix" in require(cfg, "train", dict):
        _check_mix(cfg["train"]["mix"], "train.mix")
    if require(cfg, "train", dict).get("precision", "fp32") not in ("bf16", "fp32"):
        raise ConfigError(f"config key `train.precision` must be 'bf16' or 'fp32', got {cfg['train']['precision']!r}")
    _positive(cfg, "train.eval.k", int)
    nonfinite = cfg.get("train", {}).get("nonfinite", "stop")
    if nonfinite not in ("stop", "skip"):
        raise ConfigError(f"config key `train.nonfinite` must be 'stop' or 'skip', got {nonfinite!r}")
    skips = cfg.get("train", {}).get("max_nonfinite_skips", 3)
    if not isinstance(skips, int) or isinstance(skips, bool) or skips < 0:
        raise ConfigError(f"config key `train.max_nonfinite_skips` must be an integer >= 0, got {skips!r}")
    for method in ("grpo", "opd"):
        _positive(cfg, f"methods.{method}.steps", int)
        _positive(cfg, f"methods.{method}.lr", (int, float))
    if require(cfg, "methods.grpo.group_size", int) < 2:
        raise ConfigError("config key `methods.grpo.group_size` must be at least 2: GRPO's advantages compare samples within a group")
    _positive(cfg, "methods.opd.rollouts_per_prompt", int)
    _positive(cfg, "methods.opd.top_k", int)
    if require(cfg, "tokenizer", dict).get("source") == "hub":
        require(cfg, "tokenizer.path", str)   # the students' tokenizer; its size is known once it is loaded
        vocab = int(cfg["tokenizer"].get("vocab_size") or cfg["methods"]["opd"]["top_k"])
    else:
        vocab = require(cfg, "tokenizer.vocab_size", int)
    if cfg["methods"]["opd"]["top_k"] > vocab:
        raise ConfigError(
            f"config key `methods.opd.top_k` ({cfg['methods']['opd']['top_k']}) exceeds `tokenizer.vocab_size` ({vocab})"
        )
    for study, scfg in require(cfg, "studies", dict).items():
        if not isinstance(scfg, dict):
            raise ConfigError(f"config key `studies.{study}` must be a mapping (a study block), got {scfg!r}")
        if scfg.get("mix") is not None:
            _check_mix(scfg["mix"], f"studies.{study}.mix")
        for domain in scfg.get("domains", []) + ([scfg["domain"]] if "domain" in scfg else []):
            if domain not in cfg["domains"]:
                raise ConfigError(
                    f"config key `studies.{study}` uses domain {domain!r}, which is not in `domains` ({sorted(cfg['domains'])})"
                )
        if scfg.get("student") is not None and scfg["student"] not in cfg["models"]:
            raise ConfigError(f"config key `studies.{study}.student`: {scfg['student']!r} is not in `models` ({sorted(cfg['models'])})")
        for teacher in scfg.get("teachers", []) + ([scfg["teacher"]] if "teacher" in scfg else []):
            if teacher not in cfg["models"]:
                raise ConfigError(
                    f"config key `studies.{study}` uses teacher {teacher!r}, which is not in `models` ({sorted(cfg['models'])})"
                )
    for study in cfg["studies"]:  # each study's own checks (an unknown study is named by the planner)
        if study in REGISTRY:
            REGISTRY[study].validate(cfg)
    if "student" not in cfg["models"]:
        raise ConfigError("config key `models.student` is missing: every study trains the student")


def _check_mix(value: Any, dotted: str) -> None:
    if value not in MIXES:
        raise ConfigError(f"config key `{dotted}` must be one of {list(MIXES)} (equal share per domain, or share by pool size), "
                          f"got {value!r}")


def _validate_domains(cfg: dict[str, Any]) -> None:
    """Every domain's kind is known, its sizes are positive, and its pools build: non-empty and disjoint.

    The pools are deterministic functions of the config and cheap (well under a second for all domains), so they
    are built here once, before Snakemake schedules anything; a training job builds them again for itself.
    """
    from .domains import KINDS, build_domain, heldout_overlap  # lazy; the domains import no torch

    for name, dcfg in require(cfg, "domains", dict).items():
        kind = require(cfg, f"domains.{name}.kind", str)
        if kind not in KINDS:
            raise ConfigError(f"config key `domains.{name}.kind`: unknown kind {kind!r}; known kinds: {sorted(KINDS)}")
        heldout = require(cfg, f"domains.{name}.heldout", dict)
        if not heldout:
            raise ConfigError(f"config key `domains.{name}.heldout` is empty; give the domain at least one held-out set")
        blocks = {"train": dcfg.get("train")} | {f"heldout.{s}": spec for s, spec in heldout.items()}
        for where, block in blocks.items():
            if block is None:
                continue
            if not isinstance(block, dict):
                raise ConfigError(f"config key `domains.{name}.{where}` must be a mapping, got {block!r}")
            size = block.get("size")
            if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
                raise ConfigError(f"config key `domains.{name}.{where}.size` must be a positive integer, or null for every "
                                  f"instance; got {size!r} (an empty data set)")
        if getattr(KINDS[kind], "LAZY_POOLS", False):
            # Hub data sets load in the jobs (on the cluster, with the hub cache), not when the DAG is planned:
            # `snakemake -n` works offline. Their source blocks are checked here; rows are checked by the jobs.
            _check_sources(name, dcfg)
            continue
        try:
            domain = build_domain(dcfg)
            pool, sets = domain.training_pool(), domain.heldout_sets()
        except ConfigError:
            raise
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"config block `domains.{name}` does not build its prompt pools: {err}") from err
        if not pool:
            raise ConfigError(f"config block `domains.{name}.train` yields an empty training pool; raise its size or widen the domain")
        for s, tasks in sets.items():
            if not tasks:
                raise ConfigError(f"config block `domains.{name}.heldout.{s}` yields an empty held-out set; raise its size or drop it")
        problem = heldout_overlap(name, pool, sets)
        if problem:
            raise ConfigError(f"config block `domains.{name}`: {problem}")


def _check_sources(name: str, dcfg: dict[str, Any]) -> None:
    from .domains.hub import SOURCE_KEYS

    blocks = {"train": dcfg.get("train")} | {f"heldout.{s}": spec for s, spec in dcfg["heldout"].items()}
    for where, block in blocks.items():
        source = (block or {}).get("source")
        if not isinstance(source, dict) or not source.get("path") or not source.get("split"):
            raise ConfigError(f"config key `domains.{name}.{where}.source` must be a mapping with `path` (hub id or local "
                              f"directory) and `split`, got {source!r}")
        unknown = sorted(set(source) - set(SOURCE_KEYS))
        if unknown:
            raise ConfigError(f"config key `domains.{name}.{where}.source` has unknown keys {unknown}; known: {list(SOURCE_KEYS)}")
