"""The sandbox runs hostile programs without letting them reach the caller or outlive the run."""

from __future__ import annotations

import os
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from proc_markers import survivors_after

from opdgrpo.sandbox import SandboxResult, isolation, run_python

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


def test_isolation_probe_reports_booleans():
    info = isolation()
    assert set(info) == {"network", "pid", "filesystem"} and all(isinstance(v, bool) for v in info.values())
