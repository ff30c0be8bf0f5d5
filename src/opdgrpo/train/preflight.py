"""Checks a training job runs before any compute.

:func:`check_run_inputs` reads only the job's config and small files (tokenizer and model ``config.json`` of each
checkpoint, the S2 subsets file): it loads no model and writes nothing, so a bad input fails in a second and leaves
the run directory, finished or not, exactly as it was. The job then holds the run directory's lock
(:func:`opdgrpo.runio.job_lock`) for the whole run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opdgrpo import schema, tracking
from opdgrpo.domains import build_domain, heldout_overlap
from opdgrpo.subsets import load_subset


def _tokenizer_vocab(directory: Path, role: str) -> dict[str, int]:
    """Token -> id of the tokenizer saved in ``directory`` (base vocabulary plus added tokens), from its files."""
    file = Path(directory) / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"{role}: no tokenizer.json in {directory}; rerun the job that writes it (its upstream job)")
    data = json.loads(file.read_text())
    vocab = dict(data.get("model", {}).get("vocab") or {})
    for token in data.get("added_tokens", []):
        vocab[token["content"]] = token["id"]
    return vocab


def _vocab_difference(a: dict[str, int], b: dict[str, int], names: tuple[str, str]) -> str | None:
    """One concrete difference between two vocabularies, or None when they are the same mapping."""
    if a == b:
        return None
    for token in sorted(set(a) | set(b)):
        if a.get(token) != b.get(token):
            return (f"token {token!r} has id {a.get(token, 'none')} in the {names[0]}'s and {b.get(token, 'none')} in the "
                    f"{names[1]}'s (vocabulary sizes {len(a)} and {len(b)})")
    return "they differ"  # unreachable: unequal dicts differ on some key


def _model_vocab_size(checkpoint: Path, role: str) -> int:
    file = Path(checkpoint) / "config.json"
    if not file.is_file():
        raise ValueError(f"{role}: no checkpoint at {checkpoint} (no config.json); run its upstream job first")
    cfg = json.loads(file.read_text())
    return int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size"))


def check_tokenizers(cfg: dict[str, Any]) -> None:
    """The run's tokenizer, the student's and every teacher's are the same vocabulary, and each model's
    embedding covers it.

    OPD compares teacher and student distributions token id by token id, so teachers built on another tokenizer
    would be distilled silently wrong; equal sizes are not enough (two BPE runs of one size assign different
    ids), so the token -> id mappings are compared.
    """
    run_tok = Path(cfg["tokenizer"])
    run_vocab = _tokenizer_vocab(run_tok, "the run's tokenizer (`tokenizer`)")
    checkpoints = {"student": Path(cfg["student"]["path"])}
    for domain, teacher in (cfg.get("teachers") or {}).items():
        checkpoints[f"teacher for {domain}"] = Path(teacher["path"])
    student_vocab: dict[str, int] = {}
    for role, path in checkpoints.items():
        size = _model_vocab_size(path, role)
        vocab = _tokenizer_vocab(path, role)
        if role == "student":
            student_vocab = vocab
            if (diff := _vocab_difference(vocab, run_vocab, ("student", "run"))):
                raise ValueError(f"student at {path} was built with another tokenizer than the run's ({run_tok}): {diff}; "
                                 "every model of a run must share the run's tokenizer: rebuild it from the same tokenizer job")
        elif (diff := _vocab_difference(vocab, student_vocab, ("teacher", "student"))):
            raise ValueError(f"{role} at {path} and the student at {checkpoints['student']} have different tokenizers: {diff}; "
                             "OPD needs teacher and student to share one tokenizer: rebuild the teacher from the run's tokenizer job")
        if size < len(run_vocab):
            raise ValueError(f"{role} at {path} has an embedding of {size} tokens, fewer than the tokenizer's {len(run_vocab)}; "
                             "rebuild the model with this tokenizer")


def check_engine_installed(engine: str | None) -> None:
    """``train.engine: vllm`` without vLLM installed fails before any compute, naming the install command."""
    import importlib.util

    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        from opdgrpo.train.engines.vllm_engine import INSTALL_HINT

        raise ImportError(INSTALL_HINT)


def check_run_inputs(cfg: dict[str, Any]) -> None:
    """Everything a training job can check before it loads a model; raises ValueError naming the key or file."""
    for key in ("run_id", "seed", "threads", "method", "train", "train_domains", "eval_domains", "domains", "tokenizer", "student"):
        if key not in cfg:
            raise ValueError(f"run config: missing key `{key}`; regenerate the job's config from the plan (`opdgrpo plan`)")
    method = cfg["method"]
    fix = "regenerate the job's config from the plan (`opdgrpo plan`) or fix `{key}` in it"
    schema.refuse_renamed(cfg, run_config=True, fix="regenerate the job's config from the plan (`opdgrpo plan`) or "
                                                    "rename it `{key}` in it")
    schema.validate(method, "method", where="method", fix=fix)
    schema.validate(cfg["train"], "train", where="train", fix=fix)
    tracking.check_installed(cfg["train"].get("report_to"))
    check_engine_installed(cfg["train"].get("engine"))
    for key in ("train_domains", "eval_domains"):
        unknown = [d for d in cfg[key] if d not in cfg["domains"]]
        if unknown or not cfg[key]:
            raise ValueError(f"config key `{key}` ({cfg[key]}) must be a non-empty list of domains in `domains` ({sorted(cfg['domains'])})")
    for name in dict.fromkeys([*cfg["train_domains"], *cfg["eval_domains"]]):
        domain = build_domain(cfg["domains"][name])
        pool, heldout = domain.training_pool(), domain.heldout_sets()
        if name in cfg["train_domains"] and not pool:
            raise ValueError(f"domain {name}: the training pool is empty; check `domains.{name}.train`")
        empty = [s for s, tasks in heldout.items() if not tasks]
        if not heldout or empty:
            raise ValueError(f"domain {name}: held-out set(s) {empty or '(none)'} are empty; check `domains.{name}.heldout`")
        problem = heldout_overlap(name, pool, heldout)
        if problem:
            raise ValueError(problem)
    if method["name"] == "opd":
        missing = [d for d in cfg["train_domains"] if d not in (cfg.get("teachers") or {})]
        if missing:
            raise ValueError(f"OPD run {cfg['run_id']}: no teacher for domain(s) {missing}; `teachers` has {sorted(cfg.get('teachers') or {})}")
    if cfg.get("train_subset"):
        spec = cfg["train_subset"]
        load_subset(Path(spec["file"]), spec["subset"])
    check_tokenizers(cfg)
