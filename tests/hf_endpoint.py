"""A Hugging Face hub on 127.0.0.1, good enough for the real `huggingface_hub` client.

`FakeHub` serves, from a ThreadingHTTPServer in a background thread, what
huggingface_hub 2.x calls for `HfApi.model_info(files_metadata=True)` and
`hf_hub_download`:

    GET  /api/models?search=Q&filter=gguf&limit=N       the repos whose id contains Q
    GET  /api/models/{repo}[/revision/{rev}]?blobs=true   sha + siblings (size, blobId, lfs)
    HEAD /{repo}/resolve/{rev}/{path}    X-Repo-Commit, ETag ("<sha256>" for LFS files,
                                         the git blob id otherwise), X-Linked-Etag,
                                         X-Linked-Size, Content-Length
    GET  /{repo}/resolve/{rev}/{path}    the bytes; Range gives 206 + Content-Range

Errors carry the `X-Error-Code` header the client maps to its exceptions
(RepoNotFound, RevisionNotFound, EntryNotFound). A repo can be private: it
then answers 401 unless `Authorization: Bearer <token>` comes with the
request. `GET /files/{name}` serves plain downloads (for https:// sources).

Switches, per file name (a repo path or a /files name): `cut_after` sends N
bytes then hangs up (once), `stall_after` sends N bytes then stalls until the
hub stops (once), `wrong_bytes` serves altered bytes of the right length,
`file_status` answers with an HTTP error; `api_status` makes /api/* answer
with an HTTP error, `api_body` with a 200 that is no hub's JSON. `padded`
(repo path -> size) makes a file that big, its bytes followed by zeros, served
only in ranges (a whole GET is a 403): a test of reading the first megabytes
of a large model without downloading it. Every request is recorded with its
headers.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.loopback import LoopbackHTTP

LFS_POINTER_SIZE = 134


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(name: str) -> bool:
    return name.endswith(".gguf")


def corrupt(data: bytes) -> bytes:
    """The same number of bytes, one of them changed."""
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


@dataclass
class Seen:
    """One request the hub answered."""

    method: str
    path: str
    headers: dict[str, str]

    def header(self, name: str) -> str | None:
        """A request header by name, whatever its case on the wire."""
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), None)


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # sha -> path -> bytes
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> sha
    token: str | None = None  # private: this bearer token is required


@dataclass
class FakeHub:
    """The hub's repos and switches; use as a context manager to serve it."""

    repos: dict[str, Repo] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)  # /files/<name>
    cut_after: dict[str, int] = field(default_factory=dict)
    stall_after: dict[str, int] = field(default_factory=dict)
    wrong_bytes: set[str] = field(default_factory=set)
    file_status: dict[str, int] = field(default_factory=dict)
    api_status: int | None = None
    api_body: bytes | None = None  # answer /api/* with 200 and this instead
    padded: dict[str, int] = field(default_factory=dict)  # repo path -> size, zeros after
    requests: list[Seen] = field(default_factory=list)
    url: str = ""
    stalled: threading.Event = field(default_factory=threading.Event)
    _release: threading.Event = field(default_factory=threading.Event)

    def add_repo(
        self, repo_id: str, files: dict[str, bytes], *, ref: str = "main", token: str | None = None
    ) -> str:
        """Add a commit holding `files` to a repo, point `ref` at it; return its sha."""
        repo = self.repos.setdefault(repo_id, Repo())
        listing = json.dumps({k: sha256(v) for k, v in sorted(files.items())})
        commit = hashlib.sha1(f"{repo_id}\n{len(repo.commits)}\n{listing}".encode()).hexdigest()
        repo.commits[commit] = dict(files)
        repo.refs[ref] = commit
        repo.token = token if token is not None else repo.token
        return commit

    def file_url(self, name: str) -> str:
        return f"{self.url}/files/{name}"

    def seen(self, method: str, part: str) -> list[Seen]:
        return [s for s in self.requests if s.method == method and part in s.path]

    def __enter__(self) -> FakeHub:
        self._served = LoopbackHTTP(_handler(self))
        self.url = self._served.url
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._release.set()  # let stalled downloads finish hanging up
        self._served.stop()

    def model_json(self, repo_id: str, commit: str, blobs: bool) -> dict[str, Any]:
        siblings = []
        for name, data in sorted(self.repos[repo_id].commits[commit].items()):
            entry: dict[str, Any] = {"rfilename": name}
            size = self.padded.get(name, len(data))
            if blobs:
                entry["size"] = size
                if is_lfs(name):
                    pointer = f"oid sha256:{sha256(data)}\nsize {size}\n".encode()
                    entry["blobId"] = git_oid(pointer)
                    entry["lfs"] = {
                        "sha256": sha256(data),
                        "size": size,
                        "pointerSize": LFS_POINTER_SIZE,
                    }
                else:
                    entry["blobId"] = git_oid(data)
            siblings.append(entry)
        owner = repo_id.split("/")[0]
        stamp = "2025-01-01T00:00:00.000Z"
        return {
            "_id": commit[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": owner,
            "sha": commit,
            "lastModified": stamp,
            "createdAt": stamp,
            "private": self.repos[repo_id].token is not None,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": ["gguf"],
            "library_name": "gguf",
            "siblings": siblings,
        }

    def listing(self, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        """`GET /api/models`: repos whose id contains `search` (GGUF ones for filter=gguf)."""
        search = (query.get("search") or [""])[0].lower()
        gguf = "gguf" in query.get("filter", [])
        limit = int((query.get("limit") or ["1000"])[0])
        found = []
        for repo_id, repo in sorted(self.repos.items()):
            files = repo.commits[repo.refs["main"]] if "main" in repo.refs else {}
            if repo.token or search not in repo_id.lower():
                continue
            if gguf and not any(is_lfs(n) for n in files):
                continue
            info = self.model_json(repo_id, repo.refs["main"], False)
            found.append({k: v for k, v in info.items() if k != "siblings"})
        return found[:limit]


_API = re.compile(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?")
_RESOLVE = re.compile(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)")


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self._route("HEAD")

        def do_GET(self) -> None:
            self._route("GET")

        def _route(self, method: str) -> None:
            hub.requests.append(Seen(method, self.path, dict(self.headers.items())))
            url = urlsplit(self.path)
            if url.path == "/api/models":
                body = json.dumps(hub.listing(parse_qs(url.query))).encode()
                self._send(200, body, {"Content-Type": "application/json"}, method)
            elif api := _API.fullmatch(url.path):
                if hub.api_status is not None:
                    self._error(hub.api_status, None, "the hub is having trouble")
                    return
                if hub.api_body is not None:
                    self._send(200, hub.api_body, {"Content-Type": "text/html"}, method)
                    return
                blobs = parse_qs(url.query).get("blobs") == ["true"]
                self._api(api.group(1), unquote(api.group(2) or "main"), blobs, method)
            elif resolve := _RESOLVE.fullmatch(url.path):
                repo_id, rev, path = resolve.groups()
                self._resolve(repo_id, unquote(rev), unquote(path), method)
            elif url.path.startswith("/files/"):
                name = unquote(url.path.removeprefix("/files/"))
                if name in hub.file_status:
                    self._error(hub.file_status[name], None, "no luck")
                elif name in hub.files:
                    self._bytes(name, hub.files[name], {}, method)
                else:
                    self._error(404, None, "not found")
            else:
                self._error(404, None, "no such route")

        def _commit(self, repo_id: str, rev: str) -> str | None:
            """The commit a request may see, or None after answering with an error."""
            repo = hub.repos.get(repo_id)
            wanted = f"Bearer {repo.token}" if repo is not None else None
            if repo is None or (repo.token and self.headers.get("Authorization") != wanted):
                self._error(401, "RepoNotFound", "Repository not found")
                return None
            commit = rev if rev in repo.commits else repo.refs.get(rev)
            if commit is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return commit

        def _api(self, repo_id: str, rev: str, blobs: bool, method: str) -> None:
            commit = self._commit(repo_id, rev)
            if commit is not None:
                body = json.dumps(hub.model_json(repo_id, commit, blobs)).encode()
                self._send(200, body, {"Content-Type": "application/json"}, method)

        def _resolve(self, repo_id: str, rev: str, path: str, method: str) -> None:
            commit = self._commit(repo_id, rev)
            if commit is None:
                return
            data = hub.repos[repo_id].commits[commit].get(path)
            if data is None:
                self._error(404, "EntryNotFound", f"{path} does not exist", commit)
                return
            etag = f'"{sha256(data)}"' if is_lfs(path) else f'"{git_oid(data)}"'
            headers = {"X-Repo-Commit": commit, "ETag": etag}
            size = hub.padded.get(path, len(data))
            if is_lfs(path):
                headers |= {"X-Linked-Etag": etag, "X-Linked-Size": str(size)}
            if path in hub.padded:
                self._padded(data, size, headers, method)
                return
            self._bytes(path, data, headers, method)

        def _padded(self, data: bytes, size: int, headers: dict[str, str], method: str) -> None:
            ranged = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
            if method == "HEAD":
                self._send(200, b"", {**headers, "Accept-Ranges": "bytes"}, method, length=size)
                return
            if ranged is None:
                self._error(403, None, "this test hub serves padded files only in ranges")
                return
            start, end = int(ranged.group(1)), min(int(ranged.group(2)) + 1, size)
            part = (data + bytes(max(0, end - len(data))))[start:end]
            headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{size}"}
            self._send(206, part, {**headers, "Content-Type": "application/octet-stream"}, method)

        def _bytes(self, name: str, data: bytes, headers: dict[str, str], method: str) -> None:
            if name in hub.wrong_bytes:
                data = corrupt(data)
            ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            start, end, code = 0, len(data), 200
            if ranged is not None and method == "GET":
                start = int(ranged.group(1))
                end = min(int(ranged.group(2)) + 1 if ranged.group(2) else len(data), len(data))
                if start >= len(data):
                    self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"}, method)
                    return
                code = 206
                headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
            headers = {**headers, "Accept-Ranges": "bytes"}
            headers.setdefault("Content-Type", "application/octet-stream")
            if method == "HEAD":
                self._send(code, b"", headers, method, length=end - start)
                return
            cut, stall = hub.cut_after.pop(name, None), hub.stall_after.pop(name, None)
            limit = cut if cut is not None else stall
            if limit is None:
                self._send(code, data[start:end], headers, method)
                return
            self._send(code, data[start : start + limit], headers, method, length=end - start)
            self.wfile.flush()
            if stall is not None:  # keep the connection open, sending nothing more
                hub.stalled.set()
                hub._release.wait(timeout=30)
            self.close_connection = True

        def _error(self, code: int, error: str | None, message: str, commit: str = "") -> None:
            headers = {"Content-Type": "application/json", "X-Error-Message": message}
            if error is not None:
                headers["X-Error-Code"] = error
            if commit:
                headers["X-Repo-Commit"] = commit
            body = json.dumps({"error": message}).encode()
            self._send(code, body, headers, self.command)

        def _send(
            self,
            code: int,
            body: bytes,
            headers: dict[str, str],
            method: str,
            length: int | None = None,
        ) -> None:
            self.send_response(code)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(body)

    return Handler
