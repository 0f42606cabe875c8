"""Calls from the gateway to a leased speech child: transcribe (whisper) and synthesize (piper).

The audio routes (`blazar.serve.routes.audio_api`) and the async jobs
(`blazar.serve.request.audio_jobs`) lease a slot through the one request path
(`blazar.serve.request.pipeline`) and call the child here, on the gateway's one child
client (`ChildConnections`). The audio travels as the request body, in memory:
the engine decodes it itself (faster-whisper with PyAV), so the gateway never
interprets or writes it. A transcription's answer is read line by line as the
engine works (`on_progress` hears seconds done of the total); closing the
exchange early (a cancelled job, a client gone) makes the engine stop at its
next segment. A child that fails is a `ProtocolError` (502, or 504 when it stays
silent past serving.upstream_timeout); a 400 from the engine (audio it cannot
decode) keeps its status and message.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from blazar.protocols import ProtocolError
from blazar.protocols.openai_audio import SpeechRequest, Transcript, TranscriptionRequest
from blazar.serve.supervisor.child_http import (
    ChildConnection,
    ChildConnections,
    UpstreamError,
    UpstreamTimeout,
)

Progress = Callable[[float, float], None]  # (seconds done, seconds in all)


def _failed(model: str, exc: BaseException) -> ProtocolError:
    """As `blazar.serve.request.child_calls.child_failed` says it for the chat routes."""
    if isinstance(exc, UpstreamTimeout):
        return ProtocolError(
            504, f"model '{model}' timed out: {exc} (serving.upstream_timeout)", "upstream_timeout"
        )
    detail = str(exc) or type(exc).__name__
    return ProtocolError(502, f"model '{model}' failed while answering: {detail}", "upstream_error")


def _refusal(model: str, status: int, payload: bytes) -> ProtocolError:
    """The engine's own error answer, kept for a 4xx; a 502 for anything else."""
    try:
        data = json.loads(payload)
        message = data["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = payload.decode(errors="replace")[:500] or f"status {status}"
    if 400 <= status < 500:
        return ProtocolError(status, str(message), "invalid_request_error")
    return ProtocolError(
        502, f"model '{model}' failed while answering: {message}", "upstream_error"
    )


async def transcribe(
    children: ChildConnections,
    url: str,
    model: str,
    audio: bytes,
    request: TranscriptionRequest,
    on_progress: Progress | None = None,
) -> Transcript:
    """What the whisper engine at `url` hears in `audio`."""
    connection: ChildConnection | None = None
    transcript = Transcript(task=request.task)
    try:
        connection = await children.post(url, f"/v1/transcribe?{request.query()}", audio)
        if connection.status != 200:
            raise _refusal(model, connection.status, await connection.read_all())
        pending = b""
        finished = False
        while chunk := await connection.read():
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                if not raw.strip():
                    continue
                line = json.loads(raw)
                if line.get("type") == "error":
                    raise ProtocolError(
                        502,
                        f"model '{model}' failed while transcribing: {line.get('message')}",
                        "upstream_error",
                    )
                finished = finished or line.get("type") == "done"
                transcript.feed(line)
                if on_progress is not None and line.get("type") in ("info", "segment"):
                    on_progress(transcript.done, transcript.duration)
        if not finished:
            raise ProtocolError(
                502,
                f"model '{model}' ended its answer before the transcription was done",
                "upstream_error",
            )
    except (UpstreamError, ConnectionError) as exc:
        raise _failed(model, exc) from None
    except ValueError:  # a line that is not JSON
        raise ProtocolError(
            502, f"model '{model}' sent an answer that is not JSON lines", "upstream_error"
        ) from None
    finally:
        if connection is not None:  # closed if unfinished: the engine stops
            children.release(url, connection)
    return transcript


async def synthesize(
    children: ChildConnections, url: str, model: str, request: SpeechRequest
) -> bytes:
    """The audio the piper engine at `url` makes of the request's text."""
    connection: ChildConnection | None = None
    body = json.dumps(request.engine_body()).encode()
    try:
        connection = await children.post(url, "/v1/synthesize", body)
        payload = await connection.read_all()
        if connection.status != 200:
            raise _refusal(model, connection.status, payload)
        return payload
    except (UpstreamError, ConnectionError) as exc:
        raise _failed(model, exc) from None
    finally:
        if connection is not None:
            children.release(url, connection)
