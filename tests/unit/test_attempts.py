"""A retry of a training job trains only after an interrupted attempt that made progress (opdgrpo.attempts)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from opdgrpo import attempts, cli


def _checkpoint(run_dir, step):
    (run_dir / "checkpoint").mkdir(parents=True, exist_ok=True)
    torch.save({"step": step, "optimizer": {}}, run_dir / "checkpoint" / "trainer_state.pt")


def test_an_interrupted_attempt_that_checkpointed_is_continued(tmp_path):
    assert attempts.begin(tmp_path, 1) == 0
    _checkpoint(tmp_path, 6)
    before = time.time()
    attempts.end(tmp_path, 1, "interrupted", why="SLURM job 3 ends in 40 s, less than a step (9 s), a save (2 s) and a "
                                                 "30-s margin")
    end = attempts.records(tmp_path)[-1]
    assert end["why"].startswith("SLURM job 3 ends in 40 s") and before - 0.001 <= end["at"] <= time.time() + 0.001   # `at` is rounded to ms
    assert attempts.records(tmp_path)[0]["launched_by"] == attempts.launched_by()   # who started this process
    assert attempts.begin(tmp_path, 2) == 6
    _checkpoint(tmp_path, 12)                      # attempt 2 killed at the limit after a periodic checkpoint
    assert attempts.begin(tmp_path, 3) == 12
    seen = attempts.records(tmp_path)
    assert [(r["attempt"], r.get("end", "begin"), r["step"]) for r in seen] == \
        [(1, "begin", 0), (1, "interrupted", 6), (2, "begin", 6), (3, "begin", 12)]


@pytest.mark.parametrize("how", ["crashed", "nonfinite"])
def test_a_retry_after_an_error_refuses(tmp_path, how):
    attempts.begin(tmp_path, 1)
    _checkpoint(tmp_path, 4)
    attempts.end(tmp_path, 1, how, "ValueError: boom")
    with pytest.raises(attempts.NotRetried, match=f"attempt 1 ended {how} \\(ValueError: boom\\)"):
        attempts.begin(tmp_path, 2)
    assert attempts.begin(tmp_path, 1) == 4        # a new snakemake invocation (attempt 1) always trains


def test_a_retry_after_a_finished_attempt_whose_job_was_killed_resumes_at_the_end(tmp_path, capsys):
    """The CI failure this covers: attempt 2 wrote done.json and its end line, then SLURM cancelled the step as it
    exited; Snakemake deleted done.json, and every retry refused ("attempt 2 ended done")."""
    attempts.begin(tmp_path, 1)
    _checkpoint(tmp_path, 6)
    attempts.end(tmp_path, 1, "interrupted")
    attempts.begin(tmp_path, 2)
    _checkpoint(tmp_path, 10)
    attempts.end(tmp_path, 2, "done")
    assert attempts.begin(tmp_path, 3) == 10
    assert "attempt 2 trained to the end (checkpoint step 10)" in capsys.readouterr().err


def test_a_retry_after_an_attempt_without_progress_refuses(tmp_path):
    _checkpoint(tmp_path, 4)
    attempts.begin(tmp_path, 1)                    # killed before its first checkpoint: no end line, still step 4
    with pytest.raises(attempts.NotRetried, match="left no checkpoint past step 4"):
        attempts.begin(tmp_path, 2)


def test_the_cli_refuses_a_retry_in_seconds_and_records_a_crash(tmp_path, capsys):
    bad = json.dumps({"run_id": "x"})            # not a run config: train() fails before any compute
    with pytest.raises(Exception):
        cli.main(["train", "--out", str(tmp_path), "--config-json", bad])
    assert attempts.records(tmp_path)[-1]["end"] == "crashed"
    assert cli.main(["train", "--out", str(tmp_path), "--config-json", bad, "--attempt", "2"]) == attempts.NOT_RETRIED
    assert "not training, attempt 1 ended crashed" in capsys.readouterr().err
