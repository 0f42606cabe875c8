"""The gateway's aiohttp application, assembled in one place.

`build_app` registers every protocol's routes (OpenAI with its audio API, ollama,
Anthropic, Blazar's own) on one application and installs the middleware every request
passes through: `observe` (`blazar.serve.state.tracing`) traces each request; the
access layer (`blazar.serve.gateway.access`: Host, Origin and CORS, API keys and
scopes, rate and body limits) runs inside `errors`, and the relay
(`blazar.serve.gateway.relay`: requests carried out on remotes) inside it; `errors`
gives each response its trace id and answers what a route raised in the route's protocol envelope
(`failure`, `envelopes.for_request`): a client's mistake as a 4xx, a
bug as a 500 in the same shape with the traceback only in serve's log. What
aiohttp's router and body reader refuse (an unknown route, a wrong method, a
body over `MAX_BODY`) is answered in the same envelope, never as aiohttp's
`text/plain`. The route modules depend on `Services`, never on this module or
the daemon.
"""

from __future__ import annotations

import logging

from aiohttp import web

from blazar.observe.trace import current
from blazar.serve.gateway.access import Access, add_cors_headers
from blazar.serve.http import TRACE, Handler, trace_id
from blazar.serve.request.envelopes import for_request
from blazar.serve.request.steps import Failure, failure
from blazar.serve.routes import (
    anthropic_api,
    audio_api,
    batches_api,
    blazar_api,
    fleet_api,
    keys_api,
    mcp_api,
    observe_api,
    ollama_admin,
    ollama_api,
    ollama_blobs,
    ollama_pull,
    openai_api,
    responses_api,
    sessions_api,
)
from blazar.serve.routes.services import Services
from blazar.serve.state.remotes import FLEET

MAX_BODY = 64 * 1024**2
logger = logging.getLogger("blazar.serve")


def refused_by_aiohttp(request: web.Request, exc: web.HTTPException) -> Failure:
    """What the router or the body reader refused, said for the client."""
    where = f"{request.method} {request.path}"
    if isinstance(exc, web.HTTPNotFound):
        return Failure(
            404,
            f"{where}: no such endpoint here; docs/compatibility.md "
            "lists the OpenAI, ollama and Anthropic routes Blazar serves",
            "unknown_endpoint",
        )
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        return Failure(405, f"{where}: method not allowed; use {allowed}", "method_not_allowed")
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return Failure(
            413, f"the request body is over the gateway's limit of {MAX_BODY // 1024**2} MiB"
        )
    return Failure(exc.status, f"{where}: {exc.reason}")


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The trace id on every response, and every raised failure in its protocol's shape."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:  # a redirect is not a failure
            raise
        refused = refused_by_aiohttp(request, exc)
        answer = for_request(request).response(
            request, refused.status, refused.message, refused.code
        )
        if "Allow" in exc.headers:
            answer.headers["Allow"] = exc.headers["Allow"]
        return answer
    except Exception as exc:
        known = failure(exc)
        if known is None:  # a bug: the client still gets its protocol's shape, not a traceback
            logger.exception("%s %s failed", request.method, request.path)
            known = Failure(500, f"internal error ({type(exc).__name__}); see serve's log")
        if (trace := current()) is not None:  # observe: the failure, on the request's trace
            trace.failed(known.status, known.message, known.code)
        return for_request(request).response(
            request, known.status, known.message, known.code, known.retry_after
        )
    if not response.prepared:
        response.headers.setdefault(TRACE, trace_id(request))
    return response


def build_app(services: Services, access: Access | None = None) -> web.Application:
    """Every route of the gateway on one application, behind the middleware; `access` is
    the daemon's (a default one checks Host and Origin, with no keys)."""
    access = access or Access()
    access.max_body = MAX_BODY
    # observe first: it sees every answer, the errors middleware's and the access layer's
    # refusals included.
    middlewares = [services.observer.middleware(), errors, access.middleware]
    app = web.Application(client_max_size=MAX_BODY, middlewares=middlewares)
    app[FLEET] = services.fleet
    app.on_response_prepare.append(add_cors_headers)
    blazar_api.register(app, services)
    observe_api.register(app, services)
    openai_api.register(app, services)
    responses_api.register(app, services)
    ollama_api.register(app, services)
    ollama_admin.register(app, services)
    ollama_pull.register(app, services)
    ollama_blobs.register(app, services)
    anthropic_api.register(app, services)
    batches_api.register(app, services)
    sessions_api.register(app, services)
    keys_api.register(app, services)
    audio_api.register(app, services)
    fleet_api.register(app, services)
    mcp_api.register(app, services)
    return app
