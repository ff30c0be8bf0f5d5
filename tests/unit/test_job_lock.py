"""One job per output directory, for every job command: a second process starting a job where one runs stops at
once, naming the holder, before it writes anything (the case of a second snakemake after `snakemake --unlock`).
The lock itself (a killed holder leaves none) is tested in tests/e2e/test_concurrency.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from opdgrpo.runio import job_lock


@pytest.mark.parametrize("command", ["tokenizer", "pretrain", "difficulty", "train"])
def test_a_second_job_in_a_directory_in_use_stops_naming_the_holder(tmp_path, command):
    with job_lock(tmp_path):
        result = subprocess.run([sys.executable, "-m", "opdgrpo.cli", command, "--out", str(tmp_path), "--config-json", "{}"],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 1
        assert f"{tmp_path} is in use by another process (pid {os.getpid()} on" in result.stderr
        assert "Traceback" not in result.stderr and not (tmp_path / "attempts.jsonl").exists()
    with job_lock(tmp_path):   # released when the holder's block ends
        pass
