"""A realtime voice session's work: what `/v1/realtime`'s events make the gateway do.

The route (`blazar.serve.routes.realtime_api`) owns the WebSocket and its limits and
hands each client event to `RealtimeSession.handle`; the protocol's checks and shapes
are `blazar.protocols.openai_realtime`, the audio's `blazar.protocols.realtime_audio`.
Everything a session asks of a model goes through the one request path:

- a commit's audio is transcribed by the session's transcription model (a whisper
  child leased with `Pipeline.held`, called with `audio_engine.transcribe`), in a
  task of its own, while the client goes on;
- a response (`Turn`) waits for those transcripts, then asks the chat model with
  the conversation through `Pipeline.events` (resolve, require, lease, admit, trace:
  each response is one trace, its id the response's, so `blazar why resp_...` shows
  it); the text goes out as it arrives and, with audio, is cut into sentences;
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
import base64
import logging
import secrets
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from blazar.observe.trace import CURRENT, Trace
from blazar.protocols import EngineRequest, LoadOnly, ProtocolError
from blazar.protocols.openai_audio import SpeechRequest, TranscriptionRequest
from blazar.protocols.openai_realtime import (
    RATE,
    Conversation,
    EventError,
    Events,
    Item,
    ResponseOptions,
    Settings,
    Transcription,
    for_response,
    parse_event,
    parse_item,
    response_object,
    updated,
    usage,
)
from blazar.protocols.openai_requests import shape_request
from blazar.protocols.realtime_audio import (
    AudioBuffer,
    AudioError,
    Sentences,
    chunks,
    decode_pcm,
    pcm_of_wav,
    resample,
    wav,
)
from blazar.serve.http import wants_priority
from blazar.serve.request import steps
from blazar.serve.request.asks import Answer, Ask, Plan
from blazar.serve.request.grants import sees
from blazar.serve.request.pipeline import Pipeline
from blazar.serve.state.audio_engine import synthesize, transcribe
from blazar.serve.state.tracing import Observer
from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler import SchedulerError, Target

PATH = "/v1/realtime"
logger = logging.getLogger("blazar.serve")
CHAT_PATH = "/v1/chat/completions"
MIN_COMMIT_S = 0.1  # OpenAI's least: "expected at least 100ms of audio"
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class Limits:
    """What one session may hold and how long it may idle (docs/realtime.md)."""

    max_event_bytes: int = 8 << 20  # a text message over this is an error event
    max_frame_bytes: int = 16 << 20  # aiohttp's max_msg_size: past it, closed with 1009
    max_audio_seconds: float = 120.0  # the input buffer, at the session's rate
    idle_seconds: float = 300.0  # no event and nothing running: the session is closed
    max_items: int = 200  # conversation items kept (the oldest dropped)
    max_conversation_chars: int = 1 << 20  # their text, all told (the oldest dropped)
    audio_chunk_seconds: float = 0.5  # of PCM16 per response.audio.delta


@dataclass
class ChatAsk(Ask):
    """A response's chat call: OpenAI's chat completion, streamed, on any engine."""

    def native(self, runtime: ModelRuntime, target: Target) -> Plan | LoadOnly:
        shaping = shape_request(CHAT_PATH, self.body)
        body = shaping.body if shaping.body is not None else self.body
        return Plan(EngineRequest(CHAT_PATH, body, True), Answer, shaping.needs)

    def openai(self, runtime: ModelRuntime | None) -> Plan | LoadOnly:
        return Plan(EngineRequest(CHAT_PATH, self.body, True), Answer)


def event_error(exc: BaseException, param: str | None = None) -> EventError:
    """A failure of the request path, as the `error` event that reports it."""
    if isinstance(exc, EventError):
        return exc
    known = steps.failure(exc)
    if known is None:
        return EventError(f"internal error ({type(exc).__name__}); see serve's log",
                          "internal_error", param, "server_error")  # fmt: skip
    kind = "invalid_request_error" if known.status < 500 else "server_error"
    return EventError(known.message, known.code or "invalid_value", param, kind)


class RealtimeSession:
    """One socket's session: its settings, input buffer, conversation and tasks."""

    def __init__(
        self, pipeline: Pipeline, observer: Observer, request: web.Request, send: Send, *,
        model: str | None, limits: Limits,
    ) -> None:  # fmt: skip
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
            r.name for r in self.pipeline.scheduler.runtimes.values()
            if r.kind == kind and sees(self.request, r.name, r.aliases)
        ]  # fmt: skip
        return names[0] if len(names) == 1 else None

    def check(self, name: str, need: str, param: str) -> None:
        """The model `name` is served here, of the kind `need`, to this key; else why not."""
        if not name:
            what = {steps.CHAT: "a chat model"}.get(need, "a model")
            raise EventError(f"'{param}' is not set: name {what} served here",
                             "missing_required_parameter", param)  # fmt: skip
        try:
            self.pipeline.local(self.request, Ask(name, PATH, {}, need=need))
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
            )  # fmt: skip
        item = Item(self.new_id("item"), "user", "audio")
        previous = self.conversation.add(item)
        pcm = self.buffer.take()
        await self.send(self.event("input_audio_buffer.committed", previous_item_id=previous,
                                   item_id=item.id))  # fmt: skip
        await self.send(self.event("conversation.item.created", previous_item_id=previous,
                                   item=item.to_api()))  # fmt: skip
        task = asyncio.create_task(self._transcribe(item, pcm, self.settings.transcription))
        self.pending[item.id] = task
        task.add_done_callback(lambda _: self.pending.pop(item.id, None))

    async def _clear(self, event: dict[str, Any]) -> None:
        self.buffer.clear()
        await self.send(self.event("input_audio_buffer.cleared"))

    async def _item(self, event: dict[str, Any]) -> None:
        previous_given = event.get("previous_item_id")
        if previous_given is not None and previous_given != self.conversation.last_id:
            raise EventError("items are added at the end of the conversation here: leave out "
                             "'previous_item_id' or give the last item's id", "unsupported_value",
                             "previous_item_id")  # fmt: skip
        item = parse_item(event.get("item"), lambda: self.new_id("item"))
        previous = self.conversation.add(item)
        await self.send(self.event("conversation.item.created", previous_item_id=previous,
                                   item=item.to_api()))  # fmt: skip

    async def _respond(self, event: dict[str, Any]) -> None:
        if self.response is not None and not self.response.done():
            raise EventError("Conversation already has an active response: wait for its "
                             "response.done, or send response.cancel",
                             "conversation_already_has_active_response")  # fmt: skip
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
            raise EventError("there is no response in progress to cancel",
                             "response_cancel_not_active")  # fmt: skip
        self.response.cancel()

    # -- transcription --------------------------------------------------------------------

    async def _transcribe(self, item: Item, pcm: bytes, wanted: Transcription | None) -> None:
        kind = "conversation.item.input_audio_transcription"
        try:
            if wanted is None:
                raise EventError(
                    "no transcription model: set session.input_audio_transcription to "
                    '{"model": NAME} naming a transcription model served here',
                    "missing_required_parameter", "session.input_audio_transcription",
                )  # fmt: skip
            ask = Ask(wanted.model, PATH, {}, need=steps.TRANSCRIPTION)
            asked = TranscriptionRequest(wanted.model, language=wanted.language,
                                         prompt=wanted.prompt)  # fmt: skip
            async with self.pipeline.held(self.request, ask) as timed:
                lease = timed.lease
                heard = await transcribe(
                    self.pipeline.children, lease.url, lease.runtime.name, wav(pcm, RATE), asked
                )
        except Exception as exc:
            if steps.failure(exc) is None and not isinstance(exc, EventError):
                logger.exception("realtime transcription failed")
            item.failed = True
            failed = event_error(exc)
            await self.send(self.event(f"{kind}.failed", item_id=item.id, content_index=0, error={
                "type": failed.kind, "code": failed.code, "message": failed.message,
                "param": failed.param,
            }))  # fmt: skip
            return
        item.text = heard.text
        await self.send(self.event(f"{kind}.completed", item_id=item.id, content_index=0,
                                   transcript=heard.text))  # fmt: skip

    async def transcribed(self) -> None:
        """Wait for the transcriptions still running (a response needs their text)."""
        if self.pending:
            await asyncio.gather(*self.pending.values(), return_exceptions=True)


def no_voice(where: str) -> EventError:
    return EventError(
        f"an audio answer needs a voice: set {where}.voice to a speech model served here, or "
        f'ask for text alone with {where}.modalities ["text"]',
        "missing_required_parameter", f"{where}.voice",
    )  # fmt: skip


class Turn:
    """One response: the chat call, its text as it comes, and (with audio) its speech."""

    def __init__(self, session: RealtimeSession, response_id: str, options: ResponseOptions):
        self.session, self.id, self.options = session, response_id, options
        self.audio = "audio" in options.settings.modalities
        kind = "audio" if self.audio else "text"
        self.item = Item(session.new_id("item"), "assistant", kind, "", status="in_progress")
        self.started = False  # the item is in the conversation
        self.text = ""
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None

    def _where(self, **fields: Any) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": self.item.id, "output_index": 0,
                "content_index": 0, **fields}  # fmt: skip

    def _part(self) -> dict[str, Any]:
        if self.audio:
            return {"type": "audio", "transcript": self.text}
        return {"type": "text", "text": self.text}

    async def run(self) -> None:
        s = self.session
        created = response_object(self.id, self.options, "in_progress")
        await s.send(s.event("response.created", response=created))
        status = "completed"
        details: dict[str, Any] | None = None
        speaker: asyncio.Task[None] | None = None
        try:
            s.check(self.options.settings.model, steps.CHAT, "session.model")  # still served
            await s.transcribed()
            messages = s.conversation.messages(self.options.settings.instructions)
            if not any(m["role"] != "system" for m in messages):
                raise EventError("the conversation has nothing to answer yet: commit audio or "
                                 "create an item first", "conversation_empty")  # fmt: skip
            previous = s.conversation.add(self.item)
            self.started = True
            await s.send(s.event("response.output_item.added", response_id=self.id,
                                 output_index=0, item=self.item.to_api()))  # fmt: skip
            await s.send(s.event("conversation.item.created", previous_item_id=previous,
                                 item=self.item.to_api()))  # fmt: skip
            await s.send(s.event("response.content_part.added", **self._where(part=self._part())))
            queue: asyncio.Queue[str | None] | None = None
            if self.audio:  # started before the chat's trace is current: not its leases
                queue = asyncio.Queue()
                speaker = asyncio.create_task(self.speak(queue))
            await self.chat(messages, queue)
            if speaker is not None and queue is not None:
                queue.put_nowait(None)
                await speaker
            if self.finish == "length":
                status = "incomplete"
                details = {"type": "incomplete", "reason": "max_output_tokens"}
        except asyncio.CancelledError:
            status, details = "cancelled", {"type": "cancelled", "reason": "client_cancelled"}
        except Exception as exc:
            if steps.failure(exc) is None and not isinstance(exc, EventError):
                logger.exception("realtime response %s failed", self.id)
            failed = event_error(exc)
            status = "failed"
            said = {"type": failed.kind, "code": failed.code, "message": failed.message}
            details = {"type": "failed", "error": said}
            await s.error(failed)
        finally:
            if speaker is not None and not speaker.done():
                speaker.cancel()
                await asyncio.gather(speaker, return_exceptions=True)
        await self.done(status, details)

    async def done(self, status: str, details: dict[str, Any] | None) -> None:
        s = self.session
        self.item.text = self.text
        self.item.status = "completed" if status == "completed" else "incomplete"
        output = []
        if self.started:
            if self.audio:
                await s.send(s.event("response.audio.done", **self._where()))
                await s.send(s.event("response.audio_transcript.done",
                                     **self._where(transcript=self.text)))  # fmt: skip
            else:
                await s.send(s.event("response.text.done", **self._where(text=self.text)))
            await s.send(s.event("response.content_part.done", **self._where(part=self._part())))
            await s.send(s.event("response.output_item.done", response_id=self.id,
                                 output_index=0, item=self.item.to_api()))  # fmt: skip
            output = [self.item.to_api()]
        response = response_object(self.id, self.options, status, output=output, details=details,
                                   used=usage(self.usage))  # fmt: skip
        await s.send(s.event("response.done", response=response))

    async def chat(
        self, messages: list[dict[str, str]], queue: asyncio.Queue[str | None] | None
    ) -> None:
        """The chat model's answer, streamed to the client (and its sentences to `queue`),
        on a trace of its own whose id is the response's."""
        s, settings = self.session, self.options.settings
        body: dict[str, Any] = {
            "model": settings.model, "messages": messages, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": settings.temperature,
        }  # fmt: skip
        if settings.max_tokens is not None:
            body["max_tokens"] = settings.max_tokens
        sentences = Sentences() if queue is not None else None
        kind = "response.audio_transcript.delta" if self.audio else "response.text.delta"
        trace = Trace(self.id, "openai", PATH, enforce=s.observer.settings.sentinel_enforce)
        token = CURRENT.set(trace)
        try:
            chat = s.pipeline.events(ChatAsk(settings.model, PATH, body), priority=s.priority)
            async with aclosing(chat) as events:
                async for data in events:
                    text = self._read(data)
                    if not text:
                        continue
                    self.text += text
                    await s.send(s.event(kind, **self._where(delta=text)))
                    if sentences is not None and queue is not None:
                        for piece in sentences.feed(text):
                            queue.put_nowait(piece)
            if sentences is not None and queue is not None:
                for piece in sentences.close():
                    queue.put_nowait(piece)
            trace.status = trace.status or 200
        except asyncio.CancelledError:
            trace.failed(499, "the response was cancelled before it was complete", None)
            raise
        except Exception as exc:
            known = steps.failure(exc)
            if known is not None:
                trace.failed(known.status, known.message, known.code)
            else:
                trace.status = trace.status or 500
            raise
        finally:
            CURRENT.reset(token)
            s.observer.finished(trace, s.request)

    def _read(self, data: Any) -> str:
        """The text of one event of the chat stream (or of a whole answer); notes the
        finish reason and the usage."""
        if not isinstance(data, dict):
            return ""
        if isinstance(data.get("usage"), dict):
            self.usage = data["usage"]
        text = ""
        for choice in data.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or choice.get("message") or {}
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str):
                text += content
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])
        return text

    async def speak(self, queue: asyncio.Queue[str | None]) -> None:
        """Speak each sentence as it comes, and stream it as PCM16 at the session's rate."""
        s, settings = self.session, self.options.settings
        voice = settings.voice or ""
        while (sentence := await queue.get()) is not None:
            ask = Ask(voice, PATH, {}, need=steps.SPEECH)
            asked = SpeechRequest(voice, None, sentence, "wav", settings.speed)
            async with s.pipeline.held(s.request, ask) as timed:
                lease = timed.lease
                audio = await synthesize(s.pipeline.children, lease.url, lease.runtime.name, asked)
            try:
                pcm, rate = pcm_of_wav(audio)
            except AudioError as exc:
                raise ProtocolError(502, f"model '{voice}' failed while answering: {exc}",
                                    "upstream_error") from None  # fmt: skip
            pcm = resample(pcm, rate, RATE)
            for part in chunks(pcm, RATE, s.limits.audio_chunk_seconds):
                delta = base64.b64encode(part).decode()
                await s.send(s.event("response.audio.delta", **self._where(delta=delta)))
