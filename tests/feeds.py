"""A real release feed on 127.0.0.1 for tests of the `release` install method.

`ReleaseFeed` serves the GitHub releases API's two endpoints
(`/repos/{repo}/releases/latest`, `/repos/{repo}/releases/tags/{tag}`) and the
asset downloads they point at, from a ThreadingHTTPServer in a background
thread. Downloads honour Range (206 + Content-Range, 416 past the end); switches
make a download die midway (`cut_after`), ignore Range (`ignore_range`), or the
feed announce a wrong digest or none. Every request is recorded with its
headers so tests can assert what the client asked for.

`server_archive` builds a llama.cpp-style archive whose `build/bin/llama-server`
is a real server: a `#!/bin/sh` script that execs Blazar's launcher
(`blazar/engines/launchers/llama_launcher.py`, llama-server's flags on xllamacpp) with this
interpreter.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shlex
import sys
import tarfile
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import TracebackType
from typing import Any

from blazar.engines import launchers
from tests.loopback import LoopbackHTTP

REPO = "ggml-org/llama.cpp"
LAUNCHER = launchers.LLAMA

Files = dict[str, tuple[bytes, int]]  # member name -> (content, mode)


def launcher_script(launcher: Path = LAUNCHER) -> bytes:
    """A llama-server that is Blazar's launcher run by this Python."""
    argv = f"{shlex.quote(sys.executable)} {shlex.quote(str(launcher))}"
    return f'#!/bin/sh\nexec {argv} "$@"\n'.encode()


BROKEN_SERVER = (
    b"#!/bin/sh\n"
    b"echo 'llama-server: error while loading shared libraries: libllama.so: "
    b"cannot open shared object file' >&2\n"
    b"exit 127\n"
)


def make_archive(name: str, files: Files) -> bytes:
    """A .zip or .tar.gz (by `name`) holding `files` with their modes."""
    buf = io.BytesIO()
    if name.endswith(".zip"):
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for member, (data, mode) in files.items():
                info = zipfile.ZipInfo(member, date_time=(2025, 1, 1, 0, 0, 0))
                info.external_attr = (0o100000 | mode) << 16
                info.create_system = 3  # Unix, so the mode bits mean something
                zf.writestr(info, data)
    else:
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for member, (data, mode) in files.items():
                entry = tarfile.TarInfo(member)
                entry.size, entry.mode = len(data), mode
                tar.addfile(entry, io.BytesIO(data))
    return buf.getvalue()


def server_archive(name: str, server: bytes | None = None, extra: Files | None = None) -> bytes:
    """A llama.cpp binary archive: build/bin/llama-server plus a library and a license."""
    files: Files = {
        "build/bin/llama-server": (server if server is not None else launcher_script(), 0o755),
        "build/bin/libllama.so": (b"\x7fELF not really", 0o644),
        "build/bin/LICENSE": (b"MIT License\n", 0o644),
    }
    return make_archive(name, {**files, **(extra or {})})


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Seen:
    """One request the feed answered."""

    path: str
    headers: dict[str, str]


@dataclass
class ReleaseFeed:
    """The feed's content and switches; use as a context manager to serve it."""

    releases: dict[str, dict[str, bytes]] = field(default_factory=dict)  # tag -> name -> bytes
    latest: str | None = None
    digests: dict[str, str | None] = field(default_factory=dict)  # name -> announced digest
    cut_after: dict[str, int] = field(default_factory=dict)  # name -> bytes, then hang up once
    ignore_range: bool = False
    requests: list[Seen] = field(default_factory=list)
    url: str = ""

    def add_release(self, tag: str, assets: dict[str, bytes], latest: bool = True) -> None:
        self.releases[tag] = assets
        if latest:
            self.latest = tag

    def release_json(self, tag: str) -> dict[str, Any]:
        assets = []
        for name, data in self.releases[tag].items():
            asset: dict[str, Any] = {
                "name": name,
                "browser_download_url": f"{self.url}/download/{tag}/{name}",
                "size": len(data),
                "content_type": "application/octet-stream",
            }
            digest = self.digests.get(name, f"sha256:{sha256(data)}")
            if digest is not None:
                asset["digest"] = digest
            assets.append(asset)
        return {"tag_name": tag, "name": tag, "assets": assets}

    def downloads_of(self, name: str) -> list[Seen]:
        return [seen for seen in self.requests if seen.path.endswith("/" + name)]

    def __enter__(self) -> ReleaseFeed:
        self._served = LoopbackHTTP(_handler(self))
        self.url = self._served.url
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._served.stop()


def _handler(feed: ReleaseFeed) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            feed.requests.append(Seen(self.path, dict(self.headers.items())))
            prefix = f"/repos/{REPO}/releases/"
            if self.path == prefix + "latest" and feed.latest is not None:
                self._json(feed.release_json(feed.latest))
            elif self.path.startswith(prefix + "tags/"):
                tag = self.path[len(prefix + "tags/") :]
                if tag in feed.releases:
                    self._json(feed.release_json(tag))
                else:
                    self._send(404, b'{"message": "Not Found"}', "application/json")
            elif match := re.fullmatch(r"/download/([^/]+)/([^/]+)", self.path):
                tag, name = match.groups()
                data = feed.releases.get(tag, {}).get(name)
                if data is None:
                    self._send(404, b"not found", "text/plain")
                else:
                    self._asset(name, data)
            else:
                self._send(404, b'{"message": "Not Found"}', "application/json")

        def _json(self, body: dict[str, Any]) -> None:
            self._send(200, json.dumps(body).encode(), "application/json")

        def _send(
            self, code: int, body: bytes, ctype: str, headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def _asset(self, name: str, data: bytes) -> None:
            ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if ranged is None or feed.ignore_range:
                code, start, end = 200, 0, len(data)
            else:
                start = int(ranged.group(1))
                end = int(ranged.group(2)) + 1 if ranged.group(2) else len(data)
                if start >= len(data):
                    headers = {"Content-Range": f"bytes */{len(data)}"}
                    self._send(416, b"", "text/plain", headers)
                    return
                code, end = 206, min(end, len(data))
            self.send_response(code)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes")
            if code == 206:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self.end_headers()
            cut = feed.cut_after.pop(name, None)
            if cut is not None:  # die midway: send `cut` bytes, then hang up
                self.wfile.write(data[start : start + cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(data[start:end])

    return Handler
