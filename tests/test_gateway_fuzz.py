"""Malformed requests on every route: never a 5xx from the gateway, errors in their shape.

Hypothesis sends generated bodies (bytes that are not JSON, JSON that is not an
object, objects with the fields the three protocols use holding values of any
type, bodies nested too deep, numbers JSON does not allow) to every route the
gateway's router has (walked, so a route added later is covered by itself), with
and without `anthropic-version`. The gateway is the real app in-process
(`tests.gateway_harness`) in front of a scripted child that answers every
engine path correctly, so a 5xx could only be the gateway's own. After each
request the gateway must still answer a good one.

The example count is kept small for the default suite (a few seconds);
BLAZAR_FUZZ_EXAMPLES=5000 searches harder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from blazar.launch.served_template import builtin_text
from tests.gateway_harness import InProcessGateway, runtime
from tests.loopback import LoopbackHTTP

MODELS = ("tiny", "embed", "nope")
EXAMPLES = int(os.environ.get("BLAZAR_FUZZ_EXAMPLES", "80"))
FIELDS = (
    "model",
    "name",
    "messages",
    "prompt",
    "input",
    "stream",
    "tools",
    "tool_choice",
    "options",
    "format",
    "keep_alive",
    "max_tokens",
    "max_output_tokens",
    "logprobs",
    "top_logprobs",
    "echo",
    "context",
    "suffix",
    "raw",
    "think",
    "system",
    "images",
    "text",
    "reasoning",
    "instructions",
    "source",
    "destination",
    "from",
    "files",
    "temperature",
    "stop",
    "stop_sequences",
    "thinking",
    "output_config",
    "metadata",
    "n",
    "dimensions",
    "truncate",
    "template",
    "response_format",
    "previous_response_id",
    "include",
    "parallel_tool_calls",
    "top_p",
    "top_k",
    "insecure",
    "quantize",
    "parameters",
)
CHUNK = {"choices": [{"index": 0, "delta": {"content": " word"}, "finish_reason": None}]}
LAST = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": " word"},
            "finish_reason": "length",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    "timings": {"prompt_n": 3, "prompt_ms": 1.0, "predicted_n": 1, "predicted_ms": 1.0},
}
MESSAGE = {
    "id": "chatcmpl-1",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [{"type": "text", "text": " word"}],
    "stop_reason": "max_tokens",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 1},
}
MESSAGE_EVENTS = [
    {"type": "message_start", "message": {**MESSAGE, "content": []}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " w"}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "max_tokens"},
        "usage": {"output_tokens": 1},
    },
    {"type": "message_stop"},
]
NATIVE = {
    "content": " word",
    "stop": True,
    "stop_type": "limit",
    "tokens_predicted": 1,
    "tokens_evaluated": 3,
    "timings": {"prompt_n": 3, "predicted_n": 1},
}


def _answer(path: str, body: Any) -> tuple[str, Any]:
    """What a healthy llama-server answers: ("json", body) or ("sse", events)."""
    stream = isinstance(body, dict) and body.get("stream") is True
    if path == "/v1/chat/completions":
        return ("sse", [CHUNK, LAST, USAGE, "[DONE]"]) if stream else ("json", CHAT)
    if path == "/v1/completions":
        text = {
            "id": "chatcmpl-2",
            "object": "text_completion",
            "choices": [{"index": 0, "text": " word", "finish_reason": "length", "logprobs": None}],
        }
        return ("sse", [text, "[DONE]"]) if stream else ("json", text)
    if path == "/v1/embeddings":
        return "json", {"data": [{"index": 0, "embedding": [0.6, 0.8]}], "usage": {}}
    if path == "/v1/messages":
        return ("sse", MESSAGE_EVENTS) if stream else ("json", MESSAGE)
    if path == "/v1/messages/count_tokens":
        return "json", {"input_tokens": 3}
    if path in ("/completion", "/infill"):
        return ("sse", [NATIVE]) if stream else ("json", NATIVE)
    if path == "/apply-template":
        return "json", {"prompt": "<|im_start|>user\nhi<|im_end|>\n"}
    if path == "/tokenize":
        return "json", {"tokens": [1, 2, 3]}
    return "json", {"error": {"code": 404, "message": "File Not Found"}}


class Child(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        kind, answer = _answer(self.path, body)
        if kind == "json":
            payload = json.dumps(answer).encode()
            self.send_response(404 if "error" in answer else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        events = b"".join(
            f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in answer
        )
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(events)))
        self.end_headers()
        self.wfile.write(events)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    root = tmp_path_factory.mktemp("fuzz")
    manifest = root / "blazar.toml"
    manifest.write_text('[models.tiny]\nsource = "file:///nonexistent/tiny.gguf"\n')
    child = LoopbackHTTP(Child)
    chatml = builtin_text("chatml")  # renders tools, so tool requests go deeper
    models = (
        runtime("tiny", chat_template=chatml, facts={"chat_template": chatml}),
        runtime("embed", embeddings=True),
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BLAZAR_HOME", str(root / "home"))
        try:
            with InProcessGateway(child.url, *models, manifest=manifest) as served:
                yield served
        finally:
            child.stop()


def routes(gateway: InProcessGateway) -> list[tuple[str, str]]:
    """Every (method, path pattern) the app's router serves."""
    found = {
        (route.method, route.resource.canonical)
        for route in gateway.app.router.routes()
        if route.resource is not None
    }
    return sorted(found)


json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(MODELS)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
request_object = st.fixed_dictionaries(
    {"model": st.sampled_from(MODELS)},
    optional={key: json_value for key in FIELDS[1:]},
)
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
HI = {"role": "user", "content": "hi"}
# A valid request for each route that takes one: the examples corrupt a part of it, so
# they get past the first check and into the translators.
VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": "tiny",
        "messages": [HI],
        "max_tokens": 2,
        "tools": [TOOL],
        "logprobs": True,
    },
    "/v1/completions": {"model": "tiny", "prompt": "a", "max_tokens": 2, "logprobs": 1},
    "/v1/embeddings": {"model": "embed", "input": "x"},
    "/v1/responses": {
        "model": "tiny",
        "max_output_tokens": 3,
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "ok"},
        ],
        "tools": [{"type": "function", "name": "f", "parameters": {}}],
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}},
        "reasoning": {"effort": "none"},
    },
    "/v1/messages": {
        "model": "tiny",
        "max_tokens": 2,
        "system": [{"type": "text", "text": "s"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}],
            },
        ],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "stop_sequences": ["x"],
        "tool_choice": {"type": "auto"},
    },
    "/api/chat": {
        "model": "tiny",
        "stream": False,
        "format": {"type": "object"},
        "keep_alive": "5m",
        "messages": [
            HI,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "f", "arguments": {}}}],
            },
            {"role": "tool", "content": "ok", "tool_name": "f"},
        ],
        "tools": [TOOL],
        "options": {"num_predict": 2, "temperature": 0.5, "stop": ["x"]},
    },
    "/api/generate": {
        "model": "tiny",
        "prompt": "hi",
        "system": "s",
        "context": [1, 2],
        "options": {"num_predict": 2},
        "stream": True,
    },
    "/api/embed": {"model": "embed", "input": ["a", "b"], "dimensions": 1},
    "/api/embeddings": {"model": "embed", "prompt": "a"},
    "/api/show": {"model": "tiny"},
    "/api/copy": {"source": "tiny", "destination": "tiny-copy"},
    "/api/delete": {"model": "tiny-copy"},
    "/api/pull": {"model": "nope-model", "stream": False},
    "/api/create": {"model": "made", "from": "/nonexistent/made.gguf", "stream": False},
    "/api/blazar/stop": {"model": "tiny"},
}
VALID["/v1/messages/count_tokens"] = VALID["/v1/messages"]


@st.composite
def corrupted(draw: st.DrawFn, value: Any, depth: int = 0) -> Any:
    """`value` with one part (at some depth) replaced by any JSON, or a key dropped."""
    if depth and draw(st.integers(0, 3)) == 0:
        return draw(json_value)
    if isinstance(value, dict) and value:
        out = dict(value)
        key = draw(st.sampled_from(sorted(out)) | st.sampled_from(FIELDS))
        if key in out and draw(st.booleans()):
            del out[key]
        else:
            out[key] = draw(corrupted(out[key], depth + 1)) if key in out else draw(json_value)
        return out
    if isinstance(value, list) and value:
        out_list = list(value)
        at = draw(st.integers(0, len(out_list) - 1))
        out_list[at] = draw(corrupted(out_list[at], depth + 1))
        return out_list
    return draw(json_value)


NOT_JSON_NUMBERS = [
    b'{"model": "tiny", "temperature": NaN}',
    b'{"model": "tiny", "keep_alive": 1e999}',
    b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_p": -Infinity}',
]
garbage = st.one_of(
    request_object.map(lambda b: json.dumps(b).encode()),
    json_value.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
    st.integers(min_value=129, max_value=5000).map(lambda n: b"[" * n),
    st.sampled_from(NOT_JSON_NUMBERS),
)


def shape_of(method: str, path: str, anthropic: bool) -> str:
    if path.startswith("/api/"):
        return "ollama"
    if path.startswith("/v1/messages"):
        return "anthropic"
    openai_only = path.startswith(
        ("/v1/chat/", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/audio/")
    )
    return "anthropic" if anthropic and path.startswith("/v1/") and not openai_only else "openai"


def check_shape(kind: str, body: Any) -> None:
    if kind == "ollama":
        assert set(body) == {"error"} and isinstance(body["error"], str), body
    elif kind == "anthropic":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body) == {"error"} and set(body["error"]) >= {"message", "type", "code"}, body


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as session:  # keep-alive: the examples stay fast
        yield session


def still_serves(client: httpx.Client, url: str) -> None:
    good = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    answer = client.post(url + "/v1/chat/completions", json=good)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == " word"


def test_every_route_is_walked(gateway: InProcessGateway) -> None:
    found = routes(gateway)
    paths = {path for _, path in found}
    for path in (
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/models/{model}",
        "/api/chat",
        "/api/pull",
        "/v1/messages",
        "/api/blazar/ps",
    ):
        assert path in paths, path
    assert len(found) >= 30


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), anthropic=st.booleans())
def test_malformed_bodies_never_get_a_5xx(
    gateway: InProcessGateway, client: httpx.Client, data: st.DataObject, anthropic: bool
) -> None:
    every = routes(gateway)
    taking = [r for r in every if r[0] == "POST" and r[1] in VALID]
    # Half the examples on the routes that take a request body, where the translators are.
    method, pattern = data.draw(st.sampled_from(every) | st.sampled_from(taking), label="route")
    if pattern in VALID and data.draw(st.integers(0, 3), label="corrupt a valid one") > 0:
        body = json.dumps(data.draw(corrupted(VALID[pattern]), label="body")).encode()
    else:
        body = data.draw(garbage, label="body")
    path = pattern
    while "{" in path:  # a path variable: a name that may or may not exist
        start, end = path.index("{"), path.index("}")
        value = data.draw(st.sampled_from([*MODELS, "sha256:00", "resp_1", "x y"]), label="var")
        path = path[:start] + value + path[end + 1 :]
    headers = {"Content-Type": "application/json"}
    if anthropic:
        headers["anthropic-version"] = "2023-06-01"
    content = None if method in ("GET", "HEAD") else body
    with client.stream(method, gateway.url + path, content=content, headers=headers) as answer:
        # A live stream (the dashboard's events, a child's log) answers 200 and never ends:
        # its status and type are what it answered; the rest is not read.
        if not answer.headers.get("content-type", "").startswith("text/event-stream"):
            answer.read()
    event(f"answered {answer.status_code}")  # --hypothesis-show-statistics: how deep it got
    assert answer.status_code < 500, (method, path, body[:200], answer.text[:500])
    if answer.status_code >= 400 and method != "HEAD":
        assert answer.headers["content-type"].startswith("application/json"), answer.text
        check_shape(shape_of(method, path, anthropic), answer.json())
    still_serves(client, gateway.url)


def test_unknown_routes_are_walked_too(gateway: InProcessGateway, client: httpx.Client) -> None:
    for method, path, kind in (
        ("GET", "/v1/nope", "openai"),
        ("PUT", "/v1/chat/completions", "openai"),
        ("GET", "/api/nope", "ollama"),
        ("POST", "/v1/messages/nope", "anthropic"),
    ):
        answer = client.request(method, gateway.url + path, content=b"{}")
        assert answer.status_code in (404, 405), (method, path)
        check_shape(kind, answer.json())
