"""Bad input fails before any compute, with a message that names the key, file or column and the fix,
and deletes nothing that is finished.

Cases covered elsewhere and not repeated here:
  - unknown study, unknown domain or teacher in a study, zero/negative learning rate, GRPO group size 1, OPD's KL support
    (`kl_top_k`) larger than the vocabulary, `seeds=[]`, `threads=two`, S2 bins: tests/unit/test_config_plan.py::test_bad_config_fails_early_naming_the_key
  - unknown profile: tests/unit/test_config_plan.py::test_unknown_profile_is_named
  - evals.jsonl missing `accuracy` (the report's curves input): tests/integration/test_report.py::test_missing_key_names_key_and_line
  - a malformed or truncated evals.jsonl line: tests/integration/test_report.py::test_malformed_middle_line_names_file_and_line,
    test_truncated_last_line_is_skipped_with_warning
  - domain blocks of instruction following and knowledge: tests/unit/test_domains_ifeval_knowledge.py::test_*_config_errors_name_the_key
  - the same refusals through Snakemake, before it schedules anything: tests/e2e/test_snakemake_cli.py
"""

from __future__ import annotations

import copy
import errno
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from opdgrpo import runio
from opdgrpo.config import ConfigError, compose, workflow_overrides
from opdgrpo.domains import Task
from opdgrpo.domains.math import MathDomain
from opdgrpo.plan.build import build_plan

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"


def _compose(*overrides: str):
    return compose(["profile=smoke", *overrides], CONF)


#: The error of a renamed key (opdgrpo.schema.RENAMED_KEYS), in a composed config's terms.
RENAMED = (r"config key `methods\.opd\.top_k` was renamed `methods\.opd\.kl_top_k` \(the support of OPD's reverse KL; "
           r"sampling's top_k is `train\.eval\.top_k`\)")


# ------------------------------------------------------------------------------------------- config, before planning
@pytest.mark.parametrize(
    "override,message",
    [
        ("domains.math.kind=algebra", r"`domains\.math\.kind`: unknown kind 'algebra'; known kinds: \['arithmetic'"),
        ("train.mix=weird", r"`train\.mix` must be one of \['balanced', 'instance'\]"),
        ("studies.S5b.mix=by_size", r"`studies\.S5b\.mix` must be one of"),
        ("models.student.pretrain.thinking_fraction=1.5", r"`models\.student\.pretrain\.thinking_fraction` must be in \[0, 1\]"),
        ("models.teacher_m.pretrain.thinking_fraction=-0.1", r"`models\.teacher_m\.pretrain\.thinking_fraction` must be in \[0, 1\]"),
        ("seeds=[0,a]", r"`seeds\[1\]` must be an integer, got 'a'"),
        ("seeds=3", r"`seeds` must be a list, got 3 \(a non-empty list of distinct non-negative integers"),
        ("seeds=[0.5]", r"`seeds\[0\]` must be an integer, got 0.5"),
        ("seeds=[0,0]", r"`seeds` must be a list without repeats, got \[0, 0\]"),
        ("seeds=[-1]", r"`seeds\[0\]` must be >= 0, got -1"),
        ("methods.grpo.lr=nan", r"`methods\.grpo\.lr` must be a finite number, got nan"),
        ("methods.grpo.grad_clip=nan", r"`methods\.grpo\.grad_clip` must be a finite number, got nan"),
        ("methods.opd.lr=inf", r"`methods\.opd\.lr` must be a finite number, got inf"),
        ("train.eval.temperature=-inf", r"`train\.eval\.temperature` must be a finite number, got -inf"),
        ("~train.max_new_tokens", r"missing config key `train\.max_new_tokens`.*; add it to conf/ or pass"),
        ("~methods.opd.kl_top_k", r"missing config key `methods\.opd\.kl_top_k` \(the support of OPD's reverse KL"),
        # a renamed key names its new name: as an override Hydra refuses (its hint), and as a key added to the block
        ("methods.opd.top_k=8", RENAMED + r"; use `methods\.opd\.kl_top_k` instead"),
        ("~methods.opd.top_k", RENAMED + r"; use `methods\.opd\.kl_top_k` instead"),
        ("+methods.opd.top_k=8", RENAMED + r"; rename it in conf/ or pass `methods\.opd\.kl_top_k=\.\.\.`"),
        ("methods.opd.lr=abc", r"`methods\.opd\.lr` must be a number, got 'abc'"),
        ("train.prompts_per_step=1.5", r"`train\.prompts_per_step` must be an integer, got 1\.5"),
        ("train.precision=fp8", r"`train\.precision` must be one of \['auto', 'bf16', 'fp32'\]"),
        ("domains.math.train.size=0", r"`domains\.math\.train\.size` must be >= 1, got 0 \(a positive number of prompts, or null"),
        ("domains.math.heldout.amc.size=0", r"`domains\.math\.heldout\.amc\.size` must be >= 1"),
        ("~domains.code.heldout.lcb", r"`domains\.code\.heldout` must be a non-empty mapping.*at least one held-out set"),
        ("domains.math.train.size=100000", r"`domains\.math` does not build its prompt pools: .*only about \d+ exist"),
        ("proflie=smoke", r"Could not override 'proflie'.*did you mean \['profile'\]"),
        ("methods.opd.lrr=1e-4", r"no key 'lrr' at methods\.opd; did you mean \['lr'\]"),
        ("mthod@methods.opd=opd", r"no config group 'mthod'.*did you mean \['method'"),
        ("profile=huge", r"Could not find 'profile/huge'.*smoke"),
        ("results_dir=/etc/passwd/x", r"`results_dir` \(/etc/passwd/x\) cannot be created: /etc/passwd is a file"),
    ],
)
def test_bad_config_fails_at_compose_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=f"(?s){message}"):
        _compose(override)


@pytest.mark.parametrize(
    "profile,override,message",
    [
        ("rehearsal", "+models.student.path=Qwen/Qwen3-4B-Base", r"`models\.student\.path` does nothing for `source: random`"),
        ("rehearsal", "tokenizer.path=Qwen/Qwen3-4B-Base", r"`tokenizer\.path` acts only with `tokenizer\.source: hub`"),
        ("rehearsal", "~models.student.seed", r"missing config key `models\.student\.seed`"),
        ("rehearsal", "tokenizer.source=hub", r"`tokenizer\.path` must be a string, got None"),
        ("paper", "+tokenizer.chat=true", r"`tokenizer\.chat` acts on scratch-built tokenizers only"),
    ],
)
def test_model_and_tokenizer_sources_refuse_keys_that_would_do_nothing(profile, override, message):
    with pytest.raises(ConfigError, match=f"(?s){message}"):
        compose([f"profile={profile}", override], CONF)


def test_a_renamed_key_in_a_conf_file_names_its_new_name(tmp_path):
    """A profile written before the rename still sets the old key: Hydra merges a file's keys without complaint, so
    the check on the composed config names the new key (not the schema's bare "unknown key")."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "profile" / "old.yaml").write_text("# @package _global_\ndefaults:\n  - smoke\n  - _self_\n\n"
                                              "methods:\n  opd:\n    top_k: 8\n")
    with pytest.raises(ConfigError, match=f"(?s){RENAMED}; rename it in conf/"):
        compose(["profile=old"], conf)


@pytest.mark.parametrize(
    "config,message",
    [
        ({"profle": "smoke"}, r"unknown `--config` key\(s\) \['profle'\].*did you mean \['profile'\]"),
        ({"override": ["seeds=[0]"]}, r"unknown `--config` key\(s\) \['override'\].*did you mean \['overrides'\]"),
        ({"overrides": {"seeds": 0}}, r"`--config overrides` must be a list of Hydra overrides"),
        ({"overrides": [1]}, r"`--config overrides` must be a list of Hydra overrides"),
    ],
)
def test_snakemake_config_keys_are_checked(config, message):
    """The Snakefile's `--config` mapping: a key it does not read is an error, never silently the default profile."""
    with pytest.raises(ConfigError, match=f"(?s){message}"):
        workflow_overrides(config)


def test_a_single_override_string_is_one_override_not_its_characters():
    assert workflow_overrides({"profile": "smoke", "overrides": "methods.grpo.lr=1e-4"}) == ["profile=smoke", "methods.grpo.lr=1e-4"]
    cfg = compose(workflow_overrides({"profile": "smoke", "overrides": "methods.grpo.lr=1e-4"}), CONF)
    assert cfg["methods"]["grpo"]["lr"] == 1e-4


def test_unwritable_results_dir_under_a_file_creates_nothing():
    """Tests run as root, for whom permission bits do not make a directory unwritable; a path under a regular
    file fails for every user (ENOTDIR), which is what this uses. A read-only mount fails the same probe (EROFS)."""
    with pytest.raises(ConfigError, match="results_dir"):
        _compose("results_dir=/etc/passwd/x/y")
    assert Path("/etc/passwd").is_file()


def test_unwritable_results_dir_is_probed_not_guessed(tmp_path, monkeypatch):
    """Where creating a file fails (read-only filesystem, no permission), the error names `results_dir` and the cause."""
    import tempfile

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(ConfigError, match=r"`results_dir` .* is not writable: cannot create a file in .*Read-only file system"):
        _compose(f"results_dir={tmp_path}/results")
    assert not (tmp_path / "results").exists()


def test_heldout_overlapping_training_fails_at_compose(monkeypatch):
    leak = _leaky_heldout(monkeypatch)
    with pytest.raises(ConfigError, match=rf"`domains\.math`: domain math: held-out set 'amc' shares 1 prompt\(s\) .*{leak}"):
        _compose()


# --------------------------------------------------------------------------------------------- run level, in train()
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The smoke plan with its tokenizer, and stand-in checkpoints that hold only what the checks read
    (tokenizer files and config.json, no weights): any model load would fail, so a test that gets the expected
    error also shows that no model was loaded and nothing was computed."""
    from opdgrpo.train.tokenizer import build_tokenizer, save_tokenizer

    root = tmp_path_factory.mktemp("bad")
    cfg = _compose(f"results_dir={root}/results")
    plan = build_plan(cfg)
    tok_dir = Path(plan.jobs["tokenizer"].out_dir)
    tok = build_tokenizer(cfg["domains"], cfg["tokenizer"]["vocab_size"], 50)
    save_tokenizer(tok, tok_dir)
    for job in plan.by_kind("base"):
        _fake_checkpoint(Path(job.out_dir) / "checkpoint", tok_dir, len(tok))
    return plan


def _fake_checkpoint(path: Path, tok_dir: Path, vocab_size: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for f in tok_dir.iterdir():
        (path / f.name).write_bytes(f.read_bytes())
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": vocab_size}))


def _swap_two_tokens(checkpoint: Path) -> None:
    """Same vocabulary size, different token -> id mapping: what a second tokenizer build would give."""
    file = checkpoint / "tokenizer.json"
    data = json.loads(file.read_text())
    vocab = data["model"]["vocab"]
    a, b = "a", "b"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    file.write_text(json.dumps(data))


@pytest.fixture()
def finished_run(tmp_path):
    """A finished run directory; its snapshot must be unchanged by any failed start."""
    run_dir = tmp_path / "finished"
    (run_dir / "checkpoint").mkdir(parents=True)
    for name, text in {"config.yaml": "run_id: x\n", "ledger.jsonl": '{"step": 0}\n', "evals.jsonl": '{"step": 0}\n',
                       "done.json": '{"counted": true}\n', "checkpoint/model.safetensors": "weights"}.items():
        (run_dir / name).write_text(text)
    return run_dir


def _snapshot(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(run_dir)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _run_cfg(plan, run_id: str) -> dict:
    return copy.deepcopy(plan.jobs[run_id].config)


def _leaky_heldout(monkeypatch) -> str:
    """Make the math domain's `amc` held-out set contain one training prompt (impossible by construction);
    returns that prompt, escaped for a regex."""
    original = MathDomain.heldout_sets
    leak = MathDomain(_compose()["domains"]["math"]).training_pool()[0]

    def leaky(self):
        sets = original(self)
        sets["amc"] = sets["amc"][:-1] + [Task(self.name, leak.prompt, leak.answer, leak.meta)]
        return sets

    monkeypatch.setattr(MathDomain, "heldout_sets", leaky)
    return re.escape(repr(leak.prompt))


def _fails_untouched(cfg, run_dir: Path, error, message: str) -> None:
    from opdgrpo.train.loop import train

    before = _snapshot(run_dir)
    with pytest.raises(error, match=f"(?s){message}"):
        train(cfg, run_dir)
    assert _snapshot(run_dir) == before
    assert not (run_dir / ".lock").exists()  # failed before it even took the run directory


def test_heldout_overlapping_training_fails_in_train(world, finished_run, monkeypatch):
    cfg = _run_cfg(world, "grpo-student-math-s0")
    leak = _leaky_heldout(monkeypatch)
    _fails_untouched(cfg, finished_run, ValueError, rf"domain math: held-out set 'amc' shares 1 prompt\(s\).*{leak}")


def test_empty_training_pool_fails_in_train(world, finished_run, monkeypatch):
    monkeypatch.setattr(MathDomain, "training_pool", lambda self: [])
    _fails_untouched(_run_cfg(world, "grpo-student-math-s0"), finished_run, ValueError,
                     r"domain math: the training pool is empty; check `domains\.math\.train`")


def test_empty_heldout_set_fails_in_train(world, finished_run):
    cfg = _run_cfg(world, "grpo-student-math-s0")
    cfg["domains"]["math"]["heldout"]["amc"]["size"] = 0
    _fails_untouched(cfg, finished_run, ValueError, r"domain math: held-out set\(s\) \['amc'\] are empty")


def test_invalid_mix_and_method_fail_in_train(world, finished_run):
    cfg = _run_cfg(world, "grpo-student-math+code-s0")
    cfg["train"]["mix"] = "weird"
    _fails_untouched(cfg, finished_run, ValueError, r"`train\.mix` must be one of")
    cfg = _run_cfg(world, "grpo-student-math-s0")
    cfg["method"]["name"] = "ppo"
    _fails_untouched(cfg, finished_run, ValueError, r"`method\.name` must be one of \['grpo', 'opd'\]")


def test_a_renamed_key_in_a_run_config_names_its_new_name(world, finished_run):
    """A run config written by hand (or before the rename) with the old key: the job names the new one."""
    cfg = _run_cfg(world, "opd-teacher_m-math-s0")
    cfg["method"]["top_k"] = cfg["method"].pop("kl_top_k")
    _fails_untouched(cfg, finished_run, ValueError,
                     r"config key `method\.top_k` was renamed `method\.kl_top_k` \(the support of OPD's reverse KL; "
                     r"sampling's top_k is `train\.eval\.top_k`\); regenerate the job's config from the plan")


def test_opd_without_a_teacher_for_a_domain(world, finished_run):
    cfg = _run_cfg(world, "opd-experts-math+code-s0")
    del cfg["teachers"]["code"]
    _fails_untouched(cfg, finished_run, ValueError, r"no teacher for domain\(s\) \['code'\]")


def test_teacher_with_another_tokenizer_of_the_same_size(world, finished_run, tmp_path):
    cfg = _run_cfg(world, "opd-teacher_m-math-s0")
    teacher = tmp_path / "other_teacher" / "checkpoint"
    shutil.copytree(cfg["teachers"]["math"]["path"], teacher)
    _swap_two_tokens(teacher)
    cfg["teachers"]["math"]["path"] = str(teacher)
    _fails_untouched(cfg, finished_run, ValueError,
                     r"teacher for math at .*other_teacher/checkpoint and the student at .* have different tokenizers: "
                     r"token 'a' has id \d+ in the teacher's and \d+ in the student's \(vocabulary sizes (\d+) and \1\).*share one tokenizer")


def test_student_with_another_tokenizer_than_the_run(world, finished_run, tmp_path):
    cfg = _run_cfg(world, "grpo-student-math-s0")
    student = tmp_path / "other_student" / "checkpoint"
    shutil.copytree(cfg["student"]["path"], student)
    _swap_two_tokens(student)
    cfg["student"]["path"] = str(student)
    _fails_untouched(cfg, finished_run, ValueError,
                     r"student at .* was built with another tokenizer than the run's .*token 'a' has id \d+ in the student's and \d+ in the run's")


def test_model_embedding_smaller_than_the_tokenizer(world, finished_run, tmp_path):
    cfg = _run_cfg(world, "grpo-student-math-s0")
    student = tmp_path / "small" / "checkpoint"
    _fake_checkpoint(student, Path(cfg["tokenizer"]), 100)
    cfg["student"]["path"] = str(student)
    _fails_untouched(cfg, finished_run, ValueError, r"embedding of 100 tokens, fewer than the tokenizer's")


def test_random_model_with_fewer_embedding_rows_than_its_tokenizer(world, tmp_path):
    from opdgrpo.stages.hub_models import build_random

    tokenizer = Path(_run_cfg(world, "grpo-student-math-s0")["tokenizer"])
    arch = {"source": "random", "seed": 0, "vocab_size": 8, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 32}
    with pytest.raises(ValueError, match=r"`models\.student\.vocab_size` \(8\) is smaller than the tokenizer's"):
        build_random(arch, "student", tokenizer, tmp_path)
    assert not (tmp_path / "random-init").exists()


def test_missing_upstream_checkpoint(world, finished_run, tmp_path):
    cfg = _run_cfg(world, "grpo-student-math-s0")
    cfg["student"]["path"] = str(tmp_path / "nowhere" / "checkpoint")
    _fails_untouched(cfg, finished_run, ValueError, r"student: no checkpoint at .*nowhere/checkpoint .*run its upstream job")


@pytest.mark.parametrize("content,message", [
    ({"domain": "math", "subsets": {"s0t0": {"student_rate": 0.5}}}, r"subset 's0t0' is missing key 'prompts'"),
    ({"domain": "math", "subsets": {"s0t0": {"prompts": []}}}, r"subset 's0t0' has no prompts \(an empty data set\)"),
    ({"domain": "math"}, r"missing key 'subsets'"),
])
def test_subsets_file_missing_prompts(world, finished_run, tmp_path, content, message):
    cfg = _run_cfg(world, "grpo-student-math_s0t0-s0")
    file = tmp_path / "subsets.json"
    file.write_text(json.dumps(content))
    cfg["train_subset"]["file"] = str(file)
    _fails_untouched(cfg, finished_run, ValueError, rf"subsets\.json: {message}.*rerun the S2 difficulty job")


# ------------------------------------------------------------------------------------------------------ disk full
def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_atomic_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "done.json"
    runio.write_json(path, {"finished": True})
    before = path.read_text()
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(OSError) as err:
        runio.write_json(path, {"finished": False, "pad": "x" * 10000})
    assert err.value.errno == errno.ENOSPC
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done.json"]  # the temp file is gone


def test_disk_full_append_keeps_earlier_lines(tmp_path, monkeypatch):
    path = tmp_path / "ledger.jsonl"
    for step in range(3):
        runio.append_jsonl(path, {"step": step})
    before = path.read_bytes()
    real_write = os.write

    def half_then_full(fd, data):  # a partial write, then the disk is full
        real_write(fd, bytes(data[: len(data) // 2]))
        _enospc()

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        runio.append_jsonl(path, {"step": 3, "pad": "x" * 100})
    monkeypatch.setattr(os, "write", real_write)
    assert path.read_bytes() == before  # the partial line was cut back off
    runio.append_jsonl(path, {"step": 3})  # and once there is space, the file goes on cleanly
    assert [r["step"] for r in runio.read_jsonl(path)] == [0, 1, 2, 3]


def test_scratch_pretraining_under_several_processes_is_refused(monkeypatch, tmp_path, capsys):
    """`resources.base.gpu` > 1 starts base jobs under torchrun: hub and random models split their evaluation, but a
    model pretrained from scratch would be trained and written by every process."""
    import json

    from opdgrpo.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = {"name": "student", "model": {"source": "scratch"}, "train": {}}
    assert main(["pretrain", "--out", str(tmp_path / "base"), "--config-json", json.dumps(cfg)]) == 2
    assert "resources.base.processes=1" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "base").iterdir()] == [".lock"]   # only the job lock: nothing written
