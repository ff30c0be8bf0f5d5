"""Math rewards with Hugging Face ``math-verify``: 1.0 when the completion's final answer equals the gold answer.

Semantics follow math-verify's documented use (gold first: ``verify(parse(gold), parse(answer))``); the wrapping
of golds and the thinking-block rule are ours:

- the gold is a short answer string from a data set (``"17"``, ``"055"``, ``"\\frac{1}{2}"``, ``"2\\sqrt{3}"``). Plain
  text is parsed inside ``$...$``, because bare ``2\\sqrt{3}`` parses as ``2``; golds that already carry ``$`` or
  ``\\boxed`` are parsed as written;
- the completion is parsed after its last ``</think>`` (:func:`~opdgrpo.verifiers.final_answer_text`), so a boxed
  answer inside the reasoning is not scored; a completion that opens ``<think>`` and never closes it has no answer;
- extraction and comparison use math-verify's defaults: LaTeX *and* plain-expression targets for both sides (what
  its README recommends for predictions), ``float_rounding=6``, ``strict=True``. So a bare number outside math
  delimiters is read (``$``, ``5`` and ``$`` on three lines score against ``5``), where math-verify's own
  LaTeX-only regression tests find nothing; every other case of tests/unit/test_official_math.py gets
  math-verify's verdict;
- mixed numbers in plain text (``4 4/9``, ``-2 1/2``) are rewritten as improper fractions (``40/9``) before parsing:
  math-verify 0.9.0 reads ``The answer is 4 4/9.`` as 4 (scoring 1 against gold 4), ``2 1/2`` as 1 and ``12 3/4``
  as 3, which its newer releases' own mixed-number tests reject. Under RL that would pay a policy for appending a
  fraction to the right integer (tests/unit/test_official_math.py pins the cases). The rewrite takes the whole
  class of spellings, not one: any gap between the whole part and the fraction (any Unicode space such as no-break
  or thin spaces, a line break, zero-width characters, LaTeX's ``~``, ``\\,``, ``\\;``, ``\\ ``, ``\\quad`` and
  ``\\hspace{..}``, or the word "and"), any fraction slash (``/``, U+2044 ``⁄``, U+2215 ``∕``, fullwidth ``／``),
  super- and subscript digits (``4 ⁴⁄₉``) and the vulgar fraction characters (``4½``);
- a plain-text hedge between two numbers where math-verify would read one of them (no ``\\boxed`` in the answer,
  and the hedge in a sentence that states the answer or in the last line: ``The answer is 4 or 5``, ``4, or maybe
  5``) is no answer. math-verify takes the number after "answer is" (4) or the last number (5), so either way it
  would pay a list of candidates; boxed or ``$..$`` alternatives it already reads as a set, which equals no single
  gold;
- math-verify bounds each parse and comparison with ``signal.alarm``, which only works in a process's main thread.
  :class:`MathVerifier` therefore scores in worker processes, or with ``workers: 0`` in the caller's main thread.

Workers are fresh interpreters (``python -m opdgrpo.verifiers.math``, fork+exec like multiprocessing's ``spawn``:
nothing is forked from a trainer that holds torch threads, and, unlike ``spawn``, the caller's ``__main__`` is never
re-imported). They read chunks of ``(gold, completion)`` pairs as JSON lines and answer with scores. An alarm cannot
interrupt C code that never returns to the interpreter, so every chunk also has a wall-clock deadline: a chunk
whose worker misses it or dies scores 0, that worker is killed and replaced, and a warning is logged.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import re
import selectors
import subprocess
import sys
import tempfile
import threading
import time
import unicodedata
from collections import deque
from typing import Callable, Sequence

from . import answer_after_thinking

log = logging.getLogger(__name__)

STARTUP_S = 120.0      # how long a new worker may take to import sympy and math-verify (slow on a busy node)
CHUNK_SLACK_S = 10.0   # per-chunk allowance for pipes and scheduling on top of the alarm budget


def _alarm_seconds(timeout_s: float) -> int:
    """``signal.alarm`` takes whole seconds; round up so a timeout is never shorter than asked."""
    return max(1, math.ceil(float(timeout_s)))


def parse_gold(gold: str, timeout_s: float = 5.0) -> list:
    """The gold answer as math-verify objects; empty when math-verify cannot read it."""
    from math_verify import parse

    text = improper_fractions(str(gold).strip())
    if not text:
        return []
    alarm = _alarm_seconds(timeout_s)
    if "$" in text or "\\boxed" in text or "\\(" in text or "\\[" in text:
        return parse(text, parsing_timeout=alarm)
    return parse(f"${text}$", parsing_timeout=alarm) or parse(text, parsing_timeout=alarm)


# What may stand between the whole part and the fraction of a mixed number: any Unicode whitespace (``\s``: the
# no-break, thin and narrow spaces, line breaks), zero-width and invisible characters (U+2064 is "invisible plus",
# meant for mixed numbers), LaTeX's spaces (``~``, ``\,``, ``\;``, ``\:``, ``\>``, ``\ ``, ``\quad``,
# ``\thinspace``, ``\hspace{1em}``) and the word "and" ("4 and 4/9").
_GAP = (r"(?:[\s~\u200b-\u200d\u2060-\u2064\ufeff]|\\[,;:> ]|\\(?:q?quad|[a-z]*space)(?![A-Za-z])"
        r"|\\hspace\*?\{[^{}]*\}|(?<=\s)and(?=\s))+")
# Digits of the fraction: ASCII and other decimal digits, and super- and subscript digits (``⁴⁄₉``).
_DIGITS = r"[\d\u00b2\u00b3\u00b9\u2070\u2074-\u2079\u2080-\u2089]+"
_SLASH = r"[/\u2044\u2215\uff0f]"   # solidus, fraction slash, division slash, fullwidth solidus
#: A mixed number: a whole part, a gap, a fraction, standing alone (not part of a date, a ratio or a longer number:
#: ``1/2/3``, ``3.5 1/2`` and ``2 1/2/3`` are left as written).
_MIXED = re.compile(r"(?<![\d/.])([-\u2212]?)(\d+)" + _GAP + f"({_DIGITS}){_SLASH}({_DIGITS})"
                    + r"(?![\d/.\u2044\u2215]\d)")
# A vulgar fraction character (``½``, ``⅞``), with the whole number it may follow (``4½``).
_VULGAR = re.compile(r"(\d?)([\u00bc-\u00be\u2150-\u215e\u2189])")
_NUMBER = r"(?<![\w.])[-\u2212]?\d+(?:[.,]\d+)*(?:/\d+)?"
# A hedge between two numbers: "4 or 5", "4, or maybe 5", "either 4 or 5", "4 and/or 5", "4 vs 5", "4, possibly 5".
# Two numbers offered as alternatives: "4 or 5", "$4$ (or $5$)", "4, possibly 5", "4 (maybe 5)", or a range given as
# the answer, "between 4 and 5".
_HEDGE = re.compile(
    _NUMBER + r"\$?\s*,?\s*[(\[]?\s*(?:(?:or|and/or|nor|vs\.?|versus)(?:\s+(?:maybe|possibly|perhaps|probably))?"
    r"|maybe|possibly|perhaps|probably|alternatively)\s+\$?\s*[-\u2212]?\d"
    r"|\bbetween\s+\$?\s*" + _NUMBER + r"\$?\s+and\s+\$?\s*[-\u2212]?\d", re.IGNORECASE)
_ANSWER_SENTENCE = re.compile(r"(?i:\banswer\b)[^.\n]*\Z")
# Another sentence or line after a hedge: then the hedge was reasoning, unless its own sentence states the answer.
_LATER_SENTENCE = re.compile(r"\n|[.!?]\s+\S")


def _fraction_text(digits: str) -> int:
    return int(unicodedata.normalize("NFKC", digits))


def improper_fractions(text: str) -> str:
    """``4 4/9`` -> ``40/9``, ``-2 1/2`` -> ``-5/2``, ``4½`` -> ``9/2``: the value a reader gives a mixed number,
    which math-verify 0.9.0 does not (it reads ``4 4/9`` as 4), under any spacing, slash or digit form (_GAP)."""
    def vulgar(m: re.Match) -> str:
        fraction = unicodedata.normalize("NFKC", m.group(2)).replace("\u2044", "/")
        return f"{m.group(1)} {fraction}" if m.group(1) else fraction

    def whole(m: re.Match) -> str:
        sign = "-" if m.group(1) else ""
        w, n, d = int(m.group(2)), _fraction_text(m.group(3)), _fraction_text(m.group(4))
        return f"{sign}{w * d + n}/{d}" if d else m.group(0)
    return _MIXED.sub(whole, _VULGAR.sub(vulgar, text))


def hedged(text: str) -> bool:
    """Whether a plain-text answer names two numbers as alternatives ("The answer is 4 or 5"): math-verify would
    read one of them, which pays a list of candidates. Only where math-verify reads plain text (no ``\\boxed``), and
    only in a sentence that states the answer or in the last sentence, so reasoning that weighs "3 or 4 cases" before a
    stated result is still read."""
    if "\\boxed" in text:
        return False
    for m in _HEDGE.finditer(text):
        before = text[: m.start()]
        last_sentence = not _LATER_SENTENCE.search(text[m.start():].strip())
        if last_sentence or _ANSWER_SENTENCE.search(before):
            return True
    return False


def answer_text(completion: str) -> str | None:
    """The part of a completion that holds its answer; None when the model never finished thinking or hedged."""
    text = answer_after_thinking(completion)
    if text is None:
        return None
    text = improper_fractions(text)
    return None if hedged(text) else text


def verify_parsed(gold_parsed: list, completion: str, timeout_s: float = 5.0) -> bool:
    """Compare an already parsed gold with one completion (lets a worker parse each distinct gold once)."""
    from math_verify import parse, verify

    text = answer_text(completion)
    if not gold_parsed or text is None or not text.strip():
        return False
    alarm = _alarm_seconds(timeout_s)
    answer = parse(text, parsing_timeout=alarm)
    if not answer:
        return False
    return bool(verify(gold_parsed, answer, timeout_seconds=alarm))


def verify_one(gold: str, completion: str, timeout_s: float = 5.0) -> bool:
    """True when the completion's final answer equals ``gold``. Must run in a main thread (math-verify's alarms)."""
    return verify_parsed(parse_gold(gold, timeout_s), completion, timeout_s)


def score_chunk(pairs: Sequence[tuple[str, str]], timeout_s: float,
                check: Callable[[str, str, float], bool] | None = None) -> list[float]:
    """Scores of ``(gold, completion)`` pairs; what a worker runs. Each gold is parsed once per chunk.

    ``check`` replaces :func:`verify_one` (tests use it to make a worker hang or die); it must be importable by
    name in a spawned process.
    """
    out: list[float] = []
    golds: dict[str, list] = {}
    for gold, completion in pairs:
        try:
            if check is not None:
                ok = check(gold, completion, timeout_s)
            else:
                if gold not in golds:
                    golds[gold] = parse_gold(gold, timeout_s)
                ok = verify_parsed(golds[gold], completion, timeout_s)
        except Exception:  # math-verify raises on odd inputs only with raise_on_error; be safe: wrong answer
            ok = False
        out.append(1.0 if ok else 0.0)
    return out


def _check_ref(check: Callable | None) -> str | None:
    """``module:name`` of a replacement check, so a worker can import it."""
    if check is None:
        return None
    module, name = getattr(check, "__module__", None), getattr(check, "__qualname__", "")
    if not module or module == "__main__" or "<" in name or "." in name:
        raise ValueError(f"MathVerifier: check {check!r} must be a module-level function importable by name")
    return f"{module}:{name}"


def _load_check(ref: str | None) -> Callable | None:
    if not ref:
        return None
    module, name = ref.split(":", 1)
    return getattr(importlib.import_module(module), name)


def _worker_main() -> None:
    """A worker: announce readiness, then answer each JSON request line ``{pairs, timeout_s, check}`` with
    ``{scores}``. It runs in its own main thread, so math-verify's alarms work; it exits at end of input."""
    channel = os.fdopen(os.dup(1), "w", encoding="ascii")   # the protocol owns the real stdout; prints go to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)   # timeouts are expected; the caller sees 0 scores
    import math_verify  # noqa: F401  (import once, before announcing readiness)

    channel.write('{"ready": true}\n')
    channel.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        pairs = [(str(g), str(c)) for g, c in request["pairs"]]
        scores = score_chunk(pairs, float(request["timeout_s"]), _load_check(request.get("check")))
        channel.write(json.dumps({"scores": scores}) + "\n")
        channel.flush()


class WorkerDied(Exception):
    """A worker's output pipe closed: it exited or was killed."""


class _Worker:
    """One scoring process and its pipes; ``stderr`` goes to a temp file, shown when the worker fails to start."""

    def __init__(self) -> None:
        self.stderr = tempfile.TemporaryFile()
        paths = [p for p in sys.path if p and os.path.isdir(p)]   # what the caller can import, the worker can too
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        self.proc = subprocess.Popen([sys.executable, "-m", "opdgrpo.verifiers.math"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, env=env)
        self.fd = self.proc.stdout.fileno()
        self.buffer = b""

    def send(self, message: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(message).encode("ascii") + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as err:
            raise WorkerDied(str(err)) from err

    def read_message(self) -> dict | None:
        """The next complete message after the fd turned readable; None while a line is still partial."""
        if b"\n" not in self.buffer:
            data = os.read(self.fd, 1 << 16)
            if not data:
                raise WorkerDied(f"exit code {self.proc.poll()}")
            self.buffer += data
        if b"\n" not in self.buffer:
            return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.fd, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    raise RuntimeError(f"math verifier: a worker did not start within {timeout:.0f} s"
                                       f"{self.stderr_tail()}")
                try:
                    message = self.read_message()
                except WorkerDied as err:
                    raise RuntimeError(f"math verifier: a worker exited while starting ({err}){self.stderr_tail()}")
                if message is not None and message.get("ready"):
                    return

    def stderr_tail(self, limit: int = 2000) -> str:
        try:
            self.stderr.seek(0)
            text = self.stderr.read().decode("utf-8", "replace")[-limit:]
        except (OSError, ValueError):
            return ""
        return f"; its stderr ends with:\n{text}" if text.strip() else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.proc.wait()
        self.stderr.close()


class MathVerifier:
    """Scores completions against gold answers with math-verify, off the caller's threads.

    ``workers``: scoring processes, started on first use (0: score in the calling process, which must then be in
    its main thread); ``timeout_s``: math-verify's per-parse and per-comparison timeout (whole seconds, rounded up);
    ``chunk_size``: pairs per request (a hung worker costs at most one chunk, scored 0); ``deadline_s``: wall-clock
    limit per chunk (None: three timeouts per pair plus slack); ``check``: a module-level replacement for
    :func:`verify_one`, for tests.
    """

    def __init__(self, workers: int = 4, timeout_s: float = 5.0, chunk_size: int = 16,
                 deadline_s: float | None = None, check: Callable[[str, str, float], bool] | None = None):
        if int(workers) < 0:
            raise ValueError(f"MathVerifier: workers must be >= 0, got {workers!r}")
        if not float(timeout_s) > 0:
            raise ValueError(f"MathVerifier: timeout_s must be > 0, got {timeout_s!r}")
        if int(chunk_size) < 1:
            raise ValueError(f"MathVerifier: chunk_size must be >= 1, got {chunk_size!r}")
        if deadline_s is not None and not float(deadline_s) > 0:
            raise ValueError(f"MathVerifier: deadline_s must be > 0 or null, got {deadline_s!r}")
        self.workers = int(workers)
        self.timeout_s = float(timeout_s)
        self.chunk_size = int(chunk_size)
        self.deadline_s = None if deadline_s is None else float(deadline_s)
        self.check = check
        self._check_ref = _check_ref(check)
        self._pool: list[_Worker] = []
        self._lock = threading.Lock()
        self.replaced = 0          # workers killed after a missed deadline or a death (for logs and tests)

    # -- lifecycle ---------------------------------------------------------------------------------
    def _ensure_pool(self) -> None:
        self._pool = [w for w in self._pool if w.proc.poll() is None]
        fresh = [_Worker() for _ in range(self.workers - len(self._pool))]
        try:
            for worker in fresh:
                worker.wait_ready(STARTUP_S)
        except Exception:
            for worker in fresh:
                worker.kill()
            raise
        self._pool.extend(fresh)

    def close(self) -> None:
        """Stop the worker processes (a later :meth:`score` starts new ones)."""
        for worker in self._pool:
            worker.kill()
        self._pool = []

    def __enter__(self) -> "MathVerifier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_pool"], state["_lock"] = [], None   # processes cannot cross; a copy starts its own when it scores
        return state

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- scoring -----------------------------------------------------------------------------------
    def chunk_deadline(self, n: int) -> float:
        """Seconds a worker may spend on a chunk of ``n`` pairs before it is presumed hung."""
        if self.deadline_s is not None:
            return self.deadline_s
        return n * 3 * _alarm_seconds(self.timeout_s) + CHUNK_SLACK_S

    def score(self, golds: Sequence[str], completions: Sequence[str]) -> list[float]:
        """1.0/0.0 per completion: does its final answer equal the gold at the same index?"""
        if len(golds) != len(completions):
            raise ValueError(f"MathVerifier.score: {len(golds)} golds but {len(completions)} completions")
        pairs = [(str(g), str(c)) for g, c in zip(golds, completions)]
        if not pairs:
            return []
        if self.workers == 0:
            if threading.current_thread() is not threading.main_thread():
                raise RuntimeError("MathVerifier(workers=0) must run in the main thread: math-verify's timeouts use "
                                   "signal.alarm, which fails elsewhere (every answer would score 0); set "
                                   "`verifier.workers` >= 1")
            return score_chunk(pairs, self.timeout_s, self.check)
        with self._lock:
            return self._score_pool(pairs)

    def _chunks(self, pairs: list) -> list[tuple[int, list]]:
        """(start index, pairs): at most ``chunk_size`` each, small enough to keep every worker busy."""
        size = max(1, min(self.chunk_size, math.ceil(len(pairs) / self.workers)))
        return [(i, pairs[i:i + size]) for i in range(0, len(pairs), size)]

    def _score_pool(self, pairs: list) -> list[float]:
        scores = [0.0] * len(pairs)
        pending = deque(self._chunks(pairs))
        busy: dict[_Worker, tuple[int, list, float]] = {}   # a worker gets a chunk only when idle, so its
        try:                                                  # deadline runs from the moment it is sent
            self._schedule(pending, busy, scores)
        except BaseException:   # interrupted mid-batch: a busy worker's late answer must never meet the next batch
            for worker in busy:
                worker.kill()
            self._pool = [w for w in self._pool if w not in busy]
            raise
        return scores

    def _schedule(self, pending: deque, busy: dict, scores: list[float]) -> None:
        with selectors.DefaultSelector() as sel:
            while pending or busy:
                if pending and len(busy) < self.workers:
                    self._ensure_pool()
                    for worker in self._pool:
                        if worker in busy or not pending:
                            continue
                        start, chunk = pending.popleft()
                        try:
                            worker.send({"pairs": chunk, "timeout_s": self.timeout_s, "check": self._check_ref})
                        except WorkerDied as err:
                            self._lost(worker, chunk, f"it died ({err})")
                            continue
                        busy[worker] = (start, chunk, time.monotonic() + self.chunk_deadline(len(chunk)))
                        sel.register(worker.fd, selectors.EVENT_READ, worker)
                if not busy:
                    continue
                wait = min(deadline for _s, _c, deadline in busy.values()) - time.monotonic()
                for key, _events in sel.select(timeout=max(0.0, wait)):
                    worker = key.data
                    start, chunk, _deadline = busy[worker]
                    try:
                        message = worker.read_message()
                    except WorkerDied as err:
                        sel.unregister(worker.fd)
                        del busy[worker]
                        self._lost(worker, chunk, f"it died ({err})")
                        continue
                    if message is None:
                        continue
                    sel.unregister(worker.fd)
                    del busy[worker]
                    got = message.get("scores")
                    if isinstance(got, list) and len(got) == len(chunk):
                        scores[start:start + len(chunk)] = [float(x) for x in got]
                    else:
                        self._lost(worker, chunk, f"it answered {str(message)[:200]!r}")
                now = time.monotonic()
                for worker, (_start, chunk, deadline) in list(busy.items()):
                    if now >= deadline:
                        sel.unregister(worker.fd)
                        del busy[worker]
                        self._lost(worker, chunk, f"it missed its {self.chunk_deadline(len(chunk)):.0f} s deadline")

    def _lost(self, worker: _Worker, chunk: list, why: str) -> None:
        """A chunk whose worker failed scores 0 (left as initialised); the worker is killed and later replaced."""
        log.warning("math verifier: a chunk of %d answers scores 0 because %s; the worker is replaced", len(chunk), why)
        worker.kill()
        self._pool = [w for w in self._pool if w is not worker]
        self.replaced += 1


if __name__ == "__main__":
    _worker_main()
