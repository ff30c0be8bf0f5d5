"""The code domain's harness (opdgrpo.sandbox.execution): reads {"timeout", "slack", "value_cap", "item_cap", "items":
[{"source", "func", "args"}, ...]} from stdin; forks a fresh process per item (program + test arguments), runs the
module and each test call under a ``setitimer`` alarm, and prints one JSON line per item as it finishes. The child's
protocol, one JSON line each: ["c"] compiled and found the function, ["s"] syntax error, ["x", exc] module code
raised, ["t"] module code timed out, ["n"] no such function; then per test ["v", value], ["e", exc], ["t"] (and
stop), ["u"] not JSON-serialisable, ["b"] longer than ``value_cap``; finally ["d"]. The parent re-encodes what it
parsed, so nothing the child writes reaches stdout verbatim.

Nothing here depends on an expected result (the caps are constants of the host), and before any user code runs a
child drops every reference to the other items (their programs and arguments); a record of an earlier item is gone
before the next item is forked. So a program that walks frames, ``gc`` or the main module finds only its own item.
The payload comes on stdin, not in this script's text, so the script file in the work directory holds no item either.
From harness_common.py: ``own_pid_namespace``, ``start_in_own_group``, ``kill_all``."""
# ruff: noqa: F821 (names from harness_common.py, which the host sends first)

import json
import os
import select
import signal
import sys
import time

_exit, _write, _dumps = os._exit, os.write, json.dumps  # bound before any user code runs


_PENDING = []  # the items not yet run; a child empties it before any user code runs
_CAPS = {}  # "value_cap" (bytes of one returned value's JSON) and "item_cap" (bytes a child may send): constants
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
        _PENDING.clear()  # the other items' programs and arguments: out of this process's reach
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
        value_cap = _CAPS["value_cap"]
        for args in item["args"]:
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
            elif len(text) > value_cap:
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
    max_bytes = min((_CAPS["value_cap"] + 64) * len(item["args"]) + 256, _CAPS["item_cap"])
    record = {"i": index, "log": [], "end": None}
    read_end, write_end = os.pipe()
    pid = start_in_own_group(lambda: _child(item, write_end, limit), read_end)
    os.close(write_end)
    deadline = time.monotonic() + budget
    data = bytearray()
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
            del data[-len(DONE_LINE) :]
            break
    os.close(read_end)
    kill_all(pid, OWN_PID_NAMESPACE)  # the item, anything it started in its group, and what escaped the group
    os.waitpid(pid, 0)
    lines = data.split(b"\n")[:-1]
    if record["end"] == "protocol" or len(lines) > len(item["args"]) + 1:  # ["c"] and a line per test at most
        record["end"] = "protocol"  # nothing of a flood is parsed or sent on: the host scores it 0 anyway
        return record
    for line in lines:
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


def _report(index, item, limit, slack):
    """Run one item and print its record; the record dies with this call, before the next item is forked."""
    record = _run_item(index, item, limit, slack)
    _send(1, json.dumps(record))


def main():
    global OWN_PID_NAMESPACE
    OWN_PID_NAMESPACE = own_pid_namespace()
    payload = json.loads(sys.stdin.buffer.read())
    limit, slack = payload["timeout"], payload["slack"]
    _CAPS.update(value_cap=payload["value_cap"], item_cap=payload["item_cap"])
    _PENDING.extend(payload.pop("items"))
    _PENDING.reverse()  # popped from the end, in order
    _warm_up()
    index = 0
    while _PENDING:
        item = _PENDING.pop()
        try:
            _report(index, item, limit, slack)
        except OSError:  # fork or pipe failed: report nothing more; the caller reruns the rest
            break
        index += 1


if __name__ == "__main__":
    main()
