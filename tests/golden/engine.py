"""A real llama-server for protocol tests and golden captures, started through Blazar's launcher.

`running_engine(model, ...)` starts `blazar/engines/launchers/llama_launcher.py` (xllamacpp's
native llama-server) as a child process on a free loopback port, waits for its
`blazar-launcher: listening on` line, and stops it by PID with SIGTERM on exit.
`Engine.send(request)` posts a translator's `EngineRequest` and returns the status
and the JSON body, or for a stream the list of decoded SSE payloads (dicts and the
string "[DONE]"). Used by tests/test_protocols_*.py and tests/golden/capture.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from blazar.engines.launchers import llama_launcher as launcher
from blazar.protocols import EngineRequest
from blazar.protocols.sse import SSEDecoder

LAUNCHER = Path(launcher.__file__)
LISTENING = "blazar-launcher: listening on "
START_DEADLINE_S = 60.0

# A Hermes-style ChatML template that renders tools, so llama-server parses
# <tool_call> output into tool calls (the tiny model's template has no tools).
TOOLS_TEMPLATE = """\
{%- if tools %}<|im_start|>system
You may call functions.
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{%- for tool_call in message.tool_calls %}
<tool_call>
{"name": "{{ tool_call.function.name }}", "arguments": {{ tool_call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


class Engine:
    """A running launcher child and a small HTTP client for it."""

    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc, self.url = proc, url

    def _open(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def get(self, path: str) -> Any:
        status, raw = self._open("GET", path)
        assert status == 200, (path, status, raw)
        return json.loads(raw)

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        status, raw = self._open("POST", path, body)
        return status, json.loads(raw)

    def stream(self, path: str, body: Any) -> tuple[int, list[Any]]:
        status, raw = self._open("POST", path, body)
        if status != 200:
            return status, json.loads(raw)
        decoder = SSEDecoder()
        events = decoder.feed(raw) + decoder.close()
        return status, [event.data for event in events]

    def send(self, request: EngineRequest) -> tuple[int, Any]:
        """Post a translator's request; a stream comes back as its list of SSE payloads."""
        if request.stream:
            return self.stream(request.path, request.body)
        return self.post(request.path, request.body)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@contextmanager
def running_engine(model: Path, *args: str, ctx: int = 1024, threads: int = 1) -> Iterator[Engine]:
    """Serve `model` with llama-server's flags `args` until the block ends.

    One thread by default: on a busy machine, threads that spin at every barrier
    waiting for a descheduled peer made generation hundreds of times slower.
    """
    cmd = [
        sys.executable,
        str(LAUNCHER),
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--ctx-size",
        str(ctx),
        "--threads",
        str(threads),
        "--threads-batch",
        str(threads),
        *args,
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
    )
    found: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(LISTENING) and not found:
                found.append(line[len(LISTENING) :].strip())
        # keep draining so the child never blocks on a full pipe

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    engine = Engine(proc, "")
    try:
        reader.join(0.01)
        waited = 0.0
        while not found and proc.poll() is None and waited < START_DEADLINE_S:
            reader.join(0.05)
            waited += 0.05
        if not found:
            raise RuntimeError(f"launcher did not start (exit code {proc.poll()})")
        engine.url = found[0]
        yield engine
    finally:
        engine.stop()
