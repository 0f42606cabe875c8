"""The wheel lane launcher's loading and serving: construct `xllamacpp.Server`, report a
failed load in one line, serve until SIGTERM or SIGINT.

`launcher.py` (the flags) imports it; both are copied into each wheel engine's own
virtual environment (`blazar.engines.wheel`), so it too uses only the standard library
and xllamacpp.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import tempfile
import time
from typing import Any, NoReturn

import xllamacpp  # type: ignore[import-untyped, import-not-found, unused-ignore]


class LoadError(Exception):
    """The engine refused the model or the settings; the message is shown as is."""


_LOG_ERROR = re.compile(r"^\S*\s*E\s+(?:(?:srv|cmn|ctx|res|que|slt)\s+)?(.*\S)\s*$")


def _first_error(log: bytes) -> str | None:
    """The first error-level line of llama.cpp's log: the most specific reason it gives."""
    for line in log.decode("utf-8", "replace").splitlines():
        match = _LOG_ERROR.match(line)
        if match:
            return "".join(c if c.isprintable() else "?" for c in match.group(1))
    return None


def start_server(params: Any, verbose: bool) -> Any:
    """Construct `xllamacpp.Server`, which loads the model and starts listening.

    llama.cpp logs to file descriptor 2 while it loads. That log is captured so that
    a failure can be reported in one line naming the first error llama.cpp logged;
    on success (or with --verbose) the captured log is passed on to stderr.
    """
    sys.stderr.flush()
    saved_stderr = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            server = xllamacpp.Server(params)
        except Exception as exc:
            reason = None
            for _ in range(50):  # llama.cpp may log from another thread: give it a moment
                log.seek(0)
                reason = _first_error(log.read())
                if reason:
                    break
                time.sleep(0.01)
            server, failure = None, f"failed to load model {params.model.path}: {reason or exc}"
        finally:
            os.dup2(saved_stderr, 2)
            os.close(saved_stderr)
        if server is not None or verbose:
            log.seek(0)
            sys.stderr.buffer.write(log.read())
            sys.stderr.flush()
    if server is None:
        raise LoadError(failure)
    return server


def _exit_now(signum: int, frame: object) -> NoReturn:
    # xllamacpp.Server has no stop method; its destructor would wait on the main loop.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


def serve_forever(server: Any) -> NoReturn:
    """Announce the address, then block until SIGTERM or SIGINT and exit 0."""
    # The server's threads may take the signal; the wakeup fd wakes this thread anyway,
    # and Python then runs the handler here.
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_now)
    address = str(server.listening_address)
    if "://" not in address:
        address = "http://" + address
    print(f"main: server is listening on {address} - starting the main loop")
    print(f"blazar-launcher: listening on {address}", flush=True)
    while True:
        os.read(wake_read, 64)
