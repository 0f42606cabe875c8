"""The access layer: the one middleware every request passes, and the scope of every route.

The gateway's one middleware (`blazar.serve.gateway.app`) runs `Access.guard` around
every request, so each route is covered by construction; the daemon hands it the
manifest's keys and `[serving]` settings on every pass (`configure`), so key
changes apply without a restart. For each request, in this order:

1. `Host` must name the gateway (`policy.host_allowed`), else 403.
2. An `Origin` must be allowed (`policy.OriginPolicy`), else 403, on every
   route; a CORS preflight (`OPTIONS` with an Origin) is answered here, without
   a key, and allowed origins get `Access-Control-Allow-Origin` on responses.
3. With keys declared, every route not `PUBLIC` needs `Authorization: Bearer
   KEY` or `x-api-key: KEY` (a WebSocket may offer the subprotocol
   `openai-insecure-api-key.KEY`): 401 when missing or unknown, 403 when the key's
   scope is below the route's, 429 with Retry-After past its `rpm`. The key is
   found by its sha256 (one dict lookup, confirmed with `hmac.compare_digest`);
   its `Grant` and name are stored in the request for the routes and traces.
4. A body is read here, whole, within `serving.body_timeout` (408), once
   `policy.BodyBudget` has room for it (503 after waiting that long), except on
   the routes that stream their bodies (`STREAMED`).

Refusals are answered in the path's protocol envelope (`envelopes.for_path`).
`SCOPES` declares each route's scope; `PREFIXES` covers route families other
modules add (`/metrics`, `/api/why`, `/api/blazar/sessions`); a route in
neither gets `ADMIN`, the strictest. tests/test_access.py walks the router to
prove every route is declared. Admin-scope requests and refusals go to the
audit log when `serving.audit_log` (`blazar.serve.gateway.audit`).

Cost on the hot path (docs/performance.md): cached Host and route decisions,
one check when no key is declared, one sha256 and one dict lookup when keys
are; no read deadline for a body that arrived with its head.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import socket
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from aiohttp import web
from aiohttp.web_urldispatcher import AbstractRoute

from blazar.serve.gateway import policy
from blazar.serve.gateway.audit import AuditLog
from blazar.serve.http import KEY_NAME, Handler
from blazar.serve.request import steps
from blazar.serve.request.envelopes import for_path
from blazar.serve.request.grants import ADMIN, GRANT, INFERENCE, Grant
from specs.keys import Key
from specs.serving import Serving

PUBLIC = "public"
RANK = {PUBLIC: 0, INFERENCE: 1, ADMIN: 2}

# (method, route pattern) -> the least scope that may call it. HEAD takes its GET's.
SCOPES: dict[tuple[str, str], str] = {
    ("GET", "/health"): PUBLIC,
    ("HEAD", "/"): PUBLIC,  # ollama's clients probe it
    ("GET", "/"): INFERENCE,
    # OpenAI
    ("GET", "/v1/models"): INFERENCE,
    ("GET", "/v1/models/{model}"): INFERENCE,
    ("POST", "/v1/chat/completions"): INFERENCE,
    ("POST", "/v1/completions"): INFERENCE,
    ("POST", "/v1/embeddings"): INFERENCE,
    ("POST", "/v1/rerank"): INFERENCE,
    ("POST", "/rerank"): INFERENCE,  # llama-server's spelling
    ("POST", "/v1/responses"): INFERENCE,
    ("GET", "/v1/responses/{id}"): INFERENCE,  # not stored: a 404 in OpenAI's shape
    ("POST", "/v1/responses/{id}"): INFERENCE,  # metadata only
    ("DELETE", "/v1/responses/{id}"): INFERENCE,
    ("GET", "/v1/responses/{id}/input_items"): INFERENCE,
    ("POST", "/v1/responses/{id}/cancel"): INFERENCE,
    ("POST", "/v1/audio/transcriptions"): INFERENCE,
    ("POST", "/v1/audio/translations"): INFERENCE,
    ("POST", "/v1/audio/speech"): INFERENCE,
    ("GET", "/v1/audio/jobs"): INFERENCE,  # a key sees only its own jobs
    ("GET", "/v1/audio/jobs/{id}"): INFERENCE,
    ("POST", "/v1/audio/jobs/{id}/cancel"): INFERENCE,
    ("POST", "/v1/audio/jobs/{id}/retry"): INFERENCE,
    ("POST", "/v1/images/generations"): INFERENCE,
    ("POST", "/v1/images/edits"): INFERENCE,  # multipart: pictures within the body cap
    ("GET", "/v1/images/jobs"): INFERENCE,  # a key sees only its own jobs
    ("GET", "/v1/images/jobs/{id}"): INFERENCE,
    ("POST", "/v1/images/jobs/{id}/cancel"): INFERENCE,
    ("GET", "/v1/realtime"): INFERENCE,  # a WebSocket: OpenAI's Realtime protocol
    # Anthropic
    ("POST", "/v1/messages"): INFERENCE,
    ("POST", "/v1/messages/count_tokens"): INFERENCE,
    ("POST", "/v1/messages/batches"): INFERENCE,  # a key sees only its own batches
    ("GET", "/v1/messages/batches"): INFERENCE,
    ("GET", "/v1/messages/batches/{id}"): INFERENCE,
    ("DELETE", "/v1/messages/batches/{id}"): INFERENCE,
    ("POST", "/v1/messages/batches/{id}/cancel"): INFERENCE,
    ("GET", "/v1/messages/batches/{id}/results"): INFERENCE,
    # ollama: inference and listings
    ("POST", "/api/chat"): INFERENCE,
    ("POST", "/api/generate"): INFERENCE,
    ("POST", "/api/embed"): INFERENCE,
    ("POST", "/api/embeddings"): INFERENCE,
    ("GET", "/api/tags"): INFERENCE,
    ("GET", "/api/ps"): INFERENCE,
    ("POST", "/api/show"): INFERENCE,
    ("GET", "/api/version"): INFERENCE,
    # ollama: management
    ("POST", "/api/pull"): ADMIN,
    ("POST", "/api/create"): ADMIN,
    ("POST", "/api/copy"): ADMIN,
    ("DELETE", "/api/delete"): ADMIN,
    ("POST", "/api/push"): ADMIN,
    ("HEAD", "/api/blobs/{digest}"): ADMIN,
    ("POST", "/api/blobs/{digest}"): ADMIN,
    # Blazar's own
    ("GET", "/api/blazar/ps"): ADMIN,  # pids and ports: an operator's view
    ("POST", "/api/blazar/stop"): ADMIN,
    ("GET", "/api/blazar/stats"): ADMIN,  # `blazar watch`: the operator's live view
    ("GET", "/api/blazar/coreside"): ADMIN,  # `blazar coreside`: what memory holds
    ("GET", "/api/blazar/cache"): ADMIN,  # `blazar cache stats`: the response cache
    ("POST", "/api/blazar/cache/clear"): ADMIN,
    ("GET", "/api/failover"): ADMIN,  # remotes' URLs and health: `blazar remotes`
    ("POST", "/api/failover"): ADMIN,  # drain or undrain a remote
    # The dashboard (ui_api, ui_admin): its files hold no data, and must load to ask for a key
    ("GET", "/ui"): PUBLIC,
    ("GET", "/ui/"): PUBLIC,
    ("GET", "/ui/{file}"): PUBLIC,
    ("GET", "/api/ui/events"): INFERENCE,  # an inference key gets only its models' view
    ("GET", "/api/ui/trail/{trace}"): ADMIN,
    ("GET", "/api/ui/health"): ADMIN,
    ("GET", "/api/ui/logs"): ADMIN,
    ("GET", "/api/ui/logs/{name}"): ADMIN,
    ("POST", "/api/blazar/load"): ADMIN,
    ("POST", "/api/blazar/pin"): ADMIN,
    ("GET", "/api/mcp"): INFERENCE,  # what a chat request may name in `mcp`; no commands
}
# Route families, by path prefix, any method: for routes other modules add.
PREFIXES: tuple[tuple[str, str], ...] = (
    ("/api/keys", ADMIN),
    ("/metrics", ADMIN),  # PUBLIC when serving.metrics_public
    ("/api/why", ADMIN),
    ("/api/blazar/sessions", ADMIN),
)
# Routes whose handlers read their bodies as streams (to disk), not buffered here.
STREAMED = frozenset(
    {
        ("POST", "/api/blobs/{digest}"),
        ("POST", "/v1/audio/transcriptions"),  # multipart, capped by serving.max_audio_upload
        ("POST", "/v1/audio/translations"),
    }
)
PREFLIGHT_HEADERS = (
    "authorization",
    "content-type",
    "x-api-key",
    "anthropic-version",
    "x-request-id",
    "x-blazar-priority",
)
# Also allowed when a preflight asks for them: what the official SDKs send from a browser.
SDK_HEADERS = frozenset(
    {
        "anthropic-beta",
        "anthropic-dangerous-direct-browser-access",
        "openai-organization",
        "openai-project",
        "openai-beta",
    }
)
METHODS = "GET, HEAD, POST, DELETE, OPTIONS"
EXPOSED = "x-request-id, request-id, retry-after"
CORS_ORIGIN = web.RequestKey("cors_origin", str)
NO_KEY: tuple[str, Grant | None] = ("0" * 64, None)
OPERATOR = "(operator)"  # the local operator's grant: no key can be named so
CLI_HINT = (
    "the blazar CLI sends $BLAZAR_API_KEY, and on the machine serve runs on, as the user "
    "who runs it, serve's operator token without one"
)
KEY_SUBPROTOCOL = "openai-insecure-api-key."  # how browsers send a key on a WebSocket


def declared_scope(method: str, pattern: str) -> str | None:
    """The scope SCOPES or PREFIXES declares for a route; None when neither does."""
    found = SCOPES.get((method, pattern))
    if found is None and method == "HEAD":
        found = SCOPES.get(("GET", pattern))
    if found is not None:
        return found
    for prefix, scope in PREFIXES:
        if pattern == prefix or pattern.startswith(prefix.rstrip("/") + "/"):
            return scope
    return None


def scope_of(method: str, pattern: str | None, *, metrics_public: bool = False) -> str:
    """The scope a request needs: its route's, ADMIN for a route declared nowhere (or
    none matched), PUBLIC for /metrics when serving.metrics_public."""
    if pattern is None:
        return ADMIN
    if metrics_public and (pattern == "/metrics" or pattern.startswith("/metrics/")):
        return PUBLIC
    return declared_scope(method, pattern) or ADMIN


def presented_key(request: web.Request) -> str | None:
    """The key a request carries: `Authorization: Bearer KEY`, `x-api-key: KEY`, or (a
    browser's WebSocket, which cannot set headers) the subprotocol
    `openai-insecure-api-key.KEY` in `Sec-WebSocket-Protocol`."""
    auth = request.headers.get("Authorization")
    if auth is not None:
        kind, _, value = auth.strip().partition(" ")
        if kind.lower() == "bearer" and value.strip():
            return value.strip()
    key = request.headers.get("x-api-key")
    if key and key.strip():
        return key.strip()
    for offered in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
        name, _, value = offered.strip().partition(KEY_SUBPROTOCOL)
        if not name and value:
            return value
    return None


def _secret(headers: Mapping[str, str]) -> str | None:
    """`presented_key` on a head's headers (names lowercased), without the WebSocket way."""
    auth = headers.get("authorization")
    if auth is not None:
        kind, _, value = auth.strip().partition(" ")
        if kind.lower() == "bearer" and value.strip():
            return value.strip()
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def _client(request: web.Request) -> str | None:
    return request.remote


class Access:
    """The gateway's access state and its middleware; `configure` replaces the policy."""

    def __init__(self, bind_host: str = "127.0.0.1", audit: AuditLog | None = None) -> None:
        self.bind_host = bind_host
        self.audit = audit
        self.grants: dict[str, tuple[str, Grant]] = {}  # sha256 hex -> (it, grant)
        # The local operator's token (`allow_operator`): admin on this gateway while it
        # runs, never a declared key, so it neither turns keys on nor counts as one.
        self.operator: tuple[str, Grant] | None = None
        self.buckets: dict[str, policy.Bucket] = {}
        self.last_used: dict[str, float] = {}
        self.origins = policy.OriginPolicy()
        self.serving = Serving()
        self.budget = policy.BodyBudget(self.serving.max_buffered)
        self._hosts: dict[str, bool] = {}
        self._host_names = self._names(self.serving)
        self._scopes: dict[AbstractRoute, tuple[str, bool]] = {}
        self.max_body = 64 * 1024**2  # the app's client_max_size (`build_app` sets it)

    # -- configuration (the daemon, on every pass) -----------------------------------

    def _names(self, serving: Serving) -> frozenset[str]:
        names = {self.bind_host.lower().strip("[]"), socket.gethostname().lower()}
        return frozenset(names | {h.lower() for h in serving.allowed_hosts})

    def configure(self, serving: Serving, keys: Mapping[str, Key]) -> None:
        """Use these settings and keys from now on (a key's rate state is kept)."""
        self.grants = {
            key.sha256: (key.sha256, Grant.of(name, key.scope, key.models, key.rpm))
            for name, key in keys.items()
        }
        names = set(keys)
        self.buckets = {n: b for n, b in self.buckets.items() if n in names}
        if serving != self.serving:
            self.serving = serving
            self.origins = policy.OriginPolicy(serving.cors_origins)
            self.budget.limit = serving.max_buffered
            self._host_names = self._names(serving)
            self._hosts = {}
            self._scopes = {}

    def allow_operator(self, digest: str) -> None:
        """Accept the token whose sha256 is `digest` as the local operator's admin key
        (serve writes the token to a file only its owner can read: `blazar.serve.daemon`)."""
        self.operator = (digest, Grant.of(OPERATOR, "admin", ["*"], None))

    @property
    def keyed(self) -> bool:
        return bool(self.grants)

    def take_usage(self) -> dict[str, str]:
        """When each key was last used since the last call (ISO 8601), for the store."""
        used, self.last_used = self.last_used, {}
        return {
            n: datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds") for n, t in used.items()
        }

    def keep_usage(self, used: dict[str, str]) -> None:
        """Put back what `take_usage` gave when it could not be written (newer uses win)."""
        for name, when in used.items():
            self.last_used.setdefault(name, datetime.fromisoformat(when).timestamp())

    # -- the middleware ----------------------------------------------------------------

    def _route(self, request: web.Request) -> tuple[str, bool]:
        """(scope, streams its body) of the request's route; cached per route."""
        route = request.match_info.route
        found = self._scopes.get(route)
        if found is None:
            resource = route.resource
            pattern = resource.canonical if resource is not None else None
            method = route.method
            scope = scope_of(method, pattern, metrics_public=self.serving.metrics_public)
            found = (scope, (method, pattern) in STREAMED)
            if resource is not None:
                self._scopes[route] = found
        return found

    def _refuse(
        self,
        request: web.Request,
        status: int,
        message: str,
        code: str | None,
        reason: str,
        retry_after: float | None = None,
    ) -> web.Response:
        if self.audit is not None:
            self.audit.record(
                "refused",
                key=request.get(KEY_NAME),
                client=_client(request),
                method=request.method,
                path=request.path,
                status=status,
                reason=reason,
            )
        return for_path(request.path).response(request, status, message, code, retry_after)

    def _host_allowed(self, host: str | None) -> bool:
        """Whether the gateway answers to `host` (no Host header: yes), memoised."""
        if host is None:
            return True
        allowed = self._hosts.get(host)
        if allowed is None:
            allowed = policy.host_allowed(host, self._host_names)
            if len(self._hosts) < policy.CACHE_LIMIT:
                self._hosts[host] = allowed
        return allowed

    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The checks above, then `handler`; a refusal is answered here, in the path's
        envelope. The gateway's one middleware (`blazar.serve.gateway.app`) calls it."""
        host = request.headers.get("Host")
        if not self._host_allowed(host):
            return self._refuse(
                request,
                403,
                f"this gateway does not answer to the host name in Host: {host}; "
                "add it to serving.allowed_hosts if it is yours",
                "permission_denied",
                "host",
            )
        origin = request.headers.get("Origin")
        if origin is not None:
            if not self.origins.allows(origin):
                return self._refuse(
                    request,
                    403,
                    f"requests from the web origin {origin} are refused: add it "
                    "to serving.cors_origins if pages there may use this gateway",
                    "permission_denied",
                    "origin",
                )
            if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
                return self._preflight(request, origin)
            request[CORS_ORIGIN] = origin
        scope, streamed = self._route(request)
        if self.grants and scope != PUBLIC:
            refusal = self._authenticate(request, scope)
            if refusal is not None:
                return refusal
        reserved = 0
        if request.body_exists and not streamed:
            length = request.content_length
            reserved = min(length, self.max_body) if length is not None else self.max_body
            fits = self.budget.take(reserved)  # no await on the common path
            if not fits and not await self.budget.reserve(reserved, self.serving.body_timeout):
                return self._refuse(
                    request,
                    503,
                    "the gateway holds as many request bodies as it may "
                    "(serving.max_buffered); retry shortly",
                    "bodies_busy",
                    "busy",
                    retry_after=1,
                )
            try:
                if request.content.is_eof():  # it came whole with its head: nothing to wait for
                    body = await request.read()
                else:  # (a deadline costs ~15 us: only for bodies still on their way)
                    async with asyncio.timeout(self.serving.body_timeout):
                        body = await request.read()
            except TimeoutError:
                self.budget.release(reserved)
                return self._refuse(
                    request,
                    408,
                    f"the request body did not arrive within "
                    f"{self.serving.body_timeout:g} s (serving.body_timeout)",
                    "request_timeout",
                    "slow",
                )
            except BaseException:
                self.budget.release(reserved)
                raise
            if length is None:  # keep only what the body holds
                self.budget.release(reserved - len(body))
                reserved = len(body)
        try:
            if scope == ADMIN and self.audit is not None:
                return await self._audited(request, handler)
            return await handler(request)
        finally:
            if reserved:
                # aiohttp keeps the last request of a keep-alive connection, and the body
                # it read, until the next request comes: without this, ten idle clients
                # that each sent 60 MB hold 600 MB that the budget believes free.
                request._read_bytes = None
                self.budget.release(reserved)

    def relay_grant(self, headers: Mapping[str, str]) -> tuple[bool, str | None, Grant | None]:
        """The checks of `guard` for an inference request the relay carries (Host, a key,
        its scope; its rate is `relay_take`'s), on its head's headers (names lowercased):
        (admitted, the key's name, its grant). Not admitted: the request goes to aiohttp,
        whose `guard` answers the refusal in the protocol's shape and audits it. An
        Origin never gets here (`lanes.decide`: its answer needs CORS headers)."""
        if not self._host_allowed(headers.get("host")):
            return False, None, None
        if not self.grants:
            return True, None, None
        secret = _secret(headers)
        if secret is None:
            return False, None, None
        digest = hashlib.sha256(secret.encode()).hexdigest()
        known, grant = self.grants.get(digest, NO_KEY)
        if grant is None and self.operator is not None:
            known, grant = self.operator
        if grant is None or not hmac.compare_digest(known, digest):
            return False, None, None
        if RANK[grant.scope] < RANK[INFERENCE]:
            return False, None, None
        return True, grant.name, grant

    def relay_take(self, grant: Grant | None) -> bool:
        """The key's rate, for a request the relay carries: one request taken from its
        bucket, or False when it has none left (`guard` then refuses it, taking none).
        Called only once the relay has decided to carry the request, so a request it
        hands to aiohttp is counted once, by `guard`."""
        if grant is None:
            return True
        if grant.rpm is not None:
            bucket, wait = policy.take_token(
                self.buckets.get(grant.name), grant.rpm, time.monotonic()
            )
            if wait is not None:
                return False
            self.buckets[grant.name] = bucket
        if grant.name != OPERATOR:
            self.last_used[grant.name] = time.time()
        return True

    def _authenticate(self, request: web.Request, scope: str) -> web.Response | None:
        """None when the request's key may call a route of `scope`; else the refusal."""
        secret = presented_key(request)
        if secret is None:
            return self._refuse(
                request,
                401,
                "an API key is required: send Authorization: Bearer <key> or "
                f"x-api-key: <key> (`blazar keys add` makes one; {CLI_HINT})",
                "invalid_api_key",
                "no key",
            )
        digest = hashlib.sha256(secret.encode()).hexdigest()
        known, grant = self.grants.get(digest, NO_KEY)
        if grant is None and self.operator is not None:
            known, grant = self.operator
        # Found by its digest; the comparison is confirmed in constant time.
        if grant is None or not hmac.compare_digest(known, digest):
            return self._refuse(
                request,
                401,
                "the API key is not valid: check it, or make one with `blazar keys add`"
                f" ({CLI_HINT})",
                "invalid_api_key",
                "bad key",
            )
        request[KEY_NAME] = grant.name
        request[GRANT] = grant
        if RANK[grant.scope] < RANK[scope]:
            return self._refuse(
                request,
                403,
                f"the key '{grant.name}' has scope {grant.scope}; this route "
                f"needs {scope} (`blazar keys add NAME --scope {scope}`)",
                "permission_denied",
                "scope",
            )
        now = time.monotonic()
        if grant.name != OPERATOR:
            self.last_used[grant.name] = time.time()
        if grant.rpm is not None:
            bucket, wait = policy.take_token(self.buckets.get(grant.name), grant.rpm, now)
            self.buckets[grant.name] = bucket
            if wait is not None:
                return self._refuse(
                    request,
                    429,
                    f"the key '{grant.name}' may make {grant.rpm} requests a "
                    "minute; retry after the time in Retry-After",
                    "rate_limit_exceeded",
                    "rate",
                    retry_after=wait,
                )
        return None

    async def _audited(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except Exception as exc:
            known = steps.failure(exc)
            status = known.status if known is not None else 500
            raise
        finally:
            assert self.audit is not None
            self.audit.record(
                "admin",
                key=request.get(KEY_NAME),
                client=_client(request),
                method=request.method,
                path=request.path,
                status=status,
            )

    def _preflight(self, request: web.Request, origin: str) -> web.Response:
        asked = request.headers.get("Access-Control-Request-Headers", "")
        extra = [
            h
            for h in (part.strip().lower() for part in asked.split(","))
            if h and (h in SDK_HEADERS or h.startswith("x-stainless-"))
        ]
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Origin": origin,
                "Access-Control-Allow-Methods": METHODS,
                "Access-Control-Allow-Headers": ", ".join((*PREFLIGHT_HEADERS, *extra)),
                "Access-Control-Max-Age": "600",
                "Vary": "Origin",
            },
        )


async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: an allowed origin's responses say so (streams too)."""
    origin = request.get(CORS_ORIGIN)
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = EXPOSED
        response.headers.add("Vary", "Origin")
