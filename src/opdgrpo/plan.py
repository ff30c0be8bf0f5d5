"""Turn the composed config into the list of jobs and the report spec.

Every job gets a *resolved* config holding only what it uses (its method, its domains, the paths of
its upstream checkpoints), so Snakemake's params trigger reruns exactly the jobs a config edit touches.
Runs shared by several studies (the GRPO expert of S1, S3 and S4) are planned once; two studies asking
for the same run id with different configs is an error.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from .config import ConfigError
from .subsets import subset_names


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

    def runs(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.kind == "train"]

    def by_kind(self, kind: str) -> list[Job]:
        return [j for j in self.jobs.values() if j.kind == kind]


class _Planner:
    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.root = f"{cfg['results_dir']}/{cfg['profile']}"
        self.jobs: dict[str, Job] = {}
        self.studies: dict[str, dict[str, Any]] = {}

    # -- base stage ---------------------------------------------------------------------------
    def tokenizer(self) -> Job:
        if "tokenizer" not in self.jobs:
            cfg = {"tokenizer": self.cfg["tokenizer"], "domains": self.cfg["domains"], "seed": 0}
            self.jobs["tokenizer"] = Job("tokenizer", "tokenizer", f"{self.root}/base/tokenizer", cfg)
        return self.jobs["tokenizer"]

    def base(self, model: str) -> Job:
        job_id = f"base-{model}"
        if job_id not in self.jobs:
            tok = self.tokenizer()
            cfg = {
                "name": model,
                "model": self.cfg["models"][model],
                "pretrain": self.cfg["pretrain"],
                "domains": self.cfg["domains"],
                "tokenizer": tok.out_dir,
                "seed": 0,
                "threads": self.cfg["threads"],
            }
            self.jobs[job_id] = Job(job_id, "base", f"{self.root}/base/{model}", cfg, [tok.id], label=model)
        return self.jobs[job_id]

    # -- post-training runs --------------------------------------------------------------------
    def _source(self, ref: str) -> tuple[dict[str, str], str]:
        """``base:<model>`` or ``run:<id>`` -> (model entry for the run config, upstream job id)."""
        kind, name = ref.split(":", 1)
        job = self.base(name) if kind == "base" else self.jobs[name]
        return {"from": ref, "path": f"{job.out_dir}/checkpoint"}, job.id

    def run(self, run_id: str, study: str, method: str, domains: list[str], seed: int, student: str,
            teachers: dict[str, str] | None = None, method_overrides: dict[str, Any] | None = None, label: str = "",
            train_overrides: dict[str, Any] | None = None, subset: tuple[Job, dict[str, Any]] | None = None) -> Job:
        method_cfg = copy.deepcopy(self.cfg["methods"][method])
        method_cfg.update({k: v for k, v in (method_overrides or {}).items() if v is not None})
        train_cfg = copy.deepcopy(self.cfg["train"])
        train_cfg.update({k: v for k, v in (train_overrides or {}).items() if v is not None})
        student_entry, student_up = self._source(student)
        upstream = [self.tokenizer().id, student_up]
        teacher_entries = {}
        for domain, ref in (teachers or {}).items():
            teacher_entries[domain], up = self._source(ref)
            upstream.append(up)
        cfg = {
            "run_id": run_id,
            "seed": seed,
            "threads": self.cfg["threads"],
            "method": method_cfg,
            "train": train_cfg,
            "train_domains": domains,
            "eval_domains": domains,
            "domains": {d: self.cfg["domains"][d] for d in domains},
            "tokenizer": self.tokenizer().out_dir,
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
        return self.run(f"grpo-{student}-{domain}-s{seed}", study, "grpo", [domain], seed, f"base:{student}", label="GRPO")

    # -- studies ---------------------------------------------------------------------------------
    def study_S1(self, s: dict[str, Any], seed: int) -> dict[str, Any]:
        comparisons, st = [], _student(s)
        for d in s["domains"]:
            grpo = self.grpo_expert("S1", d, seed, st)
            opd = {}
            for t in s["teachers"]:
                label = f"OPD {t}"
                opd[label] = self.run(f"opd-{t}-{_into(st)}{d}-s{seed}", "S1", "opd", [d], seed, f"base:{st}", {d: f"base:{t}"},
                                      label=label).id
            comparisons.append({"domain": d, "grpo": grpo.id, "opd": opd})
        return {"title": s["title"], "comparisons": comparisons}

    def study_S1b(self, s: dict[str, Any], seed: int) -> dict[str, Any]:
        comparisons, t, st = [], s["teacher"], _student(s)
        for d in s["domains"]:
            grpo = self.grpo_expert("S1b", d, seed, st)
            teacher = self.run(f"grpo-{t}-{d}-s{seed}", "S1b-teacher", "grpo", [d], seed, f"base:{t}",
                               method_overrides={"steps": s.get("teacher_steps")}, label=f"GRPO {t} (teacher)")
            label = f"OPD {t}+GRPO"
            opd = self.run(f"opd-{t}_grpo-{_into(st)}{d}-s{seed}", "S1b", "opd", [d], seed, f"base:{st}", {d: f"run:{teacher.id}"},
                           label=label)
            comparisons.append({"domain": d, "grpo": grpo.id, "opd": {label: opd.id}, "teacher": teacher.id})
        return {"title": s["title"], "comparisons": comparisons}

    def difficulty(self, s: dict[str, Any]) -> Job:
        """S2's selection job: solve rates of the base student and the teacher, cut into subsets (one for all seeds)."""
        d, t, st = s["domain"], s["teacher"], _student(s)
        job_id = f"difficulty-{d}-{_into(st)}{t}"
        if job_id not in self.jobs:
            student, teacher = self.base(st), self.base(t)
            rule = {k: s[k] for k in ("pool_size", "k", "temperature", "student_bins", "teacher_bins", "batch_size")}
            rule["precision"] = self.cfg["train"].get("precision", "fp32")
            cfg = {"domain": d, "domains": {d: self.cfg["domains"][d]}, "rule": rule, "tokenizer": self.tokenizer().out_dir,
                   "student": self._sampler(st, student), "teacher": self._sampler(t, teacher),
                   "prompt_format": {k: self.cfg["train"][k] for k in ("chat_template", "enable_thinking", "stop_tokens")
                                     if k in self.cfg["train"]},
                   "max_new_tokens": self.cfg["train"]["max_new_tokens"], "seed": 0, "threads": self.cfg["threads"]}
            self.jobs[job_id] = Job(job_id, "difficulty", f"{self.root}/difficulty/{job_id}", cfg,
                                    [self.tokenizer().id, student.id, teacher.id], label=job_id)
        return self.jobs[job_id]

    def _sampler(self, model: str, base: Job) -> dict[str, Any]:
        """A model that samples in a job: its checkpoint, and its own sampling settings and dtype where conf has them."""
        entry: dict[str, Any] = {"path": f"{base.out_dir}/checkpoint"}
        mcfg = self.cfg["models"][model]
        if mcfg.get("sampling"):
            entry["sampling"] = mcfg["sampling"]
        if mcfg.get("source") == "hub":
            entry.update({k: mcfg[k] for k in ("dtype", "attn_implementation") if mcfg.get(k)})
        return entry

    def study_S2(self, s: dict[str, Any], seed: int) -> dict[str, Any]:
        d, t, st = s["domain"], s["teacher"], _student(s)
        selection = self.difficulty(s)
        if "S2" not in selection.studies:
            selection.studies.append("S2")
        evals = {"eval_every": s.get("eval_every")}
        subsets = []
        for name in subset_names(int(s["student_bins"]), int(s["teacher_bins"])):
            sub = (selection, {"domain": d, "subset": name, "eval_size": s.get("in_domain_eval_size")})
            grpo = self.run(f"grpo-{st}-{d}_{name}-s{seed}", "S2", "grpo", [d], seed, f"base:{st}",
                            method_overrides={"steps": s.get("grpo_steps")}, label=f"GRPO {name}", train_overrides=evals, subset=sub)
            opd = self.run(f"opd-{t}-{_into(st)}{d}_{name}-s{seed}", "S2", "opd", [d], seed, f"base:{st}", {d: f"base:{t}"},
                           {"steps": s.get("opd_steps")}, label=f"OPD {t} {name}", train_overrides=evals, subset=sub)
            subsets.append({"name": name, "grpo": grpo.id, "opd": opd.id})
        return {"title": s["title"], "domain": d, "teacher_model": t, "subsets": subsets,
                "low_teacher_subsets": int(s.get("low_teacher_subsets", 3))}

    def study_S3(self, s: dict[str, Any], seed: int) -> dict[str, Any]:
        d, st = s["domain"], _student(s)
        grpo = self.grpo_expert("S3", d, seed, st)
        opd = {}
        for n in s["rollouts_per_prompt"]:
            label = f"OPD self n={n}"
            opd[str(n)] = self.run(f"opd-self_n{n}-{_into(st)}{d}-s{seed}", "S3", "opd", [d], seed, f"base:{st}", {d: f"run:{grpo.id}"},
                                   {"rollouts_per_prompt": n}, label=label).id
        return {"title": s["title"], "domain": d, "grpo": grpo.id, "teacher": grpo.id, "opd": opd}

    def consolidation(self, key: str, s: dict[str, Any], seed: int) -> dict[str, Any]:
        """S4/S5: one GRPO expert per domain, joint GRPO on the mix, multi-teacher OPD of the experts."""
        domains, st = list(s["domains"]), _student(s)
        mix = "+".join(domains)
        train = {"mix": s.get("mix")}
        experts = [self.grpo_expert(key, d, seed, st) for d in domains]
        joint = self.run(f"grpo-{st}-{mix}-s{seed}", key, "grpo", domains, seed, f"base:{st}",
                         method_overrides={"steps": s.get("joint_steps")}, label="joint GRPO", train_overrides=train)
        distill = self.run(f"opd-experts-{_into(st)}{mix}-s{seed}", key, "opd", domains, seed, f"base:{st}",
                           {d: f"run:{e.id}" for d, e in zip(domains, experts)},
                           {"steps": s.get("distill_steps")}, label="multi-teacher OPD", train_overrides=train)
        return {"title": s["title"], "domains": domains, "joint": joint.id, "distill": distill.id,
                "experts": [e.id for e in experts], "tolerance": float(s.get("tolerance", 0.0))}

    def study_S4(self, s: dict[str, Any], seed: int) -> dict[str, Any]:
        return self.consolidation("S4", s, seed)

    def study_S5(self, s: dict[str, Any], seed: int) -> dict[str, Any]:
        return self.consolidation("S5", s, seed)

    def study_S5b(self, s: dict[str, Any], seed: int) -> dict[str, Any]:
        """One external teacher distilled on every domain at once (no experts)."""
        domains, t, st = list(s["domains"]), s["teacher"], _student(s)
        mix = "+".join(domains)
        opd = self.run(f"opd-{t}-{_into(st)}{mix}-s{seed}", "S5b", "opd", domains, seed, f"base:{st}", {d: f"base:{t}" for d in domains},
                       {"steps": s.get("steps")}, label=f"OPD {t} (all domains)", train_overrides={"mix": s.get("mix")})
        return {"title": s["title"], "domains": domains, "teacher_model": t, "opd": opd.id}


def _student(s: dict[str, Any]) -> str:
    """The model a study trains (``studies.<S>.student``; the model named ``student`` by default)."""
    return str(s.get("student") or "student")


def _into(student: str) -> str:
    """Run-id part naming a non-default student (``into_student_8b-``); empty for the default, so ids stay stable."""
    return "" if student == "student" else f"into_{student}-"


def build_plan(cfg: dict[str, Any]) -> Plan:
    """All jobs for the composed config, with the report spec that ties runs to studies."""
    planner = _Planner(cfg)
    studies: dict[str, Any] = {}
    for name, scfg in cfg["studies"].items():
        build = getattr(planner, f"study_{name}", None)
        if build is None:
            known = sorted(m[len("study_"):] for m in dir(planner) if m.startswith("study_"))
            raise ConfigError(f"config key `studies.{name}`: unknown study; known studies: {known}")
        per_seed = [build(scfg, seed) for seed in cfg["seeds"]]
        studies[name] = per_seed[0] if len(per_seed) == 1 else {"title": scfg["title"], "seeds": per_seed}
    for model in cfg["models"]:  # every model's base stage runs, so teachers can be compared to the student
        planner.base(model)
    runs = [
        {
            "run": j.id,
            "studies": j.studies,
            "method": j.config["method"]["name"],
            "label": j.label,
            "train_domains": j.config["train_domains"],
            "seed": j.config["seed"],
        }
        for j in planner.jobs.values() if j.kind == "train"
    ]
    spec = {"profile": cfg["profile"], "runs": runs, "studies": studies,
            "base_models": {j.label: j.out_dir for j in planner.jobs.values() if j.kind == "base"}}
    return Plan(planner.root, planner.jobs, spec)
