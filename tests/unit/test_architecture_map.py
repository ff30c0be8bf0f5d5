"""docs/ARCHITECTURE.md's map names every module of the package, so a newcomer finds each room from it. Folders
whose modules are one per item (a study, a domain kind, a verifier, an engine) are named by the folder, as the map
describes them; every other module is named by its file name."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "opdgrpo"
#: Folders the map describes as one module per item.
PER_ITEM = {"plan/studies": "studies/", "report/studies": "report/studies/", "domains": "domains/",
            "verifiers": "verifiers/", "train/engines": "engines/", "sandbox/programs": "programs/"}


def test_every_module_is_on_the_map():
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        folder = str(rel.parent)
        if folder in PER_ITEM:
            if PER_ITEM[folder] not in text:
                missing.append(f"{folder}/ (the folder)")
        elif path.name != "__init__.py" and not re.search(rf"(?<![\w/]){re.escape(path.stem)}(\.py)?\b", text):
            missing.append(str(rel))
    assert not missing, f"docs/ARCHITECTURE.md does not name: {missing}"


def test_the_map_names_no_module_that_is_gone():
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"(?<![\w/])([a-z_]+)\.py\b", text)) - {"conftest"}   # not tests/...
    stems = {p.stem for p in PACKAGE.rglob("*.py")}
    assert named <= stems, f"named in docs/ARCHITECTURE.md but not in the package: {sorted(named - stems)}"
