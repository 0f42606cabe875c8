"""OTLP export (serving.otlp_endpoint): one span per request with child spans for queue wait,
load and generation, sent by `blazar serve` to a collector the test serves on loopback,
which decodes the protobuf the way a real collector does (opentelemetry-proto)."""

from __future__ import annotations

import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import openai
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from blazar.observe.otlp import traces_url
from tests.fixtures import ENGINE
from tests.loopback import LoopbackHTTP
from tests.serving import Served


class Collector:
    """Receives OTLP/HTTP protobuf exports at /v1/traces; keeps the decoded spans."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.resources: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.arrived = threading.Event()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                export = ExportTraceServiceRequest()
                export.ParseFromString(body)
                collector.paths.append(self.path)
                for resource_spans in export.resource_spans:
                    attributes = {
                        a.key: a.value.string_value for a in resource_spans.resource.attributes
                    }
                    collector.resources.append(attributes)
                    for scope in resource_spans.scope_spans:
                        collector.spans.extend(scope.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)
                collector.arrived.set()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = LoopbackHTTP(Handler)
        self.url = self.server.url


def test_traces_url() -> None:
    assert traces_url("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("http://127.0.0.1:4318/") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("http://c:4318/custom/traces") == "http://c:4318/custom/traces"


def test_each_request_is_a_span_with_queue_load_and_generation(
    tmp_path: Path, blazar_home: Path, tiny_model: Path
) -> None:
    collector = Collector()
    try:
        manifest = tmp_path / "manifest" / "blazar.toml"
        manifest.parent.mkdir()
        manifest.write_text(
            f'[serving]\notlp_endpoint = "{collector.url}"\notlp_service = "team-box"\n\n'
            + ENGINE
            + f'[models.tiny]\nsource = "{tiny_model.as_uri()}"\nctx = 512\n'
        )
        trace = uuid.uuid4().hex
        with Served(manifest, blazar_home) as served:
            oai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
            oai.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=5,
                extra_headers={"x-request-id": trace},
            )
            deadline = time.monotonic() + 20
            while not any(s.trace_id.hex() == trace for s in collector.spans):
                assert time.monotonic() < deadline, "no span reached the collector"
                collector.arrived.wait(0.2)
                collector.arrived.clear()
        assert collector.paths[0] == "/v1/traces"
        assert {"service.name": "team-box"}.items() <= collector.resources[0].items()
        mine = [s for s in collector.spans if s.trace_id.hex() == trace]
        by_name = {s.name: s for s in mine}
        assert set(by_name) == {"POST /v1/chat/completions", "queue wait", "load", "generation"}
        root = by_name["POST /v1/chat/completions"]
        assert root.parent_span_id == b""
        for name in ("queue wait", "load", "generation"):
            child = by_name[name]
            assert child.parent_span_id == root.span_id
            assert root.start_time_unix_nano <= child.start_time_unix_nano
            assert child.end_time_unix_nano <= root.end_time_unix_nano
        load = by_name["load"]
        assert load.end_time_unix_nano > load.start_time_unix_nano  # the model was started
        attributes = {a.key: a.value for a in root.attributes}
        assert attributes["blazar.model"].string_value == "tiny"
        assert attributes["gen_ai.usage.output_tokens"].int_value == 5
        assert attributes["http.response.status_code"].int_value == 200
    finally:
        collector.server.stop()
