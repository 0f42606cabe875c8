"""OpenAI's audio API on the gateway: transcriptions, translations, speech, and async jobs.

- `POST /v1/audio/transcriptions`, `/v1/audio/translations`: a multipart form
  (`file`, `model`, `language`, `prompt`, `temperature`, `response_format` json |
  text | srt | vtt | verbose_json, `timestamp_granularities[]`, and Blazar's
  `async`). The form is read here as a stream (the access layer does not buffer
  these routes: `access.STREAMED`), the file capped at serving.max_audio_upload
  (413) and kept in memory; the model must be a transcription model (400
  otherwise), and the request then takes the one request path
  (`pipeline.resolve`, `lease`: slots, queue, priority, keys, traces) to a whisper
  child (`audio_engine.transcribe`). With `async=true` it answers 202 with a job
  instead (`blazar.serve.request.audio_jobs`).
- `GET /v1/audio/jobs`, `GET /v1/audio/jobs/{id}`, `POST .../{id}/cancel`,
  `POST .../{id}/retry`: the jobs; with keys in use, a key sees only its own.
- `POST /v1/audio/speech` (JSON: `model`, `input`, `voice`, `response_format` wav |
  pcm, `speed`): a piper child speaks (`audio_engine.synthesize`). A `voice` that
  names a served speech model chooses it (OpenAI's clients send a model such as
  tts-1 and the voice apart); otherwise `model` must be one.

Failures are raised as `ProtocolError`s and answered in OpenAI's envelope by the
app's errors middleware; the request checks are pure (`protocols.openai_audio`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import BodyPartReader, web

from blazar.observe.trace import current
from blazar.protocols import ProtocolError
from blazar.protocols.openai_audio import (
    SPEECH_CONTENT_TYPES,
    SpeechRequest,
    TranscriptionRequest,
    render,
    speech_request,
    transcription_request,
)
from blazar.serve.http import TRACE, parse_json_object, trace_id, wants_priority
from blazar.serve.request import steps
from blazar.serve.request.asks import Ask
from blazar.serve.request.audio_jobs import AudioJobs
from blazar.serve.request.pipeline import Leased
from blazar.serve.routes.job_routes import JobRoutes
from blazar.serve.routes.services import Services
from blazar.serve.state.audio_engine import synthesize, transcribe
from blazar.serve.supervisor.runtime import resolve as resolve_name

UPLOADS = ("/v1/audio/transcriptions", "/v1/audio/translations")
FORM_SLACK = 64 * 1024  # the form's other fields and boundaries, beyond the file itself
FIELD_LIMIT = 64 * 1024  # bytes of one text field
CHUNK = 1 << 16


@dataclass
class TranscriptionAsk(Ask):
    """A transcription or translation: the form's fields and its audio."""

    asked: TranscriptionRequest | None = None
    audio: bytes = b""
    filename: str = ""


@dataclass
class SpeechAsk(Ask):
    asked: SpeechRequest | None = None


def register(app: web.Application, services: Services) -> None:
    """Add the audio routes; under `blazar serve`, the async jobs too."""
    api = AudioAPI(services)
    for path, task in (
        ("/v1/audio/transcriptions", "transcribe"),
        ("/v1/audio/translations", "translate"),
    ):
        app.router.add_post(path, services.route(api.transcription(path, task), api.transcribe))
    app.router.add_post("/v1/audio/speech", services.route(api.speech_ask, api.speak))
    app.router.add_get("/v1/audio/jobs", api.list_jobs)
    app.router.add_get("/v1/audio/jobs/{id}", api.job)
    app.router.add_post("/v1/audio/jobs/{id}/cancel", api.cancel)
    app.router.add_post("/v1/audio/jobs/{id}/retry", api.retry)
    if services.control is not None:
        paths = services.control.paths
        api.jobs = AudioJobs(
            db=paths.db,
            lock=paths.state / "apply.lock",
            audio_dir=paths.cache / "audio",
            pipeline=services.pipeline,
            retention=lambda: services.serving.audio_job_retention,
        )
        jobs = api.jobs

        async def start(_: web.Application) -> None:
            await jobs.start()

        app.on_startup.append(start)
        services.closing.append(jobs.close)  # before the scheduler: queued jobs stay queued


def too_big(cap: int) -> ProtocolError:
    return ProtocolError(
        413,
        f"the audio file is larger than the {cap / 1024**2:.1f} MiB the gateway accepts "
        "(serving.max_audio_upload)",
        "file_too_large",
    )


class AudioAPI(JobRoutes[AudioJobs]):
    """The audio handlers; one instance per gateway app."""

    noun = "audio"

    def __init__(self, services: Services) -> None:
        self.services = services
        self.jobs: AudioJobs | None = None

    # -- transcription --------------------------------------------------------------------

    def transcription(self, path: str, task: str) -> Any:
        async def ask(request: web.Request) -> Ask:
            fields, audio, filename = await self._form(request)
            asked = transcription_request(fields, task)
            if audio is None:
                raise ProtocolError(
                    400, "'file' is required: the audio to transcribe", "invalid_request_error"
                )
            if not audio:
                raise ProtocolError(400, "the audio file is empty", "invalid_request_error")
            return TranscriptionAsk(
                asked.model,
                path,
                {},
                need=steps.TRANSCRIPTION,
                deferred=asked.run_async,
                asked=asked,
                audio=audio,
                filename=filename,
            )

        return ask

    async def transcribe(
        self, request: web.Request, ask: Ask, leased: Leased | None
    ) -> web.StreamResponse:
        assert isinstance(ask, TranscriptionAsk) and ask.asked is not None
        if leased is None:  # async: a job instead
            return await self._submit(request, ask.asked, ask.audio, ask.filename)
        lease = leased.lease
        heard = await transcribe(
            self.services.children, lease.url, lease.runtime.name, ask.audio, ask.asked
        )
        body, content_type = render(heard, ask.asked)
        if (trace := current()) is not None:
            trace.answered(body.encode(), 200)
        return web.Response(
            text=body, headers={"Content-Type": content_type, TRACE: trace_id(request)}
        )

    async def _form(self, request: web.Request) -> tuple[dict[str, list[str]], bytes | None, str]:
        """The form's text fields, the file's bytes (None: no file part) and its name."""
        cap = self.services.serving.max_audio_upload
        if request.content_length is not None and request.content_length > cap + FORM_SLACK:
            raise too_big(cap)
        if request.content_type != "multipart/form-data":
            raise ProtocolError(
                400,
                "send the audio as multipart/form-data, with the file in a 'file' field (as "
                "OpenAI's clients do)",
                "invalid_request_error",
            )
        fields: dict[str, list[str]] = {}
        audio: bytes | None = None
        filename = ""
        timeout = self.services.serving.body_timeout
        try:
            async with asyncio.timeout(timeout):
                reader = await request.multipart()
                while (part := await reader.next()) is not None:
                    if not isinstance(part, BodyPartReader):
                        raise ProtocolError(400, "nested multipart forms are not accepted")
                    if part.name == "file":
                        filename = part.filename or "audio"
                        audio = await _read(part, cap, too_big(cap))
                    elif part.name:
                        over = f"the form field {part.name!r} is over {FIELD_LIMIT} bytes"
                        raw = await _read(part, FIELD_LIMIT, ProtocolError(400, over))
                        fields.setdefault(part.name, []).append(raw.decode(errors="replace"))
        except TimeoutError:
            raise ProtocolError(
                408,
                f"the upload did not arrive within {timeout:g} s (serving.body_timeout)",
                "request_timeout",
            ) from None
        except ValueError as exc:  # aiohttp's word for a form it cannot parse
            raise ProtocolError(400, f"the multipart form cannot be read: {exc}") from None
        return fields, audio, filename

    # -- async jobs -----------------------------------------------------------------------

    async def _submit(
        self, request: web.Request, asked: TranscriptionRequest, audio: bytes, filename: str
    ) -> web.Response:
        key, _ = self._who(request)
        job = await self._jobs().submit(
            asked, audio, filename, key=key, priority=wants_priority(request)
        )
        return web.json_response(job.to_api(), status=202)

    async def retry(self, request: web.Request) -> web.Response:
        key, keyed = self._who(request)
        found = await self._jobs().retry(request.match_info["id"], key, keyed=keyed)
        return web.json_response(found.to_api(), status=202)

    # -- speech ---------------------------------------------------------------------------

    async def speech_ask(self, request: web.Request) -> Ask:
        asked = speech_request(parse_json_object(await request.read()))
        name = asked.model
        if asked.voice:  # a voice that is a served speech model chooses it
            try:
                runtime = resolve_name(self.services.scheduler.runtimes, asked.voice)[0]
            except (KeyError, ValueError):
                runtime = None
            if runtime is not None and runtime.kind == steps.SPEECH:
                name = asked.voice
        return SpeechAsk(name, "/v1/audio/speech", {}, need=steps.SPEECH, asked=asked)

    async def speak(self, request: web.Request, ask: Ask, leased: Leased | None) -> web.Response:
        assert isinstance(ask, SpeechAsk) and ask.asked is not None and leased is not None
        lease = leased.lease
        audio = await synthesize(self.services.children, lease.url, lease.runtime.name, ask.asked)
        headers: dict[str, Any] = {
            "Content-Type": SPEECH_CONTENT_TYPES[ask.asked.response_format],
            TRACE: trace_id(request),
        }
        return web.Response(body=audio, headers=headers)


async def _read(part: BodyPartReader, cap: int, over: ProtocolError) -> bytes:
    """A part's bytes, refusing past `cap`."""
    out = bytearray()
    while chunk := await part.read_chunk(CHUNK):
        out += chunk
        if len(out) > cap:
            raise over
    return bytes(out)
