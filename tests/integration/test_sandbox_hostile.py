"""Hostile programs against the sandbox and the batched harness.

Every case checks, besides its own status: the run ends within its timeout plus a few seconds; no
process of the run survives it (each run's environment carries a unique marker, looked for in every
process's environ and cmdline); nothing appears outside the sandbox's temporary directory, which is
itself removed; and the caller keeps working (a normal program afterwards is "ok").
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import time
import types
import uuid

import pytest
from proc_markers import survivors_after

import opdgrpo.sandbox as sandbox
from opdgrpo.execution import ProgramCheck, check_programs
from opdgrpo.sandbox import isolation, run_python

SECRET_TOKEN = "secret-hf-" + uuid.uuid4().hex
SECRET_KEY = "-----BEGIN OPENSSH PRIVATE KEY----- secret-key-" + uuid.uuid4().hex
SLACK_S = 3.0  # allowed on top of a run's timeout (start-up, kill, reap)


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A fake HOME with a key, a token in the environment, places to write to, a marked sandbox."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_rsa"
    key.write_text(SECRET_KEY)
    key.chmod(0o600)
    project = tmp_path / "project"
    project.mkdir()
    shared = tempfile.mkdtemp(prefix="opdgrpo-hostile-")  # world-writable, like /tmp itself
    os.chmod(shared, 0o1777)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_TOKEN", SECRET_TOKEN)

    marker = "opdgrpo-hostile-" + uuid.uuid4().hex
    real_env = sandbox._child_env
    monkeypatch.setattr(sandbox, "_child_env", lambda workdir: {**real_env(workdir), "OPDGRPO_MARK": marker})
    workdirs: list[str] = []

    def mkdtemp(**kwargs):
        workdirs.append(tempfile.mkdtemp(**kwargs))
        return workdirs[-1]

    monkeypatch.setattr(sandbox, "tempfile", types.SimpleNamespace(mkdtemp=mkdtemp))
    w = types.SimpleNamespace(
        home=str(home), key=str(key), project=str(project), shared=shared, marker=marker, workdirs=workdirs,
        fields={"HOME": str(home), "PROJECT": str(project), "SHARED": shared, "CALLER": os.getpid(), "MARK": marker},
    )
    yield w
    shutil.rmtree(shared, ignore_errors=True)


def _check_aftermath(w, *, daemon_wait_s: float = 0.0) -> None:
    assert survivors_after(w.marker, grace_s=2.0) == [], "a process of the run survived it"
    if daemon_wait_s:
        time.sleep(daemon_wait_s)
    assert sorted(os.listdir(w.home)) == [".ssh"] and os.listdir(os.path.join(w.home, ".ssh")) == ["id_rsa"]
    assert os.listdir(w.project) == [] and os.listdir(w.shared) == []
    assert w.workdirs and not any(os.path.exists(d) for d in w.workdirs), "sandbox dir left behind"
    after = run_python("print('still fine')\n", timeout_s=5)
    assert after.status == "ok" and after.stdout == "still fine\n"


def _need(what: str) -> None:
    if not isolation()[what]:
        pytest.skip(f"the sandbox gets no {what} namespace on this machine (sandbox.isolation() = {isolation()})")


# name -> (source, run_python kwargs, statuses accepted, namespace the case relies on)
_WRITES = "import os\nopen(os.path.join({where!r}, 'escaped'), 'w').write('x')\n"
CASES = {
    "endless_loop": ("while True:\n    pass\n", {"timeout_s": 1, "cpu_s": 30}, {"timeout"}, None),
    "cpu_threads": (
        "import threading\ndef burn():\n    while True:\n        pass\n"
        "for _ in range(4):\n    threading.Thread(target=burn, daemon=True).start()\nburn()\n",
        {"timeout_s": 4, "cpu_s": 1}, {"cpu"}, None,
    ),
    "fork_bomb": (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        {"timeout_s": 1}, {"timeout", "cpu"}, None,
    ),
    "memory_bomb": ("x = []\nwhile True:\n    x.append(bytearray(10**7))\n", {"timeout_s": 2}, {"memory"}, None),
    "deep_recursion": (
        "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1) + 1\nf(0)\n",
        {"timeout_s": 2}, {"signal", "memory", "error", "timeout"}, None,  # 3.11 frames live on the heap
    ),
    "stdout_flood": (
        "import os\nchunk = b'y' * 2**20\nfor _ in range(4096):\n    os.write(1, chunk)\n",
        {"timeout_s": 2}, {"output"}, None,
    ),
    "stderr_flood": (
        "import os\nchunk = b'e' * 2**20\nfor _ in range(4096):\n    os.write(2, chunk)\n",
        {"timeout_s": 2}, {"output"}, None,
    ),
    "write_home": (_WRITES.format(where="{HOME}"), {"timeout_s": 2}, {"error"}, "filesystem"),
    "write_shared_tmp": (_WRITES.format(where="{SHARED}"), {"timeout_s": 2}, {"error"}, "filesystem"),
    "write_project": (_WRITES.format(where="{PROJECT}"), {"timeout_s": 2}, {"error"}, "filesystem"),
    "read_secrets": (  # the token from env and every visible /proc/*/environ, the key via ~
        "import os\nprint(dict(os.environ))\nfor p in os.listdir('/proc'):\n    try:\n"
        "        print(open('/proc/%s/environ' % p, 'rb').read())\n    except OSError:\n        pass\n"
        "for p in ('/proc/{CALLER}/environ', os.path.expanduser('~/.ssh/id_rsa')):\n"
        "    try:\n        print(open(p, 'rb').read())\n    except OSError as e:\n        print(e)\n"
        "raise SystemExit(1)\n",
        {"timeout_s": 2}, {"error"}, "pid",
    ),
    "double_fork_daemon": (
        "import os, time\nif os.fork() == 0:\n    if os.fork() == 0:\n        time.sleep(1.0)\n"
        "        for d in ({SHARED!r}, {PROJECT!r}):\n            open(os.path.join(d, 'daemon'), 'w').write('x')\n"
        "    os._exit(0)\nraise SystemExit(3)\n",
        {"timeout_s": 2}, {"error"}, None,
    ),
    "kill_parent_and_caller": (
        "import os, signal, time\nfor sig in (signal.SIGTERM, signal.SIGKILL):\n"
        "    for pid in (os.getppid(), {CALLER}):\n        try:\n            os.kill(pid, sig)\n"
        "        except OSError:\n            pass\n"
        "if os.environ.get('OPDGRPO_SANDBOX_PIDNS') == '1':\n    try:\n        os.kill(-1, signal.SIGKILL)\n"
        "    except OSError:\n        pass\n"
        "time.sleep(30)\n",
        {"timeout_s": 1}, {"timeout"}, "pid",
    ),
    "close_stdio": ("import os, time\nfor fd in (0, 1, 2):\n    os.close(fd)\ntime.sleep(30)\n", {"timeout_s": 1}, {"timeout"}, None),
    "stdin_echo_flood": (
        "import sys\nwhile True:\n    data = sys.stdin.buffer.read(2**16)\n    if not data:\n        break\n"
        "    sys.stdout.buffer.write(data)\n",
        {"timeout_s": 2, "stdin": "z" * (32 * 2**20)}, {"output"}, None,
    ),
    "stdin_spin_after_eof": ("import sys\nwhile True:\n    sys.stdin.read()\n", {"timeout_s": 1, "stdin": "a" * 10**6}, {"timeout"}, None),
    "ctypes_segfault": ("import ctypes\nctypes.string_at(0)\n", {"timeout_s": 2}, {"signal"}, None),
    "raise_rlimits": (
        "import resource\nfor r in (resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_NPROC,"
        " resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE):\n"
        "    resource.setrlimit(r, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "print('raised')\n",
        {"timeout_s": 2}, {"error"}, None,
    ),
    "setsid_escape": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    os.setpgid(0, 0)\n    time.sleep(1.0)\n"
        "    open(os.path.join({SHARED!r}, 'escaped'), 'w').write('x')\n    time.sleep(30)\n"
        "raise SystemExit(4)\n",
        {"timeout_s": 2}, {"error"}, "pid",
    ),
    "popen_sleep_and_exit": (
        "import subprocess, sys\nsubprocess.Popen(['sleep', '100'], start_new_session=True)\nsys.exit(5)\n",
        {"timeout_s": 2}, {"error"}, "pid",
    ),
    "ignore_sigterm": (
        "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU):\n"
        "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass\n",
        {"timeout_s": 1, "cpu_s": 30}, {"timeout"}, None,
    ),
    "exit_odd_code": ("import sys\nsys.exit(-1)\n", {"timeout_s": 2}, {"error"}, None),
    "exit_object": ("import sys\nsys.exit(object())\n", {"timeout_s": 2}, {"error"}, None),
    "exit_256": ("import os\nos._exit(256)\n", {"timeout_s": 2}, {"ok", "error"}, None),
    "huge_file": (
        "chunk = b'0' * 2**20\nwith open('big', 'wb') as fh:\n    for _ in range(4096):\n        fh.write(chunk)\n",
        {"timeout_s": 3, "file_mb": 8}, {"error", "signal"}, None,
    ),
    "thousands_of_files": (
        "fs = [open('f%d' % i, 'w') for i in range(5000)]\n", {"timeout_s": 2}, {"error"}, None,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_program(name, world):
    source, kwargs, statuses, needs = CASES[name]
    if needs:
        _need(needs)
    kwargs = dict(kwargs)
    timeout = kwargs["timeout_s"]
    start = time.monotonic()
    r = run_python(source.format(**world.fields), **kwargs)
    elapsed = time.monotonic() - start
    print(f"\n{name}: status={r.status} returncode={r.returncode} wall={elapsed:.2f}s")
    assert elapsed < timeout + SLACK_S
    assert r.status in statuses, (r.status, r.returncode, r.stderr[-600:])
    assert SECRET_TOKEN not in r.stdout + r.stderr and "secret-key-" not in r.stdout + r.stderr
    if name == "exit_256":  # exit statuses are taken mod 256: this one really is 0
        assert r.returncode == 0
    _check_aftermath(world, daemon_wait_s=1.0 if name in ("double_fork_daemon", "setsid_escape") else 0.0)


def test_network_connection_to_a_local_listener_fails(world):
    _need("network")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        port = server.getsockname()[1]
        src = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')\n"
        r = run_python(src, timeout_s=3)
        with pytest.raises(socket.timeout):
            server.accept()
    assert r.status == "error" and "connected" not in r.stdout
    _check_aftermath(world)


def test_caller_survives_signals_to_its_process_group(world):
    """Without a PID namespace the program can still not reach the caller's group: it has its own."""
    src = "import os, signal\nos.killpg(os.getpgid(0), signal.SIGKILL)\n"
    r = run_python(src, timeout_s=2, namespaces=False)
    assert r.status == "signal" and r.returncode == -signal.SIGKILL  # and we are still here
    _check_aftermath(world)


# ---- the batched harness ---------------------------------------------------------------------------

TESTS = (((1,), 4), ((2,), 7))
GOOD = "def f(x):\n    return 3 * x + 1\n"


def _batch(hostile: str, per_test_s: float = 0.3, batch_s: float = 20.0):
    programs = [GOOD + "# a\n", hostile, GOOD + "# b\n", "def f(x):\n    return x\n"]
    start = time.monotonic()
    out = check_programs([ProgramCheck(p, "f", TESTS) for p in programs], per_test_timeout_s=per_test_s,
                         batch_timeout_s=batch_s, workers=1)  # fmt: skip
    elapsed = time.monotonic() - start
    assert [(o.passed, o.status) for o in (out[0], out[2], out[3])] == [(2, "ok"), (2, "ok"), (0, "ok")]
    return out[1], elapsed


def test_harness_item_that_kills_the_harness(world):
    hostile = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef f(x):\n    return 3 * x + 1\n"
    outcome, elapsed = _batch(hostile)
    print(f"\nkill harness: {outcome} in {elapsed:.2f}s")
    assert (outcome.passed, outcome.status) == (0, "sandbox") and elapsed < 10
    _check_aftermath(world)


@pytest.mark.parametrize("target", ["harness", "self"])
def test_harness_item_that_sigstops(target, world):
    who = "os.getppid()" if target == "harness" else "os.getpid()"
    hostile = f"import os, signal\ndef f(x):\n    os.kill({who}, signal.SIGSTOP)\n    return 3 * x + 1\n"
    outcome, elapsed = _batch(hostile, batch_s=30.0)
    print(f"\nSIGSTOP {target}: {outcome} in {elapsed:.2f}s")
    assert outcome.passed == 0 and outcome.status in ("timeout", "sandbox")
    assert elapsed < 15  # far below the 30 s batch timeout
    _check_aftermath(world)


def test_harness_item_with_an_endless_loop(world):
    hostile = "def f(x):\n    while True:\n        pass\n"
    outcome, elapsed = _batch(hostile)
    print(f"\nendless loop: {outcome} in {elapsed:.2f}s")
    assert (outcome.passed, outcome.status) == (0, "timeout") and elapsed < 8
    _check_aftermath(world)

