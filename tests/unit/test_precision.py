"""`precision: auto`: bf16 only where the CPU multiplies bfloat16 natively and measures faster; recorded for done.json."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from opdgrpo.train import numerics, precision
from opdgrpo.train.models import autocast


@pytest.fixture(autouse=True)
def fresh():
    precision.reset()
    yield
    precision.reset()


def test_explicit_choices_are_kept_and_recorded():
    assert precision.resolve("bf16") == "bf16" and precision.report()["reason"] == "set explicitly"
    assert precision.resolve("fp32", key="pretrain.precision") == "fp32"
    assert precision.report() == {"requested": "fp32", "resolved": "fp32", "key": "pretrain.precision",
                                  "reason": "set explicitly"}


def test_a_bad_value_names_the_key():
    with pytest.raises(ValueError, match=r"`pretrain\.precision` must be one of \['auto', 'bf16', 'fp32'\], got 'fp16'"):
        precision.resolve("fp16", key="pretrain.precision")
    with pytest.raises(ValueError, match="train.precision"):
        autocast("fp16")


def test_without_bfloat16_instructions_auto_is_float32_without_measuring(monkeypatch):
    monkeypatch.setattr(precision, "native_bf16", lambda: (False, "no avx512_bf16, no amx_bf16"))
    monkeypatch.setattr(precision, "measure", lambda threads=None: pytest.fail("measured on a CPU without bf16"))
    assert precision.resolve("auto") == "fp32"
    decision = precision.report()
    assert decision["requested"] == "auto" and decision["resolved"] == "fp32"
    assert "without bfloat16 instructions" in decision["reason"] and "measured" not in decision
    with autocast(precision.resolve("auto")):
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("speedup, chosen", [(3.0, "bf16"), (precision.MARGIN, "bf16"), (1.1, "fp32"), (0.13, "fp32")])
def test_with_them_the_measurement_decides_with_a_margin(monkeypatch, speedup, chosen):
    """A native CPU whose kernels are capped (ONEDNN_MAX_CPU_ISA=AVX2) measures bf16 slower: float32."""
    monkeypatch.setattr(precision, "native_bf16", lambda: (True, "avx512_bf16"))
    monkeypatch.setattr(precision, "measure", lambda threads=None: {"speedup": speedup})
    assert precision.resolve("auto") == chosen
    assert precision.report()["measured"] == {"speedup": speedup}
    with autocast(precision.resolve("auto")):
        assert torch.is_autocast_enabled("cpu") == (chosen == "bf16")


def test_the_decision_is_made_once_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(precision, "native_bf16", lambda: (True, "amx_bf16"))
    monkeypatch.setattr(precision, "measure", lambda threads=None: calls.append(1) or {"speedup": 2.0})
    assert [precision.resolve("auto") for _ in range(3)] == ["bf16"] * 3 and len(calls) == 1


def test_the_measurement_times_both_arithmetics():
    timing = precision.measure()
    assert timing["fp32_s"] > 0 and timing["bf16_s"] > 0
    assert timing["speedup"] == pytest.approx(timing["fp32_s"] / timing["bf16_s"], rel=1e-2)


def test_this_machines_decision_follows_its_flags():
    native, flags = precision.native_bf16()
    chosen = precision.resolve("auto")
    if not native:
        assert chosen == "fp32" and flags in precision.report()["reason"]
    assert numerics.report()["precision"]["resolved"] == chosen   # what done.json records


def test_under_the_workflow_the_first_job_decides_for_the_whole_dag(monkeypatch, tmp_path):
    """The rules export the DAG's record: the first process measures and writes it; a later one (another job, a
    resume) adopts it without measuring, even where its own measurement would differ."""
    record = tmp_path / "results" / "precision.json"
    monkeypatch.setenv(precision.RECORD_ENV, str(record))
    monkeypatch.setattr(precision, "native_bf16", lambda: (True, "amx_bf16"))
    monkeypatch.setattr(precision, "measure", lambda threads=None: {"speedup": 2.0})
    assert precision.resolve("auto") == "bf16" and precision.report()["record_written"] is True
    assert '"resolved": "bf16"' in record.read_text()
    precision.reset()   # a later job: its own measurement would say float32
    monkeypatch.setattr(precision, "measure", lambda threads=None: pytest.fail("a later job measured again"))
    assert precision.resolve("auto") == "bf16"
    assert precision.report()["reason"].startswith(f"the DAG's decision ({record})")
    assert precision.resolve("fp32") == "fp32"   # an explicit setting is the user's, record or not


def test_two_jobs_deciding_at_once_agree(monkeypatch, tmp_path):
    """Both measured; the second to create the record adopts the first one's decision instead of its own."""
    record = tmp_path / "precision.json"
    monkeypatch.setenv(precision.RECORD_ENV, str(record))
    monkeypatch.setattr(precision, "native_bf16", lambda: (True, "amx_bf16"))

    def measured_while_another_wrote(threads=None):
        record.write_text('{"resolved": "fp32", "reason": "the other job measured 1.1x"}\n')
        return {"speedup": 2.0}

    monkeypatch.setattr(precision, "measure", measured_while_another_wrote)
    assert precision.resolve("auto") == "fp32" and "the other job measured 1.1x" in precision.report()["reason"]


def test_a_record_is_never_read_half_written(monkeypatch, tmp_path):
    """The record goes into place whole (written beside it, then linked), so a process that finds it while its
    writer is still writing never reads it half written: that read's error once left a job's other process waiting
    in a collective until its timeout. Here the other process looks between the draft's write and the link."""
    record = tmp_path / "precision.json"
    monkeypatch.setenv(precision.RECORD_ENV, str(record))
    monkeypatch.setattr(precision, "native_bf16", lambda: (True, "amx_bf16"))
    monkeypatch.setattr(precision, "measure", lambda threads=None: {"speedup": 2.0})
    seen = []
    link = precision.os.link

    def link_after_a_look(draft, target):
        seen.append((Path(target).exists(), Path(draft).read_text().endswith("}\n")))
        link(draft, target)

    monkeypatch.setattr(precision.os, "link", link_after_a_look)
    assert precision.resolve("auto") == "bf16" and precision.report()["record_written"]
    assert seen == [(False, True)] and [p.name for p in tmp_path.iterdir()] == ["precision.json"]   # no draft left
    assert precision.json.loads(record.read_text())["resolved"] == "bf16"


def test_an_unreadable_record_is_named(monkeypatch, tmp_path):
    record = tmp_path / "precision.json"
    record.write_text("{cut")
    monkeypatch.setenv(precision.RECORD_ENV, str(record))
    with pytest.raises(ValueError, match=rf"{record}: the DAG's precision record is unreadable .*delete it"):
        precision.resolve("auto")


def test_autocast_refuses_auto_so_a_job_resolves_its_precision_once():
    """Every forward reads the job's one resolution: a forward that resolved `auto` itself could decide otherwise
    (a measurement on a loaded machine) and compute in another arithmetic than the rest of its job."""
    with pytest.raises(ValueError, match="resolved precision"):
        autocast("auto")


def test_one_default_for_every_precision_key():
    """`train.precision`, `pretrain.precision` and a difficulty rule's precision share the schema's one default."""
    from opdgrpo import schema
    from opdgrpo.run_shape import train_settings

    assert precision.DEFAULT == schema.default("train", "precision") == "fp32"
    assert schema.default("config.schema.yaml#/$defs/pretrain", "precision") == precision.DEFAULT
    assert precision.configured({}, "pretrain.precision") == train_settings({})["precision"] == precision.DEFAULT
    assert precision.configured({"precision": "auto"}, "pretrain.precision") == "auto"
    with pytest.raises(ValueError, match="pretrain.precision"):
        precision.configured({"precision": "fp16"}, "pretrain.precision")
