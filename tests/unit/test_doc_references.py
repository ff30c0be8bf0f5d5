"""Every pointer into the docs resolves: a markdown link to a `.md` file (in README, docs, benchmarks, workflow) names
a file that exists and, with an anchor, a heading it has; any mention of a `docs/....md` path (in those and in src,
tests, scripts, conf) names a file that exists; and a prose pointer `docs/<file>.md, "Section"` names a heading that
starts with that title (or a bold paragraph label that does). Docs move and headings get renamed; a pointer
that leads nowhere costs a reader more than no pointer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = ["README.md", "CONTRIBUTING.md", "docs", "src", "tests", "scripts", "benchmarks", "conf", "workflow", "Snakefile"]
SUFFIXES = {".md", ".py", ".yaml", ".smk", ".rst", ".sh", ""}

LINK = re.compile(r"\]\(([^)#\s:]+\.md)(#[\w-]+)?\)")
MENTION = re.compile(r"(?<![\w/.])(docs/[\w/.-]+\.md)")
PROSE = re.compile(r"(docs/[\w-]+\.md),\s+\"([^\"]+)\"")


def _files() -> list[Path]:
    out = []
    for name in SOURCES:
        path = REPO / name
        if path.is_file():
            out.append(path)
        elif path.is_dir():
            out += [p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES and "egg-info" not in str(p)
                    and "__pycache__" not in p.parts and "fixtures" not in p.parts
                    and p.resolve() != Path(__file__).resolve()]
    return out


def _headings(doc: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in doc.read_text().splitlines() if re.match(r"#{1,6} ", line)]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.lower())
    return text.replace(" ", "-")


def _links() -> list[tuple[str, Path, str | None]]:
    found = []
    for f in _files():
        text = f.read_text(errors="replace")
        if f.suffix in (".md", ".rst"):
            for m in LINK.finditer(text):
                target, anchor = m.group(1), m.group(2)
                found.append((f"{f.relative_to(REPO)} -> {target}{anchor or ''}", (f.parent / target).resolve(), anchor))
        for m in MENTION.finditer(text):
            found.append((f"{f.relative_to(REPO)} mentions {m.group(1)}", REPO / m.group(1), None))
    return sorted(set(found), key=lambda t: t[0])


def test_the_scan_finds_pointers():
    assert len(_links()) > 20 and len(_prose()) > 10


@pytest.mark.parametrize("where,path,anchor", _links(), ids=[w for w, _, _ in _links()])
def test_a_link_into_docs_resolves(where, path, anchor):
    assert path.is_file(), f"{where}: no such file"
    if anchor:
        anchors = {_anchor(h) for h in _headings(path)}
        assert anchor[1:] in anchors, f"{where}: {path.name} has no heading with that anchor"


def _prose() -> list[tuple[str, str, str]]:
    found = []
    for f in _files():
        text = re.sub(r"\s*\n\s*(?:#|\*|//)?\s*", " ", f.read_text(errors="replace"))  # pointers split over lines
        for m in PROSE.finditer(text):
            found.append((str(f.relative_to(REPO)), m.group(1), m.group(2)))
    return found


@pytest.mark.parametrize("where,doc,title", _prose(), ids=[f"{w} -> {d}, {t}" for w, d, t in _prose()])
def test_a_named_section_exists(where, doc, title):
    path = REPO / doc
    assert path.is_file(), f"{where}: {doc} does not exist"
    title = title.rstrip(".")
    labelled = f"**{title}" in path.read_text()   # a bold paragraph label also names a section
    assert labelled or any(h.startswith(title) for h in _headings(path)), f"{where}: {doc} has no section {title!r}"
