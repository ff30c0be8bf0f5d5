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

from . import schema, tracking
from .errors import ConfigError  # noqa: F401  (re-exported: the error of a bad config)
from .run_shape import train_settings


def default_conf_dir() -> Path:
    return Path.cwd() / "conf"


def compose(overrides: Sequence[str] = (), conf_dir: Path | None = None) -> dict[str, Any]:
    """Compose ``conf/config.yaml`` with Hydra overrides (e.g. ``profile=smoke``) into a plain dict.

    ``${conf_dir:}`` in a value is the conf directory's absolute path: files shipped beside conf/ (the rehearsal's
    data fixtures) are then found from any working directory (``snakemake --directory``, a cluster job's)."""
    conf_dir = Path(conf_dir or default_conf_dir()).resolve()
    if not (conf_dir / "config.yaml").is_file():
        raise ConfigError(f"no config.yaml in {conf_dir}: run from the repository root or pass the conf directory")
    OmegaConf.register_new_resolver("conf_dir", lambda: str(conf_dir), replace=True)
    with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
        try:
            cfg = hydra_compose(config_name="config", overrides=plain_overrides_of_schema_keys(conf_dir, overrides))
        except Exception as err:  # Hydra's own messages name the group/key; keep them, add where they came from
            hint = _override_hint(conf_dir, overrides)
            raise ConfigError(f"could not compose conf/ with overrides {list(overrides)}: {err}{hint}") from err
    resolved = drop_switched_off(OmegaConf.to_container(cfg, resolve=True))
    validate(resolved)
    check_results_dir(resolved["results_dir"])
    return resolved


def plain_overrides_of_schema_keys(conf_dir: Path, overrides: Sequence[str]) -> list[str]:
    """``overrides`` with each plain ``key=value`` of a key the schema declares spelt ``++key=value`` (Hydra's "set or
    add"). conf/ writes only what a profile sets; a key's default is in its schema (:func:`opdgrpo.schema.default`),
    so ``train.engine=vllm`` must work where no conf file names ``train.engine``, without Hydra's ``+``. A key the
    schema does not know stays plain, so Hydra still refuses a misspelt one (and :func:`_override_hint` names the
    closest keys); a config group (``profile=smoke``) is never rewritten."""
    groups = {p.name for p in conf_dir.iterdir() if p.is_dir()}
    out = []
    for override in overrides:
        key = override.split("=", 1)[0]
        plain = "=" in override and not key.startswith(("+", "~")) and "@" not in key and key.split(".")[0] not in groups
        out.append(f"++{override}" if plain and schema.knows(key) else override)
    return out


#: The ``snakemake --config`` keys the workflow reads, and what each does. Snakemake accepts any key there and the
#: workflow would silently ignore a misspelt one (``profle=smoke`` would start the default profile's 80 jobs).
WORKFLOW_KEYS = {
    "profile": "the scale (conf/profile/*.yaml): smoke, tiny, paper, ...",
    "overrides": "Hydra overrides, a list: 'overrides=[\"methods.opd.lr=1e-4\"]'",
    "opdgrpo_cmd": "the command jobs run instead of `python -m opdgrpo.cli`",
    "launch_cmd": "the launcher of multi-process jobs instead of torchrun",
    "gpu_model": "the GPU model SLURM jobs ask for (`--gpus=<model>:<n>`)",
    "slurm_extra": "further sbatch flags for the GPU jobs",
}


def workflow_overrides(config: dict[str, Any]) -> list[str]:
    """The Hydra overrides a ``snakemake --config`` mapping stands for, after refusing what it cannot mean: an unknown
    key (with the closest known ones) or ``overrides`` that is not a list of strings. A single string is read as one
    override (``overrides=methods.opd.lr=1e-4``), not split into characters; Snakemake parses ``[a=1,b=2]`` into a
    list itself."""
    import difflib

    unknown = sorted(set(config) - set(WORKFLOW_KEYS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(WORKFLOW_KEYS), n=2)
        raise ConfigError(
            f"unknown `--config` key(s) {unknown}: the workflow reads only {sorted(WORKFLOW_KEYS)}"
            + (f"; did you mean {close}?" if close else "")
            + "; a setting of conf/ goes in as `--config 'overrides=[\"key=value\"]'`")
    overrides = config.get("overrides", [])
    if isinstance(overrides, str):
        overrides = [overrides]
    if not isinstance(overrides, (list, tuple)) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"`--config overrides` must be a list of Hydra overrides (strings), got {overrides!r}; "
                          "e.g. --config 'overrides=[\"methods.opd.lr=1e-4\",\"seeds=[0]\"]'")
    profile = [f"profile={config['profile']}"] if "profile" in config else []
    return profile + list(overrides)


#: The blocks whose entries a profile may switch off by setting them to null.
SWITCHABLE = ("studies", "models", "domains")


def drop_switched_off(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` without the studies, models and domains set to null.

    A profile built on another (``tiny-map`` on ``tiny``) names what it does not run as ``studies.S1: null``; Hydra
    cannot delete a key from a config file, only from the command line (``~studies.S1``). A domain no study of the
    profile trains on is dropped the same way (``node`` drops the paper's IFEval and knowledge domains), so neither
    its base evaluation nor `opdgrpo fetch` reads its data sets."""
    for block in SWITCHABLE:
        if isinstance(cfg.get(block), dict):
            cfg[block] = {k: v for k, v in cfg[block].items() if v is not None}
    return cfg


def _override_hint(conf_dir: Path, overrides: Sequence[str]) -> str:
    """For an override whose key does not exist (a typo), the closest existing keys or config groups; for a renamed
    key (:data:`opdgrpo.schema.RENAMED_KEYS`), its new name."""
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
        if (note := schema.renamed(key)) is not None:
            hints.append(note)
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
                declared = list(schema.declared_keys(".".join(path)))   # keys with a default and no conf line
                candidates = list(dict.fromkeys([str(k) for k in node] + declared + (groups if not path else [])))
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


def validate(cfg: dict[str, Any]) -> None:
    """Check the config before any compute: against its schemas (``src/opdgrpo/schemas``: every key's type, range and
    allowed values, and no key that nothing reads), then what a schema cannot say: the names one block gives another
    (a study's domains and models) and the domains' pools (built once here). Each study's own keys and rules are
    checked by the planner (:func:`opdgrpo.plan.build.check_studies`), which knows the studies; conf does not."""
    try:
        schema.refuse_renamed(cfg)
        schema.validate(cfg, "config")
    except schema.SchemaError as err:
        raise ConfigError(str(err)) from None
    _validate_domains(cfg)
    _check_model_sources(cfg)
    _check_fsdp_block(cfg["train"])
    _check_engine_blocks(cfg["train"])
    _check_engine_lengths(cfg)
    _check_engine_shares(cfg["train"])
    _check_engine_correction(cfg["methods"], cfg["train"])
    vocab = cfg["tokenizer"].get("vocab_size")
    if vocab is not None and cfg["methods"]["opd"]["kl_top_k"] > vocab:   # a hub tokenizer's size is known once loaded
        raise ConfigError(
            f"config key `methods.opd.kl_top_k` ({cfg['methods']['opd']['kl_top_k']}) exceeds `tokenizer.vocab_size` ({vocab})"
        )
    for study, scfg in cfg["studies"].items():
        _check_names(cfg, study, scfg)
    tracking.check_installed(cfg["train"].get("report_to"))


def _check_model_sources(cfg: dict[str, Any]) -> None:
    """What a source does not read is refused by name: a ``random`` model is built by its base job (no path, no
    revision, no pretraining stage: null, as a hub block's are when a profile turns it random); a tokenizer's
    ``chat`` acts on a scratch-built tokenizer only; a ``hub`` model needs its path."""
    for name, mcfg in cfg["models"].items():
        if mcfg.get("source") == "hub" and not mcfg.get("path"):
            raise ConfigError(f"config key `models.{name}.path`: a `source: hub` model needs a hub id "
                              f"(Qwen/Qwen3-4B-Base) or a local directory")
        if mcfg.get("source") == "random":
            extra = sorted(k for k in ("path", "revision", "pretrain") if mcfg.get(k) is not None)
            if extra:
                raise ConfigError(f"config key `models.{name}.{extra[0]}` does nothing for `source: random` (its base job "
                                  f"builds random weights from the architecture keys and `seed`); remove it")
    for where, spec in [("tokenizer", cfg["tokenizer"])] + [(f"models.{m}.tokenizer", c["tokenizer"])
                                                             for m, c in cfg["models"].items() if c.get("tokenizer")]:
        if spec.get("chat") is not None and spec.get("source") == "hub":
            raise ConfigError(f"config key `{where}.chat` acts on scratch-built tokenizers only (a hub tokenizer has "
                              f"its own chat template); remove it")
        hub_only = sorted(k for k in ("path", "revision") if spec.get(k) is not None)
        if spec.get("source") != "hub" and hub_only:
            raise ConfigError(f"config key `{where}.{hub_only[0]}` acts only with `{where}.source: hub` (a scratch "
                              f"tokenizer is built from the domains' texts); set it to null")


def _check_fsdp_block(train: dict[str, Any]) -> None:
    """``train.fsdp``'s settings act only under ``distributed: fsdp``; set under another strategy they would do nothing."""
    train = train_settings(train)
    strategy = str(train["distributed"])
    set_keys = sorted(k for k, v in train["fsdp"].items() if v is not None)
    if set_keys and strategy != "fsdp":
        raise ConfigError(f"config key `train.fsdp` sets {set_keys}, which act only with `train.distributed: fsdp` "
                          f"(it is {strategy!r}): remove the block (`~train.fsdp`) or set `train.distributed=fsdp`")


def _check_engine_blocks(train: dict[str, Any]) -> None:
    """``train.vllm`` and ``train.vllm_alone`` act only under ``train.engine: vllm``."""
    engine = str(train_settings(train)["engine"])
    for key in ("vllm", "vllm_alone"):
        if train.get(key) and engine != "vllm":
            raise ConfigError(f"config key `train.{key}` acts only with `train.engine: vllm` (it is {engine!r}): "
                              f"remove it (`~train.{key}`) or set `train.engine=vllm`")


def _check_engine_lengths(cfg: dict[str, Any]) -> None:
    """A ``max_model_len`` no longer than the new tokens a job generates leaves no room for any prompt: vLLM would
    refuse every row (the engine checks the job's real longest prompt as it starts; this catches the sure case now)."""
    train = cfg["train"]
    new = {"vllm": int(train["max_new_tokens"]),
           "vllm_alone": max(int(train["max_new_tokens"]),
                             int(schema.with_defaults((cfg.get("pretrain") or {}).get("eval") or {},
                                                      "config.schema.yaml#/$defs/pretrain", "eval")["max_new_tokens"]))}
    for key, tokens in new.items():
        length = (train.get(key) or {}).get("max_model_len")
        if length is not None and int(length) <= tokens:
            raise ConfigError(f"config key `train.{key}.max_model_len` ({length}) leaves no room for a prompt beside "
                              f"{tokens} new tokens; leave it unset (the engine takes each job's longest row)")


def _check_engine_shares(train: dict[str, Any]) -> None:
    """A share or ``max_num_seqs`` set by hand in ``train.vllm`` or ``train.vllm_alone`` is a fraction of the GPU in
    (0, 1] and a whole number of rows: vLLM would refuse anything else as the job's engine starts, hours later."""
    from .job_identity import hand_set

    for key in ("vllm", "vllm_alone"):
        hand_set(train.get(key) or {}, f"train.{key}")


def _check_engine_correction(methods: dict[str, Any], train: dict[str, Any]) -> None:
    """``engine_is_cap`` weights GRPO's policy-gradient terms by the engine/trainer ratio of the sampled token: it
    needs the engine's log-probs (``train.engine: vllm``), and OPD has no term it corrects (docs/method.md)."""
    if methods["opd"].get("engine_is_cap") is not None:
        raise ConfigError("config key `methods.opd.engine_is_cap` does nothing OPD can use: its top-k KL at a "
                          "position does not depend on the token sampled there, so the sampled token's ratio corrects "
                          "nothing (the state distribution's correction would be the prefix's ratio); remove it")
    engine = str(train_settings(train)["engine"])
    if methods["grpo"].get("engine_is_cap") is not None and engine != "vllm":
        raise ConfigError(f"config key `methods.grpo.engine_is_cap` acts only with `train.engine: vllm` (it is "
                          f"{engine!r}: the sampler is the trainer's own model); set `methods.grpo.engine_is_cap=null`")


def _check_names(cfg: dict[str, Any], study: str, scfg: dict[str, Any]) -> None:
    """A study's domains, student and teachers are blocks of `domains` and `models`."""
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


def _validate_domains(cfg: dict[str, Any]) -> None:
    """Every domain's kind is known and its pools build: non-empty and disjoint (the schema checked the rest).

    The pools are deterministic functions of the config and cheap (well under a second for all domains), so they
    are built here once, before Snakemake schedules anything; a training job builds them again for itself.
    """
    from .domains import KINDS, build_domain, heldout_overlap  # lazy; the domains import no torch

    for name, dcfg in cfg["domains"].items():
        kind = dcfg["kind"]
        if kind not in KINDS:
            raise ConfigError(f"config key `domains.{name}.kind`: unknown kind {kind!r}; known kinds: {sorted(KINDS)}")
        for key, lacks in (("interference", "no shared form (only the tiny synthetic kinds do)"),
                           ("pretrain_slip", "no pretraining stage (only the tiny synthetic kinds pretrain their base "
                                             "models)")):
            if float(dcfg.get(key) or 0) > 0 and not hasattr(KINDS[kind], "SHARED_WRAP"):   # the tiny kinds' mark
                raise ConfigError(f"config key `domains.{name}.{key}`: kind {kind!r} has {lacks}; remove the key or "
                                  f"set it to 0")
        if getattr(KINDS[kind], "LAZY_POOLS", False):
            # Hub data sets load in the jobs (on the cluster, with the hub cache), not when the DAG is planned:
            # `snakemake -n` works offline. Their source blocks are checked here, and the domain is built (its
            # constructor checks its own keys, loading nothing); rows are checked by the jobs.
            _check_sources(name, dcfg)
            try:
                build_domain(dcfg)
            except (ValueError, KeyError, TypeError) as err:
                raise ConfigError(f"config block `domains.{name}`: {err}") from err
            continue
        sets = {"train": dcfg.get("train")} | {f"heldout.{s}": spec for s, spec in dcfg["heldout"].items()}
        for where in [w for w, block in sets.items() if isinstance(block, dict) and "keep" in block]:
            raise ConfigError(f"config key `domains.{name}.{where}.keep`: kind {kind!r} generates its tasks, it "
                              f"reads no data set whose rows `keep` could select (hub kinds only); remove the key")
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
    """A hub domain's data sets: each block names its source (the schema checks what a source may hold)."""
    blocks = {"train": dcfg.get("train")} | {f"heldout.{s}": spec for s, spec in dcfg["heldout"].items()}
    for where, block in blocks.items():
        if not isinstance((block or {}).get("source"), dict):
            raise ConfigError(f"config key `domains.{name}.{where}.source` must be a mapping with `path` (hub id or local "
                              f"directory) and `split`, got {(block or {}).get('source')!r}")
