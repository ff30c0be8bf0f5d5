"""The planner's vocabulary: a job, the plan (every job and the report spec), and the :class:`Planner` that the
studies' :meth:`~opdgrpo.plan.studies.base.Study.plan` hooks ask for runs (:mod:`opdgrpo.plan.build` drives them).

Every job gets a *resolved* config holding only what it uses (its method, its domains, the paths of
its upstream checkpoints), so Snakemake's params trigger reruns exactly the jobs a config edit touches.
Runs shared by several studies (the GRPO expert of S1, S3 and S4) are planned once; two studies asking
for the same run id with different configs is an error. This module imports no study: the studies import it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from opdgrpo.errors import ConfigError
from opdgrpo.plan.naming import into, study_student
from opdgrpo.run_shape import method_settings, train_settings


@dataclass
class Job:
    id: str                      # "tokenizer", "base-<model>" or a run id
    kind: str                    # "tokenizer" | "base" | "train"
    out_dir: str                 # where the job writes; its done.json is the Snakemake output
    config: dict[str, Any]
    upstream: list[str] = field(default_factory=list)
    studies: list[str] = field(default_factory=list)
    label: str = ""

    @property
    def done(self) -> str:
        return f"{self.out_dir}/done.json"


@dataclass
class Plan:
    root: str
    jobs: dict[str, Job]
    report_spec: dict[str, Any]
    models: dict[str, Any] = field(default_factory=dict)   # model variants the studies derived (Planner.model_variant)

    def config_for(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """``cfg`` with the plan's model variants added to ``models``, for what looks up a job's model by name (the
        cost model, the scheduler, the resource check); ``cfg`` itself when the plan derived none."""
        return cfg if not self.models else {**cfg, "models": {**cfg["models"], **self.models}}

    def runs(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.kind == "train"]

    def by_kind(self, kind: str) -> list[Job]:
        return [j for j in self.jobs.values() if j.kind == kind]

    def inputs(self, job_id: str) -> dict[str, list[str]]:
        """What a job consumes, by role, as its upstream jobs' ``done.json`` (the inputs its rule names): the
        ``tokenizer``; for a run its ``student``, ``teachers`` and S2's difficulty ``selection``; for a difficulty job
        the ``models`` it samples. Every upstream job has a role; one without is a planner error."""
        job = self.jobs[job_id]
        owner = {self.jobs[u].out_dir: u for u in job.upstream}
        cfg = job.config

        def of(*paths: str) -> list[str]:   # checkpoints, subset files: their job is their directory's
            ids = [owner.get(p, owner.get(str(Path(p).parent))) for p in paths]
            return [self.jobs[i].done for i in dict.fromkeys(ids) if i is not None]

        roles = {"tokenizer": of(cfg["tokenizer"])} if isinstance(cfg.get("tokenizer"), str) else {}
        if job.kind == "train":
            roles["student"] = of(cfg["student"]["path"])
            roles["teachers"] = of(*(t["path"] for t in (cfg.get("teachers") or {}).values()))
            roles["selection"] = of(cfg["train_subset"]["file"]) if cfg.get("train_subset") else []
        elif job.kind == "difficulty":
            roles["models"] = of(cfg["student"]["path"], cfg["teacher"]["path"])
        unnamed = {self.jobs[u].done for u in job.upstream} - {d for done in roles.values() for d in done}
        if unnamed:
            raise RuntimeError(f"job {job_id}: upstream {sorted(unnamed)} has no role in Plan.inputs")
        return roles


class Planner:
    """Builds the jobs: the generic stages (tokenizer, base models, training runs, S2-style selection jobs) that the
    studies' :meth:`~opdgrpo.plan.studies.base.Study.plan` hooks ask for. A run asked for twice is planned once."""

    def __init__(self, cfg: dict[str, Any]):
        self.cfg = {**cfg, "models": dict(cfg["models"])}   # model variants are added to this copy, not to ``cfg``
        self.variants: dict[str, Any] = {}
        #: A variant model -> (world tag, the domain blocks its base stage and runs use) where not the profile's.
        self.worlds: dict[str, tuple[str, dict[str, Any]]] = {}
        self.root = f"{cfg['results_dir']}/{cfg['profile']}"
        self.jobs: dict[str, Job] = {}
        self.studies: dict[str, dict[str, Any]] = {}
        listed = {d for d, steps in method_settings(cfg["methods"]["grpo"])["domain_steps"].items() if steps is not None}
        unknown = sorted(listed - set(cfg["domains"]))
        if unknown:
            raise ConfigError(f"config key `methods.grpo.domain_steps` names {unknown}, not among `domains` "
                              f"({sorted(cfg['domains'])})")

    # -- base stage ---------------------------------------------------------------------------
    def tokenizer(self, model: str | None = None) -> Job:
        """The tokenizer job of ``model`` (None: the profile's ``tokenizer``). A model whose block names its own
        ``tokenizer`` (Olmo-3's Dolma2 tokenizer next to the Qwen3 models') gets its own job; models with equal
        specs share the job of the first of them, so a tokenizer is saved once. A model of another world
        (:meth:`model_variant`) gets that world's tokenizer, ``tokenizer-<world>``: its corpus is that world's."""
        spec = self.tokenizer_spec(model)
        owner = None if model is None or spec == self.cfg["tokenizer"] else next(
            m for m in self.cfg["models"] if self.tokenizer_spec(m) == spec)
        world, domains = self.world_of(model)
        label = "-".join(part for part in (owner or "", world) if part)
        job_id = f"tokenizer-{label}" if label else "tokenizer"
        if job_id not in self.jobs:
            cfg = {"tokenizer": spec, "domains": domains, "seed": 0}
            self.jobs[job_id] = Job(job_id, "tokenizer", f"{self.root}/base/{job_id}", cfg, label=label)
        return self.jobs[job_id]

    def tokenizer_spec(self, model: str | None) -> dict[str, Any]:
        """``models.<model>.tokenizer`` where the block has one, else the profile's ``tokenizer``."""
        own = self.cfg["models"][model].get("tokenizer") if model is not None else None
        return dict(own) if own else dict(self.cfg["tokenizer"])

    def engine(self) -> dict[str, Any]:
        """``train.engine`` and its settings for the jobs that sample outside a training run (base evaluation, S2's
        difficulty job: ``train.vllm`` with ``train.vllm_alone`` over it, the engine having the GPU to itself);
        nothing under ``hf`` (the default), so those jobs' configs, and their reruns, stay as they were."""
        train = train_settings(self.cfg["train"])
        engine = train["engine"]
        return {} if engine == "hf" else {"engine": engine, "vllm": {**train["vllm"], **train["vllm_alone"]}}

    def prompt_format(self, model: str) -> dict[str, Any]:
        """The prompt format runs of ``model`` use: ``train``'s keys, replaced by the model's ``prompt_format``."""
        fmt = {k: self.cfg["train"][k] for k in ("chat_template", "enable_thinking", "stop_tokens", "stop_strings")
               if k in self.cfg["train"]}
        return {**fmt, **(self.cfg["models"][model].get("prompt_format") or {})}

    def base_model(self, ref: str) -> str:
        """The conf model behind ``base:<model>`` or ``run:<id>`` (that run's student, followed to its base)."""
        kind, name = ref.split(":", 1)
        while kind == "run":
            kind, name = self.jobs[name].config["student"]["from"].split(":", 1)
        return name

    def world_of(self, model: str | None) -> tuple[str, dict[str, Any]]:
        """(world tag, domain blocks) of ``model``'s base stage and runs: ``("", domains)`` for the profile's world."""
        return self.worlds.get(model or "", ("", self.cfg["domains"]))

    def model_variant(self, model: str, tag: str, overrides: Mapping[str, Any] | None = None,
                      world: tuple[str, Mapping[str, Any]] | None = None) -> str:
        """A model derived from ``models.<model>`` for a study that sweeps the world (S6): its block deep-merged with
        ``overrides`` (e.g. ``{"pretrain": {"thinking_fraction": 0.0}}``), and with ``world`` = (tag, domain blocks)
        its own tokenizer, pretraining and runs on those domains (e.g. with ``interference`` set). Named
        ``<model>_<tag>`` with its own base job; a variant equal to ``model`` in block and world *is* ``model`` (the
        base stage is shared by content, as every study shares it). Returns the name runs refer to (``base:<name>``)."""
        block = _merged(self.cfg["models"][model], overrides or {})
        tag_world, domains = world if world is not None else ("", self.cfg["domains"])
        domains = dict(domains)
        if domains == self.cfg["domains"]:
            tag_world = ""
        if block == self.cfg["models"][model] and (tag_world, domains) == self.world_of(model):
            return model
        name = f"{model}_{tag}"
        for other, (t, d) in self.worlds.items():
            if t == tag_world and d != domains:
                raise ConfigError(f"world `{tag_world}` of model `{name}` has other domain blocks than `{other}`'s")
        if name in self.cfg["models"] and (self.cfg["models"][name] != block or self.world_of(name) != (tag_world, domains)):
            raise ConfigError(f"model variant `{name}` is derived twice with different settings; give one its own tag")
        self.cfg["models"][name] = self.variants[name] = block
        if tag_world:
            self.worlds[name] = (tag_world, domains)
        return name

    def base(self, model: str) -> Job:
        job_id = f"base-{model}"
        if job_id not in self.jobs:
            tok = self.tokenizer(model)
            cfg = {
                "name": model,
                "model": self.cfg["models"][model],
                "pretrain": self.cfg["pretrain"],
                "domains": self.world_of(model)[1],
                "tokenizer": tok.out_dir,
                "seed": 0,
                "threads": self.cfg["threads"],
                **self.engine(),
            }
            fmt = self.prompt_format(model)
            if fmt:   # the tiny world has none: its base jobs' configs stay as they were
                cfg["prompt_format"] = fmt   # its base evaluation formats and stops as its runs do
            self.jobs[job_id] = Job(job_id, "base", f"{self.root}/base/{model}", cfg, [tok.id], label=model)
        return self.jobs[job_id]

    # -- post-training runs --------------------------------------------------------------------
    def _source(self, ref: str) -> tuple[dict[str, str], str]:
        """``base:<model>`` or ``run:<id>`` -> (model entry for the run config, upstream job id)."""
        kind, name = ref.split(":", 1)
        job = self.base(name) if kind == "base" else self.jobs[name]
        return {"from": ref, "path": f"{job.out_dir}/checkpoint"}, job.id

    def add_run(self, run_id: str, study: str, method: str, domains: list[str], seed: int, student: str,
                teachers: dict[str, str] | None = None, method_overrides: dict[str, Any] | None = None,
                label: str = "", train_overrides: dict[str, Any] | None = None,
                subset: tuple[Job, dict[str, Any]] | None = None) -> Job:
        method_cfg = copy.deepcopy(self.cfg["methods"][method])
        method_cfg.pop("domain_steps", None)   # read by grpo_expert; a run's block holds its own steps
        method_cfg.update({k: v for k, v in (method_overrides or {}).items() if v is not None})
        train_cfg = copy.deepcopy(self.cfg["train"])
        train_cfg.update({k: v for k, v in (train_overrides or {}).items() if v is not None})
        student_entry, student_up = self._source(student)
        student_model = self.base_model(student)
        world = self.world_of(student_model)
        train_cfg.update({k: v for k, v in self.prompt_format(student_model).items() if k not in (train_overrides or {})})
        tokenizer = self.tokenizer(student_model)
        upstream = [tokenizer.id, student_up]
        teacher_entries = {}
        for domain, ref in (teachers or {}).items():
            teacher_entries[domain], up = self._source(ref)
            upstream.append(up)
            teacher_model = self.base_model(ref)
            if self.world_of(teacher_model) != world:
                raise ConfigError(f"run {run_id}: teacher `{teacher_model}` and student `{student_model}` come from different "
                                  f"worlds (domain blocks, e.g. `interference`); derive both in the same world")
            if self.tokenizer_spec(teacher_model) != self.tokenizer_spec(student_model):
                raise ConfigError(
                    f"run {run_id}: teacher `{teacher_model}` and student `{student_model}` have different tokenizers "
                    f"({self.tokenizer_spec(teacher_model).get('path')} vs {self.tokenizer_spec(student_model).get('path')}; "
                    f"`models.<name>.tokenizer`, else `tokenizer`): a teacher scores the student's token ids, so they "
                    f"must share one. Pick teachers of the student's family (e.g. `studies.{study}.teachers`)")
        cfg = {
            "run_id": run_id,
            "seed": seed,
            "threads": self.cfg["threads"],
            "method": method_cfg,
            "train": train_cfg,
            "train_domains": domains,
            "eval_domains": domains,
            "domains": {d: world[1][d] for d in domains},
            "tokenizer": tokenizer.out_dir,
            "student": student_entry,
            "teachers": teacher_entries,
        }
        if subset is not None:  # S2: train on one difficulty subset only
            selection, subset_cfg = subset
            cfg["train_subset"] = {**subset_cfg, "file": f"{selection.out_dir}/subsets.json"}
            upstream.append(selection.id)
        if run_id in self.jobs:
            existing = self.jobs[run_id]
            if existing.config != cfg:
                raise ConfigError(
                    f"run {run_id} is planned by studies {existing.studies} and {study} with different configs; "
                    "give one of them its own settings name or align the study configs"
                )
            if study not in existing.studies:
                existing.studies.append(study)
            return existing
        job = Job(run_id, "train", f"{self.root}/runs/{run_id}", cfg, list(dict.fromkeys(upstream)), [study], label or run_id)
        self.jobs[run_id] = job
        return job

    def grpo_expert(self, study: str, domain: str, seed: int, student: str = "student") -> Job:
        """A student's GRPO run on one domain: S1's baseline, S3's self-teacher, S4/S5's expert (one run, shared)."""
        steps = method_settings(self.cfg["methods"]["grpo"])["domain_steps"].get(domain)
        return self.add_run(f"grpo-{student}-{domain}-s{seed}", study, "grpo", [domain], seed, f"base:{student}",
                        method_overrides={"steps": steps}, label="GRPO")

    # -- selection jobs ---------------------------------------------------------------------------------------
    def difficulty(self, s: Mapping[str, Any]) -> Job:
        """S2's selection job: solve rates of the base student and the teacher, cut into subsets (one for all seeds)."""
        d, t, st = s["domain"], s["teacher"], study_student(s)
        job_id = f"difficulty-{d}-{into(st)}{t}"
        if job_id not in self.jobs:
            student, teacher = self.base(st), self.base(t)
            rule = {k: s[k] for k in ("pool_size", "k", "temperature", "student_bins", "teacher_bins", "batch_size")}
            if s.get("max_batch_tokens") is not None:   # absent unless set: unchanged configs rerun nothing
                rule["max_batch_tokens"] = s["max_batch_tokens"]
            rule["precision"] = train_settings(self.cfg["train"])["precision"]
            tokenizer = self.tokenizer(st)
            if self.tokenizer_spec(t) != self.tokenizer_spec(st):
                raise ConfigError(f"S2's teacher `{t}` and student `{st}` have different tokenizers: the solve rates "
                                  "are of the same prompts, tokenized once; pick a teacher of the student's family")
            cfg = {"domain": d, "domains": {d: self.cfg["domains"][d]}, "rule": rule, "tokenizer": tokenizer.out_dir,
                   "student": self._sampler(st, student), "teacher": self._sampler(t, teacher),
                   "prompt_format": self.prompt_format(st),
                   "max_new_tokens": self.cfg["train"]["max_new_tokens"], "seed": 0, "threads": self.cfg["threads"],
                   **self.engine()}
            self.jobs[job_id] = Job(job_id, "difficulty", f"{self.root}/difficulty/{job_id}", cfg,
                                    [tokenizer.id, student.id, teacher.id], label=job_id)
        return self.jobs[job_id]

    def _sampler(self, model: str, base: Job) -> dict[str, Any]:
        """A model that samples in a job: its checkpoint, and its own sampling settings and dtype where conf has them."""
        entry: dict[str, Any] = {"path": f"{base.out_dir}/checkpoint"}
        mcfg = self.cfg["models"][model]
        if mcfg.get("sampling"):
            entry["sampling"] = mcfg["sampling"]
        own = mcfg.get("prompt_format") or {}
        if "stop_strings" in own:   # the job formats prompts as the student's runs do; a chat teacher has no stop strings
            entry["stop_strings"] = bool(own["stop_strings"])
        if mcfg.get("source") in ("hub", "random"):
            entry.update({k: mcfg[k] for k in ("dtype", "attn_implementation") if mcfg.get(k)})
        return entry


def _merged(block: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``block`` deep-copied with ``overrides`` merged in, nested mappings key by key."""
    out = copy.deepcopy(dict(block))
    for key, value in overrides.items():
        out[key] = _merged(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) \
            else copy.deepcopy(value)
    return out
