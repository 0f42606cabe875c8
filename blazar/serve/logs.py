"""`blazar serve`'s log: configured once, when serve starts (`blazar.serve.daemon.run`).

Every `logging` record of Blazar's (the daemon's own lines, remotes going up and
down, drains, instances that could not start, the session bank) at INFO and above,
and every other library's at WARNING and above, goes to stderr and to
`<logs>/serve.log`, each line with its time and level. When stderr already is that
file (`blazar launch` starts serve with its output there) it is written once.
The file rotates at MAX_BYTES, keeping BACKUPS older ones. Children's output has
logs of its own: an instance's child writes its file itself (`blazar.host.children.
DirectLog`: serve copies nothing per request; no client header reaches a child, the
gateway sends it Host, Content-Type and Content-Length only), engine services and MCP
servers through serve (`ChildLog`).

No key reaches these lines (docs/security.md, "Logs"): every handler installed
here carries `ScrubSecrets`, which formats each record, whatever logger it comes
from (aiohttp's, asyncio's, a library's error path quoting a header), and
replaces what looks like a credential before any handler writes it. The files
are readable by their owner only (0600, rotations included).
"""

from __future__ import annotations

import io
import logging
import logging.handlers
import os
import re
import sys
from pathlib import Path

from blazar.host.children import owner_only, restrict_rotations

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 3
_MARK = "_blazar_serve"  # on the handlers this module installs, so a second call replaces them
HIDDEN = "***"

# What a credential looks like in a log line, whoever wrote it: a header line, a dict or
# tuple repr (str or bytes), a traceback quoting a raw request head. Each replacement
# leaves the name and puts HIDDEN where the value was, so scrubbing twice changes nothing.
_CREDENTIALS: tuple[tuple[re.Pattern[str], str], ...] = (
    # A credential header's whole value, up to a quote, a comma, a brace or the line's end
    # (a Basic pair or a key with a control byte in it goes too): `Authorization: Basic x`,
    # `'x-api-key': 'k'`, `(b'authorization', b'Bearer k')`, and those quoted in a repr.
    (
        re.compile(
            r"(?i)((?:proxy-)?authorization|(?:x-)?api-key)"
            r"((?:\\?['\"])?\s*[:=,]\s*(?:b?\\?['\"])?)[^'\"\r\n,}]*"
        ),
        rf"\1\2{HIDDEN}",
    ),
    # A bearer token anywhere (an error message that quotes one without its header name).
    (re.compile(r"(?i)(bearer\s+)[^\s'\",;]+"), rf"\1{HIDDEN}"),
    # The WebSocket form of a key (docs/security.md: `Sec-WebSocket-Protocol`).
    (re.compile(r"(openai-insecure-api-key\.)[^\s'\",;]+"), rf"\1{HIDDEN}"),
    # Blazar's own keys (`blazar.manifest.keys.new_secret`), wherever they stand.
    (re.compile(r"plm_[A-Za-z0-9_-]+"), f"plm_{HIDDEN}"),
)


def scrub(text: str) -> str:
    """`text` with every credential-shaped value replaced by HIDDEN."""
    for pattern, replacement in _CREDENTIALS:
        text = pattern.sub(replacement, text)
    return text


class ScrubSecrets(logging.Filter):
    """A handler filter that formats a record's message, exception and stack, scrubbed.

    On a handler, not a logger, so it sees every record that reaches the handler,
    whatever logger it was logged on. The record is changed in place (its message
    formatted, its arguments dropped, its traceback turned into text), so a handler
    that runs after this one writes the scrubbed text too.
    """

    _exceptions = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # bad arguments: logging would print them raw to stderr
            message = f"{record.msg} [its arguments could not be formatted]"
        record.msg, record.args = scrub(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = self._exceptions.formatException(record.exc_info)
        record.exc_info = None  # the text below is the only form left to write
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        return True


class _OwnerOnlyFileHandler(logging.handlers.RotatingFileHandler):
    """serve.log, appended to, opened (and reopened at each rotation) readable by its owner
    only."""

    def _open(self) -> io.TextIOWrapper:
        return open(
            self.baseFilename, "a", encoding=self.encoding, errors=self.errors, opener=owner_only
        )


def serve_log(logs: Path) -> Path:
    return logs / "serve.log"


def configure(logs: Path, *, stream: object = None) -> Path:
    """Send log records to `stream` (default: stderr) and to serve.log under `logs`; return
    that file's path. Calling it again replaces what an earlier call installed."""
    out = stream if stream is not None else sys.stderr
    path = serve_log(logs)
    path.parent.mkdir(parents=True, exist_ok=True)
    formatter = logging.Formatter(FORMAT)
    handlers: list[logging.Handler] = [logging.StreamHandler(out)]  # type: ignore[arg-type]
    if _same_file(out, path):  # opened by `blazar launch`, with the mode it chose
        path.chmod(0o600)
    else:
        handlers.append(
            # a lone surrogate (text a client sent) is written escaped: strict, the whole
            # record was lost to an encoding error
            _OwnerOnlyFileHandler(
                path,
                maxBytes=MAX_BYTES,
                backupCount=BACKUPS,
                encoding="utf-8",
                errors="backslashreplace",
            )
        )
    restrict_rotations(path, BACKUPS)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(old)
        old.close()
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.addFilter(ScrubSecrets())
        setattr(handler, _MARK, True)
        root.addHandler(handler)
    root.setLevel(logging.WARNING)  # other libraries: their warnings and errors
    logging.getLogger("blazar").setLevel(logging.INFO)
    return path


def _same_file(stream: object, path: Path) -> bool:
    """Whether `stream` writes to the file at `path` already (serve's output redirected)."""
    try:
        fileno = stream.fileno()  # type: ignore[attr-defined]
        here = os.fstat(fileno)
        there = path.stat()
    except (AttributeError, OSError, ValueError):
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
