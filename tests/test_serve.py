"""`blazar serve` end to end: the real engine, tiny models, the official openai client."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from blazar.testing.tiny import is_tiny_text, write_tiny_model
from tests.fixtures import ENGINE, model_block, write_manifest
from tests.serving import (
    Served,
    assert_generation_cancelled,
    processes_mentioning,
    tokens_in_progress,
    tokens_predicted,
)
from tests.waiting import wait_until


def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)


def test_openai_client_plain_and_streamed(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path]
) -> None:
    text = ENGINE + model_block("tiny", models["tiny"], aliases=["mini"])
    text += model_block("plain", models["plain"])
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        oai = client(served)
        listed = sorted(m.id for m in oai.models.list())
        assert listed == ["mini", "plain", "tiny"]
        chat = oai.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
        assert is_tiny_text(chat.choices[0].message.content or "", allow=())
        parts = []
        for chunk in oai.chat.completions.create(
            model="mini", messages=[{"role": "user", "content": "hello"}], max_tokens=8, stream=True
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        assert len(parts) >= 4 and is_tiny_text("".join(parts), allow=())
        done = oai.completions.create(model="plain", prompt="the quick", max_tokens=6)
        assert is_tiny_text(done.choices[0].text, allow=())
        streamed = "".join(
            c.choices[0].text
            for c in oai.completions.create(model="plain", prompt="a", max_tokens=6, stream=True)
            if c.choices
        )
        assert is_tiny_text(streamed, allow=())
        # A base model with no template: chat is refused, with the way out.
        with pytest.raises(openai.BadRequestError) as refused:
            oai.chat.completions.create(
                model="plain", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        assert "no chat template" in str(refused.value) and "chat_template" in str(refused.value)
        with pytest.raises(openai.NotFoundError) as missing:
            oai.completions.create(model="nope", prompt="x", max_tokens=1)
        assert missing.value.code == "model_not_found"
        response = oai.responses.create(model="tiny", input="hello", max_output_tokens=8)
        assert response.output_text
        raw = oai.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )
        assert len(raw.headers["x-request-id"]) == 32


def test_errors_in_openai_shape(tmp_path: Path, blazar_home: Path, models: dict[str, Path]) -> None:
    text = ENGINE + model_block("tiny", models["tiny"])
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        for body, status, code in [
            (b"{not json", 400, "invalid_json"),
            (b'{"prompt": "x"}', 400, "invalid_request_error"),
            (b'{"model": "tiny", "input": "x"}', 400, "invalid_request_error"),
        ]:
            path = "/v1/embeddings" if b"input" in body else "/v1/completions"
            request = urllib.request.Request(served.url + path, data=body)
            with pytest.raises(urllib.error.HTTPError) as error:
                urllib.request.urlopen(request, timeout=10)
            assert error.value.code == status
            assert error.value.headers["x-request-id"]
            assert json.load(error.value)["error"]["code"] == code


def test_embeddings_model(tmp_path: Path, blazar_home: Path, models: dict[str, Path]) -> None:
    text = ENGINE + model_block("embed", models["tiny"], embeddings=True, pooling="mean")
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        vectors = client(served).embeddings.create(model="embed", input=["a fox", "the moon"])
        assert [len(v.embedding) for v in vectors.data] == [64, 64]
        assert vectors.data[0].embedding != vectors.data[1].embedding


def test_max_loaded_models_evicts_lru_and_never_a_pin(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path]
) -> None:
    # No min_residency (each load evicts the model loaded just before), and a short wait
    # for room: the last load finds only a pin, waits for room, then gets its 503.
    text = '[serving]\nmax_loaded_models = 1\nmin_residency = "0s"\nqueue_timeout = "2s"\n\n'
    text += ENGINE + model_block("tiny", models["tiny"]) + model_block("other", models["other"])
    text += model_block("plain", models["plain"], pin=True)
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        oai = client(served)
        oai.completions.create(model="tiny", prompt="a", max_tokens=2)
        assert [r["model"] for r in served.ps()] == ["tiny"]
        oai.completions.create(model="other", prompt="a", max_tokens=2)
        assert [r["model"] for r in served.ps()] == ["other"]  # tiny was evicted
        oai.completions.create(model="plain", prompt="a", max_tokens=2)
        assert [r["model"] for r in served.ps()] == ["plain"]
        with pytest.raises(openai.APIStatusError) as full:
            oai.completions.create(model="tiny", prompt="a", max_tokens=2)
        assert full.value.status_code == 503 and "pinned" in str(full.value)
        assert [r["model"] for r in served.ps()] == ["plain"]  # the pin stayed


def test_keep_alive_expiry_unloads(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path]
) -> None:
    """keep_alive 0 unloads after the request; 1 s unloads a second after it.

    Deterministic on a loaded machine: each model is observed on its own, so no child's
    start eats into the other's keep-alive (the race this replaced: 'tiny' expired while
    'now' was starting). The one timed observation, a ps right after a request, is
    judged against the time it took.
    """
    text = ENGINE + model_block("tiny", models["tiny"], keep_alive="1s")
    text += model_block("now", models["other"], keep_alive="0")
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        oai = client(served)

        def loaded(model: str) -> list[dict[str, Any]]:
            return [r for r in served.ps() if r["model"] == model]

        def wait_until_unloaded(model: str, why: str) -> None:
            deadline = time.monotonic() + 10  # far below the default keep_alive (5 min)
            while loaded(model):
                assert time.monotonic() < deadline, why
                time.sleep(0.05)

        oai.completions.create(model="now", prompt="a", max_tokens=2)
        wait_until_unloaded("now", "keep_alive 0 did not unload 'now' after its request")

        sent = time.monotonic()
        oai.completions.create(model="tiny", prompt="a", max_tokens=2)
        rows = loaded("tiny")
        elapsed = time.monotonic() - sent
        # The expiry was set (request end + 1 s) and ps taken within `elapsed`, so:
        if elapsed < 1:
            [row] = rows
            assert 1 - elapsed <= row["keep_alive_remaining"] <= 1, (row, elapsed)
        else:  # too slow a machine to see it loaded for sure; still never past 1 s
            assert all(0 <= r["keep_alive_remaining"] <= 1 for r in rows), (rows, elapsed)
        wait_until_unloaded("tiny", "keep_alive 1s did not unload 'tiny'")
        assert served.ps() == []


async def _concurrent(
    url: str, n: int, body: dict[str, object], headers: dict[str, str] | None = None
) -> list[tuple[int, dict[str, str], bytes]]:
    async with aiohttp.ClientSession() as session:

        async def one() -> tuple[int, dict[str, str], bytes]:
            async with session.post(url, json=body, headers=headers or {}) as resp:
                return resp.status, dict(resp.headers), await resp.read()

        return await asyncio.gather(*(one() for _ in range(n)))


def test_replicas_share_load(tmp_path: Path, blazar_home: Path, models: dict[str, Path]) -> None:
    text = ENGINE + model_block("tiny", models["tiny"], replicas=2, slots=1)
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        deadline = time.monotonic() + 30
        while len([r for r in served.ps() if r["state"] == "ready"]) < 2:
            assert time.monotonic() < deadline, served.ps()
            time.sleep(0.1)  # warm replicas come up without any request
        body = {"model": "tiny", "prompt": "a", "max_tokens": 64}
        results = asyncio.run(_concurrent(f"{served.url}/v1/completions", 8, body))
        assert [status for status, _, _ in results] == [200] * 8
        ports = [r["port"] for r in served.ps()]
        assert all(tokens_predicted(port) > 0 for port in ports)  # both replicas served some


def test_saturation_gives_only_200_and_503_with_retry_after(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path]
) -> None:
    text = '[serving]\nmax_queue = 2\nqueue_timeout = "1s"\n\n' + ENGINE
    text += model_block("tiny", models["tiny"], slots=1, ctx=1024)
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        client(served).completions.create(model="tiny", prompt="a", max_tokens=1)  # loaded
        body = {"model": "tiny", "prompt": "a", "max_tokens": 900}
        results = asyncio.run(_concurrent(f"{served.url}/v1/completions", 12, body))
        statuses = sorted(status for status, _, _ in results)
        assert len(statuses) == 12 and set(statuses) <= {200, 503}  # none lost
        assert 200 in statuses and 503 in statuses
        for status, headers, payload in results:
            if status == 503:
                assert int(headers["Retry-After"]) >= 1
                assert json.loads(payload)["error"]["code"] == "all_slots_busy"


def test_priority_requests_jump_the_queue(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path]
) -> None:
    """One slot, held by a stream the test does not read (its top_logprobs make each
    chunk about 5 KB, so the socket buffers fill and it stays in flight); two requests
    queue, then an urgent one, each sent once `blazar ps` shows the one before queued.
    When the stream's client leaves and the slot frees up, the urgent one goes first.
    (The exact queue order with several of each: test_scheduler.py.)"""
    text = '[serving]\nqueue_timeout = "60s"\n\n' + ENGINE
    text += model_block("tiny", models["tiny"], slots=1, ctx=2048)
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        client(served).completions.create(model="tiny", prompt="a", max_tokens=1)
        url = f"{served.url}/v1/completions"
        finished: list[str] = []

        def queued(n: int) -> None:
            wait_until(
                lambda: [(r["in_flight"], r["queued"]) for r in served.ps()] == [(1, n)],
                f"{n} requests queued behind the one in flight",
            )

        async def run() -> None:
            async with aiohttp.ClientSession() as session:

                async def one(tag: str, priority: bool) -> None:
                    headers = {"x-blazar-priority": "high"} if priority else {}
                    body = {"model": "tiny", "prompt": "a", "max_tokens": 8}
                    async with session.post(url, json=body, headers=headers) as resp:
                        assert resp.status == 200
                        await resp.read()
                    finished.append(tag)

                hold = {
                    "model": "tiny",
                    "prompt": "a",
                    "max_tokens": 1500,
                    "stream": True,
                    "logprobs": 60,
                }
                async with session.post(url, json=hold) as first:
                    await first.content.readline()  # it is in flight
                    await asyncio.to_thread(queued, 0)
                    tasks = []
                    for n, (tag, priority) in enumerate(
                        [("normal-1", False), ("normal-2", False), ("urgent", True)], 1
                    ):
                        tasks.append(asyncio.create_task(one(tag, priority)))
                        await asyncio.to_thread(queued, n)
                    first.close()  # its client leaves: the slot frees up
                await asyncio.gather(*tasks)

        asyncio.run(run())
        assert finished == ["urgent", "normal-1", "normal-2"]  # urgent overtook the queue


def test_child_killed_mid_stream_gives_an_error_then_recovers(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path]
) -> None:
    text = ENGINE + model_block("tiny", models["tiny"], ctx=2048)
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        oai = client(served)
        oai.completions.create(model="tiny", prompt="a", max_tokens=1)
        [row] = served.ps()
        stream = oai.completions.create(model="tiny", prompt="a", max_tokens=2000, stream=True)
        with pytest.raises(openai.APIError) as failed:
            for index, _ in enumerate(stream):
                if index == 3:
                    os.kill(row["pid"], signal.SIGKILL)
        assert "failed while answering" in str(failed.value)
        deadline = time.monotonic() + 30
        while True:
            try:
                again = oai.completions.create(model="tiny", prompt="a", max_tokens=4)
                break
            except openai.APIStatusError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert is_tiny_text(again.choices[0].text, allow=())
        [after] = served.ps()
        assert after["pid"] != row["pid"]


def test_client_disconnect_cancels_upstream_work(tmp_path: Path, blazar_home: Path) -> None:
    # A context this long lets the request ask for 4,000 tokens: seconds of work that only
    # a cancellation cuts short (the tiny model never stops by itself).
    long = write_tiny_model(tmp_path / "long.gguf", n_ctx_train=4096)
    text = ENGINE + model_block("tiny", long, ctx=4096)
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        client(served).completions.create(model="tiny", prompt="a", max_tokens=1)
        [row] = served.ps()
        max_tokens = 4000
        request = {"model": "tiny", "prompt": "a", "max_tokens": max_tokens, "stream": True}
        body = json.dumps(request).encode()
        sock = socket.create_connection(("127.0.0.1", served.port))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        received = b""
        while received.count(b"data: ") < 3:  # tokens are flowing
            chunk = sock.recv(4096)
            assert chunk, received.decode(errors="replace")
            received += chunk
        assert received.startswith(b"HTTP/1.1 200")
        in_progress = tokens_in_progress(row["port"])
        assert in_progress > 0  # the child is generating for this client
        at_disconnect = tokens_predicted(row["port"]) + in_progress
        sock.close()  # the client goes away mid-stream
        assert_generation_cancelled(row["port"], at_disconnect, max_tokens)


def test_edited_manifest_restarts_only_the_edited_model(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path]
) -> None:
    text = ENGINE + model_block("tiny", models["tiny"], ctx=1024)
    text += model_block("other", models["other"], ctx=1024)
    manifest = write_manifest(tmp_path, text)
    with Served(manifest, blazar_home) as served:
        oai = client(served)
        for name in ("tiny", "other"):
            oai.completions.create(model=name, prompt="a", max_tokens=1)
        before = {r["model"]: r["pid"] for r in served.ps()}
        manifest.write_text(
            text.replace('ctx = 1024\n\n[models."other"]', 'ctx = 2048\n\n[models."other"]')
        )
        deadline = time.monotonic() + 20

        def old_tiny_serving() -> bool:
            return any(
                r["model"] == "tiny" and r["pid"] == before["tiny"] and not r["retired"]
                for r in served.ps()
            )

        while old_tiny_serving():  # the watcher sees the edit and swaps tiny's instance out
            assert time.monotonic() < deadline, served.ps()
            time.sleep(0.1)
        oai.completions.create(model="tiny", prompt="a", max_tokens=1)
        after = {r["model"]: (r["pid"], r["ctx"]) for r in served.ps() if not r["retired"]}
        assert after["tiny"][1] == 2048 and after["tiny"][0] != before["tiny"]
        assert after["other"] == (before["other"], 1024)  # untouched


def test_busy_port_is_exit_code_3(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        manifest = write_manifest(tmp_path, model_block("tiny", models["tiny"]))
        exe = Path(sys.executable).with_name("blazar")
        result = subprocess.run(
            [str(exe), "serve", str(manifest), "--port", str(port), "--no-apply"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 3
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: port {port} on 127.0.0.1 is already in use: stop what listens there, "
        "or pass --port"
    )


def test_cli_on_a_running_daemon(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path]
) -> None:
    exe = str(Path(sys.executable).with_name("blazar"))
    text = ENGINE + model_block("tiny", models["tiny"])
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        env = {**os.environ, "BLAZAR_URL": served.url}

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=60)

        assert "No model is loaded." in cli("ps").stdout
        answer = cli("run", "tiny", "hello there", "--max-tokens", "5")
        assert answer.returncode == 0 and is_tiny_text(answer.stdout.strip(), allow=())
        dashed = cli("run", "--max-tokens", "3", "tiny", "--", "--not-a-flag")
        assert dashed.returncode == 0, dashed.stderr
        [row] = [json.loads(line) for line in cli("ps", "--json").stdout.splitlines()]
        assert row["model"] == "tiny" and row["state"] == "ready" and row["slots"] == 1
        table = cli("ps").stdout
        assert "MODEL" in table and "b11549-cpu" in table
        assert "stopped tiny" in cli("stop", "tiny").stdout
        assert "No model is loaded." in cli("ps").stdout
        interactive = subprocess.run(
            [exe, "run", "tiny", "--max-tokens", "3"],
            input="hello\n\n",
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        said = " ".join(interactive.stdout.replace(">>>", "").split())
        assert interactive.returncode == 0 and is_tiny_text(said, allow=())
        show_env = "import os; print(os.environ['OPENAI_BASE_URL'], os.environ['OLLAMA_HOST'])"
        launched = cli("launch", sys.executable, "-c", show_env)
        assert launched.stdout.split() == [f"{served.url}/v1", served.url]
    gone = subprocess.run(
        [exe, "ps"], capture_output=True, text=True, env={**os.environ, "BLAZAR_URL": served.url}
    )
    assert gone.returncode == 1 and "blazar serve" in gone.stderr


def test_no_orphans_after_sigint(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path]
) -> None:
    text = ENGINE + model_block("tiny", models["tiny"], replicas=2)
    served = Served(write_manifest(tmp_path, text), blazar_home)
    with served:
        deadline = time.monotonic() + 30
        while len(served.ps()) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert len(processes_mentioning(str(blazar_home / "data"))) >= 2
        assert served.proc is not None
        served.proc.send_signal(signal.SIGINT)
        served.proc.wait(timeout=30)
        assert processes_mentioning(str(blazar_home / "data")) == []
