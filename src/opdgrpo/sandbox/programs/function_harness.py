"""The code domain's harness (opdgrpo.sandbox.execution): forks a fresh process per item (program + tests), runs the module
and each test call under a ``setitimer`` alarm, and prints one JSON line per item as it finishes. The host appends
``main(<payload>)``. The child's protocol, one JSON line each: ["c"] compiled and found the function, ["s"] syntax
error, ["x", exc] module code raised, ["t"] module code timed out, ["n"] no such function; then per test ["v", value],
["e", exc], ["t"] (and stop), ["u"] not JSON-serialisable, ["b"] longer than the cap; finally ["d"]. The parent
re-encodes what it parsed, so nothing the child writes reaches stdout verbatim. From harness_common.py:
``own_pid_namespace``, ``start_in_own_group``, ``kill_all``."""
# ruff: noqa: F821 (names from harness_common.py, which the host sends first)

import json
import os
import select
import signal
import sys
import time

_exit, _write, _dumps = os._exit, os.write, json.dumps  # bound before any user code runs


_DONE = '["d"]'  # last line from an item: the harness need not wait for EOF (a daemon may hold the pipe)


class _Timeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


def _send(fd, text):
    data = (text + "\n").encode("utf-8", "replace")
    while data:
        data = data[_write(fd, data):]


def _child(item, fd, limit):
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for target in (0, 1, 2):
            os.dup2(devnull, target)
        signal.signal(signal.SIGALRM, _on_alarm)
        try:
            code = compile(item["source"], "<solution>", "exec")
        except BaseException:
            _send(fd, '["s"]')
            return
        namespace = {"__name__": "solution", "__builtins__": __builtins__}
        try:
            signal.setitimer(signal.ITIMER_REAL, limit)
            try:
                exec(code, namespace)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Timeout:
            _send(fd, '["t"]')
            return
        except BaseException as exc:
            _send(fd, _dumps(["x", type(exc).__name__]))
            return
        func = namespace.get(item["func"])
        if not callable(func):
            _send(fd, '["n"]')
            return
        _send(fd, '["c"]')
        for args, cap in zip(item["args"], item["caps"]):
            try:
                signal.setitimer(signal.ITIMER_REAL, limit)
                try:
                    value = func(*args)
                    try:
                        text = _dumps(value)
                    except Exception:
                        text = None
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except _Timeout:
                _send(fd, '["t"]')
                return
            except BaseException as exc:
                _send(fd, _dumps(["e", type(exc).__name__]))
                continue
            if text is None:
                _send(fd, '["u"]')
            elif len(text) > cap:
                _send(fd, '["b"]')
            else:
                _send(fd, '["v",' + text + "]")
    except _Timeout:  # an alarm that fired just after a call returned
        _send(fd, '["t"]')
    finally:
        try:
            _send(fd, _DONE)
        finally:
            _exit(0)


DONE_LINE = (_DONE + "\n").encode()


def _run_item(index, item, limit, slack):
    budget = limit * (len(item["args"]) + 1) + slack
    max_bytes = sum(item["caps"]) + 64 * (len(item["args"]) + 4)
    record = {"i": index, "log": [], "end": None}
    read_end, write_end = os.pipe()
    pid = start_in_own_group(lambda: _child(item, write_end, limit), read_end)
    os.close(write_end)
    deadline = time.monotonic() + budget
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            record["end"] = "timeout"
            break
        if not select.select([read_end], [], [], left)[0]:
            continue
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        data += chunk
        if len(data) > max_bytes:
            record["end"] = "protocol"
            break
        if data.endswith(DONE_LINE):
            data = data[: -len(DONE_LINE)]
            break
    os.close(read_end)
    kill_all(pid, OWN_PID_NAMESPACE)  # the item, anything it started in its group, and what escaped the group
    os.waitpid(pid, 0)
    for line in data.split(b"\n")[:-1]:
        try:
            entry = json.loads(line)
        except ValueError:
            record["end"] = "protocol"
            break
        if not isinstance(entry, list) or not entry:
            record["end"] = "protocol"
            break
        record["log"].append(entry)
    return record


def _warm_up():
    # The first compile() and json.dumps() in a process set up interpreter state (about 2 ms of CPU and 150 page
    # faults). Done once here, before any fork, every item inherits it instead of redoing it: the harness's CPU
    # per item halves (benchmarks/sandbox_warmup.py). No user code has run yet; nothing of it is visible to items.
    exec(compile("def _w(x):\n    return [x, {1: (x, 2.0)}]\n", "<warm-up>", "exec"), {})
    _dumps([1, {"a": 2.0}, None, True, "s"])


def main(payload):
    global OWN_PID_NAMESPACE
    OWN_PID_NAMESPACE = own_pid_namespace()
    limit, slack = payload["timeout"], payload["slack"]
    _warm_up()
    for index, item in enumerate(payload["items"]):
        try:
            record = _run_item(index, item, limit, slack)
        except OSError:  # fork or pipe failed: report nothing more; the caller reruns the rest
            break
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()
