"""`GET /v1/realtime`: OpenAI's Realtime protocol on a WebSocket, voice in and voice out.

The handshake passes the access layer like every route (the key in `Authorization`,
or, from a browser, in the `openai-insecure-api-key.KEY` subprotocol:
`access.presented_key`); the answer chooses the `realtime` subprotocol. A `model`
in the query is checked before the upgrade, so a model that is not served (or not
to this key) is refused in OpenAI's envelope as any route's would be; a request
that is not a WebSocket upgrade is a 426.

Then this module owns the socket: it reads each message within the limits
(`Limits`: a text message over `max_event_bytes` is an `error` event and is
dropped, one over `max_frame_bytes` closes the socket with 1009 as aiohttp must;
binary messages and text that is not JSON are `error` events), hands each event to
the session (`blazar.serve.request.realtime`), and closes the session after
`idle_seconds` without an event while nothing runs (an `error` event first, then
close code 1000). Sends from the session's tasks go out as whole frames; once the
client has gone they are dropped. As serve stops, open sessions are closed with
1001 (`close_all`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from blazar.protocols import ProtocolError
from blazar.protocols.openai_realtime import EventError
from blazar.serve.request import steps
from blazar.serve.request.asks import Ask
from blazar.serve.request.realtime import RealtimeSession
from blazar.serve.request.realtime_turn import PATH, Limits
from blazar.serve.routes.services import Services

SUBPROTOCOL = "realtime"
LIMITS = Limits()


def register(app: web.Application, services: Services) -> None:
    """Add `/v1/realtime` to the gateway's app; open sessions are closed (1001) as serve
    stops, before the scheduler stops the children (else aiohttp waits a minute for them)."""
    api = RealtimeAPI(services)
    app.router.add_get(PATH, api.handle)
    services.closing.append(api.close_all)

    async def shutdown(_: web.Application) -> None:
        await api.close_all()

    app.on_shutdown.append(shutdown)


class RealtimeAPI:
    """The handler; one instance per gateway app (`limits` None: the module's `LIMITS`)."""

    def __init__(self, services: Services, limits: Limits | None = None) -> None:
        self.services = services
        self.limits = limits
        self.open: set[web.WebSocketResponse] = set()

    async def close_all(self) -> None:
        """Close every open session: the client hears 1001 (going away)."""
        for ws in list(self.open):
            await ws.close(code=1001, message=b"the gateway is stopping")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        limits = self.limits or LIMITS
        ws = web.WebSocketResponse(protocols=(SUBPROTOCOL,), max_msg_size=limits.max_frame_bytes)
        if not ws.can_prepare(request).ok:
            raise ProtocolError(
                426,
                f"GET {PATH} is a WebSocket (OpenAI's Realtime protocol): connect with "
                "ws:// or wss:// and Upgrade: websocket",
                "upgrade_required",
            )
        model = request.query.get("model") or None
        pipeline = self.services.pipeline
        if model is not None:  # refused before the upgrade, in OpenAI's envelope
            pipeline.servable(request, Ask(model, PATH, {}, need=steps.CHAT))
        await ws.prepare(request)

        async def send(event: dict[str, Any]) -> None:
            if ws.closed:
                return
            with contextlib.suppress(ConnectionError, RuntimeError):  # the client went away
                await ws.send_str(orjson.dumps(event).decode())

        session = RealtimeSession(
            pipeline, self.services.observer, request, send, model=model, limits=limits
        )
        self.open.add(ws)
        try:
            await session.start()
            await self._serve(ws, session, limits)
        finally:
            self.open.discard(ws)
            await session.close()
            if not ws.closed:
                await ws.close()
        return ws

    async def _serve(
        self, ws: web.WebSocketResponse, session: RealtimeSession, limits: Limits
    ) -> None:
        """Read events until the client closes, or the session idles past its limit."""
        while True:
            try:
                message = await ws.receive(timeout=limits.idle_seconds)
            except TimeoutError:
                if session.busy:
                    continue
                await session.error(
                    EventError(
                        f"the session was idle for {limits.idle_seconds:g} s: closing it",
                        "session_idle_timeout",
                    )
                )
                await ws.close(code=1000, message=b"idle timeout")
                return
            if message.type == WSMsgType.TEXT:
                await self._text(session, message.data, limits)
            elif message.type == WSMsgType.BINARY:
                await session.error(
                    EventError(
                        "binary messages are not events: send each event as a JSON text message "
                        "(audio goes base64 in input_audio_buffer.append)",
                        "invalid_json",
                    )
                )
            else:  # CLOSE, CLOSING, CLOSED, ERROR (aiohttp has closed the socket)
                return

    @staticmethod
    async def _text(session: RealtimeSession, text: str, limits: Limits) -> None:
        if len(text) > limits.max_event_bytes:
            await session.error(
                EventError(
                    f"the event is {len(text)} bytes; at most {limits.max_event_bytes} are read: "
                    "send audio in smaller appends",
                    "event_too_large",
                )
            )
            return
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            await session.error(EventError(f"the message is not JSON: {exc}", "invalid_json"))
            return
        await session.handle(data)
