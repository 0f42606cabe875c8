"""Access control on a live `blazar serve`, tried with the official clients and as an attacker.

One serve with keys carries most checks (a start costs seconds): 401 in each
protocol's shape, 403 for a scope, 404 and filtered listings for a key's
unlisted model, 429 with Retry-After, key management over HTTP and from the
CLI with hot reload, 409 on the last key, CORS, foreign Origin and Host, server
paths and uploads over the API, slow clients cut off while others are served,
connections per client, and the audit log; at the end the whole BLAZAR_HOME,
the manifest's folder and serve's output hold none of the keys used. Serving
with no key, binding beyond loopback and TLS have their own serves.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import socket
import tempfile
import threading
import time
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

from blazar.testing.tiny import is_tiny_text
from tests.conftest import run_blazar
from tests.fixtures import ENGINE, model_block, write_manifest, write_models
from tests.serving import Served
from tests.waiting import wait_until

HI = [{"role": "user", "content": "hello"}]
LIMIT = 24  # serving.max_connections_per_client: room for the clients' own pools too
SECRETS: dict[str, str] = {
    "ops": "plm_ops-" + "a" * 40,
    "app": "plm_app-" + "b" * 40,
    "slow": "plm_slow-" + "c" * 40,
}


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def key_block(name: str, secret: str, **fields: object) -> str:
    lines = [f"[keys.{name}]", f'sha256 = "{sha(secret)}"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in fields.items()]
    return "\n".join(lines) + "\n\n"


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    return {
        **write_models(tmp_path / "models", "tiny", "other", "made"),
        **write_models(tmp_path / "imports", "imported"),
    }


# -- keys, scopes, models, rates --------------------------------------------------------


def check_401_shapes(url: str) -> None:
    for key in (None, "plm_wrong"):
        headers = bearer(key) if key else {}
        oai = openai.OpenAI(base_url=f"{url}/v1", api_key=key or "x", max_retries=0)
        if key:
            with pytest.raises(openai.AuthenticationError) as refused:
                oai.models.list()
            assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
        raw = httpx.post(f"{url}/v1/chat/completions", headers=headers, json={"model": "tiny"})
        assert raw.status_code == 401
        assert raw.json()["error"]["type"] == "invalid_request_error"
        assert raw.json()["error"]["code"] == "invalid_api_key"
        raw = httpx.post(f"{url}/api/chat", headers=headers, json={"model": "tiny"})
        assert raw.status_code == 401 and isinstance(raw.json()["error"], str)
        raw = httpx.post(f"{url}/v1/messages", headers={"x-api-key": key or ""}, json={})
        assert raw.status_code == 401
        assert raw.json()["type"] == "error"
        assert raw.json()["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError) as refused_a:
        anthropic.Anthropic(base_url=url, api_key="plm_wrong", max_retries=0).messages.create(
            model="tiny", max_tokens=4, messages=HI
        )
    assert refused_a.value.status_code == 401
    with pytest.raises(ollama.ResponseError) as refused_o:
        ollama.Client(host=url).list()
    assert refused_o.value.status_code == 401 and "API key" in refused_o.value.error
    assert httpx.get(f"{url}/health").status_code == 200  # probes need no key
    assert httpx.head(f"{url}/").status_code == 200
    assert httpx.get(f"{url}/").status_code == 401


def check_models_and_listings(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ops = openai.OpenAI(base_url=f"{url}/v1", api_key=SECRETS["ops"], max_retries=0)
    app = openai.OpenAI(base_url=f"{url}/v1", api_key=SECRETS["app"], max_retries=0)
    # The admin key loads `other`; the app key, limited to `tiny`, must not learn of it.
    ops.completions.create(model="other", prompt="a", max_tokens=2)
    chat = app.chat.completions.create(model="tiny", messages=HI, max_tokens=4)
    assert is_tiny_text(chat.choices[0].message.content or "", allow=())
    with pytest.raises(openai.NotFoundError) as hidden:
        app.completions.create(model="other", prompt="a", max_tokens=2)
    with pytest.raises(openai.NotFoundError) as absent:
        app.completions.create(model="nope", prompt="a", max_tokens=2)
    assert str(hidden.value).replace("other", "X") == str(absent.value).replace("nope", "X")
    assert "models served here: tiny." in str(hidden.value)
    assert sorted(m.id for m in app.models.list()) == ["mini", "tiny"]
    assert sorted(m.id for m in ops.models.list()) == ["mini", "other", "tiny"]
    anth = anthropic.Anthropic(base_url=url, api_key=SECRETS["app"], max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        anth.messages.create(model="other", max_tokens=4, messages=HI)
    reply = anth.messages.create(model="mini", max_tokens=4, messages=HI)
    assert reply.content
    monkeypatch.setenv("OLLAMA_API_KEY", SECRETS["app"])  # how ollama's client sends a key
    olla = ollama.Client(host=url)
    assert sorted(m.model for m in olla.list().models) == ["mini:latest", "tiny:latest"]
    assert [m.model for m in olla.ps().models] == ["tiny:latest"]
    with pytest.raises(ollama.ResponseError) as shown:
        olla.show("other")
    assert shown.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as generated:
        olla.generate(model="other", prompt="a", options={"num_predict": 1})
    assert generated.value.status_code == 404
    assert "models served here: tiny." in generated.value.error
    monkeypatch.setenv("OLLAMA_API_KEY", SECRETS["ops"])
    assert sorted(m.model for m in ollama.Client(host=url).ps().models) == [
        "other:latest",
        "tiny:latest",
    ]
    monkeypatch.delenv("OLLAMA_API_KEY")


def check_scopes(url: str) -> None:
    app = ollama.Client(host=url, headers=bearer(SECRETS["app"]))
    for call in (
        lambda: app.pull("tiny", stream=False),
        lambda: app.delete("tiny"),
        lambda: app.copy("tiny", "tiny2"),
    ):
        with pytest.raises(ollama.ResponseError) as refused:
            call()
        assert refused.value.status_code == 403 and "scope inference" in refused.value.error
    for method, path in (
        ("GET", "/api/keys"),
        ("POST", "/api/blazar/stop"),
        ("GET", "/api/blazar/ps"),
    ):
        answer = httpx.request(method, url + path, headers=bearer(SECRETS["app"]), json={})
        assert answer.status_code == 403, (path, answer.text)
    # An admin key may do what it needs: `blazar ps` reads /api/blazar/ps with it.
    shown = run_blazar("ps", "--url", url, env={"BLAZAR_API_KEY": SECRETS["ops"]})
    assert shown.returncode == 0 and "tiny" in shown.stdout
    # With no key: the local operator (serve's token, tests/test_operator_token.py) gets
    # in; a CLI elsewhere (another home: no serve.json, no token) is refused.
    assert run_blazar("ps", "--url", url).returncode == 0
    with tempfile.TemporaryDirectory() as elsewhere:
        assert run_blazar("ps", "--url", url, env={"BLAZAR_HOME": elsewhere}).returncode == 1


def check_rate_limit(url: str) -> None:
    slow = openai.OpenAI(base_url=f"{url}/v1", api_key=SECRETS["slow"], max_retries=0)
    slow.models.list()
    slow.models.list()
    with pytest.raises(openai.RateLimitError) as limited:
        slow.models.list()
    retry_after = int(limited.value.response.headers["retry-after"])
    assert 1 <= retry_after <= 30  # rpm 2: a request every 30 s
    assert limited.value.code == "rate_limit_exceeded"
    openai.OpenAI(base_url=f"{url}/v1", api_key=SECRETS["app"], max_retries=0).models.list()


def check_key_management(url: str, manifest: Path, made: list[str]) -> None:
    """Over HTTP and from the CLI; each change takes effect without a restart."""
    ops = bearer(SECRETS["ops"])
    listed = httpx.get(f"{url}/api/keys", headers=ops).json()["keys"]
    assert [k["name"] for k in listed] == ["app", "ops", "slow"]
    assert {k["scope"] for k in listed} == {"admin", "inference"}
    assert all(secret not in json.dumps(listed) for secret in SECRETS.values())
    assert all(sha(secret) not in json.dumps(listed) for secret in SECRETS.values())
    added = httpx.post(f"{url}/api/keys", headers=ops, json={"name": "web", "models": ["tiny"]})
    assert added.status_code == 201, added.text
    web_key = added.json()["key"]
    made.append(web_key)
    assert web_key.startswith("plm_") and len(web_key) >= 4 + 43
    assert sha(web_key) in manifest.read_text() and web_key not in manifest.read_text()
    assert httpx.get(f"{url}/v1/models", headers=bearer(web_key)).status_code == 200  # at once
    assert httpx.post(f"{url}/api/keys", headers=ops, json={"name": "web"}).status_code == 409
    assert httpx.delete(f"{url}/api/keys/web", headers=ops).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers=bearer(web_key)).status_code == 401
    # The CLI edits the manifest serve watches; the control loop picks the change up.
    added_cli = run_blazar("keys", "add", "cli", "--rpm", "100", "--manifest", str(manifest))
    assert added_cli.returncode == 0, added_cli.stderr
    cli_key = added_cli.stdout.strip()
    made.append(cli_key)
    assert cli_key.startswith("plm_") and "\n" not in cli_key and "declared" in added_cli.stderr

    def cli_key_answer() -> int:
        return httpx.get(f"{url}/v1/models", headers=bearer(cli_key)).status_code

    wait_until(lambda: cli_key_answer() == 200, "a key added by `blazar keys add` is accepted")
    assert run_blazar("keys", "rm", "cli", "--manifest", str(manifest)).returncode == 0
    # 401, not any refusal: polling the key must not pass on its own rate limit (429)
    wait_until(lambda: cli_key_answer() == 401, "a key removed by `blazar keys rm` is refused")
    listing = run_blazar("keys", "list", "--json", "--manifest", str(manifest))
    rows = [json.loads(line) for line in listing.stdout.splitlines()]
    assert [r["name"] for r in rows] == ["app", "ops", "slow"]
    # The last key is never removed over HTTP: the gateway would go authless.
    for name in ("app", "slow"):
        assert httpx.delete(f"{url}/api/keys/{name}", headers=ops).status_code == 200
    last = httpx.delete(f"{url}/api/keys/ops", headers=ops)
    assert last.status_code == 409 and "refuses to go authless" in last.json()["error"]
    refused = run_blazar("keys", "rm", "ops", "--manifest", str(manifest))
    assert refused.returncode == 1 and "refuses to go authless" in refused.stderr
    assert httpx.get(f"{url}/api/keys", headers=ops).json()["keys"][0]["name"] == "ops"


# -- browsers and strangers ---------------------------------------------------------------


def check_cors_origin_and_host(url: str) -> None:
    ops = bearer(SECRETS["ops"])
    asks = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
    }
    allowed = httpx.options(
        f"{url}/v1/chat/completions", headers={"Origin": "https://app.example", **asks}
    )
    assert allowed.status_code == 204  # no key: browsers never send one on a preflight
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    granted = {h.strip() for h in allowed.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "x-api-key", "anthropic-version"} <= granted
    assert "x-stainless-os" in granted and "POST" in allowed.headers["access-control-allow-methods"]
    refused = httpx.options(
        f"{url}/v1/chat/completions", headers={"Origin": "https://evil.example", **asks}
    )
    assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
    # The request that follows a preflight is checked as usual, and says who may read it.
    listed = httpx.get(f"{url}/v1/models", headers={"Origin": "https://app.example", **ops})
    assert listed.headers["access-control-allow-origin"] == "https://app.example"
    body = {"model": "tiny", "messages": HI, "max_tokens": 3, "stream": True}
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        json=body,
        headers={"Origin": "http://localhost:5173", **ops},
    ) as streamed:
        assert streamed.headers["access-control-allow-origin"] == "http://localhost:5173"
        assert "[DONE]" in streamed.read().decode()
    assert (
        httpx.get(f"{url}/v1/models", headers={"Origin": "https://app.example"}).status_code == 401
    )
    # A page elsewhere cannot drive the gateway through the user's browser, key or not.
    foreign = httpx.post(
        f"{url}/api/delete",
        json={"model": "tiny"},
        headers={"Origin": "https://evil.example", **ops},
    )
    assert foreign.status_code == 403 and "evil.example" in foreign.json()["error"]
    rebound = httpx.get(f"{url}/v1/models", headers={"Host": "evil.example:11435", **ops})
    assert rebound.status_code == 403 and "allowed_hosts" in rebound.json()["error"]["message"]
    assert httpx.get(f"{url}/v1/models", headers={"Host": "box.lan", **ops}).status_code == 200


def check_server_paths(url: str, tmp_path: Path, models: dict[str, Path]) -> None:
    ops = ollama.Client(host=url, headers=bearer(SECRETS["ops"]))
    passwd = Path("/etc/passwd").read_bytes()
    answers = []
    for path in ("/etc/passwd", "/etc/shadow", "/etc/no-such-file", str(models["other"])):
        with pytest.raises(ollama.ResponseError) as refused:
            ops.create(model="stolen", from_=path)
        assert refused.value.status_code == 403
        answers.append(refused.value.error.replace(path, "PATH"))
        assert "root:" not in refused.value.error
        assert hashlib.sha256(passwd).hexdigest() not in refused.value.error
    assert len(set(answers)) == 1  # existing or not, readable or not: the same answer
    with pytest.raises(ollama.ResponseError) as pulled:
        ops.pull("file:///etc/passwd", stream=False)
    assert pulled.value.status_code == 403
    assert "stolen" not in [m.model.split(":")[0] for m in ops.list().models]
    # serving.import_roots is where the API may read; the upload is the other way in.
    ops.create(model="imported", from_=str(models["imported"]))
    assert "imported:latest" in [m.model for m in ops.list().models]


def check_uploads(url: str, paths_cache: Path, models: dict[str, Path]) -> None:
    ops = ollama.Client(host=url, headers=bearer(SECRETS["ops"]))
    junk = paths_cache.parent / "junk.bin"
    junk.write_bytes(os.urandom(2 * 1024**2))
    with pytest.raises(ollama.ResponseError) as refused:
        ops.create_blob(junk)
    assert refused.value.status_code == 400 and "not a GGUF" in refused.value.error
    assert str(paths_cache) not in refused.value.error
    blobs = paths_cache / "blobs"
    assert not blobs.exists() or list(blobs.iterdir()) == []  # not kept, not even in part
    digest = ops.create_blob(models["made"])
    assert (blobs / digest.replace(":", "-")).is_file()
    ops.create(model="made", files={"made.gguf": digest})
    made = ops.generate(model="made", prompt="a", options={"num_predict": 3})
    assert is_tiny_text(made.response, allow=())


def check_slow_clients(url: str) -> None:
    """A client that never finishes its headers, or its body, is cut off; others go on."""
    port = int(url.rsplit(":", 1)[1])
    heads = socket.create_connection(("127.0.0.1", port))
    heads.sendall(b"POST /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    body = socket.create_connection(("127.0.0.1", port))
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {SECRETS['ops']}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    body.sendall(head.encode() + b'{"model":')
    started = time.monotonic()
    stop = threading.Event()

    def trickle() -> None:  # one more header byte every half second: never a whole head
        while not stop.is_set():
            try:
                heads.sendall(b"X")
            except OSError:
                return
            stop.wait(0.5)  # the attacker's pace, not a wait for serve

    threading.Thread(target=trickle, daemon=True).start()
    ops = openai.OpenAI(base_url=f"{url}/v1", api_key=SECRETS["ops"], max_retries=0)
    served = 0
    while time.monotonic() - started < 1.5:  # while both hang there, others are served
        assert ops.models.list().data
        served += 1
    assert served >= 3
    heads.settimeout(20)
    assert heads.recv(1024) == b""  # closed by serve
    cut = time.monotonic() - started
    stop.set()
    assert 1.5 < cut < 15, cut  # serving.header_timeout = 2s
    body.settimeout(20)
    answer = body.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408"), answer  # serving.body_timeout = 3s
    assert b"body_timeout" in answer
    heads.close()
    body.close()


def check_connections_per_client(url: str) -> None:
    port = int(url.rsplit(":", 1)[1])
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(LIMIT + 16)]

    def answered() -> int:  # how many of them serve wrote to (its 503) or closed
        return len(select.select(held, [], [], 0)[0])

    wait_until(lambda: answered() >= 16, "serve turns away the connections over its limit")
    refused = 0
    for sock in held:
        sock.setblocking(False)
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            continue
        assert data.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in data
        refused += 1
    assert refused >= 16  # none of them sent a byte: more than the limit are turned away
    for sock in held:
        sock.close()
    ops = bearer(SECRETS["ops"])
    wait_until(
        lambda: httpx.get(f"{url}/v1/models", headers=ops).status_code == 200,
        "a client is served again once it closed its connections",
    )


# -- the test ------------------------------------------------------------------------


@pytest.mark.parametrize("relay", [True, False], ids=["relay", "interpreted"])
def test_keys_and_a_hardened_gateway_with_the_official_clients(
    tmp_path: Path,
    blazar_home: Path,
    models: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    relay: bool,
) -> None:
    monkeypatch.delenv("OLLAMA_API_KEY", raising=False)
    serving = {
        "relay": relay,  # both lanes (issue 30): the relay runs the same access checks
        "cors_origins": ["https://app.example"],
        "allowed_hosts": ["box.lan"],
        "import_roots": [str(tmp_path / "imports")],
        "audit_log": True,
        "header_timeout": "2s",
        "body_timeout": "3s",
        "max_connections_per_client": LIMIT,
    }
    text = "[serving]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in serving.items())
    text += "\n" + ENGINE + model_block("tiny", models["tiny"], aliases=["mini"])
    text += model_block("other", models["other"])
    text += key_block("ops", SECRETS["ops"], scope="admin")
    text += key_block("app", SECRETS["app"], models=["mini"], description="the web app")
    text += key_block("slow", SECRETS["slow"], rpm=2)
    manifest = write_manifest(tmp_path, text)
    made: list[str] = []
    with Served(manifest, blazar_home) as served:
        url = served.url
        check_401_shapes(url)
        check_models_and_listings(url, monkeypatch)
        check_scopes(url)
        check_rate_limit(url)
        check_cors_origin_and_host(url)
        check_server_paths(url, tmp_path, models)
        check_uploads(url, blazar_home / "cache", models)
        check_slow_clients(url)
        check_connections_per_client(url)
        check_key_management(url, manifest, made)
        log = served.log
    audit = [json.loads(line) for line in (blazar_home / "state" / "logs" / "audit.jsonl").open()]
    assert {"refused", "admin"} <= {a["event"] for a in audit}
    assert any(
        a["status"] == 401 and a["key"] is None and a["client"] == "127.0.0.1" for a in audit
    )
    assert any(
        a["event"] == "admin" and a["key"] == "ops" and a["path"] == "/api/create" for a in audit
    )
    assert any(a["status"] == 403 and a["key"] == "app" and a["outcome"] == "scope" for a in audit)
    # Used all along, never written down: not in any file, not in serve's output.
    secrets = [*SECRETS.values(), *made, "plm_wrong"]
    for path in tmp_path.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            for secret in secrets:
                assert secret.encode() not in data, f"{secret[:8]}... found in {path}"
    assert not any(secret in log for secret in secrets)
    assert "Authorization" not in log and "Bearer" not in log


# -- no key, beyond loopback ---------------------------------------------------------------


def test_without_keys_key_management_is_refused_and_exposure_needs_consent(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path]
) -> None:
    manifest = write_manifest(tmp_path, ENGINE + model_block("tiny", models["tiny"]))
    with Served(manifest, blazar_home) as served:
        for method in ("GET", "POST"):
            answer = httpx.request(method, f"{served.url}/api/keys", json={"name": "x"})
            assert answer.status_code == 403
            assert "needs at least one key first (`blazar keys add" in answer.json()["error"]
        assert httpx.delete(f"{served.url}/api/keys/x").status_code == 403
        assert httpx.get(f"{served.url}/v1/models").status_code == 200  # no key needed
        foreign = httpx.get(f"{served.url}/v1/models", headers={"Origin": "https://evil.example"})
        assert foreign.status_code == 403
    # Beyond loopback with no key: refused before anything listens.
    exposed = run_blazar("serve", str(manifest), "--host", "0.0.0.0", "--port", "1")
    assert exposed.returncode == 1
    assert "refusing to serve on 0.0.0.0 with no API key" in exposed.stderr
    assert "blazar keys add" in exposed.stderr and "allow_unauthenticated" in exposed.stderr
