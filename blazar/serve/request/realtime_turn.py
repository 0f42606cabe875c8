"""One response of a realtime session: the chat call, its text as it comes, and its speech.

`blazar.serve.request.realtime.RealtimeSession` makes a `Turn` for each
`response.create` and runs it in a task of its own; `response.cancel` (or the socket
closing) cancels that task. The turn waits for the transcriptions still running,
asks the chat model with the conversation through `Pipeline.events` on a trace of its
own (its id is the response's, so `blazar why resp_...` shows the call), sends the
text as it arrives and, with audio, cuts it into sentences (`realtime_audio.Sentences`)
for a speaker task: each sentence is spoken as soon as it is whole (a piper child, one
`Pipeline.hold` slot per sentence, `audio_engine.synthesize`), resampled to the
session's rate and streamed as PCM16 chunks while the chat model writes the next one.
The speaker starts before the trace is made current, so its leases never show as the
chat call's. Whatever ends the turn, `response.done` says how (completed, incomplete,
cancelled, failed) and is the last event; no audio is sent after it.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from blazar.observe.trace import CURRENT, Trace
from blazar.protocols import EngineRequest, LoadOnly, ProtocolError
from blazar.protocols.openai_audio import SpeechRequest
from blazar.protocols.openai_realtime import (
    RATE,
    Conversation,
    EventError,
    Item,
    ResponseOptions,
    response_object,
    usage,
)
from blazar.protocols.openai_requests import shape_request
from blazar.protocols.realtime_audio import AudioError, Sentences, chunks, pcm_of_wav, resample
from blazar.serve.request import steps
from blazar.serve.request.asks import Answer, Ask, Plan
from blazar.serve.request.pipeline import Pipeline
from blazar.serve.state.audio_engine import synthesize
from blazar.serve.state.tracing import Observer
from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler import Target

PATH = "/v1/realtime"
CHAT_PATH = "/v1/chat/completions"
logger = logging.getLogger("blazar.serve")
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
        return EventError(
            f"internal error ({type(exc).__name__}); see serve's log",
            "internal_error",
            param,
            "server_error",
        )
    kind = "invalid_request_error" if known.status < 500 else "server_error"
    return EventError(known.message, known.code or "invalid_value", param, kind)


class Session(Protocol):
    """What a turn uses of its session (`realtime.RealtimeSession`)."""

    pipeline: Pipeline
    observer: Observer
    request: web.Request
    limits: Limits
    priority: bool
    conversation: Conversation
    send: Send

    def new_id(self, prefix: str) -> str: ...

    def event(self, kind: str, **fields: Any) -> dict[str, Any]: ...

    async def error(self, error: EventError, event_id: str | None = None) -> None: ...

    def check(self, name: str, need: str, param: str) -> None: ...

    async def transcribed(self) -> None: ...


class Turn:
    """One response: the chat call, its text as it comes, and (with audio) its speech."""

    def __init__(self, session: Session, response_id: str, options: ResponseOptions):
        self.session, self.id, self.options = session, response_id, options
        self.audio = "audio" in options.settings.modalities
        kind = "audio" if self.audio else "text"
        self.item = Item(session.new_id("item"), "assistant", kind, "", status="in_progress")
        self.started = False  # the item is in the conversation
        self.text = ""
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None

    def _where(self, **fields: Any) -> dict[str, Any]:
        return {
            "response_id": self.id,
            "item_id": self.item.id,
            "output_index": 0,
            "content_index": 0,
            **fields,
        }

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
                raise EventError(
                    "the conversation has nothing to answer yet: commit audio or "
                    "create an item first",
                    "conversation_empty",
                )
            previous = s.conversation.add(self.item)
            self.started = True
            await s.send(
                s.event(
                    "response.output_item.added",
                    response_id=self.id,
                    output_index=0,
                    item=self.item.to_api(),
                )
            )
            await s.send(
                s.event(
                    "conversation.item.created", previous_item_id=previous, item=self.item.to_api()
                )
            )
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
                await s.send(
                    s.event("response.audio_transcript.done", **self._where(transcript=self.text))
                )
            else:
                await s.send(s.event("response.text.done", **self._where(text=self.text)))
            await s.send(s.event("response.content_part.done", **self._where(part=self._part())))
            await s.send(
                s.event(
                    "response.output_item.done",
                    response_id=self.id,
                    output_index=0,
                    item=self.item.to_api(),
                )
            )
            output = [self.item.to_api()]
        response = response_object(
            self.id, self.options, status, output=output, details=details, used=usage(self.usage)
        )
        await s.send(s.event("response.done", response=response))

    async def chat(
        self, messages: list[dict[str, str]], queue: asyncio.Queue[str | None] | None
    ) -> None:
        """The chat model's answer, streamed to the client (and its sentences to `queue`),
        on a trace of its own whose id is the response's."""
        s, settings = self.session, self.options.settings
        body: dict[str, Any] = {
            "model": settings.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": settings.temperature,
        }
        if settings.max_tokens is not None:
            body["max_tokens"] = settings.max_tokens
        sentences = Sentences() if queue is not None else None
        kind = "response.audio_transcript.delta" if self.audio else "response.text.delta"
        trace = Trace(self.id, "openai", PATH)
        s.observer.started(trace)
        token = CURRENT.set(trace)
        status = 500  # unless it ends well, or a failure says which
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
            status = 200
        except asyncio.CancelledError:
            trace.failed(499, "the response was cancelled before it was complete", None)
            raise
        except Exception as exc:
            known = steps.failure(exc)
            if known is not None:
                trace.failed(known.status, known.message, known.code)
            raise
        finally:
            CURRENT.reset(token)
            s.observer.finished(trace, s.request, status)

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
            async with s.pipeline.hold(s.request, ask) as leased:
                lease = leased.lease
                audio = await synthesize(s.pipeline.children, lease.url, lease.runtime.name, asked)
            try:
                pcm, rate = pcm_of_wav(audio)
            except AudioError as exc:
                raise ProtocolError(
                    502, f"model '{voice}' failed while answering: {exc}", "upstream_error"
                ) from None
            pcm = resample(pcm, rate, RATE)
            for part in chunks(pcm, RATE, s.limits.audio_chunk_seconds):
                delta = base64.b64encode(part).decode()
                await s.send(s.event("response.audio.delta", **self._where(delta=delta)))
