"""S6 end to end: the smoke-sized map (2 x 2 cells, one seed, S6 alone) through Snakemake, down to its figure and
its table with one row per cell."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]
#: The smoke map: only S6 (the other studies, the teacher and the domains only they use removed), 2 x 2 levels, a
#: world of math and code, evaluated at steps 0, 2 and 4, and the student's own thinking fraction 1.0 so one cell
#: shares the profile's base student: 28 jobs and the report, each mostly the interpreter's and torch's start-up.
#: Two distillation budgets (2 and the smoke OPD's own 4 steps) read the one 4-step distillation twice.
OVERRIDES = ["+study@studies.S6=s6", "studies.S6.interference=[0,0.5]", "studies.S6.thinking_fraction=[1.0,0.0]",
             "studies.S6.min_levels=2", "studies.S6.joint_steps=4", "studies.S6.distill_budgets=[2,4]",
             "studies.S6.external_domains=[math,code]",
             "~models.teacher_l", "~domains.ifeval", "~domains.knowledge", "~cost_model.per_domain.ifeval",
             "~cost_model.per_domain.knowledge", "models.student.pretrain.thinking_fraction=1.0",
             *[f"~studies.{s}" for s in ("S1", "S1b", "S2", "S3", "S4", "S5", "S5b")]]


@pytest.mark.slow
def test_the_smoke_map_writes_its_figure_and_one_table_row_per_cell(tmp_path):
    done = subprocess.run([*SNAKEMAKE, "--directory", str(tmp_path), "--cores", "2", "--config", "profile=smoke",
                           f"overrides={json.dumps(OVERRIDES)}"], capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = tmp_path / "results" / "smoke" / "report"
    for ext in ("png", "pdf"):
        assert (report / f"S6_map.{ext}").stat().st_size > 10_000
    table = pd.read_csv(report / "S6_map.csv")
    cells = [(0.0, 0.0), (0.0, 0.5), (1.0, 0.0), (1.0, 0.5)]
    assert sorted(zip(table["thinking_fraction"], table["interference"], table["distill_steps"])) == [
        (*cell, steps) for cell in cells for steps in (2, 4)]
    assert set(table["savings_sign"]) <= {"positive", "negative", "inconclusive"}
    assert table["math_base"].between(0, 1).all() and table["code_final"].between(0, 1).all()
    rows = [line for line in (report / "S6_map.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| interference")]
    assert len(rows) == 8   # a row per cell and distillation budget
    spec = json.loads((report / "spec.json").read_text())
    assert list(spec["studies"]) == ["S6"] and len(spec["runs"]) == 4 * 5
    assert not (report / "S6_accuracy.png").exists()   # S6 draws its map, not the per-run figures
