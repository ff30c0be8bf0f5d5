"""A stand-in for the Hugging Face Hub on 127.0.0.1: the part of its HTTP API that ``huggingface_hub.snapshot_download``
and ``datasets.load_dataset`` use, serving local directories as model and data set repos.

Point a process at it with ``HF_ENDPOINT=<stub.endpoint>`` (and a temporary ``HF_HOME``): both libraries read the
endpoint when they are imported, so the code under test runs in a subprocess. Each repo has one commit (a hash of
its files), which ``main`` and the commit hash itself resolve to. What is served, as the hub serves it:

- ``GET /api/{models,datasets}/<repo>[/revision/<rev>]``: the repo's info (``id``, ``sha``, ``siblings``);
- ``GET /api/{models,datasets}/<repo>/tree/<rev>[/<path>]?recursive=``: its files and folders (one page);
- ``HEAD``/``GET /[datasets/]<repo>/resolve/<rev>/<file>``: a file, with ``X-Repo-Commit``, ``ETag`` and
  ``Content-Length``;
- anything else, or a missing repo, revision or file: 404 with the hub's ``X-Error-Code`` (``RepoNotFound``,
  ``RevisionNotFound``, ``EntryNotFound``), which the libraries turn into their own errors.

Every request is recorded in :attr:`HubStub.requests` (method, path), so a test can say what was asked for.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

API = re.compile(r"^/api/(models|datasets)/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+)(/.*)?)?$")
RESOLVE = re.compile(r"^/(datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class Repo:
    """A directory served as one repo at one commit."""

    def __init__(self, repo_id: str, root: Path):
        self.id, self.root = repo_id, Path(root)
        self.files = sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())
        digest = hashlib.sha1(repo_id.encode())
        for name in self.files:
            digest.update(name.encode() + b"\0" + (self.root / name).read_bytes())
        self.sha = digest.hexdigest()

    def entry(self, path: str) -> dict | None:
        """The tree entry of a file or folder (the hub's JSON), None if neither."""
        target = self.root / path
        if path in self.files:
            data = target.read_bytes()
            return {"type": "file", "path": path, "size": len(data),
                    "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
        if path and target.is_dir():
            return {"type": "directory", "path": path, "oid": hashlib.sha1(path.encode()).hexdigest()}
        return None

    def tree(self, path: str, recursive: bool) -> list[dict] | None:
        base = (self.root / path) if path else self.root
        if not base.is_dir():
            return None
        found = base.rglob("*") if recursive else base.iterdir()
        return [e for e in (self.entry(p.relative_to(self.root).as_posix()) for p in sorted(found)) if e is not None]


class HubStub:
    """The server: ``HubStub({("model", "Qwen/Qwen3-4B-Base"): dir, ("dataset", "math-ai/amc23"): dir})``, used as
    a context manager (it serves from a thread until the block ends)."""

    def __init__(self, repos: dict[tuple[str, str], Path]):
        self.repos = {(kind, repo_id): Repo(repo_id, root) for (kind, repo_id), root in repos.items()}
        self.requests: list[tuple[str, str]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubStub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def downloads(self) -> list[str]:
        """The files fetched with GET (not the HEAD requests that only ask for metadata)."""
        return [path for method, path in self.requests if method == "GET" and "/resolve/" in path]

    def repo(self, kind: str, repo_id: str, revision: str) -> tuple[Repo | None, str | None]:
        """(repo, None) or (None, the hub's error code)."""
        repo = self.repos.get((kind, repo_id))
        if repo is None:
            return None, "RepoNotFound"
        if unquote(revision) not in ("main", repo.sha):
            return None, "RevisionNotFound"
        return repo, None


def _handler(stub: HubStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:   # quiet: the test reads stub.requests instead
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            url = urlparse(self.path)
            stub.requests.append((self.command, url.path))
            if (m := API.match(url.path)):
                self._api(m, parse_qs(url.query))
            elif (m := RESOLVE.match(url.path)):
                self._file(m, body)
            else:
                self._error(404, "EntryNotFound")

        def _api(self, m: re.Match, query: dict) -> None:
            kind, repo_id, action, revision, path = m.group(1)[:-1], m.group(2), m.group(3), m.group(4), m.group(5)
            repo, error = stub.repo(kind, repo_id, revision or "main")
            if repo is None:
                return self._error(404, error)
            path = unquote((path or "").strip("/"))
            if action in (None, "revision"):
                return self._json({"id": repo.id, "sha": repo.sha, "private": False, "gated": False, "disabled": False,
                                   "siblings": [{"rfilename": f} for f in repo.files]})
            entries = repo.tree(path, query.get("recursive", ["false"])[0].lower() == "true")
            return self._json(entries) if entries is not None else self._error(404, "EntryNotFound")

        def _file(self, m: re.Match, body: bool) -> None:
            kind = "dataset" if m.group(1) else "model"
            repo, error = stub.repo(kind, m.group(2), m.group(3))
            name = unquote(m.group(4))
            if repo is None or name not in repo.files:
                return self._error(404, error or "EntryNotFound", repo.sha if repo else None)
            data = (repo.root / name).read_bytes()
            self.send_response(200)
            self.send_header("X-Repo-Commit", repo.sha)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def _json(self, value) -> None:
            data = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, code: str, commit: str | None = None) -> None:
            data = json.dumps({"error": code}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

    return Handler
