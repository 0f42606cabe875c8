"""The gateway's aiohttp application, assembled in one place.

`build_app` registers every protocol's routes (OpenAI with its audio API, ollama,
Anthropic, Blazar's own, the dashboard) on one application and installs the one
middleware every request passes through (`gateway`): the request's trace
(`blazar.serve.state.tracing`), the access layer (`blazar.serve.gateway.access`: Host,
Origin and CORS, API keys and scopes, rate and body limits), and the answer to what a
route raised, in the route's protocol envelope (`steps.failure`,
`envelopes.for_request`): a client's mistake as a 4xx, a bug as a 500 in the same
shape with the traceback only in serve's log. What aiohttp's router and body reader
refuse (an unknown route, a wrong method, a body over `MAX_BODY`) is answered in the
same envelope, never as aiohttp's `text/plain`. The route modules depend on
`Services`, never on this module or the daemon.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from blazar.serve.gateway.access import Access, add_cors_headers
from blazar.serve.gateway.listener import RELAYER
from blazar.serve.gateway.relay import Relayer
from blazar.serve.http import TRACE, Handler, trace_id
from blazar.serve.request.envelopes import for_request
from blazar.serve.request.steps import Failure, failure
from blazar.serve.routes import (
    anthropic_api,
    audio_api,
    batches_api,
    blazar_api,
    cache_api,
    fleet_api,
    images_api,
    keys_api,
    mcp_api,
    observe_api,
    ollama_admin,
    ollama_api,
    ollama_blobs,
    ollama_pull,
    openai_api,
    realtime_api,
    rerank_api,
    responses_api,
    sessions_api,
    ui_admin,
    ui_api,
)
from blazar.serve.routes.services import Services
from blazar.serve.state.remotes import FLEET
from blazar.serve.state.tracing import Observer

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


def gateway(observer: Observer, access: Access) -> Any:
    """The gateway's one middleware, around every request: its trace (inference routes;
    `Observer.begin`/`end`, which see every answer, refusals included), the access layer
    (`Access.guard`), and every failure a route raised answered in its protocol's shape
    (`steps.failure`, `envelopes.for_request`): a client's mistake as a 4xx, a bug as a
    500 in the same shape with the traceback only in serve's log. Every response gets its
    trace id. One middleware, not four: each layer of aiohttp's chain costs a call and a
    closure per request (docs/performance.md)."""
    begin, end, guard = observer.begin, observer.end, access.guard

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        trace = begin(request)
        try:
            response = await guard(request, handler)
        except asyncio.CancelledError:
            if trace is not None:
                trace.failed(499, "the client went away before the answer was complete", None)
                end(trace, request, 499)
            raise
        except web.HTTPException as exc:
            if exc.status < 400:  # a redirect is not a failure
                if trace is not None:
                    end(trace, request, exc.status)
                raise
            refused = refused_by_aiohttp(request, exc)
            response = for_request(request).response(
                request, refused.status, refused.message, refused.code
            )
            if "Allow" in exc.headers:
                response.headers["Allow"] = exc.headers["Allow"]
        except Exception as exc:
            known = failure(exc)
            if known is None:  # a bug: the client gets its protocol's shape, not a traceback
                logger.exception("%s %s failed", request.method, request.path)
                known = Failure(500, f"internal error ({type(exc).__name__}); see serve's log")
            if trace is not None:  # the failure, on the request's trace
                trace.failed(known.status, known.message, known.code)
            response = for_request(request).response(
                request, known.status, known.message, known.code, known.retry_after
            )
        except BaseException:
            if trace is not None:
                end(trace, request, 500)
            raise
        else:
            if not response.prepared:
                response.headers.setdefault(TRACE, trace_id(request))
        if trace is not None:
            end(trace, request, response.status)
        return response

    return middleware


def build_app(services: Services, access: Access | None = None) -> web.Application:
    """Every route of the gateway on one application, behind the middleware; `access` is
    the daemon's (a default one checks Host and Origin, with no keys)."""
    access = access or Access()
    access.max_body = MAX_BODY
    app = web.Application(
        client_max_size=MAX_BODY, middlewares=[gateway(services.observer, access)]
    )
    app[FLEET] = services.fleet
    app[RELAYER] = Relayer(services, access)  # the relay lane (GatewaySite's connections)
    app.on_response_prepare.append(add_cors_headers)
    blazar_api.register(app, services)
    cache_api.register(app, services)
    observe_api.register(app, services)
    openai_api.register(app, services)
    responses_api.register(app, services)
    rerank_api.register(app, services)
    ollama_api.register(app, services)
    ollama_admin.register(app, services)
    ollama_pull.register(app, services)
    ollama_blobs.register(app, services)
    anthropic_api.register(app, services)
    batches_api.register(app, services)
    sessions_api.register(app, services)
    keys_api.register(app, services)
    audio_api.register(app, services)
    images_api.register(app, services)
    realtime_api.register(app, services)
    fleet_api.register(app, services)
    ui_api.register(app, services)
    ui_admin.register(app, services)
    mcp_api.register(app, services)
    return app
