"""Every model route goes through the one pipeline, by construction and in behaviour.

The router is walked: each route that names a model (the traced inference routes of
every protocol, the audio API) must be a `PipelineRoute`, and each such route must be
traced. Then each is asked for a model nobody serves, on the real app in front of a
scripted child (`tests.gateway_harness`: the child is never reached): every one must
answer with the pipeline's 404 in its protocol's shape, and its trace must carry the
name as the pipeline's resolve step noted it. A route that parses and resolves on its
own fails one or the other. Faults the pipeline must carry the same on every route (a
stream cut short after its headers) are injected here too.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from blazar.serve.gateway.app import build_app
from blazar.serve.routes.services import PipelineRoute, Services
from blazar.serve.state.tracing import TRACED
from blazar.serve.supervisor.scheduler import Scheduler
from blazar.testing.tiny_vision import png_bytes
from tests.gateway_harness import InProcessGateway, one_chunk_of_a_stream
from tests.loopback import LoopbackHTTP

# A body per model route naming a model nobody serves; audio uploads are forms.
NOPE = "nope-xyz"
HI = [{"role": "user", "content": "hi"}]
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": NOPE, "messages": HI},
    "/v1/completions": {"model": NOPE, "prompt": "hi"},
    "/v1/embeddings": {"model": NOPE, "input": "hi"},
    "/v1/rerank": {"model": NOPE, "query": "hi", "documents": ["hi"]},
    "/rerank": {"model": NOPE, "query": "hi", "documents": ["hi"]},
    "/v1/responses": {"model": NOPE, "input": "hi"},
    "/v1/messages": {
        "model": NOPE,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
    },
    "/v1/messages/count_tokens": {"model": NOPE, "messages": HI},
    "/api/chat": {"model": NOPE, "messages": HI},
    "/api/generate": {"model": NOPE, "prompt": "hi"},
    "/api/embed": {"model": NOPE, "input": "hi"},
    "/api/embeddings": {"model": NOPE, "prompt": "hi"},
    "/v1/audio/speech": {"model": NOPE, "input": "hi", "voice": "x"},
    "/v1/images/generations": {"model": NOPE, "prompt": "hi"},
}
UPLOADS = ("/v1/audio/transcriptions", "/v1/audio/translations", "/v1/images/edits")


def _app_routes() -> dict[str, Any]:
    scheduler = Scheduler({}, max_loaded=1, max_queue=1, queue_timeout=1.0, log_dir=None)  # type: ignore[arg-type]
    app = build_app(Services(scheduler))
    return {
        r.resource.canonical: r.handler
        for r in app.router.routes()
        if r.method == "POST" and r.resource is not None
    }


def test_every_model_route_is_a_pipeline_route_and_every_pipeline_route_is_traced() -> None:
    routes = _app_routes()
    piped = {path for path, handler in routes.items() if hasattr(handler, "pipeline_route")}
    assert set(TRACED) <= set(routes), set(TRACED) - set(routes)
    missing = sorted(path for path in TRACED if path not in piped)
    assert missing == [], f"model routes that do not go through the pipeline: {missing}"
    untraced = sorted(piped - set(TRACED))
    assert untraced == [], f"pipeline routes without a trace: {untraced}"
    assert all(isinstance(routes[p].pipeline_route, PipelineRoute) for p in piped)
    assert set(BODIES) | set(UPLOADS) == set(TRACED)  # this test asks each of them below


def _post(url: str, path: str, body: bytes, content_type: str, trace: str) -> tuple[int, Any]:
    request = urllib.request.Request(
        url + path, data=body, headers={"Content-Type": content_type, "x-request-id": trace}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def _form(model: str, path: str = "") -> tuple[bytes, str]:
    boundary = "blazarboundary"
    image = path.startswith("/v1/images/")  # an edit: its picture and its prompt
    field, filename = ("image", "a.png") if image else ("file", "a.wav")
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{model}\r\n',
        *(
            [f'--{boundary}\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nhi\r\n']
            if image
            else []
        ),
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n",
    ]
    # A picture the gateway passes on (it reads an edit's header before the model is
    # resolved); the audio routes take any bytes.
    upload = png_bytes(2, 2) if image else b"RIFF"
    closing = f"\r\n--{boundary}--\r\n".encode()
    body = "".join(parts).encode() + upload + closing
    return body, f"multipart/form-data; boundary={boundary}"


def _why(url: str, trace: str) -> dict[str, Any]:
    deadline = time.monotonic() + 5
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/why/{trace}", timeout=10) as resp:
                return dict(json.load(resp))
        except urllib.error.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _message(path: str, body: Any) -> str:
    if path.startswith("/api/"):
        return str(body["error"])
    return str(body["error"]["message"])


def test_each_model_route_resolves_through_the_pipeline() -> None:
    with InProcessGateway("http://127.0.0.1:1") as gateway:  # the child is never reached
        for path in [*BODIES, *UPLOADS]:
            trace = uuid.uuid4().hex
            if path in UPLOADS:
                data, content_type = _form(NOPE, path)
            else:
                data, content_type = json.dumps(BODIES[path]).encode(), "application/json"
            status, body = _post(gateway.url, path, data, content_type, trace)
            assert status == 404, (path, body)
            message = _message(path, body)
            assert f"model '{NOPE}' not found; models served here: tiny" in message, path
            if path.startswith("/v1/messages"):
                assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
            record = _why(gateway.url, trace)
            assert record["requested"] == NOPE and record["status"] == 404, (path, record)


class CutsChatStream(BaseHTTPRequestHandler):
    """Starts a chat event stream with one chunk ("fox"), then hangs up."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        one_chunk_of_a_stream(self)
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


STREAMS = {
    "/v1/chat/completions": {"messages": HI},
    "/v1/responses": {"input": "hi"},
    "/api/chat": {"messages": HI},
    "/v1/messages": {"max_tokens": 8, "messages": HI},
}


@pytest.mark.parametrize("path", sorted(STREAMS))
def test_a_stream_cut_short_ends_with_an_error_event_and_the_failure_on_its_trace(
    path: str,
) -> None:
    """The one stream-error writer per envelope, on every protocol: the client reads what
    came and then an error event in its protocol's shape; the trace keeps the failure.
    (Responses used to skip the trace's failure.)"""
    child = LoopbackHTTP(CutsChatStream)
    try:
        with InProcessGateway(child.url) as gateway:
            trace = uuid.uuid4().hex
            body = {"model": "tiny", "stream": True, **STREAMS[path]}
            request = urllib.request.Request(
                gateway.url + path,
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json", "x-request-id": trace},
            )
            with urllib.request.urlopen(request, timeout=30) as resp:
                assert resp.status == 200
                text = resp.read().decode()
            assert "fox" in text, text
            assert "failed while answering" in text, text  # the error event
            if path == "/v1/messages":
                assert "event: error" in text
            elif path == "/v1/responses":
                assert "response.failed" in text or '"type":"error"' in text.replace(" ", "")
            record = _why(gateway.url, trace)
            assert record["status"] == 502 and record["code"] == "upstream_error", record
    finally:
        child.stop()
