"""``opdgrpo fetch --profile paper``: put every hub model, tokenizer and data set the planned jobs read into the
Hugging Face caches, on a machine with network, before the jobs run on nodes without it.

It takes the plan's jobs (the command line composes the profile and plans it, as every subcommand does) and lists
what each reads (:func:`opdgrpo.stages.hub_cache.job_items`): what no job reads is named and not fetched. Each item
is then local (a directory: checked, not fetched), already cached (found without network: nothing is downloaded),
or fetched with the jobs' own calls; a failure is reported with the item's config key and the library's reason,
and the others go on. ``--dry-run`` lists and checks the caches without any request to the hub.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .hub_cache import Item, check, config_items, download, is_local, job_items, merge, offline_mode, size
from .hub_models import MODEL_FILES


@dataclass
class Outcome:
    """What became of one item: ``status`` is local, cached, fetched, to fetch (a dry run) or failed."""

    item: Item
    status: str
    files: list[Path] = field(default_factory=list)
    error: str = ""


def fetch_item(item: Item, dry_run: bool = False) -> Outcome:
    """Check ``item`` without network; fetch it when it is not there (unless ``dry_run``)."""
    try:
        local = is_local(item)
        try:
            return Outcome(item, "local" if local else "cached", check(item))
        except Exception:
            if local:   # a local copy that does not load: there is nowhere to fetch it from
                raise
        if dry_run:
            return Outcome(item, "to fetch")
        return Outcome(item, "fetched", download(item))
    except Exception as err:   # one item's failure is reported; the others go on
        return Outcome(item, "failed", error=f"{type(err).__name__}: {_one_line(err)}")


def used_items(jobs: Iterable[Any]) -> list[Item]:
    """What the planned jobs read (``jobs``: the plan's :class:`~opdgrpo.plan.planner.Job` s), one item per thing."""
    return merge(item for job in jobs for item in job_items(job.kind, job.config, job.label))


def run(cfg: Mapping[str, Any], jobs: list[Any], dry_run: bool = False, out: Callable[[str], None] = print) -> int:
    """Fetch (or, ``dry_run``, list) every item the jobs read; print one line per item and a total. Returns 1 if
    any item failed, else 0."""
    from datasets import config as datasets_config
    from huggingface_hub import constants

    used = sorted(used_items(jobs), key=lambda item: item.kind != "model")   # models first, then data sets
    seen = {item.identity for item in used}
    unused = [item for item in merge(config_items(cfg)) if item.identity not in seen]
    out(f"# opdgrpo fetch{' --dry-run' if dry_run else ''}: profile `{cfg.get('profile')}`, {len(used)} item(s) read by "
        f"{len(jobs)} planned job(s), from {constants.ENDPOINT}")
    out(f"# into the hub cache {constants.HF_HUB_CACHE} and the datasets cache {datasets_config.HF_DATASETS_CACHE} "
        f"(the jobs must see the same HF_HOME); of a model, the files the jobs load: {' '.join(MODEL_FILES)}")
    if offline_mode() and not dry_run:
        out("# offline mode is on (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE): nothing can be downloaded; unset it here")
    outcomes = []
    for item in used:
        outcomes.append(fetch_item(item, dry_run))
        out(_line(outcomes[-1], constants.ENDPOINT))
    for item in unused:
        out(f"{'unused':9s} {'-':>9s}  {', '.join(item.keys)}: {item.describe()}: read by no planned job, not fetched")
    out(_total(outcomes))
    return 1 if any(o.status == "failed" for o in outcomes) else 0


def _line(o: Outcome, endpoint: str) -> str:
    item = o.item
    where = f"{', '.join(item.keys)}: {item.describe()}"
    if o.status == "failed":
        return f"{'FAILED':9s} {'-':>9s}  {where}: {o.error}"
    if o.status == "local":
        return f"{o.status:9s} {_human(size(o.files)):>9s}  {where}: a local path, checked, not fetched"
    if o.status == "cached":
        return f"{o.status:9s} {_human(size(o.files)):>9s}  {where}: already in the cache, not downloaded"
    url = f"{endpoint}/{'datasets/' if item.kind == 'dataset' else ''}{item.path}"
    sized = _human(size(o.files)) if o.files else "-"
    return f"{o.status:9s} {sized:>9s}  {where} from {url}"


def _total(outcomes: list[Outcome]) -> str:
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    failed = [k for o in outcomes if o.status == "failed" for k in o.item.keys]
    text = (f"total: {_human(size(f for o in outcomes for f in o.files))} on disk for {len(outcomes)} item(s) ("
            + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")")
    return text + (f"; failed: {', '.join(failed)}" if failed else "")


def _human(n: float) -> str:
    units = ("B", "kB", "MB", "GB", "TB")
    i = 0
    while n >= 1000 and i < len(units) - 1:
        n, i = n / 1000, i + 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())
