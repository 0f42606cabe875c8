"""Which lane a request takes: the relay (its bytes moved as they are) or the interpreted
pipeline. A pure function of what the gateway knows once a request's head and body are in.

The gateway's connection handler (`blazar.serve.gateway.listener.GatewayHandler`) reads
each request's head and body itself; `decide` then says `RELAY`, when the child would
get the client's bytes as they came and the client the child's bytes as they come (the
only changes the relay makes are the hop's own headers: Host, Connection,
Content-Length, and the gateway's x-request-id and x-blazar-spec on the answer), or
`Interpret(reason)`, when anything must be rewritten on the way in or out: the request
then goes to aiohttp and the one request path (`blazar.serve.request.pipeline`), on
the same connection, bytes and all. Every case that needs a rewrite is a row of the
table in tests/test_relay_lanes.py. The relay still leases through the scheduler,
runs the prompt preflight and the sessions' slot routing after the lease
(`admission.admitted`), whose changes, when there are any, it carries out itself
(new body bytes, the cap header): those depend on the leased child, not on the
request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blazar.serve.request.singleflight import deterministic

# The routes the relay carries, where llama-server answers in the client's protocol.
# ollama's routes translate (never relayed); /v1/completions is reshaped for OpenAI's
# legacy shape whenever `shape_request` says so (the caller's `shaped`).
RELAY_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})
OUTPUT_LIMITS = ("max_completion_tokens", "max_tokens", "max_output_tokens", "n_predict")


@dataclass(frozen=True, slots=True)
class Interpret:
    """The request goes to the interpreted pipeline, for `reason` (kept on no trace: it
    is what a test or a reader of the code wants to see)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Relay:
    """The request's bytes go to the leased child as they came."""


RELAY = Relay()
Lane = Relay | Interpret


@dataclass(frozen=True, slots=True)
class Head:
    """What the request's head says, as the relay's parser read it (names lowercased)."""

    method: str
    path: str
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Settings:
    """The `[serving]` fields the decision reads."""

    relay: bool = True
    sentinel: bool = True
    sentinel_enforce: bool = False
    cache: bool = False  # the response cache (issue 32) answers this model's requests


@dataclass(frozen=True, slots=True)
class Model:
    """What the decision needs of the resolved model (`ModelRuntime`, its `Target`)."""

    name: str  # the name it is served under: llama-server echoes that in its answers
    dialect: str = "llama-server"
    refusal: bool = False  # no engine serves it here: the pipeline's 400 says why
    adapters: bool = False  # the request chose adapters, or the model has always-on ones
    system: bool = False  # a system prompt to add where a request sends none
    params: bool = False  # request defaults (Modelfile PARAMETERs) to fill in
    max_tokens: int | None = None  # the default output limit injected (a base model's)
    child_max_tokens: int | None = None  # the child's own default (-n), when started with one
    singleflight: bool = False
    sessions: bool = False  # the session bank routes its requests to slots
    spec: str = "off"  # speculative mode: a whole answer's header is read from its body
    failover: bool = False  # a failover chain: a refusal here goes to the next member
    shaped: bool = False  # shape_request rewrites the body or the answer (legacy shapes)


def decide(
    head: Head, body: Mapping[str, Any], model: Model, settings: Settings, *, images: bool = False
) -> Lane:
    """RELAY, or Interpret with the first reason found; `body` is the parsed JSON object,
    `images` whether its bytes may carry images (the pipeline fetches and checks them)."""
    if not settings.relay:
        return Interpret("serving.relay is off")
    if head.method != "POST" or head.path not in RELAY_PATHS:
        return Interpret("a route the relay does not carry")
    headers = head.headers
    if "origin" in headers:
        return Interpret("CORS: the answer gets the origin's headers")
    if "expect" in headers:
        return Interpret("Expect: 100-continue")
    if "content-encoding" in headers:
        return Interpret("a compressed body")
    requested = body.get("model")
    if not isinstance(requested, str) or requested != model.name:
        return Interpret("the answer names the model as asked (an alias, adapters, a replica)")
    if model.dialect != "llama-server":
        return Interpret("an engine that speaks only OpenAI's API")
    if model.refusal:
        return Interpret("no engine serves the model here")
    if model.failover:
        return Interpret("a failover chain")
    if body.get("mcp") is not None:
        return Interpret("tools the gateway runs (mcp)")
    if images:
        return Interpret("images to fetch and check")
    if model.shaped:
        return Interpret("the body or the answer is reshaped")
    if model.adapters:
        return Interpret("adapters")
    if model.system or model.params:
        return Interpret("model defaults (system prompt, parameters)")
    stream = body.get("stream") is True
    if (
        model.max_tokens is not None
        and head.path != "/v1/embeddings"
        and not any(field in body for field in OUTPUT_LIMITS)
        and model.child_max_tokens != model.max_tokens
    ):
        return Interpret("a default output limit to inject")
    if model.sessions:
        return Interpret("sessions")
    if model.singleflight and deterministic(body):
        return Interpret("singleflight")
    if settings.cache:
        return Interpret("the response cache")
    if settings.sentinel_enforce:
        return Interpret("serving.sentinel_enforce reads the whole answer first")
    if settings.sentinel and _schema(body):
        return Interpret("a schema the sentinels check against the whole text")
    if model.spec != "off" and not stream:
        return Interpret("the speculative header of a whole answer")
    return RELAY


def _schema(body: Mapping[str, Any]) -> bool:
    response_format = body.get("response_format")
    return isinstance(response_format, Mapping) or "json_schema" in body or "grammar" in body
