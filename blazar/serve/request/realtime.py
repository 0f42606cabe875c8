"""A realtime voice session's work: what `/v1/realtime`'s events make the gateway do.

The route (`blazar.serve.routes.realtime_api`) owns the WebSocket and its limits and
hands each client event to `RealtimeSession.handle`; the protocol's checks and shapes
are `blazar.protocols.openai_realtime`, the audio's `blazar.protocols.realtime_audio`.
Everything a session asks of a model goes through the one request path:

- a commit's audio is transcribed by the session's transcription model (a whisper
  child leased with `Pipeline.hold`, called with `audio_engine.transcribe`), in a
  task of its own, while the client goes on;
- a response (`realtime_turn.Turn`) waits for those transcripts, then asks the chat
  model with the conversation through `Pipeline.events` (resolve, require, lease,
  admit, trace: each response is one trace, its id the response's, so `blazar why
  resp_...` shows it); the text goes out as it arrives and, with audio, is cut into
  sentences;
- a speaker task speaks each sentence as soon as it is whole (a piper child, one
  `held` slot per sentence, `audio_engine.synthesize`) and streams it as PCM16
  chunks, while the chat model writes the next one.

One response at a time; `response.cancel` (or the socket closing) cancels it, which
closes the engine's connection (the child stops) and gives every slot back. The
speaker and the transcriptions start outside the response's trace, so their leases
never show as the chat call's.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from blazar.protocols import ProtocolError
from blazar.protocols.openai_audio import TranscriptionRequest
from blazar.protocols.openai_realtime import (
    RATE,
    Conversation,
    EventError,
    Events,
    Item,
    Settings,
    Transcription,
    for_response,
    parse_event,
    parse_item,
    updated,
)
from blazar.protocols.realtime_audio import AudioBuffer, AudioError, decode_pcm, wav
from blazar.serve.http import wants_priority
from blazar.serve.request import steps
from blazar.serve.request.asks import Ask
from blazar.serve.request.grants import sees
from blazar.serve.request.pipeline import Pipeline
from blazar.serve.request.realtime_turn import PATH, Limits, Send, Turn, event_error
from blazar.serve.state.audio_engine import transcribe
from blazar.serve.state.tracing import Observer
from blazar.serve.supervisor.scheduler import SchedulerError

MIN_COMMIT_S = 0.1  # OpenAI's least: "expected at least 100ms of audio"
logger = logging.getLogger("blazar.serve")


class RealtimeSession:
    """One socket's session: its settings, input buffer, conversation and tasks."""

    def __init__(
        self,
        pipeline: Pipeline,
        observer: Observer,
        request: web.Request,
        send: Send,
        *,
        model: str | None,
        limits: Limits,
    ) -> None:
        self.pipeline, self.observer, self.request = pipeline, observer, request
        self.send, self.limits = send, limits
        self.priority = wants_priority(request)  # x-blazar-priority on the handshake
        self.id = self.new_id("sess")
        self.events = Events(self.id.removeprefix("sess_")[:12])
        voice = self._only(steps.SPEECH)
        heard = self._only(steps.TRANSCRIPTION)
        self.settings = Settings(
            model or self._only(steps.CHAT) or "",
            voice=voice,
            transcription=Transcription(heard) if heard is not None else None,
            modalities=("text", "audio") if voice is not None else ("text",),
        )
        self.buffer = AudioBuffer(RATE, limits.max_audio_seconds)
        self.conversation = Conversation(limits.max_items, limits.max_conversation_chars)
        self.pending: dict[str, asyncio.Task[None]] = {}  # transcriptions, by item id
        self.response: asyncio.Task[None] | None = None
        self.handlers: dict[str, Callable[[dict[str, Any]], Awaitable[None]]] = {
            "session.update": self._update,
            "input_audio_buffer.append": self._append,
            "input_audio_buffer.commit": self._commit,
            "input_audio_buffer.clear": self._clear,
            "conversation.item.create": self._item,
            "response.create": self._respond,
            "response.cancel": self._cancel,
        }

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}_{secrets.token_hex(12)}"

    @property
    def busy(self) -> bool:
        """Work is running that the client waits for (the idle timeout waits too)."""
        return bool(self.pending) or (self.response is not None and not self.response.done())

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return self.events.make(kind, **fields)

    async def start(self) -> None:
        await self.send(self.event("session.created", session=self.settings.to_api(self.id)))

    async def error(self, error: EventError, event_id: str | None = None) -> None:
        await self.send(self.events.error(error, event_id))

    async def handle(self, data: Any) -> None:
        """One client event; a bad one is answered with an `error` event."""
        event_id = data.get("event_id") if isinstance(data, dict) else None
        said = event_id if isinstance(event_id, str) else None
        try:
            event = parse_event(data)
            await self.handlers[event["type"]](event)
        except EventError as exc:
            await self.error(exc, said)
        except Exception as exc:  # a bug: the client hears of it, the log has the traceback
            logger.exception("a realtime event failed")
            await self.error(event_error(exc), said)

    async def close(self) -> None:
        """The socket is gone: stop what runs (slots go back, children stop)."""
        tasks = [*self.pending.values(), *([self.response] if self.response else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- models ---------------------------------------------------------------------------

    def _only(self, kind: str) -> str | None:
        """The one served model of `kind` the request's key may use; None if not one."""
        names = [
            r.name
            for r in self.pipeline.scheduler.runtimes.values()
            if r.kind == kind and sees(self.request, r.name, r.aliases)
        ]
        return names[0] if len(names) == 1 else None

    def check(self, name: str, need: str, param: str) -> None:
        """The model `name` is served here, of the kind `need`, to this key; else why not."""
        if not name:
            what = {steps.CHAT: "a chat model"}.get(need, "a model")
            raise EventError(
                f"'{param}' is not set: name {what} served here",
                "missing_required_parameter",
                param,
            )
        try:
            self.pipeline.servable(self.request, Ask(name, PATH, {}, need=need))
        except (ProtocolError, SchedulerError) as exc:
            failed = event_error(exc, param)
            failed.message = f"{param}: {failed.message}"
            raise failed from None

    # -- client events --------------------------------------------------------------------

    async def _update(self, event: dict[str, Any]) -> None:
        new = updated(self.settings, event.get("session"))
        if new.model != self.settings.model:
            self.check(new.model, steps.CHAT, "session.model")
        if new.voice is not None and new.voice != self.settings.voice:
            self.check(new.voice, steps.SPEECH, "session.voice")
        heard = new.transcription
        if heard is not None and heard != self.settings.transcription:
            where = "session.input_audio_transcription.model"
            self.check(heard.model, steps.TRANSCRIPTION, where)
        if "audio" in new.modalities and new.voice is None:
            raise no_voice("session")
        self.settings = new
        await self.send(self.event("session.updated", session=new.to_api(self.id)))

    async def _append(self, event: dict[str, Any]) -> None:
        try:
            pcm = decode_pcm(event.get("audio"))
        except AudioError as exc:
            raise EventError(str(exc), "invalid_value", "audio") from None
        try:
            self.buffer.append(pcm)
        except AudioError as exc:
            raise EventError(str(exc), "input_audio_buffer_full", "audio") from None

    async def _commit(self, event: dict[str, Any]) -> None:
        if self.buffer.seconds < MIN_COMMIT_S:
            raise EventError(
                f"buffer too small: expected at least {MIN_COMMIT_S * 1000:.0f}ms of audio, got "
                f"{self.buffer.seconds * 1000:.2f}ms; append PCM16 audio at {RATE} Hz first",
                "input_audio_buffer_commit_empty",
            )
        item = Item(self.new_id("item"), "user", "audio")
        previous = self.conversation.add(item)
        pcm = self.buffer.take()
        await self.send(
            self.event("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id)
        )
        await self.send(
            self.event("conversation.item.created", previous_item_id=previous, item=item.to_api())
        )
        task = asyncio.create_task(self._transcribe(item, pcm, self.settings.transcription))
        self.pending[item.id] = task
        task.add_done_callback(lambda _: self.pending.pop(item.id, None))

    async def _clear(self, event: dict[str, Any]) -> None:
        self.buffer.clear()
        await self.send(self.event("input_audio_buffer.cleared"))

    async def _item(self, event: dict[str, Any]) -> None:
        previous_given = event.get("previous_item_id")
        if previous_given is not None and previous_given != self.conversation.last_id:
            raise EventError(
                "items are added at the end of the conversation here: leave out "
                "'previous_item_id' or give the last item's id",
                "unsupported_value",
                "previous_item_id",
            )
        item = parse_item(event.get("item"), lambda: self.new_id("item"))
        previous = self.conversation.add(item)
        await self.send(
            self.event("conversation.item.created", previous_item_id=previous, item=item.to_api())
        )

    async def _respond(self, event: dict[str, Any]) -> None:
        if self.response is not None and not self.response.done():
            raise EventError(
                "Conversation already has an active response: wait for its "
                "response.done, or send response.cancel",
                "conversation_already_has_active_response",
            )
        options = for_response(self.settings, event.get("response"))
        chosen = options.settings
        if chosen.voice is not None and chosen.voice != self.settings.voice:
            self.check(chosen.voice, steps.SPEECH, "response.voice")
        if "audio" in chosen.modalities and chosen.voice is None:
            raise no_voice("response")
        turn = Turn(self, self.new_id("resp"), options)
        self.response = asyncio.create_task(turn.run())

    async def _cancel(self, event: dict[str, Any]) -> None:
        if self.response is None or self.response.done():
            raise EventError(
                "there is no response in progress to cancel", "response_cancel_not_active"
            )
        self.response.cancel()

    # -- transcription --------------------------------------------------------------------

    async def _transcribe(self, item: Item, pcm: bytes, wanted: Transcription | None) -> None:
        kind = "conversation.item.input_audio_transcription"
        try:
            if wanted is None:
                raise EventError(
                    "no transcription model: set session.input_audio_transcription to "
                    '{"model": NAME} naming a transcription model served here',
                    "missing_required_parameter",
                    "session.input_audio_transcription",
                )
            ask = Ask(wanted.model, PATH, {}, need=steps.TRANSCRIPTION)
            asked = TranscriptionRequest(
                wanted.model, language=wanted.language, prompt=wanted.prompt
            )
            async with self.pipeline.hold(self.request, ask) as leased:
                lease = leased.lease
                heard = await transcribe(
                    self.pipeline.children, lease.url, lease.runtime.name, wav(pcm, RATE), asked
                )
        except Exception as exc:
            if steps.failure(exc) is None and not isinstance(exc, EventError):
                logger.exception("realtime transcription failed")
            item.failed = True
            failed = event_error(exc)
            await self.send(
                self.event(
                    f"{kind}.failed",
                    item_id=item.id,
                    content_index=0,
                    error={
                        "type": failed.kind,
                        "code": failed.code,
                        "message": failed.message,
                        "param": failed.param,
                    },
                )
            )
            return
        item.text = heard.text
        await self.send(
            self.event(f"{kind}.completed", item_id=item.id, content_index=0, transcript=heard.text)
        )

    async def transcribed(self) -> None:
        """Wait for the transcriptions still running (a response needs their text)."""
        if self.pending:
            await asyncio.gather(*self.pending.values(), return_exceptions=True)


def no_voice(where: str) -> EventError:
    return EventError(
        f"an audio answer needs a voice: set {where}.voice to a speech model served here, or "
        f'ask for text alone with {where}.modalities ["text"]',
        "missing_required_parameter",
        f"{where}.voice",
    )
