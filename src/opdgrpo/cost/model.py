"""The cost model: every planned run's training FLOPs, predicted from the config before anything runs.

The FLOP ledger (:mod:`opdgrpo.train.flops`, written by :mod:`opdgrpo.train.loop`) counts what a run computed; this module
predicts the same numbers from the plan and a few assumed lengths, with the ledger's own formulas, so a profile's
compute (the paper's EFLOP figures) can be sized before it is spent. Per step of a run it predicts, like the ledger:

* ``rollout``: the sampler's prefill over the left-padded prompt block, then one cached decode step per generated
  token for the rows still running (:mod:`opdgrpo.train.sampling` drops a row from the batch once it emits EOS);
* ``train``: the student's forward + backward over the whole padded batch (prompt block + every decode position),
  once per pass over the batch (GRPO's ``updates_per_batch``; mini-batches split a pass, they do not add to it);
* ``old_policy`` (GRPO with more than one update per batch): one gradient-free forward of the student over that batch;
* ``reference`` (GRPO with ``beta > 0``): one forward of the reference (the initial student) over that batch;
* ``teacher`` (OPD): one forward of each domain's teacher over its rows of that same padded batch.

Evaluation FLOPs are not training FLOPs and are left out, as in the ledger. Lengths are config (``cost_model``,
see :func:`lengths_for`); ``docs/cost-model.md`` states the approximations and the profiles' numbers.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

from opdgrpo.config import ConfigError
from opdgrpo.plan.studies import REGISTRY
from opdgrpo.run_shape import RunShape
from opdgrpo.train import flops as flop_formulas

UNITS = {"FLOP": 1.0, "GFLOP": 1e9, "TFLOP": 1e12, "PFLOP": 1e15, "EFLOP": 1e18}
COMPONENTS = ("rollout", "train", "old_policy", "reference", "teacher")
#: Components the runs table always shows; the others get a column when some run has them.
SHOWN = ("rollout", "train", "teacher")
#: The CSV's FLOP columns: every component, those added since the first three after them.
CSV_ORDER = SHOWN + ("old_policy", "reference")

#: Keys of a conf/model block that the FLOP formulas read (``vocab_size`` may instead come from the tokenizer).
ARCH_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "head_dim")
#: Keys of sliding-window architectures (Olmo-3): which layers slide, and the window (absent: every layer is full).
WINDOW_KEYS = ("layer_types", "sliding_window")

#: The ``cost_model`` block's keys and their defaults (used where the block or a key is absent).
LENGTH_KEYS = {
    "prompt_tokens": 256,            # mean prompt tokens per row (what the tokenizer makes of a training prompt)
    "padded_prompt_tokens": None,    # the prompt block the sampler computes (longest prompt in a step); null: prompt_tokens
    "response_tokens": None,         # mean response tokens per row, EOS excluded (the ledger's mean_response_length); null: max_new_tokens
    "padded_response_tokens": None,  # decode positions per step (longest response + EOS); null: max_new_tokens
}


# -- lengths ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lengths:
    """Assumed token counts per row: means, and the padded block the ledger counts (see :func:`lengths_for`)."""

    prompt: float
    padded_prompt: float
    response: float
    padded_response: float


def _length_block(block: Any, where: str) -> dict[str, Any]:
    if block is None:
        return {}
    if not isinstance(block, Mapping):
        raise ConfigError(f"config key `{where}` must be a mapping of {sorted(LENGTH_KEYS)}, got {block!r}")
    for key, value in block.items():
        if key not in LENGTH_KEYS:
            raise ConfigError(f"config key `{where}.{key}`: unknown key; known keys: {sorted(LENGTH_KEYS)}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ConfigError(f"config key `{where}.{key}` must be a number >= 0 or null, got {value!r}")
    return dict(block)


def cost_block(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The validated ``cost_model`` block: ``{**LENGTH_KEYS, per_domain: {domain: {...}}}`` (absent keys: defaults)."""
    raw = cfg.get("cost_model") or {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config key `cost_model` must be a mapping, got {raw!r}")
    top = _length_block({k: v for k, v in raw.items() if k not in ("per_domain", "thinking")}, "cost_model")
    per_domain = raw.get("per_domain") or {}
    if not isinstance(per_domain, Mapping):
        raise ConfigError(f"config key `cost_model.per_domain` must be a mapping of domain -> lengths, got {per_domain!r}")
    known = set(cfg.get("domains", {}))
    blocks = {}
    for domain, block in per_domain.items():
        if known and domain not in known:
            raise ConfigError(f"config key `cost_model.per_domain.{domain}`: no such domain; domains: {sorted(known)}")
        blocks[domain] = _length_block(block, f"cost_model.per_domain.{domain}")
    return {**LENGTH_KEYS, **top, "per_domain": blocks, "thinking": _thinking_block(raw.get("thinking"), known)}


def _thinking_block(raw: Any, known: set[str]) -> dict[str, float]:
    """``cost_model.thinking``: mean response tokens per domain of a model sampling in thinking mode (the Qwen3
    teachers' base evaluation, S2's teacher solve rates, a GRPO run of a thinking model; see
    :mod:`opdgrpo.cost.heldout`). A domain without a figure, or with null (a profile that drops a domain of the
    profile it builds on), is priced at the cap there (every answer runs to it)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config key `cost_model.thinking` must be a mapping of domain -> tokens, got {raw!r}")
    raw = {d: v for d, v in raw.items() if v is not None}
    for domain, value in raw.items():
        if known and domain not in known:
            raise ConfigError(f"config key `cost_model.thinking.{domain}`: no such domain; domains: {sorted(known)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"config key `cost_model.thinking.{domain}` must be a number >= 0, got {value!r}")
    return {d: float(v) for d, v in raw.items()}


def lengths_for(block: Mapping[str, Any], domain: str, max_new_tokens: int) -> Lengths:
    """A domain's lengths: each key from ``per_domain.<domain>``, else the block's top level, else the default.

    One exception keeps a prompt and its padding together: a per-domain block that sets ``prompt_tokens`` but not
    ``padded_prompt_tokens`` means no padding beyond that prompt (not the top level's padded prompt). A mean
    response cannot exceed the cap, nor the padded block its longest row: values are clamped to
    ``max_new_tokens`` (and the padded prompt to at least the mean prompt).
    """
    own = block["per_domain"].get(domain, {})
    merged = {**{k: block[k] for k in LENGTH_KEYS}, **own}
    if "prompt_tokens" in own and "padded_prompt_tokens" not in own:
        merged["padded_prompt_tokens"] = None
    prompt = float(merged["prompt_tokens"])
    padded_prompt = max(prompt, float(merged["padded_prompt_tokens"] if merged["padded_prompt_tokens"] is not None else prompt))
    response = min(float(max_new_tokens if merged["response_tokens"] is None else merged["response_tokens"]), max_new_tokens)
    padded = merged["padded_response_tokens"]
    padded_response = min(float(max_new_tokens if padded is None else padded), float(max_new_tokens))
    return Lengths(prompt, padded_prompt, response, padded_response)


def generated_tokens(lengths: Lengths, max_new_tokens: float) -> float:
    """Tokens a row generates: its response plus the EOS that ends it, unless it ran to the cap (no EOS then).

    With a mean response this is ``min(response + 1, cap)``: it counts an EOS for every row, one token too many
    for each row that hit the cap (a small overestimate; none when the mean is the cap itself).
    """
    return min(lengths.response + 1.0, float(max_new_tokens), lengths.padded_response)


# -- architectures ----------------------------------------------------------------------------------------------
def architecture(cfg: Mapping[str, Any], model: str) -> SimpleNamespace:
    """The FLOP formulas' view of ``cfg["models"][model]``: its Qwen3 shape keys, its sliding-window layers if any
    (Olmo-3's ``layer_types`` and ``sliding_window``), and vocabulary size.

    ``vocab_size`` comes from the model block (paper models) or else from ``tokenizer.vocab_size`` (tiny models
    are built on the tiny tokenizer); ``num_key_value_heads`` and ``head_dim`` default as in Qwen3Config.
    """
    models = cfg.get("models", {})
    if model not in models:
        raise ConfigError(f"config key `models.{model}` is missing (a run trains or distils from `base:{model}`); "
                          f"models: {sorted(models)}")
    block = models[model]
    missing = [k for k in ARCH_KEYS[:4] if k not in block]
    if missing:
        raise ConfigError(f"config block `models.{model}` lacks {missing}: the cost model needs the architecture "
                          f"({', '.join(ARCH_KEYS)}, and vocab_size unless `tokenizer.vocab_size` gives it)")
    vocab = block.get("vocab_size") or cfg.get("tokenizer", {}).get("vocab_size")
    if not vocab:
        raise ConfigError(f"neither `models.{model}.vocab_size` nor `tokenizer.vocab_size` is set: the LM head's cost needs it")
    keys = {k: block[k] for k in ARCH_KEYS + WINDOW_KEYS if block.get(k) is not None}
    if "layer_types" in keys and len(keys["layer_types"]) != int(block["num_hidden_layers"]):
        raise ConfigError(f"config key `models.{model}.layer_types` has {len(keys['layer_types'])} entries for "
                          f"{block['num_hidden_layers']} layers (`num_hidden_layers`)")
    if "sliding_attention" in keys.get("layer_types", ()) and "sliding_window" not in keys:
        raise ConfigError(f"config key `models.{model}.sliding_window` is missing: `layer_types` has sliding layers")
    return SimpleNamespace(**keys, vocab_size=int(vocab), tie_word_embeddings=bool(block.get("tie_word_embeddings", False)),
                           name=model)


def model_of(ref: str, jobs: Mapping[str, Any]) -> str:
    """The conf model behind a ``from`` reference: ``base:<model>`` is that model, ``run:<id>`` that run's student."""
    kind, _, name = ref.partition(":")
    seen = set()
    while kind == "run":
        if name in seen or name not in jobs:
            raise ConfigError(f"reference `run:{name}` names no planned run (or a cycle); check the study config")
        seen.add(name)
        kind, _, name = jobs[name].config["student"]["from"].partition(":")
    if kind != "base":
        raise ConfigError(f"model reference {ref!r} must be `base:<model>` or `run:<id>`")
    return name


# -- one step ---------------------------------------------------------------------------------------------------
def decode_flops(config: Any, rows: float, prompt_block: float, generated: float) -> float:
    """Cached decode FLOPs of ``rows`` rows generating ``generated`` tokens each after a ``prompt_block`` prompt block.

    The first token comes from the prefill; token ``s + 1`` is one decode step against ``prompt_block + s``
    positions (:func:`opdgrpo.train.flops.decode_step_flops`), for s = 1 .. generated - 1. The sum is closed-form
    (:func:`opdgrpo.train.flops.decode_steps_flops`, piecewise in the context where layers have a sliding window):
    exact for integer lengths (it equals :func:`opdgrpo.train.flops.generate_flops` minus the prefill) and the same
    polynomial between them, at any length in O(1).
    """
    return flop_formulas.decode_steps_flops(config, rows, prompt_block, max(0.0, generated - 1.0))


def step_flops(student: Any, rows: Mapping[str, int], lengths: Mapping[str, Lengths], max_new_tokens: float,
               teachers: Mapping[str, Any] | None = None, passes: Mapping[str, Any] | None = None,
               packed: bool = False, student_packed: bool = False) -> dict[str, float]:
    """Predicted FLOPs of one training step, by component, as :func:`opdgrpo.train.loop.train` books them.

    ``rows``: sequences per domain in the step's batch; ``lengths``: each domain's lengths; ``teachers``: the
    teacher architecture per domain (OPD) or None (GRPO); ``passes`` (:func:`method_passes`): the training passes
    over the batch and whether an old-policy and a reference forward run (default: one pass, neither). The batch
    shares one prompt block (the longest domain's padded prompt) and one decode length (the longest domain's padded
    response); each domain's rows stop after their own mean number of generated tokens.

    ``packed`` (``train.max_tokens_per_microbatch`` set): the training passes (and the old-policy, reference and
    teacher forwards) run over rows repacked by length, so each domain's rows are counted at their mean prompt and
    generated lengths instead of the step's padded block; the padding left inside a packed micro-batch, and the
    spread of lengths around the mean (attention grows with the square of a row's length), are not counted.
    ``student_packed`` (``train.packed_row_tokens`` set): the student's training and old-policy passes and the
    teachers' forwards are counted that way (rows laid end to end), the reference's forward at the padded block; a
    packed row's attention over its other rows and the packed rows' unused tails are not counted.
    """
    passes = passes or {}
    live = {d: n for d, n in rows.items() if n > 0}
    if not live:
        return dict.fromkeys(COMPONENTS, 0.0)
    batch = sum(live.values())
    prompt_block = max(lengths[d].padded_prompt for d in live)
    decode = max(lengths[d].padded_response for d in live)
    rollout = flop_formulas.prefill_flops(student, batch, prompt_block)
    for d, n in live.items():
        rollout += decode_flops(student, n, prompt_block, min(generated_tokens(lengths[d], max_new_tokens), decode))
    by_row = {d: (lengths[d].prompt + generated_tokens(lengths[d], max_new_tokens),
                  generated_tokens(lengths[d], max_new_tokens) + 1) for d in live}
    padded = dict.fromkeys(live, (prompt_block + decode, decode + 1))
    shapes = by_row if packed else padded
    student_shapes = by_row if packed or student_packed else padded

    def over_rows(fn: Any, config: Any, domains: Any = None, at: Any = None) -> float:
        at = shapes if at is None else at
        return sum(fn(config if domains is None else domains[d], n, at[d][0], logits_positions=at[d][1])
                   for d, n in live.items())

    train = over_rows(flop_formulas.train_flops, student, at=student_shapes) * int(passes.get("updates", 1))
    old_policy = over_rows(flop_formulas.forward_flops, student, at=student_shapes)
    reference = over_rows(flop_formulas.forward_flops, student)
    teacher = over_rows(flop_formulas.forward_flops, None, teachers, at=student_shapes) if teachers else 0.0
    return {"rollout": rollout, "train": train, "old_policy": old_policy if passes.get("old_policy") else 0.0,
            "reference": reference if passes.get("reference") else 0.0, "teacher": float(teacher)}


def method_passes(shape: RunShape) -> dict[str, Any]:
    """What a run's shape adds to a step beyond one training pass, as the trainer reads it: ``updates`` training
    passes over the batch, an ``old_policy`` forward when the batch gets more than one optimiser update, a
    ``reference`` forward (of the initial student, so the student's shape) when ``beta > 0``."""
    return {"updates": shape.updates_per_batch, "old_policy": shape.old_policy, "reference": shape.reference}


# -- runs -------------------------------------------------------------------------------------------------------
@dataclass
class RunEstimate:
    run: str
    method: str
    studies: list[str]
    student: str
    teachers: dict[str, str]           # domain -> teacher (conf model, or the run it comes from)
    domains: list[str]
    steps: int
    sequences_per_step: int
    rows: dict[str, int]               # sequences per step by domain
    lengths: Lengths                   # the batch's: row-weighted means, padded block = the longest domain's
    flops: dict[str, float]            # whole run, by component
    measured: dict[str, Any] = field(default_factory=dict)   # from the run's ledger, when asked and present

    @property
    def total(self) -> float:
        return sum(self.flops.values())


def _pool_sizes(domains: Mapping[str, Any], names: Sequence[str], cache: dict[str, int]) -> dict[str, int]:
    """Training-pool sizes (only the ``instance`` mix needs them); built once per domain config."""
    from opdgrpo.domains import KINDS, build_domain

    sizes = {}
    for d in names:
        key = json.dumps(domains[d], sort_keys=True, default=str)
        expected = (domains[d].get("train") or {}).get("expected_rows")
        if key in cache:
            pass
        elif getattr(KINDS.get(domains[d].get("kind")), "LAZY_POOLS", False) and expected:
            # Hub data sets are not loaded to plan: their documented row count stands in for the pool.
            size = (domains[d].get("train") or {}).get("size")
            cache[key] = min(int(expected), int(size)) if size else int(expected)
        else:
            cache[key] = len(build_domain(domains[d]).training_pool())
        sizes[d] = cache[key]
    return sizes


def rows_per_domain(run_cfg: Mapping[str, Any], pool_cache: dict[str, int] | None = None) -> dict[str, int]:
    """Sequences per step by domain: the trainer's own prompt split (:func:`opdgrpo.train.batching.domain_counts`) times the
    samples per prompt (GRPO's group size, OPD's rollouts per prompt)."""
    from opdgrpo.train.batching import domain_counts

    shape = RunShape.of(run_cfg)
    names = list(run_cfg["train_domains"])
    sizes = _pool_sizes(run_cfg["domains"], names, {} if pool_cache is None else pool_cache) \
        if shape.mix == "instance" and len(names) > 1 else {d: 1 for d in names}
    counts = domain_counts({d: range(sizes[d]) for d in names}, shape.prompts_per_step, shape.mix)
    return {d: c * shape.rows_per_prompt for d, c in counts.items()}


def estimate_run(cfg: Mapping[str, Any], job: Any, jobs: Mapping[str, Any], block: Mapping[str, Any] | None = None,
                 pool_cache: dict[str, int] | None = None) -> RunEstimate:
    """Predict one planned train job's FLOPs: one step (:func:`step_flops`) times its steps."""
    rc = job.config
    block = cost_block(cfg) if block is None else block
    max_new = int(rc["train"]["max_new_tokens"])
    rows = rows_per_domain(rc, pool_cache)
    lengths = {d: lengths_for(block, d, max_new) for d in rows}
    student_model = model_of(rc["student"]["from"], jobs)
    student = architecture(cfg, student_model)
    teachers, teacher_names = None, {}
    if rc["method"]["name"] == "opd":
        teachers = {d: architecture(cfg, model_of(rc["teachers"][d]["from"], jobs)) for d in rows}
        teacher_names = {d: _display(rc["teachers"][d]["from"], jobs) for d in rows}
    shape = RunShape.of(rc)   # FLOPs do not depend on how many processes share the step
    per_step = step_flops(student, rows, lengths, max_new, teachers, method_passes(shape),
                          packed=shape.microbatch_tokens is not None, student_packed=shape.packed_row_tokens is not None)
    steps = shape.steps
    batch = sum(rows.values())
    live = [d for d, n in rows.items() if n > 0]
    mean = lambda attr: sum(getattr(lengths[d], attr) * rows[d] for d in live) / batch  # noqa: E731
    batch_lengths = Lengths(mean("prompt"), max(lengths[d].padded_prompt for d in live), mean("response"),
                            max(lengths[d].padded_response for d in live))
    return RunEstimate(job.id, rc["method"]["name"], list(job.studies), _display(rc["student"]["from"], jobs), teacher_names,
                       list(rc["train_domains"]), steps, batch, rows, batch_lengths, {k: v * steps for k, v in per_step.items()})


def _display(ref: str, jobs: Mapping[str, Any]) -> str:
    """``base:teacher_m`` -> ``teacher_m``; ``run:<id>`` -> ``<id> (<its model>)``."""
    kind, _, name = ref.partition(":")
    return name if kind == "base" else f"{name} ({model_of(ref, jobs)})"


def estimate_plan(cfg: Mapping[str, Any], plan: Any | None = None) -> list[RunEstimate]:
    """Every planned training run's predicted FLOPs, in plan order."""
    from opdgrpo.plan.build import build_plan

    plan = build_plan(dict(cfg)) if plan is None else plan
    cfg = plan.config_for(dict(cfg)) if hasattr(plan, "config_for") else cfg   # with the plan's model variants (S6)
    block, cache = cost_block(cfg), {}
    return [estimate_run(cfg, job, plan.jobs, block, cache) for job in plan.runs()]


# -- measured lengths and FLOPs (ledgers) ---------------------------------------------------------------------------
def measured_lengths(records: Sequence[Mapping[str, Any]], sequences_per_step: int) -> Lengths:
    """A run's mean lengths per step, read back from its ledger lines (steps skipped as non-finite left out).

    The ledger books ``tokens.rollout_computed = B * prompt_block + (completion tokens - B)`` (the prefill, then
    one decode per generated token after each row's first) and ``tokens.train = B * (prompt_block + decode)``,
    which gives the padded blocks; ``tokens.prompt`` and ``mean_response_length`` give the means.
    """
    done = [r for r in records if "tokens" in r]
    if not done:
        raise ValueError("the ledger has no completed step to measure lengths from")
    b = float(sequences_per_step)
    prompt = padded_prompt = response = padded_response = 0.0
    for r in done:
        t = r["tokens"]
        block = (t["rollout_computed"] - t["completion"] + b) / b
        prompt += t["prompt"] / b
        padded_prompt += block
        response += r["mean_response_length"]
        padded_response += t["train"] / b - block
    n = len(done)
    return Lengths(prompt / n, padded_prompt / n, response / n, padded_response / n)


def read_measured(out_dir: str | Path) -> dict[str, Any]:
    """What a run directory's ledger says so far: steps done and cumulative FLOPs by component ({} if no ledger)."""
    from opdgrpo.runio import read_jsonl

    path = Path(out_dir) / "ledger.jsonl"
    if not path.is_file():
        return {}
    records = read_jsonl(path)
    if not records:
        return {}
    totals = dict.fromkeys(COMPONENTS, 0.0)
    for r in records:
        for k in COMPONENTS:
            totals[k] += float(r["flops"].get(k, 0.0))
    return {"steps": len(records), "total": float(records[-1]["cumulative_flops"]), "flops": totals, "records": records}


def calibrate(plan: Any) -> dict[str, Any]:
    """A ``cost_model`` block measured from the plan's finished runs: per domain, the lengths of the student's
    single-domain GRPO runs (the experts; S2's subset runs left out), averaged over their ledgers' steps and seeds.

    A pilot run's lengths this way replace guesses; OPD and multi-domain runs then inherit their domains' lengths
    (an approximation: OPD from a verbose teacher lengthens responses, see docs/cost-model.md).
    """
    per_domain: dict[str, dict[str, float]] = {}
    for job in plan.runs():
        rc = job.config
        if rc["method"]["name"] != "grpo" or len(rc["train_domains"]) != 1 or rc.get("train_subset") \
                or rc["student"]["from"] != "base:student":
            continue
        m = read_measured(job.out_dir)
        if not m:
            continue
        if rc["train"].get("packed_row_tokens") is not None:
            raise ValueError(f"run {job.id} trained with config key `train.packed_row_tokens`: its ledger's "
                             "tokens.train counts packed rows, not the padded block calibration reads; calibrate "
                             "from runs without it")
        rows = int(rc["train"]["prompts_per_step"]) * int(rc["method"]["group_size"])
        per_domain.setdefault(rc["train_domains"][0], []).append(measured_lengths(m["records"], rows))
    block: dict[str, Any] = {"per_domain": {}}
    for d, found in sorted(per_domain.items()):
        mean = lambda attr: round(sum(getattr(x, attr) for x in found) / len(found), 2)  # noqa: E731
        block["per_domain"][d] = {"prompt_tokens": mean("prompt"), "padded_prompt_tokens": mean("padded_prompt"),
                                  "response_tokens": mean("response"), "padded_response_tokens": mean("padded_response")}
    if block["per_domain"]:
        values = list(block["per_domain"].values())
        block = {k: round(sum(v[k] for v in values) / len(values), 2) for k in LENGTH_KEYS} | block
    return block


# -- studies ----------------------------------------------------------------------------------------------------
@dataclass
class StudyRow:
    study: str
    quantity: str
    value: float            # FLOPs, a percentage or a ratio, per ``unit``
    unit: str               # "flops" | "%" | "x"
    runs: list[str]


def _seed_entries(spec: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    if "seeds" in spec:
        return [(f" [seed entry {i}]", s) for i, s in enumerate(spec["seeds"])]
    return [("", spec)]


class _Sheet:
    """The :class:`~opdgrpo.plan.studies.base.CostSheet` one study entry writes its rows to (one seed's entry)."""

    def __init__(self, study: str, tag: str, costs: Mapping[str, float], study_runs: list[str], rows: list[StudyRow]):
        self.study, self.tag, self.costs, self.study_runs, self.rows = study, tag, costs, study_runs, rows

    def cost(self, run: str) -> float:
        return float(self.costs.get(run, float("nan")))

    def add(self, quantity: str, runs: Sequence[str], unit: str = "flops", value: float | None = None) -> None:
        total = sum(self.cost(r) for r in runs) if value is None else value
        self.rows.append(StudyRow(self.study, f"{quantity}{self.tag}", total, unit, list(runs)))


def study_totals(report_spec: Mapping[str, Any], estimates: Sequence[RunEstimate],
                 costs: Mapping[str, float] | None = None) -> list[StudyRow]:
    """The studies' FLOP figures, as the paper (arXiv 2611.08453) quotes them, from the plan's report spec.

    Each study's rows come from its module (:meth:`opdgrpo.plan.studies.base.Study.cost_rows`: e.g. S4's experts,
    distillation, share, joint GRPO, pipeline and savings of the full runs); a study no module registers gets the
    total of its runs. ``costs`` (run -> FLOPs) replaces the predictions, e.g. with the ledgers' totals; a figure
    with a run missing from it is NaN.
    """
    known = {e.run: e.total for e in estimates} if costs is None else costs
    rows: list[StudyRow] = []
    for name, spec in report_spec.get("studies", {}).items():
        study = REGISTRY.get(name)
        for tag, entry in _seed_entries(spec):
            sheet = _Sheet(name, tag, known, [r.run for r in estimates if name in r.studies], rows)
            if study is None:
                sheet.add("all runs", sheet.study_runs)
            else:
                study.cost_rows(entry, sheet)
    return rows


# -- output -----------------------------------------------------------------------------------------------------
def _num(x: float) -> str:
    return f"{x:.4g}"


def shown_components(estimates: Sequence[RunEstimate]) -> list[str]:
    """The runs table's FLOP columns: rollout, train, teacher, and old_policy / reference where some run has them."""
    return [k for k in COMPONENTS if k in SHOWN or any(e.flops.get(k) for e in estimates)]


def runs_table(estimates: Sequence[RunEstimate], unit: str = "EFLOP") -> str:
    scale = UNITS[unit]
    measured = any(e.measured for e in estimates)
    shown = shown_components(estimates)
    head = ["run", "method", "student", "teacher(s)", "steps", "seq/step", "prompt (pad)", "response (pad)",
            *(f"{k} {unit}" for k in shown), f"total {unit}"]
    if measured:
        head += [f"ledger {unit}", "pred / ledger"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in estimates:
        teachers = ", ".join(sorted(set(e.teachers.values()))) or "-"
        L = e.lengths
        cells = [e.run, e.method, e.student, teachers, str(e.steps), str(e.sequences_per_step),
                 f"{L.prompt:.1f} ({L.padded_prompt:.1f})", f"{L.response:.1f} ({L.padded_response:.1f})",
                 *(_num(e.flops[k] / scale) for k in shown), _num(e.total / scale)]
        if measured:
            m = e.measured
            if not m:
                cells += ["-", "-"]
            else:
                partial = "" if m["steps"] == e.steps else f" ({m['steps']}/{e.steps} steps)"
                ratio = f"{e.total / m['total']:.3f}" if m["steps"] == e.steps and m["total"] > 0 else "-"
                cells += [_num(m["total"] / scale) + partial, ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _value(row: StudyRow, unit: str) -> str:
    if row.value != row.value:   # NaN: a run without a finished ledger
        return "-"
    if row.unit == "flops":
        return f"{_num(row.value / UNITS[unit])} {unit}"
    return f"{row.value:.1f}%" if row.unit == "%" else f"{row.value:.3g}x"


def studies_table(rows: Sequence[StudyRow], unit: str = "EFLOP", measured: Sequence[StudyRow] | None = None) -> str:
    """The studies' figures; with ``measured`` (the same rows from the ledgers) a ledger column beside them."""
    if measured is None:
        lines = ["| study | quantity | predicted | runs |", "|---|---|---|---|"]
        lines += [f"| {r.study} | {r.quantity} | {_value(r, unit)} | {', '.join(r.runs)} |" for r in rows]
    else:
        lines = ["| study | quantity | predicted | ledger | runs |", "|---|---|---|---|---|"]
        lines += [f"| {r.study} | {r.quantity} | {_value(r, unit)} | {_value(m, unit)} | {', '.join(r.runs)} |"
                  for r, m in zip(rows, measured)]
    return "\n".join(lines)


def write_csv(path: Path, estimates: Sequence[RunEstimate]) -> None:
    """One row per run, FLOPs in FLOP (not scaled): the machine-readable form of :func:`runs_table`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        w = csv.writer(handle)
        w.writerow(["run", "method", "studies", "student", "teachers", "train_domains", "steps", "sequences_per_step",
                    "prompt_tokens", "padded_prompt_tokens", "response_tokens", "padded_response_tokens",
                    *(f"{k}_flops" for k in CSV_ORDER), "total_flops", "ledger_steps", "ledger_flops"])
        for e in estimates:
            L = e.lengths
            w.writerow([e.run, e.method, ";".join(e.studies), e.student, ";".join(f"{d}={t}" for d, t in e.teachers.items()),
                        ";".join(e.domains), e.steps, e.sequences_per_step, L.prompt, L.padded_prompt, L.response,
                        L.padded_response, *(e.flops[k] for k in CSV_ORDER), e.total,
                        e.measured.get("steps", ""), e.measured.get("total", "")])


def write_studies_csv(path: Path, rows: Sequence[StudyRow]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        w = csv.writer(handle)
        w.writerow(["study", "quantity", "value", "unit", "runs"])
        for r in rows:
            w.writerow([r.study, r.quantity, r.value, r.unit, ";".join(r.runs)])


def assumptions(cfg: Mapping[str, Any]) -> str:
    """One line on where the lengths come from, so a table is never read without them."""
    block = cost_block(cfg)
    given = "cost_model block" if cfg.get("cost_model") else "no `cost_model` block: defaults"
    show = lambda v: "null" if v is None else f"{v:g}"  # noqa: E731
    top = ", ".join(f"{k}={show(block[k])}" for k in LENGTH_KEYS)
    per = "; ".join(f"{d}: " + ", ".join(f"{k}={show(v)}" for k, v in b.items()) for d, b in block["per_domain"].items())
    return (f"Lengths ({given}; null = train.max_new_tokens = {cfg['train']['max_new_tokens']}): {top}"
            + (f"; per domain: {per}" if per else "") + ". Evaluation FLOPs excluded.")
