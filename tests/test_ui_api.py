"""The dashboard's routes without a browser: who may call them, the page's headers, what
the event stream carries, the log tail's refusals, and the series' arithmetic.

The app is the real one (`build_app`) with a real scheduler, observer and access layer,
in-process; requests that the observer traces are ones no model serves (404s), so no
engine is needed. The same routes against a real `blazar serve` are in
tests/test_ui_served.py, and in a real browser in tests/test_ui_browser.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer

from blazar.errors import Conflict, NotFound
from blazar.host.children import LogFile
from blazar.manifest import ops as manifest_ops
from blazar.serve.gateway.access import Access
from blazar.serve.gateway.app import build_app
from blazar.serve.routes import ui_api
from blazar.serve.routes.services import Services
from blazar.serve.state import events, log_tail, series
from blazar.serve.supervisor.scheduler import Scheduler
from specs.keys import Key
from specs.serving import Serving
from tests import browser

ADMIN_KEY, INFERENCE_KEY = "plm_ui-admin", "plm_ui-inference"
WEBUI = ui_api.webui_dir()


def app_for(logs: Path, *, keyed: bool) -> Any:
    scheduler = Scheduler({}, max_loaded=1, max_queue=1, queue_timeout=1.0, log_dir=logs)
    access = Access()
    keys = {
        "ops": Key(sha256=hashlib.sha256(ADMIN_KEY.encode()).hexdigest(), scope="admin"),
        "app": Key(sha256=hashlib.sha256(INFERENCE_KEY.encode()).hexdigest()),
    }
    access.configure(Serving(), keys if keyed else {})
    return build_app(Services(scheduler), access)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def run(
    tmp_path: Path, test: Callable[[TestClient[Any, Any]], Awaitable[None]], keyed: bool = True
) -> None:
    async def main() -> None:
        async with TestClient(TestServer(app_for(tmp_path / "logs", keyed=keyed))) as client:
            await test(client)

    asyncio.run(main())


async def read_events(resp: ClientResponse) -> AsyncIterator[tuple[str, Any]]:
    """(event, data) of a server-sent event stream, as they arrive."""
    pending = b""
    async for chunk in resp.content.iter_any():
        pending += chunk
        while b"\n\n" in pending:
            block, pending = pending.split(b"\n\n", 1)
            lines = block.decode().split("\n")
            if all(line.startswith(":") for line in lines):
                continue
            name = next(line[7:] for line in lines if line.startswith("event: "))
            data = next(line[6:] for line in lines if line.startswith("data: "))
            yield name, json.loads(data)


async def until(
    stream: AsyncIterator[tuple[str, Any]], wanted: Callable[[str, Any], bool], timeout: float = 5.0
) -> list[tuple[str, Any]]:
    """The events read until one is `wanted` (that one last)."""
    seen: list[tuple[str, Any]] = []

    async def read() -> None:
        async for name, data in stream:
            seen.append((name, data))
            if wanted(name, data):
                return
        raise AssertionError(f"the stream ended; it sent {[n for n, _ in seen]}")

    await asyncio.wait_for(read(), timeout)
    return seen


# -- the page ------------------------------------------------------------------------------


def test_the_page_loads_without_a_key_with_its_csp_and_nothing_else_is_served(
    tmp_path: Path,
) -> None:
    async def test(client: TestClient[Any, Any]) -> None:
        for path in ("/ui", "/ui/", "/ui/app.js", "/ui/app.css"):
            resp = await client.get(path)
            assert resp.status == 200, path
            csp = resp.headers["Content-Security-Policy"]
            assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
            assert "script-src 'self'" in csp and "connect-src 'self'" in csp
            assert resp.headers["X-Frame-Options"] == "DENY"
            assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert (
            (await client.get("/ui/app.js")).headers["Content-Type"].startswith("text/javascript")
        )
        for path in ("/ui/nope.js", "/ui/..%2Fpyproject.toml", "/ui/%2e%2e%2f__init__.py"):
            resp = await client.get(path)
            assert resp.status == 404, path
            assert "no such file of the dashboard" in (await resp.text())
        # Everything else still needs a key; the page's own data routes too.
        assert (await client.get("/api/ui/events")).status == 401
        # A page elsewhere cannot read it (Origin) nor rebind a name to it (Host).
        assert (await client.get("/ui", headers={"Origin": "https://evil.example"})).status == 403
        assert (await client.get("/ui", headers={"Host": "evil.example"})).status == 403

    run(tmp_path, test)


def test_the_page_names_no_other_host() -> None:
    """Offline by construction: no file of the page refers to anything but this origin."""
    files = sorted(p for p in WEBUI.iterdir() if p.suffix in (".html", ".js", ".css"))
    assert {p.name for p in files} >= {"index.html", "app.js", "app.css"}
    for path in files:
        # SVG's namespace is a name, never fetched.
        text = path.read_text().replace('"http://www.w3.org/2000/svg"', "SVG_NS")
        assert not re.search(r"https?://|wss?://|//[a-z0-9.-]+\.[a-z]{2,}/", text), path.name
        assert "@import" not in text and "url(" not in text, path.name
        assert "innerHTML" not in text and "eval(" not in text, path.name
    index = (WEBUI / "index.html").read_text()
    assert re.findall(r'(?:src|href)="([^"]+)"', index) == ["data:,", "/ui/app.css", "/ui/app.js"]
    assert "<script>" not in index and " style=" not in index  # the CSP allows neither


# -- scopes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/blazar/load"),
        ("POST", "/api/blazar/pin"),
        ("GET", "/api/ui/health"),
        ("GET", "/api/ui/logs"),
        ("GET", "/api/ui/logs/tiny-0.log"),
        ("GET", "/api/ui/trail/abc"),
    ],
)
def test_admin_routes_refuse_an_inference_key(tmp_path: Path, method: str, path: str) -> None:
    async def test(client: TestClient[Any, Any]) -> None:
        assert (await client.request(method, path, json={})).status == 401
        resp = await client.request(method, path, json={}, headers=bearer(INFERENCE_KEY))
        assert resp.status == 403
        assert "needs admin" in (await resp.json())["error"]

    run(tmp_path, test)


def test_an_inference_key_streams_only_its_models_view(tmp_path: Path) -> None:
    async def test(client: TestClient[Any, Any]) -> None:
        resp = await client.get("/api/ui/events", headers=bearer(INFERENCE_KEY))
        assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
        stream = read_events(resp)
        seen = await until(stream, lambda name, _: name == "models")
        assert seen[0] == (
            "hello",
            {"version": seen[0][1]["version"], "keyed": True, "key": "app", "scope": "inference"},
        )
        # A request it makes is traced, but its trail is an admin's to see.
        await client.post(
            "/v1/chat/completions", json={"model": "nope"}, headers=bearer(INFERENCE_KEY)
        )
        with pytest.raises(TimeoutError):
            await until(stream, lambda name, _: name in ("request", "requests", "sample"), 2.5)
        resp.close()

    run(tmp_path, test)


# -- the event stream ----------------------------------------------------------------------


def test_the_stream_starts_from_a_snapshot_then_tells_each_request_as_it_goes(
    tmp_path: Path,
) -> None:
    async def test(client: TestClient[Any, Any]) -> None:
        resp = await client.get("/api/ui/events", headers=bearer(ADMIN_KEY))
        stream = read_events(resp)
        first = await until(stream, lambda name, _: name == "series")
        assert [name for name, _ in first] == ["hello", "models", "requests", "series"]
        hello, models, requests, points = (data for _, data in first)
        assert hello["scope"] == "admin" and hello["key"] == "ops"
        assert models["models"] == [] and requests == {"finished": [], "running": []}
        assert points["every"] == series.SAMPLE_EVERY and points["window"] == series.WINDOW
        answer = await client.post(
            "/v1/chat/completions",
            json={"model": "ghost", "messages": [{"role": "user", "content": "hi"}]},
            headers={**bearer(ADMIN_KEY), "x-request-id": "ui-test-1"},
        )
        assert answer.status == 404
        told = await until(stream, lambda name, data: name == "request" and data["done"])
        rows = [data for name, data in told if name == "request"]
        assert [r["done"] for r in rows] == [False, True]  # started, then finished
        started, finished = rows
        assert started["id"] == finished["id"] == "ui-test-1"
        assert started["key"] == finished["key"] and started["route"] == "/v1/chat/completions"
        assert finished["status"] == 404 and finished["model"] == "ghost"
        assert finished["protocol"] == "openai" and finished["key_name"] == "ops"
        # Within the sample interval, the series has a point that counted it.
        sample = await until(stream, lambda name, _: name == "sample", series.SAMPLE_EVERY + 2)
        point = sample[-1][1]
        assert point["requests_per_second"] > 0 and point["errors_per_second"] > 0
        # Its trail: the lines `blazar why` prints.
        trail = await client.get("/api/ui/trail/ui-test-1", headers=bearer(ADMIN_KEY))
        body = await trail.json()
        assert body["record"]["id"] == "ui-test-1"
        assert body["trail"][0].startswith("trace ui-test-1")
        assert any("asked for 'ghost': not resolved" in line for line in body["trail"])
        assert any("status 404" in line for line in body["trail"])
        missing = await client.get("/api/ui/trail/never", headers=bearer(ADMIN_KEY))
        assert missing.status == 404 and "no trace 'never'" in (await missing.json())["error"]
        resp.close()

    run(tmp_path, test)


def test_a_subscriber_that_falls_behind_is_dropped_and_its_stream_ends() -> None:
    async def test() -> None:
        bus = events.EventBus(lambda: None)
        slow = bus.subscribe({"scope": "admin"}, True, lambda name, aliases: True)
        for n in range(events.QUEUE + 5):
            bus.publish("request", {"n": n}, admin=True)
        assert slow not in bus.subscribers
        assert await slow.queue.get() is None  # what waited was dropped; then the end
        other = bus.subscribe({"scope": "inference"}, False, lambda name, aliases: True)
        bus.publish("request", {"n": 1}, admin=True)  # admin only: not for this one
        bus.close()
        got = [await other.queue.get() for _ in range(other.queue.qsize())]
        assert got[-1] is None and not any(e and b"event: request" in e for e in got)
        assert bus.subscribe({}, True, lambda n, a: True).queue.get_nowait() is None

    asyncio.run(test())


# -- the log tail ---------------------------------------------------------------------------


def test_the_log_tail_follows_a_listed_log_and_refuses_every_other_path(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "tiny-0.log"
    log.write_text("".join(f"line {n}\n" for n in range(3)))
    (logs / "audit.jsonl").write_text('{"key": "ops"}\n')
    secret = tmp_path / "secret.log"
    secret.write_text("not for you\n")
    (logs / "evil.log").symlink_to(secret)
    (logs / "sub.log").mkdir()
    (tmp_path / "outside.log").write_text("outside\n")

    async def test(client: TestClient[Any, Any]) -> None:
        admin = bearer(ADMIN_KEY)
        listed = await (await client.get("/api/ui/logs", headers=admin)).json()
        assert [row["name"] for row in listed["logs"]] == ["tiny-0.log"]
        for name in (
            "evil.log",
            "audit.jsonl",
            "sub.log",
            "..%2Foutside.log",
            "%2E%2E%2Foutside.log",
            "..%2F..%2Fsecret.log",
            str(secret).replace("/", "%2F"),
            "tiny-0.log%00",
            "nope.log",
        ):
            resp = await client.get(f"/api/ui/logs/{name}", headers=admin)
            assert resp.status == 404, name
            assert "GET /api/ui/logs lists" in (await resp.json())["error"], name
        resp = await client.get("/api/ui/logs/tiny-0.log", headers=admin)
        assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
        stream = read_events(resp)
        first = await until(stream, lambda name, _: name == "lines")
        assert first[-1][1]["lines"] == ["line 0", "line 1", "line 2"]
        with log.open("a") as fh:
            fh.write("line 3\n")
        later = await until(stream, lambda name, _: name == "lines")
        assert later[-1][1]["lines"] == ["line 3"]
        os.replace(log, logs / "tiny-0.log.1")  # rotated, as children.LogFile does
        log.write_text("fresh 0\n")
        rotated = await until(stream, lambda name, _: name == "lines")
        assert rotated[-1][1]["lines"] == ["fresh 0"]
        resp.close()

    run(tmp_path, test)


def test_the_log_listing_and_pick_are_confined_to_the_folder(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    assert log_tail.listing(logs) == []  # no folder yet: nothing, not an error
    logs.mkdir()
    (logs / "a-0.log").write_text("x\n")
    assert log_tail.pick(logs, "a-0.log") == logs / "a-0.log"
    for name in ("../a-0.log", "/etc/passwd", "a-0.log/..", "", ".", ".."):
        with pytest.raises(NotFound):
            log_tail.pick(logs, name)


# -- the series ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "share", "expected"),
    [
        ([], 0.5, None),
        ([7.0], 0.95, 7.0),
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.0),
        ([1.0, 2.0, 3.0, 4.0], 0.95, 4.0),
        ([5.0, 1.0, 3.0], 0.5, 3.0),
        ([float(n) for n in range(1, 101)], 0.95, 95.0),
    ],
)
def test_percentiles_are_nearest_rank(values: list[float], share: float, expected: float) -> None:
    assert series.percentile(values, share) == expected


def test_a_point_sums_up_the_requests_of_its_interval() -> None:
    done = series.Interval()
    records = [
        {
            "status": 200,
            "ttft_ms": 10.0,
            "tokens_per_second": 100.0,
            "prompt_tokens": 40,
            "cached_tokens": 30,
            "generated_tokens": 8,
            "response_cache": {"result": "hit-exact", "tier": "exact"},
        },
        {
            "status": 200,
            "ttft_ms": 30.0,
            "tokens_per_second": 300.0,
            "prompt_tokens": 60,
            "cached_tokens": 0,
            "generated_tokens": 12,
            "response_cache": {"result": "miss", "tier": None},
        },
        {
            "status": 404,
            "ttft_ms": None,
            "tokens_per_second": None,
            "prompt_tokens": None,
            "cached_tokens": None,
            "generated_tokens": None,
            "response_cache": {"result": "bypass (off)", "tier": None},  # not a lookup
        },
    ]
    for record in records:
        done.add(record)
    point = series.point(
        100.0, 2.0, done, queue_depth=3, in_flight=1, memory_bytes=5, gateway_bytes=7
    )
    assert point == {
        "t": 100.0,
        "requests_per_second": 1.5,
        "errors_per_second": 0.5,
        "ttft_p50_ms": 10.0,
        "ttft_p95_ms": 30.0,
        "decode_tokens_per_second": 200.0,
        "generated_tokens_per_second": 10.0,
        "cache_hit_ratio": 0.3,
        "response_cache_hit_ratio": 0.5,
        "queue_depth": 3,
        "in_flight": 1,
        "memory_bytes": 5,
        "gateway_memory_bytes": 7,
    }
    empty = series.point(
        1.0,
        2.0,
        series.Interval(),
        queue_depth=0,
        in_flight=0,
        memory_bytes=None,
        gateway_bytes=None,
    )
    assert empty["requests_per_second"] == 0 and empty["ttft_p50_ms"] is None
    assert empty["cache_hit_ratio"] is None and empty["response_cache_hit_ratio"] is None


def test_the_series_keeps_one_hour() -> None:
    kept = series.Series(every=2.0, window=10.0)
    for t in range(8):
        kept.add({"t": t})
    assert [p["t"] for p in kept.view()["points"]] == [3, 4, 5, 6, 7]
    assert series.Series().points.maxlen == 1800
    assert series.rss_bytes(os.getpid()) and series.rss_bytes(None) is None


# -- pinning in the manifest ---------------------------------------------------------------


def test_set_pin_edits_only_the_models_pin_and_refuses_an_undeclared_model(
    tmp_path: Path,
) -> None:
    path = tmp_path / "blazar.toml"
    text = (
        '# my models\n[models.tiny]\nsource = "file:///m/tiny.gguf"  # the small one\n'
        'aliases = ["mini"]\n\n[models.other]\nsource = "file:///m/other.gguf"\n'
    )
    path.write_text(text)
    assert manifest_ops.set_pin(path, "mini", True) is True  # an alias names its model
    pinned = path.read_text()
    assert pinned.startswith("# my models\n") and "# the small one" in pinned
    assert pinned.index("pin = true") < pinned.index("[models.other]")
    assert manifest_ops.set_pin(path, "tiny:latest", True) is False  # already pinned
    assert manifest_ops.set_pin(path, "tiny", False) is True
    assert path.read_text() == text
    with pytest.raises(Conflict, match="served but not declared"):
        manifest_ops.set_pin(path, "held-only", True)
    assert path.read_text() == text


def test_a_childs_log_lines_reach_the_file_within_half_a_second(tmp_path: Path) -> None:
    """The log tail reads the file: lines the buffered writer holds back must not wait for
    the child's next line (the last line of a request would wait for the next request)."""

    async def test() -> None:
        log = LogFile(tmp_path / "a-0.log", max_bytes=1 << 20, backups=1)
        log.write("first")  # flushed: nothing was flushed for FLUSH_EVERY
        log.write("second")  # held back
        assert (tmp_path / "a-0.log").read_text() == "first\n"
        await asyncio.sleep(LogFile.FLUSH_EVERY + 0.2)
        assert (tmp_path / "a-0.log").read_text() == "first\nsecond\n"
        log.close()

    asyncio.run(test())


def test_a_browser_test_without_its_browser_fails_saying_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BLAZAR_CHROMIUM", "/nonexistent/chromium-headless-shell")
    with pytest.raises(pytest.fail.Exception) as failed:
        browser.executable()
    message = str(failed.value)
    assert "no headless Chromium at /nonexistent/chromium-headless-shell" in message
    assert "make test-ui" in message and "apt-get install -y chromium-headless-shell" in message
