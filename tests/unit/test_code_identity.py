"""The report rule's params carry a digest of the report's code, so a changed rule re-renders a finished report."""

from __future__ import annotations

import shutil
from pathlib import Path

from opdgrpo.report.code_identity import RENDERING_PACKAGES, code_digest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "opdgrpo"


def test_the_digest_follows_the_rendering_code_and_nothing_else(tmp_path):
    for package in RENDERING_PACKAGES:
        shutil.copytree(PACKAGE / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "loop.py").write_text("x = 1\n")
    before = code_digest(tmp_path)
    assert before == code_digest(PACKAGE) == code_digest()     # the copy, the source tree and the installed package
    (tmp_path / "train" / "loop.py").write_text("x = 2\n")      # the trainer is not the report's code
    (tmp_path / "report" / "notes.txt").write_text("not code\n")
    assert code_digest(tmp_path) == before
    matching = tmp_path / "report" / "matching.py"
    matching.write_text(matching.read_text() + "\n# a changed rule\n")
    assert code_digest(tmp_path) != before
    matching.rename(tmp_path / "report" / "matching_rule.py")  # a renamed module changes it too
    assert len({before, code_digest(tmp_path)}) == 2
