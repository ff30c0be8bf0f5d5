"""The code's shape, as docs/ARCHITECTURE.md promises it: short functions, and data flowing one way (conf -> plan ->
rules -> run directories -> report), so no module imports one further up that chain than itself."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "opdgrpo"
LONGEST = 80   # lines, decorators and docstring included


def _modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(SRC)): ast.parse(p.read_text(encoding="utf-8")) for p in SRC.rglob("*.py")}


def test_no_function_is_longer_than_80_lines():
    long = [f"{name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for name, tree in _modules().items() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > LONGEST]
    assert not long, f"split these into named steps: {long}"


def _imports(tree: ast.Module, package: str) -> set[str]:
    """The opdgrpo modules a module imports (relative imports resolved against its package)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("opdgrpo")}


def test_the_report_never_imports_the_trainer_or_the_planner():
    """The report reads run directories and the studies' declarations (opdgrpo.plan.studies), nothing that plans or
    trains: it can run on run directories from anywhere."""
    for name, tree in _modules().items():
        if name.startswith("report/"):
            package = "opdgrpo." + name.rsplit("/", 1)[0].replace("/", ".")
            bad = {m for m in _imports(tree, package) if _group(m) not in ("base", "plan", "report")
                   or m.startswith(("opdgrpo.plan.build", "opdgrpo.plan.planner"))}
            assert not bad, f"src/opdgrpo/{name} imports {sorted(bad)}: the report reads run directories only"



def _import_graph() -> dict[str, set[str]]:
    """Module -> the opdgrpo modules it imports (function-level imports too), by dotted name."""
    modules = _modules()
    names = {("opdgrpo." + rel[:-3].replace("/", ".")).removesuffix(".__init__"): rel for rel in modules}
    graph = {}
    for name, rel in names.items():
        package = name if rel.endswith("__init__.py") else name.rsplit(".", 1)[0]
        deps = set()
        for imported in _imports(modules[rel], package):
            parts = imported.split(".")
            while parts and ".".join(parts) not in names:   # `from .x import name` names x, or x's module name
                parts.pop()
            if parts and ".".join(parts) != name:
                deps.add(".".join(parts))
        graph[name] = deps
    return graph


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    """Not one: the studies declare, the planner plans through them, the report renders them in its own half
    (opdgrpo.report.studies), and conf knows none of them (docs/ARCHITECTURE.md)."""
    circles = _circles(_import_graph())
    assert not circles, [sorted(c) for c in circles]


#: The package map (docs/ARCHITECTURE.md), by the first name under opdgrpo: what each group is made of.
GROUPS = {
    "base": ("", "runio", "progress", "tracking", "schema", "attempts", "errors", "gpu_slots"),
    "sandbox": ("sandbox",),
    "verifiers": ("verifiers",),
    "domains": ("domains", "subsets"),
    "config": ("config", "run_shape", "job_identity"),
    "plan": ("plan",),
    "train": ("train",),
    "stages": ("stages",),
    "cost": ("cost",),
    "report": ("report",),
    "cli": ("cli", "launch"),
}
#: Which groups each group may import (besides itself): conf -> plan -> (rules) -> train and the base stages -> run
#: directories -> report, with the cost model beside the plan (it prices runs with the trainer's own formulas).
#: Nothing imports a group downstream of it; the graph between groups has no cycle.
ALLOWED = {
    "base": set(),
    "sandbox": {"base"},
    "verifiers": {"base", "sandbox"},
    "domains": {"base", "sandbox", "verifiers"},
    "config": {"base", "domains"},
    "plan": {"base", "config", "domains"},
    "train": {"base", "sandbox", "verifiers", "domains", "config"},
    "stages": {"base", "sandbox", "verifiers", "domains", "config", "train"},
    "cost": {"base", "domains", "config", "plan", "train"},
    "report": {"base", "plan"},
    "cli": {"base", "sandbox", "verifiers", "domains", "config", "plan", "train", "stages", "cost", "report"},
}


def _group(module: str) -> str:
    top = module.split(".")[1] if "." in module else ""
    return next((g for g, tops in GROUPS.items() if top in tops), "?")


def test_every_module_is_in_the_package_map():
    """A new top-level module or package names its place in GROUPS (and docs/ARCHITECTURE.md's map)."""
    stray = sorted(m for m in _import_graph() if _group(m) == "?")
    assert not stray, f"add these to GROUPS: {stray}"


def test_imports_between_packages_point_one_way():
    """Every import between groups is one ALLOWED names (so conf never imports the studies, the studies never import
    the report, the trainer never imports the planner), and ALLOWED itself has no cycle."""
    graph = _import_graph()
    bad = [f"{m} ({_group(m)}) imports {d} ({_group(d)})" for m, deps in sorted(graph.items()) for d in sorted(deps)
           if _group(m) != _group(d) and _group(d) not in ALLOWED[_group(m)]]
    assert not bad, bad
    assert not _circles({g: set(allowed) for g, allowed in ALLOWED.items()})


def test_no_two_test_files_share_a_name():
    """tests/ has no __init__.py (pytest's rootdir-relative import mode is not set), so two files with one basename in
    different folders stop the whole collection with 'import file mismatch', on a clean clone where no cache hides it."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, list[str]] = {}
    for p in tests.rglob("test_*.py"):
        seen.setdefault(p.name, []).append(str(p.relative_to(tests)))
    clashes = {n: ps for n, ps in seen.items() if len(ps) > 1}
    assert not clashes, f"rename one of each: {clashes}"


def test_no_two_rule_files_are_the_same_rule_under_another_name():
    """Each stage's rule names what it consumes (Plan.inputs), so the DAG reads from workflow/rules/ alone."""
    import re

    rules = Path(__file__).resolve().parents[2] / "workflow" / "rules"
    bodies = {p.name: re.sub(rf"\b{p.stem}\b|\brule \w+:|#.*", "", p.read_text()) for p in rules.glob("*.smk")}
    same = [(a, b) for a in bodies for b in bodies if a < b and bodies[a] == bodies[b]]
    assert not same, f"identical apart from names and comments: {same}"


def test_the_report_imports_without_hydra_the_planner_or_the_config():
    """The report reads run directories and a spec: every module of opdgrpo.report imports, directly or through the
    studies' declarations, with Hydra and OmegaConf absent, and none of them loads the planner or opdgrpo.config (so
    a reader of results needs no config machinery, and the layering holds for indirect imports too)."""
    import subprocess
    import sys

    probe = (
        "import sys, pkgutil, importlib\n"
        "sys.modules['hydra'] = None; sys.modules['omegaconf'] = None\n"
        "import opdgrpo.report, opdgrpo.report.studies\n"
        "for m in pkgutil.walk_packages(opdgrpo.report.__path__, 'opdgrpo.report.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(' '.join(sorted(k for k in sys.modules if k.startswith('opdgrpo'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(done.stdout.split())
    assert "opdgrpo.report.studies.s3" in loaded
    assert not loaded & {"opdgrpo.plan.planner", "opdgrpo.config", "opdgrpo.plan.build"}, sorted(loaded)


def test_the_snakefile_includes_the_rules_in_the_order_the_dag_runs_them():
    """A reader of the Snakefile meets the stages as the data flows: helpers, base models, S2's selection, GRPO, OPD,
    the report; every rule file is included once."""
    import re

    repo = Path(__file__).resolve().parents[2]
    included = re.findall(r'^include: "workflow/rules/(\w+)\.smk"', (repo / "Snakefile").read_text(), re.M)
    assert included == ["common", "base", "difficulty", "grpo", "opd", "report"]
    assert sorted(included) == sorted(p.stem for p in (repo / "workflow" / "rules").glob("*.smk"))


def test_no_python_program_in_a_string_over_20_lines():
    """Programs are files (opdgrpo/sandbox/programs), linted and read like the rest; a string constant that parses as
    Python and runs over 20 lines is one that was not moved (docstrings aside)."""
    found = []
    for name, tree in _modules().items():
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and len(node.value.strip().splitlines()) > 20):
                try:
                    ast.parse(node.value)
                except SyntaxError:
                    continue
                found.append(f"{name}:{node.lineno} ({len(node.value.strip().splitlines())} lines)")
    assert not found, f"move these programs into files: {found}"
