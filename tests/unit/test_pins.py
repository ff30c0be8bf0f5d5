"""The pin store: bitwise pins bind only under their own fingerprint, and the tolerance comparison tells another
CPU's arithmetic from a regression (tested on the two machines' real pins in ``tests/fixtures/speed_pins.json``)."""

from __future__ import annotations

import copy
import itertools
import json

import pytest
from pins import PINS, PinStore, differences, tolerance_view


def test_pins_recorded_under_one_fingerprint_bind_only_there(tmp_path):
    path = tmp_path / "pins.json"
    PinStore(path, fingerprint="machine-a", arithmetic="bf16", record=True).bitwise("run/ledger", [{"loss": 0.5, "step": 0}])
    PinStore(path, fingerprint="machine-a", arithmetic="bf16").bitwise("run/ledger", [{"loss": 0.5, "step": 0}])
    with pytest.raises(AssertionError, match=r"run/ledger\[0\] differs"):
        PinStore(path, fingerprint="machine-a", arithmetic="bf16").bitwise("run/ledger", [{"loss": 0.5000001, "step": 0}])
    with pytest.raises(pytest.skip.Exception, match="fingerprint machine-b.*machine-a.*OPDGRPO_RECORD_PINS=1"):
        PinStore(path, fingerprint="machine-b", arithmetic="bf16").bitwise("run/ledger", [{"loss": 0.5, "step": 0}])
    # the unknown machine still runs the tolerance comparison against machine-a's pins
    other = PinStore(path, fingerprint="machine-b", arithmetic="bf16")
    other.within_tolerance("run/ledger", [{"loss": 0.52, "step": 0}])
    with pytest.raises(AssertionError, match="loss"):
        other.within_tolerance("run/ledger", [{"loss": 0.75, "step": 0}])


def test_a_new_recording_replaces_only_its_own_machines_set(tmp_path):
    path = tmp_path / "pins.json"
    PinStore(path, fingerprint="machine-a", arithmetic="bf16", record=True).bitwise("x", 1)
    PinStore(path, fingerprint="machine-b", arithmetic="bf16", record=True).bitwise("x", 2)
    machines = json.loads(path.read_text())["machines"]
    assert {fp: m["pins"] for fp, m in machines.items()} == {"machine-a": {"x": 1}, "machine-b": {"x": 2}}
    assert machines["machine-b"]["machine"]["fingerprint"] == "machine-b"


def test_a_machine_that_resolves_float32_pins_a_set_of_its_own(tmp_path):
    """`precision: auto` is float32 on a CPU without bfloat16 instructions: its bits are not the bf16 set's, so its
    set is keyed apart (the tolerance comparison still runs against the bf16 set)."""
    path = tmp_path / "pins.json"
    PinStore(path, fingerprint="machine-a", arithmetic="bf16", record=True).bitwise("x", 1.0)
    fp32 = PinStore(path, fingerprint="machine-a", arithmetic="fp32")
    with pytest.raises(pytest.skip.Exception, match=r"machine-a\+fp32"):
        fp32.bitwise("x", 1.0)
    fp32.within_tolerance("x", 1.01)
    PinStore(path, fingerprint="machine-a", arithmetic="fp32", record=True).bitwise("x", 1.01)
    machines = json.loads(path.read_text())["machines"]
    assert {fp: m["pins"] for fp, m in machines.items()} == {"machine-a": {"x": 1.0}, "machine-a+fp32": {"x": 1.01}}
    assert machines["machine-a+fp32"]["machine"]["precision"] == "fp32"


def _real_pins() -> dict[str, dict]:
    machines = json.loads(PINS.read_text())["machines"]
    if len(machines) < 2:
        pytest.skip("the fixture holds one machine's pins")
    return {fp: m["pins"] for fp, m in machines.items()}


def test_every_two_recorded_machines_agree_within_the_tolerances():
    """The same code on other kernels (an AMD EPYC, an Intel Xeon, the Xeon with AVX2 kernels): every pin within
    tolerance of every other machine's, both ways."""
    pins = _real_pins()
    for (a, pa), (b, pb) in itertools.combinations(pins.items(), 2):
        shared = sorted(set(pa) & set(pb))
        assert len(shared) >= 20, (a, b)
        for name in shared:
            x, y = tolerance_view(name, pa[name]), tolerance_view(name, pb[name])
            assert differences(x, y) == [] and differences(y, x) == [], (a, b, name, differences(x, y))


def _scale(record: dict, key_path: list[str], factor: float) -> dict:
    record = copy.deepcopy(record)
    node = record
    for key in key_path[:-1]:
        node = node[key]
    node[key_path[-1]] *= factor
    return record


@pytest.mark.parametrize("regression", ["loss x1.5", "backward counted 3x", "responses twice as long",
                                        "accuracy +0.3", "prompt tokens +20%", "one step fewer"])
def test_a_regression_fails_the_tolerance_comparison(regression):
    pins = next(iter(_real_pins().values()))
    ledger, evals = pins["opd-teacher_m-math-s0/ledger"], pins["grpo-student-math-s0/evals"]
    if regression == "loss x1.5":
        changed, expected = [_scale(ledger[0], ["loss"], 1.5), *ledger[1:]], ledger
    elif regression == "backward counted 3x":   # train FLOPs are forward + 2x backward: 4/3 of that
        changed, expected = [_scale(line, ["flops", "train"], 4 / 3) for line in ledger], ledger
    elif regression == "responses twice as long":
        changed, expected = [_scale(line, ["mean_response_length"], 2.0) for line in ledger], ledger
    elif regression == "accuracy +0.3":
        changed = copy.deepcopy(evals)
        changed[-1]["results"][0]["accuracy"] += 0.3
        expected = evals
    elif regression == "prompt tokens +20%":
        changed, expected = [_scale(line, ["tokens", "prompt"], 1.2) for line in ledger], ledger
    else:
        changed, expected = ledger[:-1], ledger
    assert differences(expected, changed), regression


def test_a_base_models_answer_lengths_are_left_to_the_bitwise_pins():
    """After 30 smoke pretraining steps where a base model's answers stop is last-bits noise (12 tokens on an AMX
    Xeon, 18.7-22.8 on the pinned machines); its accuracy is still compared, and a training run's lengths too."""
    pin = [{"step": 30, "results": [{"eval_set": "lcb", "accuracy": 0.0, "mean_response_length": 18.7}]}]
    shorter = [{"step": 30, "results": [{"eval_set": "lcb", "accuracy": 0.0, "mean_response_length": 12.0}]}]
    assert differences(tolerance_view("base-teacher_m/evals", pin), tolerance_view("base-teacher_m/evals", shorter)) == []
    solved = [{"step": 30, "results": [{"eval_set": "lcb", "accuracy": 0.5, "mean_response_length": 18.7}]}]
    assert differences(tolerance_view("base-teacher_m/evals", pin), tolerance_view("base-teacher_m/evals", solved))
    assert differences(tolerance_view("opd-x/evals", pin), tolerance_view("opd-x/evals", shorter))
