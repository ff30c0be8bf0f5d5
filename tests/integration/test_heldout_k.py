"""A held-out set's own k (``domains.<d>.heldout.<set>.k``) acts for the synthetic domains as for the hub ones: the
evaluation samples that many answers per prompt, records it, and the cost model counts the same rows."""

from __future__ import annotations

import copy
from pathlib import Path

from opdgrpo.cost.resources import _evaluations
from opdgrpo.domains import build_domain
from opdgrpo.train.evaluation import evaluate, heldout_for
from opdgrpo.train.models import load_model
from opdgrpo.train.tokenizer import load_tokenizer


def test_a_sets_own_k_is_sampled_and_recorded(smoke_world):
    _, plan = smoke_world
    job = plan.jobs["grpo-student-math-s0"].config
    cfg = copy.deepcopy(job["domains"]["math"])
    cfg["heldout"]["amc"]["k"] = 1
    cfg["heldout"]["aime"].pop("k", None)   # the tiny world sets k 1 on both; without it the run's k applies
    domains = {"math": build_domain(cfg)}
    heldout = heldout_for(domains, ["math"])
    model = load_model(job["student"]["path"], trainable=False)
    results, _ = evaluate(model, load_tokenizer(Path(job["tokenizer"])), domains, heldout, k=3, temperature=0.6,
                          max_new_tokens=8, seed=0, batch_size=256)
    by_set = {r["eval_set"]: r for r in results}
    assert by_set["amc"]["k"] == 1 and "pass_at_k" not in by_set["amc"]     # its own k: one answer a prompt
    assert by_set["aime"]["k"] == 3 and set(by_set["aime"]["pass_at_k"]) == {"pass@1", "pass@2", "pass@3"}
    counted = copy.deepcopy(job)
    counted["domains"]["math"] = cfg
    counted["eval_domains"] = ["math"]
    counted["train"]["eval"]["k"] = 3
    sizes = {name: len(tasks) for name, tasks in heldout["math"].items()}
    assert cfg["heldout"]["amc"]["size"] == sizes["amc"] and cfg["heldout"]["aime"]["size"] == sizes["aime"]
    assert _evaluations(counted)[1] == sizes["amc"] * 1 + sizes["aime"] * 3   # the planner counts the same rows
