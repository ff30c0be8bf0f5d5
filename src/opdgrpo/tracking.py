"""Experiment tracking where researchers look: TensorBoard, Weights & Biases, trackio (``train.report_to``, TRL's key).

Every backend gets the same numbers: each ledger line as ``train/<key>`` scalars (reward, loss, gradient norm, mean
response length, learning rate, FLOPs by component and cumulative, tokens by kind, the method's metrics, OPD's
per-teacher diagnostics as ``train/teachers/<domain>/<stat>``, wall time and FLOP/s; a null value, such as an
unscored teacher's ``accuracy``, is left out rather than logged as 0) and each evaluation as
``eval/<domain>/<set>/<metric>``, at the training step; the run id is the run's name and its resolved config is
attached. Everything is written inside the run directory (a job writes only its
own), so ``tensorboard --logdir results/<profile>/runs`` shows every run of a profile at once.

* ``tensorboard``: event files in ``<run>/tensorboard/`` (a resumed run purges the steps after its checkpoint).
* ``wandb``: offline unless ``WANDB_MODE`` says otherwise (``wandb sync <run>/wandb/offline-run-*`` uploads), in
  ``<run>/wandb/``, the run id derived from the run's, so a resumed job continues the same W&B run.
* ``trackio``: a local trackio project in ``<run>/trackio/`` (``TRACKIO_DIR`` overrides; ``trackio show``).

Each is an optional extra (``pip install -e '.[tracking]'``); asking for one that is not installed is an error that
names the extra, raised before the run starts.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger("opdgrpo.tracking")

#: The Python module each backend needs (``train.report_to`` values besides ``none``; see the train schema).
MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


def backends(report_to: Any) -> list[str]:
    """``train.report_to`` as a list of backends (``none``, a name, or a list of names)."""
    if report_to in (None, "none"):
        return []
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    return [n for n in names if n != "none"]


def check_installed(report_to: Any) -> None:
    for name in backends(report_to):
        if importlib.util.find_spec(MODULES[name]) is None:
            raise ValueError(f"config key `train.report_to` asks for {name}, which is not installed: "
                             f"pip install -e '.[tracking]' (or pip install {MODULES[name]})")


def flatten(record: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """Numeric leaves of a ledger line or evaluation result as ``prefix/key/subkey`` scalars."""
    out: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}/{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and value is not None:
            out[name] = float(value)
    return out


def eval_scalars(results: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in results:
        values = {k: v for k, v in r.items() if k not in ("eval_domain", "eval_set", "k", "n_prompts")}
        out.update(flatten(values, f"eval/{r['eval_domain']}/{r['eval_set']}"))
    return out


class Tracker:
    """The run's tracking backends (none: every call does nothing)."""

    def __init__(self, report_to: Any, run_dir: Path, run_id: str, config: dict[str, Any], start: int = 0):
        self.sinks: list[Any] = []
        for name in backends(report_to):
            self.sinks.append({"tensorboard": _TensorBoard, "wandb": _WandB, "trackio": _Trackio}[name](
                Path(run_dir), run_id, config, start))

    def step(self, line: Mapping[str, Any]) -> None:
        scalars = flatten({k: v for k, v in line.items() if k != "step"}, "train")
        for sink in self.sinks:
            sink.log(scalars, int(line["step"]))

    def evaluation(self, record: Mapping[str, Any]) -> None:
        scalars = {**eval_scalars(record["results"]), "eval/cumulative_flops": float(record["cumulative_flops"])}
        for sink in self.sinks:
            sink.log(scalars, int(record["step"]))

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class _TensorBoard:
    def __init__(self, run_dir: Path, run_id: str, config: dict[str, Any], start: int):
        import yaml
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: a resumed run drops what an earlier process logged after its checkpoint
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=start or None)
        if not start:
            self.writer.add_text("config", "```\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, run_dir: Path, run_id: str, config: dict[str, Any], start: int):
        import wandb

        stable_id = hashlib.sha256(f"{run_dir.resolve()}".encode()).hexdigest()[:16]   # same run, same W&B run
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "opdgrpo"), name=run_id, id=stable_id,
                              resume="allow", dir=str(run_dir), config=config,
                              mode=os.environ.get("WANDB_MODE", "offline"))

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        wandb.teardown()   # finish() returns before wandb's service has written the run file; this waits for it


class _Trackio:
    def __init__(self, run_dir: Path, run_id: str, config: dict[str, Any], start: int):
        import sys

        if "trackio" not in sys.modules:   # trackio reads TRACKIO_DIR once, when it is first imported
            os.environ.setdefault("TRACKIO_DIR", str(run_dir / "trackio"))
        import trackio
        from trackio.utils import TRACKIO_DIR

        if Path(TRACKIO_DIR) != run_dir / "trackio":
            log.warning("trackio writes to %s (TRACKIO_DIR when trackio was first imported), not %s", TRACKIO_DIR,
                        run_dir / "trackio")

        self.trackio = trackio
        trackio.init(project=os.environ.get("TRACKIO_PROJECT", "opdgrpo"), name=run_id, config=config,
                     resume="allow", embed=False, auto_log_cpu=False, auto_log_gpu=False)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.trackio.log(scalars, step=step)

    def close(self) -> None:
        self.trackio.finish()
