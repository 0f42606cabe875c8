"""Two real `blazar serve` processes on loopback, A keyed and B naming A as a remote, and a
plain llama-server (Blazar's launcher) as an OpenAI-only remote of B.

One setup carries the checks (each serve costs seconds to start): B lists A's models and
serves them with A's key from its environment, on the three protocols and streamed,
forwarded in the client's own protocol; the llama-server's model through Blazar's
translators; a saturated B and a B whose instance fails to start spill over to A; one
`x-request-id` shows on both hosts' `why`; `/api/failover` and `blazar remotes` show A up,
drained, back, then down within seconds of A being killed, and a request for A's model
then fails at once with the protocol's error.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

from blazar.engines import launchers
from blazar.testing.ports import free_port
from blazar.testing.tiny import is_tiny_text, write_tiny_model
from tests.conftest import run_blazar
from tests.fixtures import ENGINE, model_block
from tests.serving import Served

LAUNCHER = launchers.LLAMA
B_KEY = "plm_b-host-" + "k" * 40  # what B sends to A (A_KEY in B's environment)
A_ADMIN = "plm_a-admin-" + "z" * 40
HI = [{"role": "user", "content": "hello"}]


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def eventually(check: Callable[[], bool], what: str, seconds: float = 20) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < seconds, f"not within {seconds} s: {what}"
        time.sleep(0.1)
    return time.monotonic() - started


class Plain:
    """llama-server (the launcher on xllamacpp) serving one model: an OpenAI-only server."""

    def __init__(self, model: Path, alias: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [
            sys.executable,
            str(LAUNCHER),
            "--model",
            str(model),
            "--alias",
            alias,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-c",
            "2048",
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self) -> Plain:
        def up() -> bool:
            assert self.proc.poll() is None, "llama-server exited"
            try:
                return httpx.get(self.url + "/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        eventually(up, "llama-server answers /health", 60)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def fleet(tmp_path: Path, blazar_home: Path) -> Iterator[tuple[Served, Served, Plain]]:
    src = tmp_path / "models"
    src.mkdir()
    tiny = write_tiny_model(src / "tiny.gguf")
    local = write_tiny_model(src / "local.gguf", seed=4)
    lonely = write_tiny_model(src / "lonely.gguf", seed=6)
    a_text = ENGINE + model_block("tiny", tiny) + model_block("local", local)
    a_text += model_block("broken", local)
    a_text += f'[keys.b-host]\nsha256 = "{sha(B_KEY)}"\n\n'
    a_text += f'[keys.admin]\nsha256 = "{sha(A_ADMIN)}"\nscope = "admin"\n\n'
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "blazar.toml").write_text(a_text)
    a = Served(tmp_path / "a" / "blazar.toml", blazar_home)
    with Plain(lonely, "lonely") as plain, a:
        b_text = "[serving]\nmax_queue = 0\n\n" + ENGINE
        b_text += model_block("local", local, slots=1, failover=["a"])
        b_text += model_block("broken", local, args=["--no-such-flag"], failover=["a"])
        b_text += (
            f'[remotes.a]\nurl = "{a.url}"\nkey_env = "A_KEY"\ntimeout = "2s"\n'
            'health_interval = "0.5s"\n\n'
            f'[remotes.plain]\nurl = "{plain.url}/v1"\nhealth_interval = "0.5s"\n'
        )
        (tmp_path / "b").mkdir()
        (tmp_path / "b" / "blazar.toml").write_text(b_text)
        home_b = tmp_path / "home-b"
        env = {"BLAZAR_HOME": str(home_b), "A_KEY": B_KEY}
        with Served(tmp_path / "b" / "blazar.toml", home_b, env=env) as b:
            yield a, b, plain


def failover_view(b: Served) -> dict[str, dict[str, object]]:
    return {r["name"]: r for r in httpx.get(b.url + "/api/failover").json()["remotes"]}


def why(served: Served, trace: str, key: str | None = None) -> dict[str, object]:
    env = {"BLAZAR_API_KEY": key} if key else {}
    done = run_blazar("why", trace, "--json", "--url", served.url, env=env)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_two_hosts_forward_fail_over_and_notice_a_remote_going_down(
    fleet: tuple[Served, Served, Plain],
) -> None:
    a, b, _ = fleet
    eventually(lambda: failover_view(b)["a"]["health"] == "up", "B sees A up")
    eventually(lambda: failover_view(b)["plain"]["health"] == "up", "B sees llama-server up")
    view = failover_view(b)
    assert view["a"]["kind"] == "blazar" and view["plain"]["kind"] == "openai"

    # -- listings: A's models and the llama-server's, marked remote; B's own stay local --
    oai = openai.OpenAI(base_url=f"{b.url}/v1", api_key="unused", max_retries=0)
    listed = {m.id: m for m in oai.models.list().data}
    assert {"tiny", "lonely", "local", "broken"} <= set(listed)
    assert listed["tiny"].model_extra == {"blazar_remote": "a"}
    assert listed["lonely"].model_extra == {"blazar_remote": "plain"}
    assert not listed["local"].model_extra
    tags = {m["name"]: m for m in httpx.get(b.url + "/api/tags").json()["models"]}
    assert tags["tiny:latest"]["remote_host"] == a.url
    ps = {r["model"]: r for r in b.ps()}
    assert ps["tiny"]["remote"] == "a" and ps["tiny"]["state"] == "up"
    shown = run_blazar("ps", "--url", b.url)
    assert "remote a" in shown.stdout and "remote plain" in shown.stdout
    # A itself does not hand out B's key-less requests
    assert httpx.get(a.url + "/v1/models").status_code == 401

    # -- A's model through B, in each protocol, forwarded as it came (A's key from B's env) --
    answer = oai.chat.completions.create(model="tiny", messages=HI, max_tokens=8)
    assert is_tiny_text(answer.choices[0].message.content or "")
    pieces = [
        c.choices[0].delta.content or ""
        for c in oai.chat.completions.create(model="tiny", messages=HI, max_tokens=8, stream=True)
        if c.choices
    ]
    assert len(pieces) > 2 and is_tiny_text("".join(pieces))
    olla = ollama.Client(host=b.url)
    assert is_tiny_text(
        olla.chat(model="tiny", messages=HI, options={"num_predict": 8}).message.content or ""
    )
    streamed = list(olla.chat(model="tiny", messages=HI, options={"num_predict": 8}, stream=True))
    assert streamed[-1].done and is_tiny_text("".join(c.message.content or "" for c in streamed))
    anth = anthropic.Anthropic(base_url=b.url, api_key="unused", max_retries=0)
    reply = anth.messages.create(model="tiny", max_tokens=8, messages=HI)
    assert reply.type == "message" and is_tiny_text(reply.content[0].text)  # type: ignore[union-attr]
    with anth.messages.stream(model="tiny", max_tokens=8, messages=HI) as events:
        assert is_tiny_text("".join(events.text_stream))
    assert olla.show("tiny").details.family == "llama"  # A's own details of its model
    stop = httpx.post(b.url + "/api/blazar/stop", json={"model": "tiny"})
    assert stop.status_code == 404 and "acts on this host's models only" in stop.text
    # forwarded in the client's protocol: A traced them on its ollama and Anthropic routes
    seen = run_blazar(
        "why",
        "--model",
        "tiny",
        "--last",
        "20",
        "--json",
        "--url",
        a.url,
        env={"BLAZAR_API_KEY": A_ADMIN},
    )
    routes = {json.loads(line)["route"] for line in seen.stdout.splitlines()}
    assert {"/v1/chat/completions", "/api/chat", "/v1/messages"} <= routes
    assert {json.loads(line)["key"] for line in seen.stdout.splitlines()} == {"b-host"}

    # -- the llama-server's model: OpenAI as it came, ollama and Anthropic translated --
    assert is_tiny_text(
        oai.chat.completions.create(model="lonely", messages=HI, max_tokens=8)
        .choices[0]
        .message.content
        or ""
    )
    assert is_tiny_text(
        olla.chat(model="lonely", messages=HI, options={"num_predict": 8}).message.content or ""
    )
    lines = list(olla.chat(model="lonely", messages=HI, options={"num_predict": 8}, stream=True))
    assert (
        lines[-1].done
        and lines[-1].eval_count
        and is_tiny_text("".join(c.message.content or "" for c in lines))
    )
    generated = olla.generate(model="lonely", prompt="hello", options={"num_predict": 8})
    assert is_tiny_text(generated.response)
    reply = anth.messages.create(model="lonely", max_tokens=8, messages=HI)
    assert reply.model == "lonely" and is_tiny_text(reply.content[0].text)  # type: ignore[union-attr]
    with anth.messages.stream(model="lonely", max_tokens=8, messages=HI) as events:
        assert is_tiny_text("".join(events.text_stream))
        assert events.get_final_message().stop_reason in ("end_turn", "max_tokens")
    responded = oai.responses.create(model="lonely", input="hello", max_output_tokens=8)
    assert is_tiny_text(responded.output_text)

    # -- one x-request-id on both hosts --
    traced = httpx.post(
        b.url + "/v1/chat/completions",
        json={"model": "tiny", "messages": HI, "max_tokens": 4},
        headers={"x-request-id": "fleet-trace-1"},
    )
    assert traced.status_code == 200 and traced.headers["x-request-id"] == "fleet-trace-1"
    on_b, on_a = why(b, "fleet-trace-1"), why(a, "fleet-trace-1", A_ADMIN)
    assert on_b["remote"] == f"a ({a.url})" and "remote model" in str(on_b["remote_reason"])
    assert on_a["model"] == "tiny" and on_a["key"] == "b-host" and on_a["status"] == 200
    trail = run_blazar("why", "fleet-trace-1", "--url", b.url).stdout
    assert f"forwarded to remote a ({a.url})" in trail

    # -- failover: a saturated B (one slot, no queue) spills over to A --
    def ask(n: int) -> httpx.Response:
        return httpx.post(
            b.url + "/api/chat",
            json={
                "model": "local",
                "messages": HI,
                "stream": False,
                "options": {"num_predict": 200},
            },
            headers={"x-request-id": f"fleet-spill-{n}"},
            timeout=60,
        )

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    assert [r.status_code for r in answers] == [200] * 8, [r.text for r in answers]
    assert all(is_tiny_text(r.json()["message"]["content"]) for r in answers)
    spilled = [n for n in range(8) if why(b, f"fleet-spill-{n}")["remote"]]
    assert spilled, "no request spilled over"
    reason = str(why(b, f"fleet-spill-{spilled[0]}")["remote_reason"])
    assert reason.startswith("failover: model 'local' is busy: all 1 slots are in use")
    assert why(a, f"fleet-spill-{spilled[0]}", A_ADMIN)["route"] == "/api/chat"
    # ... and an instance that fails to start, too
    broken = oai.chat.completions.create(model="broken", messages=HI, max_tokens=4)
    assert is_tiny_text(broken.choices[0].message.content or "")

    # -- drain and undrain (POST /api/failover, `blazar remotes drain`) --
    drained = run_blazar("remotes", "drain", "a", "--url", b.url)
    assert drained.returncode == 0 and "a: drained" in drained.stdout
    with pytest.raises(openai.APIStatusError) as refused:
        oai.chat.completions.create(model="tiny", messages=HI, max_tokens=4)
    assert refused.value.status_code == 503 and "which is drained" in refused.value.message
    assert run_blazar("remotes", "undrain", "a", "--url", b.url).returncode == 0
    listing = json.loads(run_blazar("remotes", "--json", "--url", b.url).stdout)
    assert [m["member"] for m in listing["chains"]["local"]] == ["a"]
    assert {r["name"]: r["health"] for r in listing["remotes"]} == {"a": "up", "plain": "up"}
    assert listing["remotes"][0]["forwarded"] >= 10
    human = run_blazar("remotes", "--url", b.url).stdout
    assert "local: local -> a (up)" in human

    # -- A goes away: marked down within seconds; its model then fails at once --
    a.stop()
    took = eventually(lambda: failover_view(b)["a"]["health"] == "down", "B marks A down", 10)
    assert took < 5
    started = time.monotonic()
    with pytest.raises(anthropic.APIStatusError) as down:
        anth.messages.create(model="tiny", max_tokens=8, messages=HI)
    assert time.monotonic() - started < 2  # the connect timeout: never a hang
    assert down.value.status_code == 503 and down.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    gone = httpx.post(b.url + "/api/chat", json={"model": "tiny", "messages": HI})
    assert gone.status_code == 503 and "remote 'a', which is down" in gone.json()["error"]
    # B's own model with A down: answered here (a slot is free), no failover needed
    assert oai.chat.completions.create(model="local", messages=HI, max_tokens=4).choices
    assert os.environ.get("A_KEY") is None  # the key lived only in B's environment
