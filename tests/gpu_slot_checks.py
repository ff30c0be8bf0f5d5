"""What a DAG's GPU slots look like after it ran on a machine block (docs/one-machine.md): shared by the rehearsals
of the paper profile and of the node profile (tests/e2e/test_rehearsal.py, test_node_rehearsal.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


def slots_side_by_side(workdir: Path, plan: Any, slots_of: Callable[[Any], int], devices: set[int]) -> dict:
    """Check every job's recorded slots and that jobs which ran at the same time held disjoint ones; return each job
    id's (acquired, finished, slots). ``slots_of(job)``: the slots a job of the plan should hold (0: none, a tokenizer
    or report job); ``devices``: the machine's slots. Each training run's attempts record theirs too."""
    ran = {}
    for job in plan.jobs.values():
        done_path = workdir / job.out_dir / "done.json"
        done = json.loads(done_path.read_text())
        want = slots_of(job)
        if not want:
            assert "gpu_slots" not in done, job.id
            continue
        record = done["gpu_slots"]
        assert len(record["slots"]) == want == len(set(record["slots"])), (job.id, record)
        assert record["devices"] == [str(s) for s in record["slots"]] and set(record["slots"]) <= devices, record
        ran[job.id] = (record["acquired_at"], done_path.stat().st_mtime, set(record["slots"]))
        if job.kind == "train":
            begun = [r for r in map(json.loads, (workdir / job.out_dir / "attempts.jsonl").read_text().splitlines())
                     if "begin" in r]
            assert begun and all(len(r["gpu_slots"]["slots"]) == want for r in begun), job.id
    together = [(a, b) for a in ran for b in ran if a < b and ran[a][0] < ran[b][1] and ran[b][0] < ran[a][1]]
    assert together, f"no two jobs ran side by side: {ran}"
    assert all(not ran[a][2] & ran[b][2] for a, b in together), {p: (ran[p[0]][2], ran[p[1]][2]) for p in together}
    return ran
