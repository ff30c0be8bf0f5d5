"""What a job reads from the Hugging Face hub, whether it is already on this machine, and putting it there.

The paper profile's jobs read hub models and tokenizers (``models.<m>`` with ``source: hub``, ``tokenizer``,
``models.<m>.tokenizer``) and data sets (``domains.<d>.train.source``, ``domains.<d>.heldout.<set>.source``). On a
cluster whose compute nodes have no network these must be in the shared caches (``HF_HOME``) before the jobs start:
``opdgrpo fetch`` puts them there (:mod:`opdgrpo.stages.fetch`), and every job checks at its start
(:func:`require_cached`) that what it reads is there, so a node without network fails in seconds, naming the item
and the command that fetches it, instead of after the libraries' network timeouts, halfway into the job.

Checks and downloads are the libraries' own calls, the ones the jobs make: ``snapshot_download`` with the jobs'
``allow_patterns`` (:data:`~opdgrpo.stages.hub_models.MODEL_FILES`; ``local_files_only=True`` to check), and the
jobs' ``datasets.load_dataset`` call (:func:`opdgrpo.domains.hub.load_rows`), with both libraries switched to their
offline mode to check: what a job started with ``HF_DATASETS_OFFLINE=1`` reads is exactly what the check found.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from opdgrpo.domains.hub import load_rows

from .hub_models import MODEL_FILES, local_dir

logger = logging.getLogger(__name__)


@dataclass
class Item:
    """One thing to have on disk: a model or tokenizer snapshot (``kind`` "model", ``spec`` its path and
    revision), or a data set (``kind`` "dataset", ``spec`` its ``source`` block); ``keys`` are the config keys that
    name it (a tokenizer from its model's repo is the model's snapshot: one item, two keys)."""

    kind: str
    spec: dict[str, Any]
    keys: list[str] = field(default_factory=list)

    @property
    def identity(self) -> str:
        return json.dumps([self.kind, self.spec], sort_keys=True, default=str)

    @property
    def path(self) -> str:
        return str(self.spec["path"])

    def describe(self) -> str:
        """The hub id and revision (or the local path) and what of it, as a person reads it."""
        parts = [f"{k} {self.spec[k]}" for k in ("name", "split", "data_files") if self.spec.get(k)]
        if not Path(self.path).expanduser().exists():
            parts.append(f"revision {self.spec.get('revision') or 'main'}")
        return f"{self.path} ({', '.join(parts)})" if parts else self.path


def _model(block: Mapping[str, Any], key: str) -> list[Item]:
    if not isinstance(block, Mapping) or block.get("source") != "hub" or not block.get("path"):
        return []
    return [Item("model", {"path": str(block["path"]), "revision": block.get("revision")}, [key])]


def _data_sets(domains: Mapping[str, Any], roles: tuple[str, ...]) -> list[Item]:
    """The ``source`` blocks of ``domains`` (``train`` and/or ``heldout``); the tiny world's domains have none."""
    items = []
    for name, domain in domains.items():
        blocks = {}
        if "train" in roles and isinstance(domain.get("train"), Mapping):
            blocks[f"domains.{name}.train.source"] = domain["train"]
        if "heldout" in roles:
            blocks.update({f"domains.{name}.heldout.{s}.source": spec for s, spec in (domain.get("heldout") or {}).items()})
        items += [Item("dataset", dict(spec["source"]), [key]) for key, spec in blocks.items()
                  if isinstance(spec, Mapping) and isinstance(spec.get("source"), Mapping)]
    return items


def job_items(kind: str, cfg: Mapping[str, Any], label: str = "") -> list[Item]:
    """What a planned job reads from the hub, by its kind and resolved config (``label``: a tokenizer job's owner
    model, the planner's job label, "" for the profile's ``tokenizer``)."""
    if kind == "tokenizer":
        return _model(cfg.get("tokenizer"), f"models.{label}.tokenizer.path" if label else "tokenizer.path")
    if kind == "base":   # the model, and the held-out sets it is evaluated on
        evaluates = (cfg.get("pretrain") or {}).get("eval", {}).get("max_prompts") != 0
        return _model(cfg.get("model"), f"models.{cfg.get('name')}.path") + (
            _data_sets(cfg.get("domains") or {}, ("heldout",)) if evaluates else [])
    if kind in ("difficulty", "train"):   # training pools are decontaminated against the held-out sets: both load
        return _data_sets(cfg.get("domains") or {}, ("train", "heldout"))
    return []


def config_items(cfg: Mapping[str, Any]) -> list[Item]:
    """Everything a composed config names on the hub, used or not."""
    items = _model(cfg.get("tokenizer"), "tokenizer.path")
    for name, block in (cfg.get("models") or {}).items():
        items += _model(block, f"models.{name}.path") + _model(block.get("tokenizer"), f"models.{name}.tokenizer.path")
    return items + _data_sets(cfg.get("domains") or {}, ("train", "heldout"))


def merge(items: Iterable[Item]) -> list[Item]:
    """One item per thing on disk, in first-seen order, with every key that names it."""
    out: dict[str, Item] = {}
    for item in items:
        kept = out.setdefault(item.identity, Item(item.kind, item.spec, []))
        kept.keys += [k for k in item.keys if k not in kept.keys]
    return list(out.values())


def offline_mode() -> bool:
    """Whether this process may not use the network: the libraries' own switches, read when they were imported
    (``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``)."""
    import datasets.config
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE)


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Both libraries in their offline mode for the block (what ``HF_HUB_OFFLINE=1`` sets when they are imported):
    ``load_dataset`` then reads its cache, and no request leaves the process. Their cache notices are silenced."""
    import datasets
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE, datasets.logging.get_verbosity()
    constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    datasets.logging.set_verbosity_error()
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved[:2]
        datasets.logging.set_verbosity(saved[2])


def is_local(item: Item) -> bool:
    """A local directory (or, for a data set, a local file) rather than a hub id."""
    if item.kind == "model":
        return local_dir(item.path, item.keys[0]) is not None
    return Path(item.path).expanduser().exists()


def check(item: Item) -> list[Path]:
    """The files ``item`` occupies on this machine, found without network; raises if it is not all there."""
    if item.kind == "model":
        local = local_dir(item.path, item.keys[0])
        if local is not None:
            return _files(local)
        from huggingface_hub import snapshot_download

        with _offline():
            return _files(Path(snapshot_download(item.path, revision=item.spec.get("revision"), allow_patterns=MODEL_FILES,
                                                 local_files_only=True)))
    with _offline():
        return _data_set_files(item, _load(item))


def download(item: Item) -> list[Path]:
    """Put ``item`` in the caches with the jobs' own call; the files it then occupies."""
    if item.kind == "model":
        from huggingface_hub import snapshot_download

        return _files(Path(snapshot_download(item.path, revision=item.spec.get("revision"), allow_patterns=MODEL_FILES)))
    return _data_set_files(item, _load(item))


def _load(item: Item):
    """The jobs' ``load_dataset`` call, raising the library's own error (not load_rows' advice) for the caller."""
    try:
        return load_rows(item.spec, item.keys[0])
    except ValueError as err:
        raise (err.__cause__ or err) from None


def _files(root: Path) -> list[Path]:
    """Every file under ``root``, links followed (a hub snapshot links into the cache's blobs)."""
    return [p.resolve() for p in sorted(root.rglob("*")) if p.is_file()] if root.is_dir() else [root.resolve()]


def _data_set_files(item: Item, rows) -> list[Path]:
    """A loaded split's Arrow files, and the source it was built from: the local copy, or the repo's files in the
    hub cache (where ``datasets`` downloads them)."""
    files = [Path(f["filename"]).resolve() for f in rows.cache_files]
    if Path(item.path).expanduser().exists():
        return files + _files(Path(item.path).expanduser())
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        repos = scan_cache_dir().repos
    except CacheNotFound:
        return files
    for repo in repos:
        if repo.repo_type == "dataset" and repo.repo_id == item.path:
            files += [f.blob_path.resolve() for rev in repo.revisions for f in rev.files]
    return files


def size(files: Iterable[Path]) -> int:
    """Bytes on disk of ``files``, each counted once."""
    return sum(p.stat().st_size for p in set(files) if p.exists())


def require_cached(kind: str, cfg: Mapping[str, Any], label: str = "", profile: str = "<profile>") -> None:
    """A job's first step: every hub model, tokenizer and data set it reads is on this machine, checked without
    network. Missing ones fail the job here in offline mode (``HF_HUB_OFFLINE=1`` or ``HF_DATASETS_OFFLINE=1``, what
    a cluster without network on its compute nodes sets), naming each item's config key and the command that fetches
    it; with network they are logged and the job downloads them as it reads them."""
    items = merge(job_items(kind, cfg, label))
    missing = []
    for item in items:
        try:
            check(item)
        except Exception as err:   # not there, or not all of it: the library's reason
            missing.append(f"config key `{'`, `'.join(item.keys)}`: {item.describe()} is not on this machine "
                           f"({type(err).__name__}: {_first_line(err)})")
    if not missing:
        return
    fetch = (f"`opdgrpo fetch --profile {profile}` (with the overrides the jobs were planned with) on a node with "
             f"network, with the jobs' HF_HOME")
    if offline_mode():
        raise ValueError("\n".join(missing) + f"\nOffline mode is on (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE), so this "
                         f"job cannot download them: run {fetch}, then rerun the job")
    logger.warning("%s\nthis job downloads them now; on a node without network set HF_HUB_OFFLINE=1 so jobs fail at "
                   "their start instead, and run %s first", "\n".join(missing), fetch)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0]
