"""The ``opdgrpo`` command: what Snakemake's thin rules call, and what a user runs by hand.

Subcommands: ``plan`` (print the jobs), ``fetch`` (fill the Hugging Face caches with what the jobs read from the hub),
``tokenizer``, ``pretrain``, ``difficulty`` (S2's subsets), ``train`` (one job each, given its resolved config as JSON),
``report``, ``savings`` and ``flops`` (the cost model: ``opdgrpo flops estimate``), ``slots`` (a machine's GPU slots
and who holds them). Each job first checks that the hub
models and data sets it reads are on the machine (:func:`opdgrpo.stages.hub_cache.require_cached`) and, where it
scores code, says which sandbox runs it and refuses hub code data without confined reads
(:func:`opdgrpo.sandbox.guard.check_job`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Sequence


def _job_config(args) -> dict:
    """The job's config, with the runtime keys the rules pass beside it and renamed keys by their current names
    (:func:`opdgrpo.job_identity.with_runtime`), and the engine settings the rules pass beside it
    (:func:`_engine_settings`)."""
    from .job_identity import with_runtime

    cfg = json.loads(args.config_json) if args.config_json else json.loads(Path(args.config_file).read_text())
    return _engine_settings(args, with_runtime(cfg))


def _engine_settings(args, cfg: dict) -> dict:
    """``cfg`` with the engine settings the rules export for this job (:func:`opdgrpo.job_identity.engine_settings_of`,
    by its ``--out``: the plan's share and ``max_num_seqs``, or a value set by hand, which the job's identity leaves
    out) in the engine block it reads: a training job's ``train.vllm``, a sampling job's ``vllm``."""
    from .job_identity import ENGINE_ENV, engine_settings_of, with_engine_settings

    training = "run_id" in cfg   # a training job's config (the plan's); a sampling job's has its own `vllm` block
    values = engine_settings_of(args.out)
    if not values:
        if training and ENGINE_ENV not in os.environ and _colocated_without_share(cfg):
            logging.getLogger("opdgrpo").warning(
                "this training job's vLLM engine has no share of the GPU (train.vllm.gpu_memory_utilization) and "
                "the rules' %s is not set: vLLM takes its default 0.9 beside the trainer. Run it through "
                "Snakemake, export the rules' variable, or set the share in the job's config (`opdgrpo resources` "
                "prints the plan's)", ENGINE_ENV)
        return cfg
    try:
        return with_engine_settings(cfg, ("train", "vllm") if training else ("vllm",), values)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from err


def _colocated_without_share(cfg: dict) -> bool:
    """A training job whose vLLM engine shares a GPU with the trainer and has no share set."""
    import torch

    from .run_shape import train_settings

    train = train_settings(cfg["train"])
    return train["engine"] == "vllm" and torch.cuda.is_available() and "gpu_memory_utilization" not in train["vllm"]


def _require_cached(kind: str, cfg: dict, out: Path) -> None:
    """The job's hub inputs are on this machine (or, with network, will be fetched): before any compute. The job's
    directory is ``<results_dir>/<profile>/<stage>/<job>`` (the planner's), which names the profile to fetch for and
    a tokenizer job's owner model (``tokenizer-<model>``)."""
    from opdgrpo.stages.hub_cache import require_cached

    out = Path(out).absolute()
    label = out.name.removeprefix("tokenizer").lstrip("-") if kind == "tokenizer" else ""
    require_cached(kind, cfg, label, out.parent.parent.name or "<profile>")


def _check_sandbox(cfg: dict) -> str | None:
    """The job's code domains (its config's ``domains``: the planner gives each job the ones it uses): which sandbox
    runs their programs here and what it confines, logged and returned; a job scoring code on hub data refuses to
    start where reads are not confined (:func:`opdgrpo.sandbox.guard.check_job`)."""
    from opdgrpo.domains import KINDS
    from opdgrpo.domains.code import CodeDomain
    from opdgrpo.domains.hub_code import HubCodeDomain
    from opdgrpo.sandbox.guard import check_job

    kinds = {name: KINDS.get(str(d.get("kind"))) for name, d in (cfg.get("domains") or {}).items()}
    code = sorted(n for n, k in kinds.items() if k is not None and issubclass(k, (CodeDomain, HubCodeDomain)))
    return check_job(code, [n for n in code if issubclass(kinds[n], HubCodeDomain)], cfg)  # type: ignore[arg-type]


def _add_job_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, type=Path, help="the job's output directory")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--config-json", help="the job's resolved config as a JSON string (what Snakemake passes)")
    group.add_argument("--config-file", help="the job's resolved config in a JSON file")


def cmd_plan(args) -> int:
    from opdgrpo.plan.build import build_plan

    from .config import compose

    plan = build_plan(compose(args.overrides, args.conf_dir))
    for job in plan.jobs.values():
        print(f"{job.id:40s} {job.kind:9s} studies={','.join(job.studies) or '-':20s} upstream={','.join(job.upstream)}")
    return 0


def cmd_fetch(args) -> int:
    from opdgrpo.plan.build import build_plan
    from opdgrpo.stages.fetch import run

    from .config import compose

    cfg = compose(([f"profile={args.profile}"] if args.profile else []) + list(args.overrides), args.conf_dir)
    for name in ("httpx", "httpx2"):   # one line per item is the report, not one per HTTP request
        logging.getLogger(name).setLevel(logging.WARNING)
    return run(cfg, list(build_plan(cfg).jobs.values()), dry_run=args.dry_run)


def cmd_tokenizer(args) -> int:
    from opdgrpo.train.tokenizer import build_tokenizer, save_tokenizer

    from .runio import write_json

    cfg = _job_config(args)
    if cfg["tokenizer"].get("source") == "hub":   # paper scale: the students' own tokenizer
        from opdgrpo.stages.hub_models import save_hub_tokenizer

        _require_cached("tokenizer", cfg, args.out)
        write_json(args.out / "done.json", {"vocab_size": save_hub_tokenizer(cfg["tokenizer"], args.out),
                                            "source": "hub", "path": str(cfg["tokenizer"]["path"])})
        return 0
    spec = cfg["tokenizer"]
    tok = build_tokenizer(cfg["domains"], int(spec["vocab_size"]), int(spec["samples_per_domain"]), int(cfg["seed"]),
                          chat=bool(spec.get("chat")))
    save_tokenizer(tok, args.out)
    write_json(args.out / "done.json", {"vocab_size": len(tok)})
    return 0


def cmd_pretrain(args) -> int:
    from opdgrpo.stages.pretrain import pretrain

    cfg = _job_config(args)
    _require_cached("base", cfg, args.out)
    _check_sandbox(cfg)
    if cfg["model"].get("source") in ("hub", "random"):   # paper scale: a hub model (or the rehearsal's random one), linked and evaluated
        from opdgrpo.stages.hub_models import fetch_base

        summary = fetch_base(cfg, args.out, collective_timeout_s=args.collective_timeout)
    elif int(os.environ.get("WORLD_SIZE", "1")) > 1:   # N processes would each pretrain and write the same model
        print(f"error: model {cfg.get('name')!r} is pretrained from scratch, in one process, but "
              f"{os.environ['WORLD_SIZE']} were started: set resources.base.processes=1 (several processes split the "
              "evaluation of hub or random models only)", file=sys.stderr)
        return 2
    else:
        summary = pretrain(cfg, args.out)
    if summary:   # under torchrun the main process writes and reports
        print(json.dumps({k: summary[k] for k in ("model", "steps", "parameters", "heldout", "wall_s")}))
    return 0


def cmd_train(args) -> int:
    """Exit 0 done, 130 interrupted by a signal (checkpointed: a retry or rerun resumes), 3 a non-finite step,
    4 a retry that refuses to train (opdgrpo.attempts), 1 an upstream output that is not whole, a checkpoint that
    cannot be resumed as set now, a sandbox that would not confine reads of hub data, or any other error."""
    from opdgrpo.sandbox.guard import UnconfinedReads
    from opdgrpo.train.checkpoint import ResumeRefused
    from opdgrpo.train.finished import BrokenUpstream
    from opdgrpo.train.loop import Interrupted, NonFinite, train

    from . import attempts

    main_process = int(os.environ.get("RANK", "0")) == 0   # under torchrun only rank 0 keeps the attempt records
    if main_process:
        try:
            attempts.begin(args.out, args.attempt)
        except attempts.NotRetried as err:
            print(f"error: {err}", file=sys.stderr)
            return attempts.NOT_RETRIED

    def ended(how: str, error: str | None = None, why: str | None = None) -> None:
        if main_process:
            attempts.end(args.out, args.attempt, how, error, why)

    try:
        cfg = _job_config(args)
        _require_cached("train", cfg, args.out)
        _check_sandbox(cfg)
        summary = train(cfg, args.out, collective_timeout_s=args.collective_timeout)
    except Interrupted as err:
        print(err, file=sys.stderr)
        ended("interrupted", why=err.why)
        return attempts.INTERRUPTED
    except NonFinite as err:   # a NaN/inf step: the message names the run, step and component
        print(f"error: {err}", file=sys.stderr)
        ended("nonfinite", str(err))
        return attempts.NONFINITE
    except (BrokenUpstream, ResumeRefused, UnconfinedReads) as err:   # refused at the start, naming the file or key
        print(f"error: {err}", file=sys.stderr)
        ended("refused", str(err))
        return 1
    except BaseException as err:   # a crash (or KeyboardInterrupt outside the loop): recorded, then raised as ever
        ended("crashed", f"{type(err).__name__}: {err}")
        raise
    ended("done")
    print(json.dumps({k: summary[k] for k in ("run", "steps", "cumulative_flops", "final_eval", "wall_s")}))
    return 0


def cmd_difficulty(args) -> int:
    from opdgrpo.stages.difficulty import select
    from opdgrpo.train.finished import BrokenUpstream

    cfg = _job_config(args)
    _require_cached("difficulty", cfg, args.out)
    _check_sandbox(cfg)
    try:
        summary = select(cfg, args.out)
    except BrokenUpstream as err:   # a base model's output that is not whole: named, with the command that redoes it
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps({k: summary[k] for k in ("domain", "prompts", "subsets", "wall_s")}))
    return 0


def cmd_slots(args) -> int:
    """Each GPU slot of the profile's machine: free, or the job and the processes holding it."""
    from .config import compose
    from .cost.gpu_counts import Machine
    from .gpu_slots import slots_status

    cfg = compose(([f"profile={args.profile}"] if args.profile else []) + list(args.overrides), args.conf_dir)
    machine = Machine.of(cfg)
    if machine is None:
        print(f"error: profile {cfg['profile']!r} has no `machine` block, so its jobs claim no GPU slots (add one: "
              "docs/one-machine.md; under SLURM, SLURM assigns the devices)", file=sys.stderr)
        return 2
    directory = Path(machine.directory(cfg))
    print(f"GPU slots of machine.gpus = {machine.gpus} in {directory.absolute()}:")
    for line in slots_status(directory):
        print(f"  {line}")
    return 0


def _forward(module: str, argv: Sequence[str]) -> int:
    """``report`` and ``savings`` own their argument parsers; pass the rest of the line through."""
    import importlib

    return importlib.import_module(module).main(list(argv)) or 0


FORWARDED = {"report": "opdgrpo.report.build", "savings": "opdgrpo.report.savings", "flops": "opdgrpo.cost.cli",
             "resources": "opdgrpo.cost.resources"}


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in FORWARDED:
        return _forward(FORWARDED[argv[0]], argv[1:])
    parser = argparse.ArgumentParser(prog="opdgrpo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="print the jobs the config plans")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. profile=smoke methods.opd.lr=1e-4")
    p.add_argument("--conf-dir", type=Path, default=None)
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("fetch", help="download every hub model, tokenizer and data set the planned jobs read into the "
                                     "Hugging Face caches (on a node with network, before the jobs)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, the ones the jobs are planned with")
    p.add_argument("--profile", help="the profile (same as the override profile=P)")
    p.add_argument("--conf-dir", type=Path, default=None)
    p.add_argument("--dry-run", action="store_true", help="list the items and what is already cached; download nothing")
    p.set_defaults(func=cmd_fetch)
    for name, func in (("tokenizer", cmd_tokenizer), ("pretrain", cmd_pretrain), ("difficulty", cmd_difficulty), ("train", cmd_train)):
        p = sub.add_parser(name, help=f"run one {name} job")
        _add_job_args(p)
        if name == "train":
            p.add_argument("--attempt", type=int, default=1,
                           help="Snakemake's attempt number (retries): a retry trains only if the previous attempt "
                                "was interrupted and made progress (opdgrpo.attempts)")
        if name in ("train", "pretrain"):
            p.add_argument("--collective-timeout", type=float, default=None, metavar="SECONDS",
                           help="the process group's timeout under several processes (the rules pass the plan's: "
                                "opdgrpo resources); default torch's (NCCL 600 s, gloo 1800 s)")
        p.set_defaults(func=func)
    sub.add_parser("report", help="build the report from run directories (opdgrpo report --help)")
    sub.add_parser("savings", help="matched-accuracy savings of experts + OPD against joint GRPO (opdgrpo savings --help)")
    sub.add_parser("flops", help="predicted training FLOPs of every planned run, before any run starts (opdgrpo flops estimate --help)")
    sub.add_parser("resources", help="estimated peak GPU memory per device and wall time of every job (opdgrpo resources --help)")
    p = sub.add_parser("slots", help="on a profile with a machine block: each GPU slot, free or held by which job and "
                                     "processes (docs/one-machine.md)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, the ones the DAG runs with")
    p.add_argument("--profile", help="the profile (same as the override profile=P)")
    p.add_argument("--conf-dir", type=Path, default=None)
    p.set_defaults(func=cmd_slots)
    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if args.func in JOB_COMMANDS:   # on a machine: this process holds its job's GPU slots while it lives
        from .gpu_slots import hold_from_env

        hold_from_env()
    if args.func in JOB_COMMANDS and int(os.environ.get("RANK", "0")) == 0:   # one holder per job, its first process
        from .runio import DirectoryInUse, job_lock

        try:
            with job_lock(args.out):
                return args.func(args)
        except DirectoryInUse as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    return args.func(args)


#: The commands that run one job in an output directory: each holds that directory's job lock while it runs.
JOB_COMMANDS = (cmd_tokenizer, cmd_pretrain, cmd_difficulty, cmd_train)


if __name__ == "__main__":
    sys.exit(main())
