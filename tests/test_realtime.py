"""`/v1/realtime` on the real app in-process: the handshake, the protocol's checks, its limits.

No engine is needed for these: they are what the gateway decides before a model is
asked (handshake refusals in OpenAI's envelope, keys in the header or the
subprotocol, bad events answered as `error` events while the session goes on, the
input buffer's bound, the idle timeout). The one response here runs against a
scripted child that streams until it is stopped (fault injection: the cancel must
close the engine's connection and give the slot back). Voice in and voice out with
the real lanes is in tests/test_audio_served.py; the pure parts are in
tests/test_realtime_units.py.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from blazar.serve.gateway.access import Access
from blazar.serve.gateway.app import build_app
from blazar.serve.request.realtime_turn import Limits
from blazar.serve.routes import realtime_api
from blazar.serve.routes.services import Services
from blazar.serve.supervisor.scheduler import Scheduler
from specs.keys import Key
from specs.serving import Serving
from tests.gateway_harness import InProcessGateway, runtime
from tests.loopback import LoopbackHTTP

KEY = "plm_realtime-secret"
PCM_100MS = b"\x01\x00" * 2400  # 0.1 s of PCM16 at 24 kHz


def app(keyed: bool = False) -> Any:
    scheduler = Scheduler({}, max_loaded=1, max_queue=1, queue_timeout=1.0, log_dir=Path("/x"))
    access = Access()
    if keyed:
        access.configure(Serving(), {"app": Key(sha256=hashlib.sha256(KEY.encode()).hexdigest())})
    return build_app(Services(scheduler), access)


@asynccontextmanager
async def client(keyed: bool = False) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(app(keyed))) as test_client:
        yield test_client


async def recv(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    message = await ws.receive(timeout=10)
    assert message.type == aiohttp.WSMsgType.TEXT, message
    return dict(json.loads(message.data))


async def error_of(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    event = await recv(ws)
    assert event["type"] == "error", event
    assert event["error"]["type"] == "invalid_request_error" and event["event_id"]
    return dict(event["error"])


def test_the_handshake_is_refused_in_openais_envelope() -> None:
    async def run() -> None:
        async with client() as http:
            plain = await http.get("/v1/realtime")
            assert plain.status == 426
            body = await plain.json()
            assert body["error"]["code"] == "upgrade_required"
            assert "is a WebSocket" in body["error"]["message"]
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect("/v1/realtime?model=nope", protocols=("realtime",))
            assert refused.value.status == 404
            unknown = await http.get(
                "/v1/realtime?model=nope",
                headers={
                    "Upgrade": "websocket",
                    "Connection": "Upgrade",
                    "Sec-WebSocket-Version": "13",
                    "Sec-WebSocket-Key": "x" * 22 + "==",
                },
            )
            said = (await unknown.json())["error"]
            assert unknown.status == 404 and "model 'nope' not found" in said["message"]

    asyncio.run(run())


def test_a_key_in_the_header_or_in_the_subprotocol() -> None:
    async def run() -> None:
        async with client(keyed=True) as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect("/v1/realtime", protocols=("realtime",))
            assert refused.value.status == 401
            wrong = ("realtime", "openai-insecure-api-key.plm_wrong")
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect("/v1/realtime", protocols=wrong)
            assert refused.value.status == 401
            offered = ("realtime", f"openai-insecure-api-key.{KEY}", "openai-beta.realtime-v1")
            async with http.ws_connect("/v1/realtime", protocols=offered) as ws:
                assert ws.protocol == "realtime"  # the key is never echoed back
                assert (await recv(ws))["type"] == "session.created"
            headers = {"Authorization": f"Bearer {KEY}"}
            async with http.ws_connect("/v1/realtime", headers=headers) as ws:
                assert (await recv(ws))["type"] == "session.created"

    asyncio.run(run())


def test_bad_events_are_error_events_and_the_session_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limits = Limits(max_audio_seconds=0.25, max_event_bytes=16384)
    monkeypatch.setattr(realtime_api, "LIMITS", limits)

    async def run() -> None:
        async with client() as http, http.ws_connect("/v1/realtime") as ws:
            created = await recv(ws)
            session = created["session"]
            assert created["type"] == "session.created" and session["id"].startswith("sess_")
            assert session["modalities"] == ["text"] and session["voice"] is None  # none served
            assert session["input_audio_format"] == "pcm16" and session["turn_detection"] is None
            await ws.send_str("not json")
            assert (await error_of(ws))["code"] == "invalid_json"
            await ws.send_bytes(b"\x00\x01")
            assert "JSON text message" in (await error_of(ws))["message"]
            await ws.send_str("x" * 20000)
            assert (await error_of(ws))["code"] == "event_too_large"
            cases: list[tuple[dict[str, Any], str, str]] = [
                (
                    {"type": "conversation.item.delete", "event_id": "e1"},
                    "invalid_value",
                    "The events served here are",
                ),
                (
                    {
                        "type": "session.update",
                        "session": {"turn_detection": {"type": "server_vad"}},
                    },
                    "unsupported_value",
                    "commit",
                ),
                (
                    {"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}},
                    "invalid_value",
                    "pcm16",
                ),
                (
                    {"type": "session.update", "session": {"colour": "blue"}},
                    "unknown_parameter",
                    "session.colour",
                ),
                (
                    {"type": "session.update", "session": {"voice": "alloy"}},
                    "model_not_found",
                    "session.voice",
                ),
                (
                    {"type": "session.update", "session": {"temperature": 9}},
                    "invalid_value",
                    "from 0 to 2",
                ),
                ({"type": "input_audio_buffer.append", "audio": "%%%"}, "invalid_value", "base64"),
                (
                    {"type": "input_audio_buffer.append", "audio": "AA=="},
                    "invalid_value",
                    "2 bytes each",
                ),
                (
                    {"type": "input_audio_buffer.commit"},
                    "input_audio_buffer_commit_empty",
                    "at least 100ms",
                ),
                ({"type": "response.cancel"}, "response_cancel_not_active", "no response"),
                (
                    {"type": "conversation.item.create", "item": {"type": "function_call"}},
                    "unsupported_value",
                    "send messages",
                ),
            ]
            for event, code, says in cases:
                await ws.send_json(event)
                error = await error_of(ws)
                assert error["code"] == code and says in error["message"], (event, error)
                assert error["event_id"] == event.get("event_id")
            audio = base64.b64encode(PCM_100MS).decode()
            for _ in range(2):
                await ws.send_json({"type": "input_audio_buffer.append", "audio": audio})
            await ws.send_json({"type": "input_audio_buffer.append", "audio": audio})
            full = await error_of(ws)  # 0.3 s would pass the 0.25 s bound
            assert full["code"] == "input_audio_buffer_full" and "0.25 s" in full["message"]
            await ws.send_json({"type": "input_audio_buffer.clear"})
            assert (await recv(ws))["type"] == "input_audio_buffer.cleared"
            await ws.send_json({"type": "input_audio_buffer.append", "audio": audio})
            await ws.send_json({"type": "input_audio_buffer.commit"})
            committed, created_item, failed = await recv(ws), await recv(ws), await recv(ws)
            assert committed["type"] == "input_audio_buffer.committed"
            assert committed["previous_item_id"] is None
            assert created_item["item"]["id"] == committed["item_id"]
            assert failed["type"] == "conversation.item.input_audio_transcription.failed"
            assert "no transcription model" in failed["error"]["message"]
            item = {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hello"}],
            }
            await ws.send_json({"type": "conversation.item.create", "item": item})
            added = await recv(ws)
            assert added["type"] == "conversation.item.created"
            assert added["previous_item_id"] == committed["item_id"]
            assert added["item"]["content"] == [{"type": "input_text", "text": "hello"}]
            await ws.send_json({"type": "response.create"})
            events = [await recv(ws) for _ in range(3)]
            assert [e["type"] for e in events] == ["response.created", "error", "response.done"]
            assert "'session.model' is not set" in events[1]["error"]["message"]
            assert events[2]["response"]["status"] == "failed"
            await ws.send_json({"type": "session.update", "session": {"instructions": "Be brief."}})
            updated = await recv(ws)
            assert updated["type"] == "session.updated"
            assert updated["session"]["instructions"] == "Be brief."

    asyncio.run(run())


def test_an_idle_session_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realtime_api, "LIMITS", Limits(idle_seconds=0.3))

    async def run() -> None:
        async with client() as http, http.ws_connect("/v1/realtime") as ws:
            assert (await recv(ws))["type"] == "session.created"
            await ws.send_json({"type": "input_audio_buffer.clear"})
            assert (await recv(ws))["type"] == "input_audio_buffer.cleared"
            started = time.monotonic()
            error = await error_of(ws)
            assert error["code"] == "session_idle_timeout"
            assert time.monotonic() - started >= 0.25
            closing = await ws.receive(timeout=5)
            assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 1000

    asyncio.run(run())


def test_open_sessions_are_closed_as_the_gateway_stops() -> None:
    async def run() -> tuple[Any, float]:
        async with client() as http:
            ws = await http.ws_connect("/v1/realtime")
            assert (await recv(ws))["type"] == "session.created"
            started = time.monotonic()
            await http.server.close()  # aiohttp would wait 60 s for an open handler
            closing = await ws.receive(timeout=10)
            return closing, time.monotonic() - started

    closing, took = asyncio.run(run())
    assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 1001
    assert took < 5


class Streams(BaseHTTPRequestHandler):
    """A chat child that streams the word "fox" every 20 ms until its client goes away."""

    protocol_version = "HTTP/1.1"
    gone = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = {"choices": [{"index": 0, "delta": {"content": " fox"}, "finish_reason": None}]}
        data = f"data: {json.dumps(chunk)}\n\n".encode()
        try:
            for _ in range(500):
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
                time.sleep(0.02)
        except OSError:
            Streams.gone.set()

    def log_message(self, *args: Any) -> None:
        pass


def test_one_response_at_a_time_and_a_cancel_stops_the_engine() -> None:
    child = LoopbackHTTP(Streams)
    try:
        with InProcessGateway(child.url, runtime("tiny", preflight="off")) as gateway:

            async def run() -> list[dict[str, Any]]:
                url = gateway.url.replace("http", "ws") + "/v1/realtime?model=tiny"
                async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
                    assert (await recv(ws))["session"]["model"] == "tiny"
                    item = {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "hi"}],
                    }
                    await ws.send_json({"type": "conversation.item.create", "item": item})
                    await ws.send_json({"type": "response.create"})
                    seen = [await recv(ws)]
                    while seen[-1]["type"] != "response.text.delta":
                        seen.append(await recv(ws))
                    await ws.send_json({"type": "response.create"})
                    while seen[-1]["type"] != "error":
                        seen.append(await recv(ws))
                    await ws.send_json({"type": "response.cancel"})
                    while seen[-1]["type"] != "response.done":
                        seen.append(await recv(ws))
                    return seen

            seen = asyncio.run(run())
            assert Streams.gone.wait(5), "the engine's connection was left open"
            error = next(e for e in seen if e["type"] == "error")["error"]
            assert error["code"] == "conversation_already_has_active_response"
            done = seen[-1]["response"]
            assert done["status"] == "cancelled"
            assert done["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
            text = done["output"][0]["content"][0]["text"]
            assert text.startswith(" fox") and text == "".join(
                e["delta"] for e in seen if e["type"] == "response.text.delta"
            )
            pool = gateway.scheduler.pools["tiny"]
            assert sum(m.in_flight for m in pool.members) == 0  # the slot is back
    finally:
        child.stop()
