"""The gateway's aiohttp application, assembled in one place.

`build_app` registers every protocol's routes (OpenAI, ollama, Anthropic,
Blazar's own) on one application and installs the middleware every request
passes through: the access layer (`blazar.serve.access`: Host, Origin and
CORS, API keys and scopes, rate and body limits), inside `errors`, which
gives each response its trace id and answers what a route raised in the
route's protocol envelope (`pipeline.failure`, `envelopes.for_path`): a
client's mistake as a 4xx, a bug as a 500 in the same shape with the
traceback only in serve's log. The route modules depend on
`Services`, never on this module or the daemon.
"""

from __future__ import annotations

import logging

from aiohttp import web

from blazar.serve import (
    anthropic_api,
    blazar_api,
    keys_api,
    ollama_admin,
    ollama_api,
    ollama_blobs,
    ollama_pull,
    openai_api,
    pipeline,
)
from blazar.serve.access import Access, add_cors_headers
from blazar.serve.envelopes import for_path
from blazar.serve.http import TRACE, trace_id
from blazar.serve.services import Services

MAX_BODY = 64 * 1024**2
logger = logging.getLogger("blazar.serve")


@web.middleware
async def errors(request: web.Request, handler: pipeline.Handler) -> web.StreamResponse:
    """The trace id on every response, and every raised failure in its protocol's shape."""
    try:
        response = await handler(request)
    except web.HTTPException:
        raise
    except Exception as exc:
        known = pipeline.failure(exc)
        if known is None:  # a bug: the client still gets its protocol's shape, not a traceback
            logger.exception("%s %s failed", request.method, request.path)
            known = pipeline.Failure(500, f"internal error ({type(exc).__name__}); see serve's log")
        envelope = for_path(request.path)
        return envelope.response(
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
    app = web.Application(client_max_size=MAX_BODY, middlewares=[errors, access.middleware])
    app.on_response_prepare.append(add_cors_headers)
    blazar_api.register(app, services)
    openai_api.register(app, services)
    ollama_api.register(app, services)
    ollama_admin.register(app, services)
    ollama_pull.register(app, services)
    ollama_blobs.register(app, services)
    anthropic_api.register(app, services)
    keys_api.register(app, services)
    return app
