"""Which job Snakemake starts first: the one heading the longest chain of remaining work (critical path).

With ``--cores 2`` and one core per job, the DAG's wall time is its total work over two cores only if both cores stay
busy to the end. Snakemake starts ready jobs in an arbitrary order by default; when the longest run (the joint
four-domain GRPO) happened to start last, one core idled for six minutes of a 41-minute tiny DAG (measured when the
tiny DAG was made faster, docs/speed.md). Each job's ``priority`` here is its own estimated seconds plus the most its
downstream jobs still need, so long chains and long jobs start first and the short ones (S2's subset runs) fill the
end.

The estimate only has to order jobs: FLOPs from the config (no data loaded, nothing imported beyond the FLOP
formulas and the ``cost_model`` lengths), converted at rough rates fitted to the tiny profile's job times on its CPU:
held-out sampling runs at about a third of the training rate per FLOP (one-token decode steps).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Mapping

from opdgrpo.run_shape import evaluation_count
from opdgrpo.train import flops as flop_formulas

#: FLOP/s of a tiny job on one core (fitted to the tiny DAG's measured job times): pretraining, post-training steps
#: (rollout + forward/backward + teacher forwards) and evaluation sampling.
PRETRAIN_RATE, TRAIN_RATE, EVAL_RATE = 105e9, 140e9, 50e9
#: Seconds every job pays whatever its size: interpreter and library imports, data, checkpoints.
OVERHEAD_S = 8.0
#: Held-out prompts assumed per set whose config gives no size nor expected_rows, and tokens per sequence when the
#: config has no ``cost_model`` lengths.
DEFAULT_SET_SIZE, PRETRAIN_TOKENS = 100, 24


def _arch(cfg: Mapping[str, Any], model: str) -> SimpleNamespace | None:
    block = (cfg.get("models") or {}).get(model) or {}
    if not all(k in block for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")):
        return None
    vocab = block.get("vocab_size") or (cfg.get("tokenizer") or {}).get("vocab_size") or 0
    return SimpleNamespace(**{k: v for k, v in block.items() if k not in ("pretrain", "vocab_size")}, vocab_size=int(vocab))


def _model(ref: str, jobs: Mapping[str, Any]) -> str:
    """``base:<model>`` -> model; ``run:<id>`` -> that run's student's model."""
    kind, _, name = str(ref).partition(":")
    for _ in range(len(jobs) + 1):
        if kind != "run" or name not in jobs:
            break
        kind, _, name = str(jobs[name].config["student"].get("from", "")).partition(":")
    return name


def _tokens(cfg: Mapping[str, Any], domain: str, max_new: int) -> float:
    """Prompt block + decode positions of a row of ``domain``: the ``cost_model`` lengths (per domain where given)."""
    block = cfg.get("cost_model") or {}
    block = {**block, **((block.get("per_domain") or {}).get(domain) or {})}
    prompt = float(block.get("padded_prompt_tokens") or block.get("prompt_tokens") or 16)
    response = float(block.get("padded_response_tokens") or max_new)
    return prompt + response


def _eval_tokens(cfg: Mapping[str, Any], rc: Mapping[str, Any], max_new: int) -> float:
    """Token positions one evaluation samples: every held-out set's prompts times its k times a row's length."""
    k = int(((rc.get("train") or {}).get("eval") or {}).get("k") or 1)
    total = 0.0
    for d in rc.get("eval_domains") or []:
        for spec in ((rc.get("domains") or {}).get(d) or {}).get("heldout", {}).values():
            spec = spec if isinstance(spec, Mapping) else {}
            total += float(spec.get("size") or spec.get("expected_rows") or DEFAULT_SET_SIZE) * int(spec.get("k") or k) * _tokens(cfg, d, max_new)
    return total


def estimated_seconds(cfg: Mapping[str, Any], job: Any, jobs: Mapping[str, Any]) -> float:
    """A rough wall-time estimate of one planned job on one core (for ordering jobs, not for planning budgets)."""
    rc = job.config
    if job.kind == "base":
        arch = _arch(cfg, job.label)
        if arch is None:
            return OVERHEAD_S
        pre = rc.get("pretrain") or {}
        steps = int(((rc.get("model") or {}).get("pretrain") or {}).get("steps") or 0)
        flops = steps * flop_formulas.train_flops(arch, int(pre["batch_size"]), PRETRAIN_TOKENS) if steps else 0.0
        return OVERHEAD_S + flops / PRETRAIN_RATE
    if job.kind != "train":
        return 4 * OVERHEAD_S   # tokenizer, difficulty selection: small next to training
    method, train = rc["method"], rc["train"]
    student = _arch(cfg, _model(rc["student"].get("from", ""), jobs))
    if student is None:
        return OVERHEAD_S
    max_new = int(train["max_new_tokens"])
    tokens = max(_tokens(cfg, d, max_new) for d in rc.get("train_domains") or [""])   # the batch's padded length
    per_prompt = int(method.get("group_size") or method.get("rollouts_per_prompt") or 1)
    rows = int(train.get("prompts_per_step") or 1) * per_prompt
    steps = int(method.get("steps") or 0)
    step = flop_formulas.forward_flops(student, rows, tokens) * 4          # rollout (about a forward) + forward and backward
    teachers = (rc.get("teachers") or {}) if method["name"] == "opd" else {}
    for ref in teachers.values():   # every domain's rows go through its own teacher once
        arch = _arch(cfg, _model(ref.get("from", ""), jobs))
        step += flop_formulas.forward_flops(arch, rows / len(teachers), tokens) if arch else 0.0
    evals = evaluation_count(rc)
    eval_flops = evals * flop_formulas.forward_flops(student, 1, 1) * _eval_tokens(cfg, rc, max_new)
    return OVERHEAD_S + steps * step / TRAIN_RATE + eval_flops / EVAL_RATE


def priorities(cfg: Mapping[str, Any], plan: Any, hours: Mapping[str, float] | None = None) -> dict[str, int]:
    """Each job's priority: the rank (1 = least) of its estimated seconds plus the longest estimated chain of jobs
    that need it. Ranks, not seconds: Snakemake's scheduler sums the priorities of the jobs it starts together, and
    small integers keep that sum exact at any scale. ``hours``: each job's hours on the GPUs of a ``machine`` at its
    count (:func:`opdgrpo.cost.gpu_counts.machine_hours`), instead of the CPU estimate, so the rules start jobs in the
    order the machine's schedule was simulated in (:mod:`opdgrpo.cost.makespan`)."""
    jobs = plan.jobs
    cfg = plan.config_for(cfg) if hasattr(plan, "config_for") else cfg   # with the plan's model variants (S6)
    own = ({jid: OVERHEAD_S + 3600 * float(hours.get(jid, 0.0)) for jid in jobs} if hours is not None
           else {jid: estimated_seconds(cfg, job, jobs) for jid, job in jobs.items()})
    children: dict[str, list[str]] = {jid: [] for jid in jobs}
    for jid, job in jobs.items():
        for up in job.upstream:
            if up in children:
                children[up].append(jid)
    memo: dict[str, float] = {}

    def chain(jid: str, depth: int = 0) -> float:
        if jid not in memo:
            if depth > len(jobs):
                raise ValueError(f"the plan has a cycle through job {jid!r}")
            memo[jid] = own[jid] + max((chain(c, depth + 1) for c in children[jid]), default=0.0)
        return memo[jid]

    values = sorted({round(chain(jid), 3) for jid in jobs})
    rank = {v: i + 1 for i, v in enumerate(values)}
    return {jid: rank[round(chain(jid), 3)] for jid in jobs}
