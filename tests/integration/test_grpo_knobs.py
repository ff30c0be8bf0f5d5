"""GRPO's knobs act in real smoke runs: several updates per sampled batch (the sampling policy's log-probs from a
forward before the first update, counted as ``old_policy``; the ratio leaves 1 and the clip acts), mini-batches, the
reference KL (``beta > 0``: a frozen reference forward, counted as ``reference``) and log-probs at the sampling
temperature. That the defaults change nothing is pinned bit for bit by ``tests/integration/test_speed_pins.py``."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from opdgrpo.runio import read_jsonl
from opdgrpo.train import flops as F
from opdgrpo.train.inference import FrozenForward
from opdgrpo.train.loop import train
from opdgrpo.train.losses import token_logprobs
from opdgrpo.train.models import autocast, load_model
from opdgrpo.train.objectives import GRPOObjective, position_ids
from opdgrpo.train.precision import resolve as resolve_precision

RUN = "grpo-student-math-s0"


def _config(plan, steps: int, method: dict | None = None, **train_keys) -> dict:
    cfg = copy.deepcopy(plan.jobs[RUN].config)
    cfg["method"].update({"steps": steps, **(method or {})})
    cfg["train"].update({"eval_every": 100, "checkpoint_every": 100, **train_keys})
    cfg["run_id"] = f"{RUN}-knobs"
    return cfg


def _record_losses(monkeypatch) -> list[dict]:
    """Every GRPO loss the trainer computes: its metrics, the logits it saw and the shard's fixed log-probs."""
    calls: list[dict] = []
    loss = GRPOObjective.loss

    def recording(self, logits, shard, normalizer, check, flops, teachers=None):
        out = loss(self, logits, shard, normalizer, check, flops, teachers)
        calls.append({"metrics": out[1], "logits": logits.detach().float(), "targets": shard.targets,
                      "mask": shard.mask.bool(), "old": shard.old_logprobs, "ref": shard.ref_logprobs,
                      "sequences": shard.sequences, "attention_mask": shard.attention_mask})
        return out

    monkeypatch.setattr(GRPOObjective, "loss", recording)
    return calls


def _shape(record: dict, rows: int) -> tuple[int, int, int]:
    t = record["tokens"]
    length, prompt = t["train"] // rows, (t["rollout_computed"] - t["completion"] + rows) // rows
    return rows, length, length - prompt + 1


def test_two_updates_per_batch_clip_and_count_one_old_policy_forward(smoke_world, tmp_path, monkeypatch, rigged_rewards):
    """2 updates per batch at temperature 0.7: the first update's ratio is exactly 1 (the old-policy forward is the
    first update's own forward, at the same temperature), later ones are not and some tokens clip; the ledger's
    old_policy is one forward of the batch and train two forward+backward passes."""
    _, plan = smoke_world
    cfg = _config(plan, steps=4, method={"updates_per_batch": 2, "lr": 3e-3}, temperature=0.7)
    calls = _record_losses(monkeypatch)
    train(cfg, tmp_path / "two")
    ledger = read_jsonl(tmp_path / "two" / "ledger.jsonl")
    student = AutoModelForCausalLM.from_pretrained(cfg["student"]["path"])
    rows = cfg["train"]["prompts_per_step"] * cfg["method"]["group_size"]
    for record in ledger:
        flops = record["flops"]
        assert set(flops) == {"rollout", "train", "old_policy", "teacher"}
        b, length, logits = _shape(record, rows)
        assert flops["old_policy"] == F.forward_flops(student.config, b, length, logits_positions=logits)
        assert flops["train"] == 2 * F.train_flops(student.config, b, length, logits_positions=logits)
        assert record["tokens"]["train"] == b * length            # the batch's tokens, counted once
    assert len(calls) == 2 * len(ledger)                          # one shard, two updates per step
    for first, second in zip(calls[::2], calls[1::2]):
        assert first["metrics"]["ratio_mean"] == 1.0 and first["metrics"]["clip_frac"] == 0.0
        assert first["old"] is second["old"]                      # computed once per batch
        # log-probs at the sampling temperature: log_softmax(logits / T) of the sampled tokens
        tempered = torch.log_softmax(first["logits"] / 0.7, dim=-1).gather(-1, first["targets"].unsqueeze(-1))[..., 0]
        torch.testing.assert_close(first["old"][first["mask"]], tempered[first["mask"]], rtol=0, atol=1e-5)
    assert any(c["metrics"]["ratio_mean"] != 1.0 for c in calls[1::2])
    assert max(r["metrics"]["clip_frac"] for r in ledger) > 0      # the clip acts
    # step 0 sampled the same batch as a default run's step 0 (its policy had not moved yet)
    default = _config(plan, steps=1, temperature=0.7)
    train(default, tmp_path / "one")
    base = read_jsonl(tmp_path / "one" / "ledger.jsonl")[0]
    assert base["flops"]["old_policy"] == 0
    assert ledger[0]["tokens"] == base["tokens"] and ledger[0]["reward"] == base["reward"]
    assert ledger[0]["flops"]["rollout"] == base["flops"]["rollout"]


def test_minibatches_split_the_batch_into_updates(smoke_world, tmp_path, monkeypatch, rigged_rewards):
    """2 mini-batches of one shard each: two updates per step over half the batch each; the second one's ratio
    moved with the first update; the old-policy forward covers both halves once."""
    _, plan = smoke_world
    cfg = _config(plan, steps=3, method={"minibatches": 2, "lr": 3e-3})
    calls = _record_losses(monkeypatch)
    train(cfg, tmp_path / "mini")
    ledger = read_jsonl(tmp_path / "mini" / "ledger.jsonl")
    assert len(calls) == 2 * len(ledger)
    for record in ledger:
        assert record["flops"]["train"] == pytest.approx(3 * record["flops"]["old_policy"], rel=1e-12)
    assert all(c["metrics"]["ratio_mean"] == 1.0 for c in calls[::2])
    assert any(c["metrics"]["ratio_mean"] != 1.0 for c in calls[1::2])
    with pytest.raises(ValueError, match="method.minibatches"):
        train(_config(plan, steps=1, method={"minibatches": 2}, micro_batches=1), tmp_path / "bad")


def test_beta_loads_the_reference_and_counts_its_forward(smoke_world, tmp_path, monkeypatch, rigged_rewards):
    """beta > 0: a frozen copy of the initial student forwards over the training sequences; the ledger's
    ``reference`` is that forward's FLOPs (the student's shape over the same tokens: a third of ``train``); the KL
    is 0 before the policy moves and the loss carries beta x KL once it has."""
    _, plan = smoke_world
    cfg = _config(plan, steps=3, method={"beta": 0.5, "lr": 3e-3})
    calls = _record_losses(monkeypatch)
    train(cfg, tmp_path / "kl")
    ledger = read_jsonl(tmp_path / "kl" / "ledger.jsonl")
    for record in ledger:
        flops = record["flops"]
        assert list(flops) == ["rollout", "train", "old_policy", "teacher", "reference"]
        assert flops["old_policy"] == 0                            # one update per batch
        assert 3 * flops["reference"] == pytest.approx(flops["train"], rel=1e-12)
        assert "kl" in record["metrics"]
    assert calls[0]["metrics"]["kl"] == pytest.approx(0.0, abs=1e-6)   # the policy is the reference at step 0
    assert all(c["ref"] is not None and c["old"] is None for c in calls)
    moved = [c for c in calls if c["metrics"]["kl"] > 0]
    assert moved, "the policy never left the reference"
    # the reference stays the initial student: the last step's reference log-probs are the initial checkpoint's
    last = calls[-1]
    initial = FrozenForward(load_model(cfg["student"]["path"], trainable=False).eval())
    keep = last["targets"].shape[1] + 1
    with torch.no_grad(), autocast(resolve_precision(cfg["train"]["precision"])):   # as the run resolved it
        logits = initial(last["sequences"], last["attention_mask"], position_ids(last["attention_mask"]), keep)[:, :-1]
    assert torch.equal(token_logprobs(logits, last["targets"]), last["ref"])


def test_reference_is_absent_from_ledgers_without_it(smoke_world, tmp_path):
    _, plan = smoke_world
    train(_config(plan, steps=1), tmp_path / "plain")
    assert set(read_jsonl(tmp_path / "plain" / "ledger.jsonl")[0]["flops"]) == {"rollout", "train", "old_policy", "teacher"}


def test_logit_chunks_train_as_the_full_logits(smoke_world, tmp_path, rigged_rewards):
    """``train.logit_chunk_tokens: 16`` (every shard of 16 rows in several chunks) for the student's training
    forward, the old-policy forward (2 updates per batch) and the reference's (``beta``), against the default (one
    chunk, the full logits), in float32: the same tokens and FLOPs, and losses, KL and gradient norms within float32
    reordering (the LM head's weight gradient is summed chunk by chunk; tests/unit/test_logit_chunks.py). Weights:
    within 1% of one update (``lr``) per entry: Adam's ``m / (sqrt(v) + eps)`` turns an ulp of difference in a
    gradient entry near 0 into a visible share of that entry's step (measured: 3 of 16,384 embedding entries move by
    more than 1e-6 after 6 updates at lr 3e-3, the largest by 1.4e-5; every other weight within 1e-6)."""
    _, plan = smoke_world
    method = {"updates_per_batch": 2, "beta": 0.5, "lr": 3e-3}
    for name, keys in {"full": {}, "chunks": {"logit_chunk_tokens": 16}}.items():
        train(_config(plan, steps=3, method=method, precision="fp32", **keys), tmp_path / name)
    full, chunks = (read_jsonl(tmp_path / n / "ledger.jsonl") for n in ("full", "chunks"))
    assert len(full) == len(chunks) == 3
    for a, b in zip(full, chunks):
        assert (a["tokens"], a["flops"], a["reward"]) == (b["tokens"], b["flops"], b["reward"])
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7)
        assert b["metrics"]["kl"] == pytest.approx(a["metrics"]["kl"], rel=1e-4, abs=1e-8)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    wa, wb = (load_file(str(tmp_path / n / "checkpoint" / "model.safetensors")) for n in ("full", "chunks"))
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-5, atol=method["lr"] / 100, msg=lambda m: f"{name}: {m}")
    print("logit chunks vs full: largest weight difference", max(float((wa[n] - wb[n]).abs().max()) for n in wa),
          "losses", [(a["loss"], b["loss"]) for a, b in zip(full, chunks)])
