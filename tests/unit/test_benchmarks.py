"""The benchmarks' own logic (counting, interleaving, config overrides), the ledger grid on a quick setting, and
that ``trl`` stays a benchmark-only dependency."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import common  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_logging():
    """The benchmarks quiet the `opdgrpo` logger (common.quiet); later tests read its INFO records."""
    import logging

    logger = logging.getLogger("opdgrpo")
    level = logger.level
    yield
    logger.setLevel(level)


def test_package_never_imports_trl():
    offenders = []
    for path in (REPO / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path}:{node.lineno}" for n in names if n == "trl" or n.startswith("trl.")]
    assert not offenders, f"trl is a benchmark-only dependency, imported at {offenders}"


def test_trl_only_in_the_bench_extra():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("trl")]
    bench = project["optional-dependencies"]["bench"]
    assert [d for d in bench if d.startswith("trl==")], bench


def test_generated_tokens_counts_up_to_and_including_the_first_eos():
    from sampler_vs_generate import generated_tokens

    eos = 1
    rows = torch.tensor([
        [5, 6, 1, 7, 1],  # 3: up to the first EOS
        [1, 5, 5, 5, 5],  # 1: EOS first
        [5, 5, 5, 5, 5],  # 5: never ended
        [5, 1, 0, 0, 0],  # 2: pads after EOS are not counted
    ])
    assert generated_tokens(rows, [eos]) == 3 + 1 + 5 + 2
    assert generated_tokens(rows, [eos, 7]) == 3 + 1 + 5 + 2
    assert generated_tokens(rows, [6]) == 2 + 5 + 5 + 5


def test_interleave_alternates_order_and_drops_warmup_rounds():
    calls = []

    def contender(name):
        def run():
            calls.append(name)
            return {"seconds": float(len(calls))}
        return run

    kept = common.interleave(3, 1, {"a": contender("a"), "b": contender("b")})
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert [r["seconds"] for r in kept["a"]] == [4.0, 5.0, 8.0]
    assert [r["seconds"] for r in kept["b"]] == [3.0, 6.0, 7.0]


def test_compare_reports_medians_per_trainer():
    results = {"ours": [{"seconds": s, "tokens": 100} for s in (1.0, 3.0, 2.0)],
               "trl": [{"seconds": s, "tokens": 120} for s in (4.0, 4.0, 10.0)]}
    text, summary = common.compare(results, {"ours": "ours", "trl": "TRL"}, batch=10)
    assert summary["ours"]["s_per_step"] == 2.0 and summary["trl"]["s_per_step"] == 4.0
    assert summary["ours"]["tokens_per_s"] == 50.0 and summary["trl"]["tokens_per_s"] == 30.0
    assert "| ours | 3 | 2.000 | 1-3 |" in text


def test_run_config_points_at_the_world_and_rejects_unknown_keys(tmp_path):
    world = common.World(tmp_path / "tok", {"student": tmp_path / "s", "teacher_l": tmp_path / "t"}, "test")
    cfg = common.run_config("opd", world, tmp_path, overrides={"method.kl_top_k": 4, "train.prompts_per_step": 2})
    assert cfg["method"]["name"] == "opd" and cfg["method"]["kl_top_k"] == 4 and cfg["train"]["prompts_per_step"] == 2
    assert cfg["student"]["path"] == str(tmp_path / "s") and cfg["tokenizer"] == str(tmp_path / "tok")
    assert cfg["teachers"] == {"math": {"from": "benchmark", "path": str(tmp_path / "t")}}
    with pytest.raises(SystemExit, match="method.kl_top_kk"):
        common.run_config("grpo", world, tmp_path, overrides={"method.kl_top_kk": 4})
    with pytest.raises(SystemExit, match=r"`method\.top_k` was renamed `method\.kl_top_k`"):
        common.run_config("opd", world, tmp_path, overrides={"method.top_k": 4})


def test_load_world_names_a_bad_directory(tmp_path):
    with pytest.raises(SystemExit, match="no tokenizer"):
        common.load_world(str(tmp_path), ["student"], tmp_path)
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"no checkpoint for \['student'\]"):
        common.load_world(str(tmp_path), ["student"], tmp_path)


def test_ledger_grid_quick_is_within_one_percent(monkeypatch, capsys):
    import ledger_vs_flopcounter

    monkeypatch.setattr(sys, "argv", ["ledger_vs_flopcounter.py", "--quick", "--batches", "3", "--lengths", "9",
                                      "--new-tokens", "5"])
    ledger_vs_flopcounter.main()  # exits non-zero above 1%
    out = capsys.readouterr().out
    assert "within the 1% target" in out
    for kind in ("| forward |", "| forward+backward |", "| sampler (cached) |", "| model.generate (cached) |"):
        assert kind in out
