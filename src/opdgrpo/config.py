"""Compose and validate the Hydra configuration (``conf/``), the single source of truth.

The Snakefile and the CLI both call :func:`compose`; nothing downstream reads ``conf/`` again: jobs
receive their resolved run config from the plan.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import OmegaConf


class ConfigError(ValueError):
    """A problem in the configuration, with the key that causes it and what would fix it."""


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
            raise ConfigError(f"could not compose conf/ with overrides {list(overrides)}: {err}") from err
    resolved = OmegaConf.to_container(cfg, resolve=True)
    validate(resolved)
    return resolved


def require(cfg: dict[str, Any], dotted: str, kind: type | tuple[type, ...] | None = None) -> Any:
    """The value at a dotted key, or a ConfigError naming the key."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"missing config key `{dotted}`; add it to conf/ or pass `{dotted}=...`")
        node = node[part]
    if kind is not None and not isinstance(node, kind) or (kind in (int, float) and isinstance(node, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(f"config key `{dotted}` must be {names}, got {node!r}")
    return node


def _positive(cfg: dict[str, Any], dotted: str, number: type | tuple = (int, float)) -> None:
    value = require(cfg, dotted, number)
    if value <= 0:
        raise ConfigError(f"config key `{dotted}` must be > 0, got {value!r}")


def validate(cfg: dict[str, Any]) -> None:
    """Check the keys every stage relies on before any compute starts."""
    require(cfg, "profile", str)
    require(cfg, "results_dir", str)
    seeds = require(cfg, "seeds", list)
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ConfigError(f"config key `seeds` must be a non-empty list of integers, got {seeds!r}")
    _positive(cfg, "threads", int)
    for name in require(cfg, "models", dict):
        require(cfg, f"models.{name}.pretrain.thinking_fraction", (int, float))
        _positive(cfg, f"models.{name}.pretrain.steps", int)
    for name in require(cfg, "domains", dict):
        require(cfg, f"domains.{name}.kind", str)
        require(cfg, f"domains.{name}.heldout", dict)
    for key in ("prompts_per_step", "max_new_tokens", "eval_every", "checkpoint_every"):
        _positive(cfg, f"train.{key}", int)
    _positive(cfg, "train.eval.k", int)
    nonfinite = cfg.get("train", {}).get("nonfinite", "stop")
    if nonfinite not in ("stop", "skip"):
        raise ConfigError(f"config key `train.nonfinite` must be 'stop' or 'skip', got {nonfinite!r}")
    skips = cfg.get("train", {}).get("max_nonfinite_skips", 3)
    if not isinstance(skips, int) or isinstance(skips, bool) or skips < 0:
        raise ConfigError(f"config key `train.max_nonfinite_skips` must be an integer >= 0, got {skips!r}")
    for method in ("grpo", "opd"):
        _positive(cfg, f"methods.{method}.steps", int)
        _positive(cfg, f"methods.{method}.lr", float)
    if require(cfg, "methods.grpo.group_size", int) < 2:
        raise ConfigError("config key `methods.grpo.group_size` must be at least 2: GRPO's advantages compare samples within a group")
    _positive(cfg, "methods.opd.rollouts_per_prompt", int)
    _positive(cfg, "methods.opd.top_k", int)
    vocab = require(cfg, "tokenizer.vocab_size", int)
    if cfg["methods"]["opd"]["top_k"] > vocab:
        raise ConfigError(
            f"config key `methods.opd.top_k` ({cfg['methods']['opd']['top_k']}) exceeds `tokenizer.vocab_size` ({vocab})"
        )
    for study, scfg in require(cfg, "studies", dict).items():
        for domain in scfg.get("domains", []) + ([scfg["domain"]] if "domain" in scfg else []):
            if domain not in cfg["domains"]:
                raise ConfigError(
                    f"config key `studies.{study}` uses domain {domain!r}, which is not in `domains` ({sorted(cfg['domains'])})"
                )
        for teacher in scfg.get("teachers", []) + ([scfg["teacher"]] if "teacher" in scfg else []):
            if teacher not in cfg["models"]:
                raise ConfigError(
                    f"config key `studies.{study}` uses teacher {teacher!r}, which is not in `models` ({sorted(cfg['models'])})"
                )
    if "S2" in cfg["studies"]:
        _validate_s2(cfg)
    if "student" not in cfg["models"]:
        raise ConfigError("config key `models.student` is missing: every study trains the student")


def _validate_s2(cfg: dict[str, Any]) -> None:
    """S2's selection rule must yield non-empty subsets and a sensible comparison."""
    for key in ("pool_size", "k", "student_bins", "teacher_bins", "batch_size"):
        _positive(cfg, f"studies.S2.{key}", int)
    s2 = cfg["studies"]["S2"]
    n = s2["student_bins"] * s2["teacher_bins"]
    if s2["pool_size"] < n:
        raise ConfigError(f"config key `studies.S2.pool_size` ({s2['pool_size']}) must be at least student_bins x teacher_bins ({n})")
    low = require(cfg, "studies.S2.low_teacher_subsets", int)
    if not 0 <= low <= n:
        raise ConfigError(f"config key `studies.S2.low_teacher_subsets` must be in [0, {n}] (the number of subsets), got {low}")
