"""What Blazar's standalone launchers share: the `main` skeleton, the flags, the HTTP side.

Every launcher in this folder is copied into its engine's own virtual environment with
this file beside it (`blazar.engines.wheel.place_launcher`) and runs under the engine's
Python, so this file uses the standard library only and the launchers import it as a
sibling module (`launcher_common`), never through `blazar`.

The skeleton (`run`), the same for every lane:

1. parse the command line: a `UsageError` is one `NAME: ...` line on stderr, exit code 2;
2. load the model: a `LoadError` is one `NAME: ...` line on stderr, exit code 1;
3. print the line the supervisor waits for, `NAME: listening on http://HOST:PORT`
   (`blazar.host.children.LISTENING`), only once the model is loaded, so `/health`
   answers 200 only once the engine can work;
4. serve until SIGTERM or SIGINT, then exit 0 at once.

Until step 4 a signal ends the process at once, even mid-load. The speech and mistralrs
launchers serve with the standard library's HTTP server (`serve_http`: their flags,
`Engine` and `Handler` bases); the llama launcher serves with llama.cpp's own
(`xllamacpp.Server`) and uses `run` and `exit_on_signal` directly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, NoReturn, TypeVar
from urllib.parse import SplitResult, urlsplit

USAGE_ERROR = 2
LOAD_ERROR = 1

Parsed = TypeVar("Parsed")
Loaded = TypeVar("Loaded")


class UsageError(Exception):
    """A command line this launcher cannot run; the message is shown as is."""


class LoadError(Exception):
    """The engine refused the model or the settings; the message is shown as is."""


class BadRequest(Exception):
    """The client's mistake, or what this engine cannot do: a 400 with this message."""


def run(
    name: str,
    parse: Callable[[], Parsed],
    load: Callable[[Parsed], Loaded],
    serve: Callable[[Loaded], object],
) -> int:
    """The launcher's life: parse, load, serve (which announces the address and blocks
    until a signal ends the process); a failure is one `name: ...` line and exit 2 or 1."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # until it serves: a signal ends it now
    try:
        args = parse()
    except UsageError as err:
        print(f"{name}: {err}", file=sys.stderr)
        return USAGE_ERROR
    try:
        loaded = load(args)
    except LoadError as err:
        print(f"{name}: {err}", file=sys.stderr)
        return LOAD_ERROR
    serve(loaded)
    return 0


def announce(name: str, address: str) -> None:
    """The line the supervisor reads the port from; printed once the engine can work."""
    print(f"{name}: listening on {address}", flush=True)


def exit_on_signal(cleanup: Callable[[], None] = lambda: None) -> None:
    """From now on SIGTERM or SIGINT runs `cleanup`, flushes and exits 0 at once: the
    server's threads are never joined (llama.cpp's server has no stop, and a request
    under way has nobody left to answer)."""

    def stop(signum: int, frame: object) -> NoReturn:
        with contextlib.suppress(Exception):
            cleanup()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(0)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)


# --- the HTTP launchers (whisper, piper, mistralrs) -------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors turned into one `UsageError` line (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def flags(
    doc: str | None, model: str, parallel: str, threads: str = "CPU threads (0: the default)"
) -> argparse.ArgumentParser:
    """The flags every HTTP launcher takes (--version, --model, --host, --port, --threads,
    --parallel, in llama-server's spelling), with help for the ones whose meaning is the
    lane's; a launcher adds its own to the parser. --help names the script it runs as."""
    parser = _Parser(description=doc)
    parser.add_argument("--version", action="store_true", help="print versions and exit")
    parser.add_argument("--model", help=model)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help=threads)
    parser.add_argument("--parallel", type=int, default=1, help=parallel)
    return parser


class Engine:
    """A model an HTTP launcher loaded (from the parsed flags); its handler reaches it as
    `self.engine`."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def describe(self) -> str:
        """What was loaded, for the line printed before the listening line."""
        return str(self.args.model)

    def close(self) -> None:
        """Remove what loading left outside the process; runs as a signal ends it."""


Route = Callable[[Any, SplitResult, bytes], None]  # (handler, URL, body) -> None


class Handler(BaseHTTPRequestHandler):
    """The HTTP side of every HTTP launcher: HTTP/1.1, no log line per request, JSON
    answers, errors in OpenAI's envelope, GET /health, a 404 naming the path for what is
    not served. A launcher lists its own routes in `GET` and `POST` (path -> method)."""

    protocol_version = "HTTP/1.1"
    engine: Engine
    GET: ClassVar[dict[str, Route]] = {}
    POST: ClassVar[dict[str, Route]] = {}

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would flood the log; errors are printed where they happen

    def not_found(self, path: str) -> str:
        return f"no such endpoint: {path}"

    def headers_for_all(self) -> dict[str, str]:
        """Headers every answer carries (none unless a launcher says so)."""
        return {}

    def send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        for name, value in {
            "Content-Type": content_type,
            "Content-Length": str(len(body)),
            **self.headers_for_all(),
        }.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, status: int, payload: Any) -> None:
        self.send(status, json.dumps(payload).encode(), "application/json")

    def send_error_json(
        self, status: int, message: str, kind: str = "invalid_request_error"
    ) -> None:
        self.send_json(status, {"error": {"message": message, "type": kind, "code": None}})

    def start_chunked(self, content_type: str, **headers: str) -> None:
        """The head of an answer whose length is not known yet: chunked, sent as made."""
        self.send_response(200)
        for name, value in {
            "Content-Type": content_type,
            **headers,
            **self.headers_for_all(),
            "Transfer-Encoding": "chunked",
        }.items():
            self.send_header(name, value)
        self.end_headers()

    def send_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        route = self.GET.get(url.path)
        if url.path == "/health":
            self.send_json(200, {"status": "ok"})
        elif route is not None:
            route(self, url, b"")
        else:
            self.send_error_json(404, self.not_found(url.path))

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        declared = (self.headers.get("Content-Length") or "0").strip()
        if not (declared.isascii() and declared.isdigit()):
            # Where the body ends is unknown (and a negative length would read to the end
            # of the stream): answer, and read nothing more from this connection.
            self.close_connection = True
            self.send_error_json(400, f"Content-Length must be a number of bytes: {declared!r}")
            return
        length = int(declared)
        body = self.rfile.read(length) if length else b""  # read even when refused
        route = self.POST.get(url.path)
        if route is None:
            self.send_error_json(404, self.not_found(url.path))
            return
        route(self, url, body)


def serve_http(
    name: str,
    argv: Sequence[str],
    parser: argparse.ArgumentParser,
    versions: Callable[[], str],
    engine: Callable[[argparse.Namespace], Engine],
    handler: type[Handler],
) -> int:
    """`run` for an HTTP launcher: parse with `parser` (--version prints `versions()`),
    load `engine(args)`, listen on --host/--port, serve with `handler` until a signal."""

    def parse() -> argparse.Namespace:
        args = parser.parse_args(list(argv))
        if args.version:
            print(versions())
            raise SystemExit(0)
        if not args.model:
            raise UsageError("--model is required")
        return args

    def load(args: argparse.Namespace) -> tuple[Engine, ThreadingHTTPServer, str]:
        started = time.monotonic()
        try:
            loaded = engine(args)
        except Exception as exc:  # the engine package's own words for what it refused
            raise LoadError(f"cannot load {args.model}: {exc}") from None
        handler.engine = loaded
        try:
            server = ThreadingHTTPServer((args.host, args.port), handler)
        except OSError as exc:
            loaded.close()
            raise LoadError(f"cannot listen on {args.host}:{args.port}: {exc}") from None
        server.daemon_threads = True
        took = time.monotonic() - started
        print(f"{versions()}: {loaded.describe()} loaded in {took:.2f} s", flush=True)
        return loaded, server, f"http://{args.host}:{server.server_address[1]}"

    def serve(loaded: tuple[Engine, ThreadingHTTPServer, str]) -> None:
        model, server, address = loaded
        exit_on_signal(model.close)
        announce(name, address)
        server.serve_forever()

    return run(name, parse, load, serve)
