"""The access layer's rules, decided apart from a running serve: scopes of every route,
origins, hosts, rates, the body budget, server paths the API may read, unused uploads.

The router walk builds the real app (`build_app`) and proves by request that no
route is left out of the middleware: every route answers 401 without a key, 403
to a key whose scope is too low, in its protocol's envelope. The end-to-end
rules with the official clients are in tests/test_access_served.py.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import logging
import os
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from blazar.serve.daemon import Daemon, ServeOptions, Unprotected
from blazar.serve.gateway import audit
from blazar.serve.gateway.access import (
    ADMIN,
    INFERENCE,
    PUBLIC,
    Access,
    declared_scope,
    presented_key,
    scope_of,
)
from blazar.serve.gateway.app import build_app
from blazar.serve.gateway.listener import GatewaySite, Limits
from blazar.serve.gateway.policy import (
    BodyBudget,
    OriginPolicy,
    exposure,
    host_allowed,
    host_name,
    is_loopback,
    take_token,
)
from blazar.serve.request import uploads
from blazar.serve.routes.services import Services
from blazar.serve.supervisor.scheduler import Scheduler
from specs.keys import Key
from specs.manifest import Manifest
from specs.serving import Serving
from specs.sizes import InvalidSize, format_size, parse_size
from tests.gateway_harness import InProcessGateway
from tests.loopback import LoopbackHTTP
from tests.test_gateway_faults import Silent

ADMIN_KEY, INFERENCE_KEY = "plm_admin-secret", "plm_inference-secret"


def app_with_keys() -> tuple[web.Application, Access]:
    scheduler = Scheduler(
        {}, max_loaded=1, max_queue=1, queue_timeout=1.0, log_dir=Path("/nonexistent")
    )
    access = Access()
    keys = {
        "ops": Key(sha256=hashlib.sha256(ADMIN_KEY.encode()).hexdigest(), scope="admin"),
        "app": Key(sha256=hashlib.sha256(INFERENCE_KEY.encode()).hexdigest()),
    }
    access.configure(Serving(), keys)
    return build_app(Services(scheduler), access), access


def concrete(pattern: str) -> str:
    return (
        pattern.replace("{digest}", "sha256:" + "0" * 64)
        .replace("{name}", "someone")
        .replace("{file}", "app.js")  # the dashboard's files (public)
    )


def routes(app: web.Application) -> list[tuple[str, str]]:
    return sorted({(r.method, r.resource.canonical) for r in app.router.routes() if r.resource})


def test_every_route_declares_its_scope_and_an_undeclared_one_is_admin() -> None:
    app, _ = app_with_keys()
    found = routes(app)
    assert ("POST", "/v1/chat/completions") in found and ("DELETE", "/api/keys/{name}") in found
    assert [r for r in found if declared_scope(*r) is None] == []
    assert scope_of("GET", "/api/not-declared-anywhere") == ADMIN
    assert scope_of("POST", None) == ADMIN  # no route matched: a 404 needs a key first
    assert scope_of("GET", "/health") == scope_of("HEAD", "/health") == PUBLIC
    assert scope_of("GET", "/") == INFERENCE and scope_of("HEAD", "/") == PUBLIC
    # Route families other modules add are declared by prefix.
    assert scope_of("GET", "/metrics") == ADMIN
    assert scope_of("GET", "/metrics", metrics_public=True) == PUBLIC
    assert scope_of("GET", "/api/why/{trace}") == ADMIN
    assert scope_of("DELETE", "/api/blazar/sessions/{name}") == ADMIN
    assert scope_of("GET", "/api/keysmith") == ADMIN  # undeclared, not the /api/keys family


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({}, None),
        ({"Authorization": "Bearer plm_a"}, "plm_a"),
        ({"Authorization": "bearer  plm_a "}, "plm_a"),
        ({"Authorization": "Basic plm_a"}, None),
        ({"x-api-key": " plm_b "}, "plm_b"),
        ({"Authorization": "Bearer plm_a", "x-api-key": "plm_b"}, "plm_a"),
        # A browser's WebSocket cannot set headers: the key comes as a subprotocol.
        ({"Sec-WebSocket-Protocol": "realtime, openai-insecure-api-key.plm_c"}, "plm_c"),
        (
            {"Sec-WebSocket-Protocol": "openai-insecure-api-key.plm_c,openai-beta.realtime-v1"},
            "plm_c",
        ),
        ({"Sec-WebSocket-Protocol": "realtime, openai-insecure-api-key."}, None),
        ({"Sec-WebSocket-Protocol": "realtime, x-openai-insecure-api-key.plm_c"}, None),
        ({"Sec-WebSocket-Protocol": "realtime"}, None),
        (
            {"x-api-key": "plm_b", "Sec-WebSocket-Protocol": "openai-insecure-api-key.plm_c"},
            "plm_b",
        ),
    ],
)
def test_the_key_a_request_presents(headers: dict[str, str], key: str | None) -> None:
    assert presented_key(make_mocked_request("GET", "/v1/realtime", headers=headers)) == key


def shape(path: str, status: int, body: Any) -> str:
    """Which protocol's envelope an error body has, checked against the path."""
    if path.startswith("/v1/messages"):
        assert body["type"] == "error"
        kind = {401: "authentication_error", 403: "permission_error"}[status]
        assert body["error"]["type"] == kind
        return "anthropic"
    if path.startswith("/api/"):
        assert isinstance(body["error"], str)
        return "ollama"
    code = {401: "invalid_api_key", 403: "permission_denied"}[status]
    assert body["error"]["code"] == code and body["error"]["type"] == "invalid_request_error"
    return "openai"


class GatewayClient:
    """`build_app` behind the daemon's own site (`GatewaySite`, whose connections read heads
    for the relay), with TestClient's way of asking."""

    def __init__(self, app: web.Application) -> None:
        self.app = app

    async def __aenter__(self) -> aiohttp.ClientSession:
        self.runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = GatewaySite(self.runner, "127.0.0.1", 0, Limits.of(Serving()))
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.session = aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}")
        return self.session

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()
        await self.runner.cleanup()


@pytest.mark.parametrize("relay", [True, False], ids=["relay", "interpreted"])
def test_every_route_is_behind_the_key_check(relay: bool) -> None:
    """Walk the router: no key -> 401, an inference key on an admin route -> 403; each in its
    route's envelope, and no handler runs (they would fail without `blazar serve`). On the
    daemon's site with the relay on, and on aiohttp's own test server (issue 30)."""

    async def walk() -> list[str]:
        app, _ = app_with_keys()
        problems = []
        lane: Any = GatewayClient(app) if relay else TestClient(TestServer(app))
        async with lane as client:
            for method, pattern in routes(app):
                path = concrete(pattern)
                scope = declared_scope(method, pattern)
                resp = await client.request(method, path, json={} if method != "HEAD" else None)
                if scope == PUBLIC:
                    if resp.status == 401:
                        problems.append(f"{method} {path}: public but asked for a key")
                    continue
                if resp.status != 401:
                    problems.append(f"{method} {path}: {resp.status} without a key")
                    continue
                if method != "HEAD":
                    shape(path, 401, await resp.json())
                if scope == ADMIN:
                    headers = {"Authorization": f"Bearer {INFERENCE_KEY}"}
                    resp = await client.request(method, path, headers=headers, json={})
                    if resp.status != 403:
                        problems.append(f"{method} {path}: {resp.status} for an inference key")
                    elif method != "HEAD":
                        shape(path, 403, await resp.json())
            # A path no route serves needs a key before it is told it does not exist.
            assert (await client.get("/v1/no-such-route")).status == 401
            wrong = {"x-api-key": "plm_not-a-key"}
            assert (await client.get("/api/tags", headers=wrong)).status == 401
        return problems

    assert asyncio.run(walk()) == []


def test_no_keys_means_no_key_check_but_host_and_origin_still_hold() -> None:
    async def run() -> None:
        scheduler = Scheduler(
            {}, max_loaded=1, max_queue=1, queue_timeout=1.0, log_dir=Path("/nonexistent")
        )
        app = build_app(Services(scheduler))
        async with TestClient(TestServer(app)) as client:
            models = await client.get("/v1/models")
            assert models.status == 200 and (await models.json())["data"] == []
            evil = await client.get("/v1/models", headers={"Origin": "https://evil.example"})
            assert evil.status == 403 and "Access-Control-Allow-Origin" not in evil.headers
            local = await client.get("/v1/models", headers={"Origin": "http://localhost:5173"})
            assert local.status == 200
            assert local.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
            rebound = await client.get("/v1/models", headers={"Host": "evil.example:11435"})
            assert rebound.status == 403
            assert "evil.example" in (await rebound.json())["error"]["message"]

    asyncio.run(run())


@pytest.mark.parametrize(
    ("origin", "extra", "allowed"),
    [
        ("http://localhost", (), True),
        ("http://localhost:5173", (), True),
        ("https://127.0.0.1:8443", (), True),
        ("http://[::1]:3000", (), True),
        ("app://obsidian.md", (), True),
        ("tauri://localhost", (), True),
        ("vscode-webview://1a2b3c", (), True),
        ("null", ("*",), False),  # sandboxed frames: never
        ("http://localhost.evil.example", (), False),
        ("http://localhost:80.evil.example", (), False),
        ("http://127.0.0.1.nip.io", (), False),
        ("https://evil.example", (), False),
        ("https://app.example", ("https://app.example",), True),
        ("https://APP.example", ("https://app.example",), True),
        ("https://app.example.evil", ("https://app.example",), False),
        ("https://team.example.com", ("https://*.example.com",), True),
        ("https://example.com", ("https://*.example.com",), False),
        ("http://box:8080", ("http://box:*",), True),
        ("http://box", ("http://box:*",), False),
        ("https://anything.example", ("*",), True),
    ],
)
def test_origins(origin: str, extra: tuple[str, ...], allowed: bool) -> None:
    assert OriginPolicy(extra).allows(origin) is allowed


@pytest.mark.parametrize(
    ("header", "names", "allowed"),
    [
        (None, frozenset(), True),  # HTTP/1.0 without Host
        ("127.0.0.1:11435", frozenset(), True),
        ("[::1]:11435", frozenset(), True),
        ("192.168.1.20:11435", frozenset(), True),  # an address cannot be rebound
        ("localhost:11435", frozenset(), True),
        ("app.localhost", frozenset(), True),
        ("LOCALHOST.", frozenset(), True),
        ("evil.example:11435", frozenset(), False),
        ("localhost.evil.example", frozenset(), False),
        ("box.lan:11435", frozenset({"box.lan"}), True),
        ("other.lan", frozenset({"box.lan"}), False),
        ("anything.example", frozenset({"*"}), True),
    ],
)
def test_hosts(header: str | None, names: frozenset[str], allowed: bool) -> None:
    assert host_allowed(header, names) is allowed


def test_host_names_and_loopback() -> None:
    assert [host_name(h) for h in ("Box.Lan:80", "[::1]:1", "a.b", "a.b.")] == [
        "box.lan",
        "::1",
        "a.b",
        "a.b",
    ]
    assert all(map(is_loopback, ["127.0.0.1", "127.0.0.2", "::1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.1.2", "box.lan"]))


def test_token_bucket_allows_bursts_of_rpm_then_one_every_60_over_rpm_seconds() -> None:
    bucket, waits = None, []
    for _ in range(4):
        bucket, wait = take_token(bucket, 3, now=100.0)
        waits.append(wait)
    assert waits[:3] == [None, None, None] and waits[3] == pytest.approx(20.0)
    bucket, wait = take_token(bucket, 3, now=110.0)  # half a token back
    assert wait == pytest.approx(10.0)
    bucket, wait = take_token(bucket, 3, now=120.0)  # a whole one
    assert wait is None
    bucket, wait = take_token(bucket, 3, now=10_000.0)  # never more than rpm saved up
    assert wait is None and bucket.tokens == pytest.approx(2.0)


def test_body_budget_waits_for_room_then_gives_up() -> None:
    async def run() -> None:
        budget = BodyBudget(100)
        assert await budget.reserve(60, timeout=1)
        assert await budget.reserve(40, timeout=1)
        assert not await budget.reserve(1, timeout=0.05)  # full: waits, then no
        waiting = asyncio.ensure_future(budget.reserve(50, timeout=5))
        for _ in range(20):  # it has every chance to go on, and does not: no room
            await asyncio.sleep(0)
        assert not waiting.done()
        budget.release(60)
        assert await waiting and budget.used == 90
        budget.release(90)
        assert await budget.reserve(500, timeout=0)  # larger than the budget: only alone
        assert not await budget.reserve(1, timeout=0)

    asyncio.run(run())


def test_server_paths_the_api_may_read(tmp_path: Path) -> None:
    root = tmp_path / "imports"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "m.gguf").write_bytes(b"GGUF")
    outside = tmp_path / "secret.gguf"
    outside.write_bytes(b"GGUF")
    (root / "link.gguf").symlink_to(outside)
    (tmp_path / "imports-evil").mkdir()
    roots = [root]
    assert uploads.permitted(str(root / "sub" / "m.gguf"), roots) == root / "sub" / "m.gguf"
    assert uploads.permitted(str(root / "sub" / ".." / "sub" / "m.gguf"), roots) is not None
    for refused in [
        str(outside),
        str(root / ".." / "secret.gguf"),
        str(root / "link.gguf"),  # a symlink out of the root
        str(tmp_path / "imports-evil" / "x.gguf"),  # a prefix of the name is not inside
        "relative/m.gguf",
        "/etc/passwd",
        str(root) + "/\0x",
    ]:
        assert uploads.permitted(refused, roots) is None, refused
    first = uploads.refused("create: from", "/etc/passwd").message
    second = uploads.refused("create: from", "/etc/no-such-file").message
    assert first.replace("/etc/passwd", "X") == second.replace("/etc/no-such-file", "X")


def test_unused_uploads_are_removed_after_the_ttl(tmp_path: Path) -> None:
    a, b, c = (tmp_path / n for n in ("a", "b", "c"))
    entries = [(a, 0.0), (b, 0.0), (c, 5000.0)]
    assert uploads.unused_blobs(entries, {b}, now=5000.0, ttl=3600) == [a]
    assert uploads.unused_blobs(entries, set(), now=3000.0, ttl=3600) == []


def test_sweep_keeps_what_a_model_uses(tmp_path: Path, paths: Any) -> None:
    folder = uploads.blob_dir(paths)
    folder.mkdir(parents=True)
    used, unused, fresh = (folder / n for n in ("sha256-" + "1" * 64, "sha256-" + "2" * 64, "x"))
    for path in (used, unused, fresh):
        path.write_bytes(b"GGUF")
    old = 1_000_000.0
    for path in (used, unused):
        os.utime(path, (old, old))
    assert uploads.sweep(paths, {used}, now=old + 7200) == [unused]
    assert sorted(p.name for p in folder.iterdir()) == sorted([used.name, fresh.name])


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("64GiB", 64 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("10GB", 10**10),
        ("1.5kB", 1500),
        (1024, 1024),
        ("1024", 1024),
        ("100B", 100),
        (" 2 MiB ", 2 * 1024**2),
    ],
)
def test_sizes(text: object, size: int) -> None:
    assert parse_size(text) == size
    assert parse_size(format_size(size)) == size


@pytest.mark.parametrize("text", ["", "lots", "-1", -1, "1PB", "1mb", True, 1.5, None])
def test_bad_sizes(text: object) -> None:
    with pytest.raises(InvalidSize, match="expected a size"):
        parse_size(text)


def test_bodies_held_at_once_are_capped_and_the_next_waits_then_gets_a_503() -> None:
    """Bodies count against serving.max_buffered until their request ends: while a 6 MiB
    request waits on a (silent) model, another 6 MiB body is not read into memory; it
    waits body_timeout and gets 503 with Retry-After, and a small request still goes on."""
    child = LoopbackHTTP(Silent)
    access = Access()
    access.configure(Serving(max_buffered="8MiB", body_timeout="1s"), {})
    big = {"model": "tiny", "prompt": "x" * (6 * 1024**2)}
    try:
        with InProcessGateway(child.url, upstream_timeout=2.5, access=access) as gateway:
            held = threading.Thread(
                target=httpx.post,
                args=(f"{gateway.url}/v1/completions",),
                kwargs={"json": big, "timeout": 30},
            )
            held.start()
            deadline = time.monotonic() + 10
            while access.budget.used < 6 * 1024**2:
                assert time.monotonic() < deadline, "the first body was never held"
                time.sleep(0.02)
            began = time.monotonic()
            refused = httpx.post(f"{gateway.url}/v1/completions", json=big, timeout=30)
            waited = time.monotonic() - began
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
            assert refused.json()["error"]["code"] == "bodies_busy"
            assert 0.9 < waited < 4, waited  # it waited body_timeout, not the model
            assert access.budget.used < 7 * 1024**2  # its body was never taken in
            small = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
            went_on = httpx.post(f"{gateway.url}/v1/completions", json=small, timeout=30)
            assert went_on.status_code == 504  # read, and sent on to the (silent) model
            held.join(timeout=30)
    finally:
        child.stop()
    assert access.budget.used == 0


def test_beyond_loopback_a_key_or_consent_is_needed(
    paths: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="blazar.serve")  # serve's log (`blazar.serve.logs`)
    keyed = Manifest(keys={"ops": Key(sha256="a" * 64, scope="admin")})
    consenting = Manifest(serving=Serving(allow_unauthenticated=True))
    assert exposure("127.0.0.1", Manifest()) is None and exposure("::1", Manifest()) is None
    assert "blazar keys add" in (exposure("0.0.0.0", Manifest()) or "")
    assert exposure("0.0.0.0", keyed) is None and exposure("192.168.1.2", consenting) is None
    path = tmp_path / "blazar.toml"
    path.write_text('[keys.ops]\nsha256 = "' + "a" * 64 + '"\nscope = "admin"\n')
    daemon = Daemon(paths, ServeOptions(path, host="0.0.0.0"))
    try:
        daemon._start_checks()
        daemon._guard(daemon.manifest)
        assert daemon.access.keyed
        daemon._guard(Manifest())  # a reload that drops every key, while exposed
        assert daemon.access.keyed
        assert "keys not changed: the manifest declares none" in caplog.text
    finally:
        daemon.store.close()
    path.write_text("[serving]\nallow_unauthenticated = true\n")
    daemon = Daemon(paths, ServeOptions(path, host="0.0.0.0"))
    try:
        daemon._start_checks()  # the user means it: serve starts, and says so loudly
        assert "WARNING: serving on 0.0.0.0 with NO API KEY" in caplog.text
    finally:
        daemon.store.close()
    path.write_text("")
    daemon = Daemon(paths, ServeOptions(path, host="0.0.0.0"))
    try:
        with pytest.raises(Unprotected, match=r"refusing to serve on 0\.0\.0\.0 with no API key"):
            daemon._start_checks()
    finally:
        daemon.store.close()


def test_the_audit_log_is_json_lines_and_rotates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit, "MAX_BYTES", 2000)
    log = audit.AuditLog(tmp_path / "logs" / "audit.jsonl")
    for n in range(40):
        log.record(
            "refused",
            key=None,
            client="10.0.0.1",
            method="POST",
            path=f"/api/pull/{n}",
            status=401,
            reason="no key",
        )
    log.record("admin", key="ops", client="::1", method="POST", path="/api/pull", status=200)
    log.close()
    files = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert "audit.jsonl" in files and "audit.jsonl.1" in files and len(files) <= 1 + audit.BACKUPS
    last = [json.loads(line) for line in (tmp_path / "logs" / "audit.jsonl").open()][-1]
    assert last["event"] == "admin" and last["key"] == "ops" and last["outcome"] == "ok"
    assert set(last) == {"time", "event", "key", "client", "method", "path", "status", "outcome"}
    first = json.loads((tmp_path / "logs" / "audit.jsonl.1").read_text().splitlines()[0])
    assert first["status"] == 401 and first["outcome"] == "no key" and first["key"] is None


def test_a_body_is_not_kept_after_its_request_on_an_idle_keep_alive_connection() -> None:
    """aiohttp keeps a connection's last request until its next one; the body it read
    must not stay with it (ten idle clients that each sent 60 MB held 600 MB)."""

    async def run() -> int:
        scheduler = Scheduler(
            {}, max_loaded=1, max_queue=1, queue_timeout=1.0, log_dir=Path("/nonexistent")
        )
        app = build_app(Services(scheduler))
        body = b'{"model": "nope", "prompt": "' + b"x" * (16 * 1024**2) + b'"}'
        async with TestServer(app) as server:
            clients = [TestClient(server) for _ in range(4)]
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            for client in clients:  # each keeps its connection open, idle, afterwards
                answer = await client.post("/v1/completions", data=body)
                assert answer.status == 404
                await answer.read()
            await asyncio.sleep(0.1)
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
            for client in clients:
                await client.close()
        return held

    assert asyncio.run(run()) < 16 * 1024**2  # less than one of the four bodies
