"""Paper-scale math without loading the hub fixtures: gold strings, the verifier's config, and math-verify rewards
in process (the data sets and the worker pool: tests/integration/test_hub_math_fixtures.py)."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import pytest
from math_cases import CASES
from omegaconf import OmegaConf

from opdgrpo.domains.hub_math import HubMathDomain, gold_string, last_boxed, strip_dapo_wrapper
from opdgrpo.verifiers.math import MathVerifier, verify_one

REPO = Path(__file__).resolve().parents[2]
HUB = REPO / "tests" / "fixtures" / "hub"


def _fixture_module():
    spec = importlib.util.spec_from_file_location("make_math", HUB / "make_math.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FIX = _fixture_module()


def paper_cfg(**verifier) -> dict:
    """conf/domain/paper_math.yaml with every source pointed at its fixture (the only change)."""
    cfg = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "domain" / "paper_math.yaml"))
    cfg["train"]["source"]["path"] = str(HUB / "open-r1__DAPO-Math-17k-Processed")
    paths = {"aime24": "HuggingFaceH4__aime_2024", "aime25": "math-ai__aime25", "amc23": "math-ai__amc23"}
    for name, folder in paths.items():
        cfg["heldout"][name]["source"]["path"] = str(HUB / folder)
    cfg["verifier"].update({"workers": 0, "timeout_s": 2, **verifier})
    return cfg


@pytest.mark.parametrize("verifier,needle", [
    ({"threads": 2}, r"domains\.math\.verifier.*unknown keys \['threads'\]"),
    ({"workers": "many"}, r"domains\.math\.verifier"),
    ({"workers": -1}, "workers must be >= 0"),
    ({"timeout_s": 0}, "timeout_s must be > 0"),
])
def test_bad_verifier_config(verifier, needle):
    with pytest.raises(ValueError, match=needle):
        HubMathDomain(paper_cfg(**verifier))


def test_gold_strings_and_dapo_wrapper():
    assert [gold_string(v) for v in (27.0, -1.0, 0.5, 7, "055 ", ["27.0"], None, float("nan"))] == \
        ["27", "-1", "0.5", "7", "055", "27.0", None, None]
    wrapped = f"{FIX.DAPO_PREFIX}\n\nWhat is $1+1$?\n\n{FIX.DAPO_SUFFIX}"
    assert strip_dapo_wrapper(wrapped) == "What is $1+1$?" and strip_dapo_wrapper("What is $1+1$?") == "What is $1+1$?"


# -- the verifier --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gold,completion,expected", CASES)
def test_verify_one(gold, completion, expected):
    assert float(verify_one(gold, completion, timeout_s=2)) == expected


@pytest.mark.parametrize("solution,answer", [
    ("so the probability is $\\boxed{\\frac{3}{8}}$.", "\\frac{3}{8}"),           # nested braces
    ("a guess $\\boxed{2}$ is wrong; the roots are $\\boxed{0,2}$.", "0,2"),       # the last box
    ("the distance is $\\fbox{5}$.", "5"),                                         # MATH's few \\fbox{}
    ("hence $\\boxed 7$.", "7"),                                                   # the brace-less form
    ("it is $\\boxed{\\{1,2\\}}$", "\\{1,2\\}"),                                  # escaped braces balance
    ("no box in this solution", None),
    ("cut off: $\\boxed{\\frac{1}{2}", None),
])
def test_last_boxed_reads_a_worked_solutions_answer(solution, answer):
    assert last_boxed(solution) == answer


def test_in_process_scoring_refuses_non_main_threads():
    verifier, errors = MathVerifier(workers=0, timeout_s=1), []

    def run():
        try:
            verifier.score(["1"], ["\\boxed{1}"])
        except RuntimeError as err:
            errors.append(str(err))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert errors and "main thread" in errors[0]
