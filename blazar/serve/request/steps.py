"""The request path's decisions, as functions of what they decide on: no I/O here.

`blazar.serve.request.pipeline.Pipeline` calls them in this order for every model
route; each is small enough to read at once and to test with a table:

- `require`: the model can do what the request needs (a chat template for chat,
  embeddings for embeddings, rank pooling for rerank, tools and thinking from its
  template, the kind of model a route serves), or one 400 that says how to fix it. One
  call per request.
- `keep_alive`: a request's keep_alive (body field or `x-blazar-keep-alive` header) in
  seconds for the scheduler. One parser for every protocol.
- `engine_body`: the body with the adapters the request chose and the model's
  `system` prompt and `params` where the request sets none.
- `with_output_limit`: the model's default output limit for a request that sets none
  (a base model's, which would write until its context is full).
- `closest`: the served name a mistyped one may have meant, for the 404's
  `did you mean`.
- `failure`: every exception a route may raise -> (status, message, code, Retry-After),
  which the gateway answers in the route's envelope (`blazar.serve.request.envelopes`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from blazar.errors import (
    AlreadyExists,
    BlazarError,
    Conflict,
    InvalidInput,
    InvalidManifest,
    NotFound,
)
from blazar.protocols import ProtocolError
from blazar.protocols.ollama import keep_alive_seconds
from blazar.protocols.ollama_options import SAMPLING_OPTIONS
from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler import (
    Lease,
    ModelNotFound,
    Scheduler,
    SchedulerError,
    Target,
)
from specs.names import InvalidName, closest_name, parse_requested
from specs.sources import InvalidSource

CHAT, EMBEDDINGS, ANY, RERANK = "chat", "embeddings", "any", "rerank"
TOOLS, THINKING = "tools", "thinking"  # what a chat template may or may not render
TRANSCRIPTION, SPEECH = "transcription", "speech"  # the audio routes' kinds of model
IMAGE = "image"  # the images routes' kind of model (an sdcpp lane)
# Where each kind of model is served, for the 400 a request of another kind gets.
SERVED_ON = {
    "chat": "/v1/chat/completions, /v1/completions, /api/chat, /v1/messages",
    TRANSCRIPTION: "/v1/audio/transcriptions or /v1/audio/translations",
    SPEECH: "/v1/audio/speech",
    IMAGE: "/v1/images/generations or /v1/images/edits",
}
KINDS = {
    CHAT: "chat",
    EMBEDDINGS: "chat",
    RERANK: "chat",
    ANY: "chat",
    TOOLS: "chat",
    THINKING: "chat",
    TRANSCRIPTION: TRANSCRIPTION,
    SPEECH: SPEECH,
    IMAGE: IMAGE,
}
KEEP_ALIVE = "x-blazar-keep-alive"


@dataclass(frozen=True)
class Failure:
    """How an error is answered: status, message, the protocol's code, Retry-After."""

    status: int
    message: str
    code: str | None = None
    retry_after: float | None = None


def failure(exc: BaseException) -> Failure | None:
    """The answer for an exception a route raised; None for one that is a bug."""
    if isinstance(exc, ProtocolError):
        return Failure(exc.status, exc.message, exc.code)
    if isinstance(exc, SchedulerError):
        return Failure(exc.status, str(exc), exc.code, exc.retry_after)
    if isinstance(exc, NotFound):
        return Failure(404, str(exc))
    if isinstance(exc, Conflict | AlreadyExists):
        return Failure(409, str(exc))
    if isinstance(exc, InvalidInput | InvalidManifest | InvalidName | InvalidSource):
        return Failure(400, str(exc))
    if isinstance(exc, BlazarError):
        return Failure(500, str(exc))
    return None


def closest(requested: str, names: Iterable[str]) -> str | None:
    """The served name (or alias) `requested` may have meant, for the 404 of an unknown
    model; None when none is close, or when its model part is served (an unknown adapter
    or replica, which the 404 names itself)."""
    try:
        model = parse_requested(requested).model
    except InvalidName:
        model = requested
    known = set(names)
    if requested in known or model in known or model.removesuffix(":latest") in known:
        return None
    return closest_name(model, known - {requested})


def did_you_mean(exc: ModelNotFound, requested: str, names: Iterable[str]) -> ModelNotFound:
    """The scheduler's 404 for an unknown model, with the closest served name if any."""
    close = closest(requested, names)
    if close is None:
        return exc
    return ModelNotFound(f"{exc} Did you mean '{close}'?")


def require(
    runtime: ModelRuntime,
    need: str,
    extra: tuple[str, ...] = (),
    *,
    alternative: str = "",
    requested: str | None = None,
) -> None:
    """Refuse (400) a request the model cannot serve: `need` is the route's (CHAT,
    EMBEDDINGS, ANY, TRANSCRIPTION, SPEECH), `extra` what this request uses of the chat
    template (TOOLS, THINKING); `alternative` is the route's own way out (for example "use
    /v1/completions, or "), `requested` the name the client used.

    TOOLS and THINKING are decided from the chat template (`runtime.capabilities`), and
    refused in ollama's words (`"<model>" does not support tools`), which clients such
    as llm-ollama read to fall back, on every protocol."""
    check_kind(runtime, KINDS.get(need, need))
    if need == CHAT or extra:
        refusal = runtime.chat_refusal(alternative)
        if refusal is not None:
            raise ProtocolError(400, refusal, "invalid_request_error")
    capabilities = runtime.capabilities if extra else None
    for wanted in extra:
        if not getattr(capabilities, wanted):
            raise ProtocolError(400, _missing(runtime, wanted, requested), "invalid_request_error")
    if need == EMBEDDINGS and not runtime.embeddings:
        raise ProtocolError(
            400,
            f"model '{runtime.name}' is not served for embeddings: set embeddings = true for "
            "it in the manifest and apply",
            "invalid_request_error",
        )
    reranker = runtime.pooling == "rank"  # its engine scores pairs; its "embeddings" are not
    if need == RERANK and not reranker:
        raise ProtocolError(
            400,
            f"model '{runtime.name}' is not a reranker: declare models.{runtime.name}.pooling "
            '= "rank" (with embeddings = true) for a reranking model, apply, and send it here',
            "invalid_request_error",
        )
    if need == EMBEDDINGS and reranker:
        raise ProtocolError(
            400,
            f"model '{runtime.name}' is a reranker (pooling = \"rank\"): send it to /v1/rerank",
            "invalid_request_error",
        )


def check_kind(runtime: ModelRuntime, kind: str) -> None:
    """Refuse (400) a model of another kind than the route serves: a voice on a chat route,
    a chat model on /v1/audio/speech."""
    if runtime.kind == kind:
        return
    what = {
        "chat": "a chat model",
        TRANSCRIPTION: "a transcription (speech to text) model",
        SPEECH: "a speech (text to speech) voice",
        IMAGE: "an image generation model",
    }
    raise ProtocolError(
        400,
        f"model '{runtime.name}' is {what.get(runtime.kind, runtime.kind)}, and this endpoint "
        f"needs {what.get(kind, kind)}: use it on {SERVED_ON.get(runtime.kind, 'its route')}, "
        "or name another model",
        "invalid_request_error",
    )


def _missing(runtime: ModelRuntime, need: str, requested: str | None) -> str:
    name = requested or runtime.name
    where = f"models.{runtime.name}.chat_template"
    if need == TOOLS:
        return (
            f'"{name}" does not support tools: its chat template renders no tool '
            f"definitions. Use a model whose template does, or set {where} to one that "
            "does (chatml, llama3, mistral-v3, mistral-v7) and apply"
        )
    return (
        f'"{name}" does not support thinking: its chat template has no thinking switch. '
        "Send the request without it, or use a reasoning model"
    )


def keep_alive(headers: Mapping[str, str], body: Mapping[str, Any]) -> float | None:
    """A request's keep_alive in seconds for the scheduler, from its `keep_alive` field or
    the `x-blazar-keep-alive` header (the field wins): None (the model's own), -1 (forever),
    or seconds (0: unload after this request). As ollama spells it ("5m", 0, -1)."""
    value = body.get("keep_alive")
    if value is None:
        value = headers.get(KEEP_ALIVE)
        if value is None:
            return None
    seconds = keep_alive_seconds(value)
    return -1.0 if seconds is None else seconds


def free_name(scheduler: Scheduler, name: str, target: Target) -> None:
    """Refuse a new name for the target's model that already names another model."""
    try:
        taken = scheduler.resolve(name).pool
    except SchedulerError:
        return
    if taken is not target.pool:
        raise InvalidInput(
            f"'{name}' already names model '{taken.runtime.name}': delete it first "
            "(`ollama rm`, `blazar rm`) or choose another name"
        )


def adapters_text(target: Target) -> str | None:
    """The adapters a request chose, as written (`fox`, `fox:0.5+owl`, `none`); None when
    it chose none and the model's always-on ones apply."""
    if target.adapters is None:
        return None
    if not target.adapters:
        return "none"
    return "+".join(c.name if c.scale is None else f"{c.name}:{c.scale:g}" for c in target.adapters)


def engine_body(lease: Lease, body: dict[str, Any], path: str = "") -> dict[str, Any]:
    """The body to send to `path`: with llama-server's per-request `lora` list when the
    request chose adapters (`model+adapter`, `model+none`) or its model has always-on
    ones, and the model's `system` prompt and `params` where the request sets none; else
    `body` itself, the same object (the pass-through then sends the client's bytes as
    they came). A client's own `lora` field is left alone unless the name chose adapters.

    Scales are per request, so concurrent requests to one instance each get their own
    adapters (llama-server batches only slots whose adapters match); see docs/serve.md.
    """
    runtime = lease.runtime
    lora = lease.lora
    if lora is None and runtime.system is None and not runtime.params:
        return body  # the common case: nothing to add
    out = dict(body)
    if lora is not None and (lease.adapters is not None or "lora" not in body):
        out["lora"] = lora
    if path != "/v1/embeddings":
        with_defaults(out, path, runtime.system, runtime.params)
    return out if out != body else body


# Where a Modelfile PARAMETER goes in llama-server's request bodies.
PARAM_FIELDS = {**SAMPLING_OPTIONS, "num_predict": "n_predict", "stop": "stop"}
# The fields a request may set its output limit with, on any protocol, in the order a
# body that sets several is read (the preflight's count, the cap it writes, a default's
# `num_predict` that yields to the request's own limit).
OUTPUT_LIMITS = ("max_completion_tokens", "max_tokens", "max_output_tokens", "n_predict")
# The engine endpoints that generate, each with the field a default output limit is
# written in (`with_output_limit`).
LIMIT_FIELD = {
    "/v1/chat/completions": "max_tokens",
    "/v1/completions": "max_tokens",
    "/v1/messages": "max_tokens",
    "/completion": "n_predict",
    "/infill": "n_predict",
}
# What llama-server's /v1/messages keeps of a request: any other default needs its chat
# endpoint (`anthropic_chat`), as adapters do.
MESSAGES_PARAMS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "stop": "stop_sequences",
}


def with_output_limit(body: dict[str, Any], path: str, limit: int | None) -> dict[str, Any]:
    """The body to `path` with the model's default output limit (`ModelRuntime.max_tokens`)
    when the request sets none of `OUTPUT_LIMITS` (any value: ollama's -1 asks for no
    limit, and gets none); else `body` itself."""
    key = LIMIT_FIELD.get(path)
    if limit is None or key is None or any(field in body for field in OUTPUT_LIMITS):
        return body
    return {**body, key: limit}


def with_defaults(
    body: dict[str, Any], path: str, system: str | None, params: Mapping[str, Any]
) -> None:
    """Fill in (in place) the model's system prompt and parameters the request left unset."""
    messages_api = path.startswith("/v1/messages")
    if system is not None:
        if messages_api:
            body.setdefault("system", system)
        elif path == "/v1/responses":
            body.setdefault("instructions", system)
        elif isinstance(body.get("messages"), list):
            roles = {m.get("role") for m in body["messages"] if isinstance(m, dict)}
            if not roles & {"system", "developer"}:
                body["messages"] = [{"role": "system", "content": system}, *body["messages"]]
    if path.endswith("count_tokens"):
        return
    fields = MESSAGES_PARAMS if messages_api else PARAM_FIELDS
    for key, value in params.items():
        name = fields.get(key)
        if name is None or name in body:
            continue
        if key == "num_predict" and any(limit in body for limit in OUTPUT_LIMITS):
            continue  # the request's own token limit (n_predict would override it)
        body[name] = value
