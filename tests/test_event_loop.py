"""serve's event loop: uvloop where installed, asyncio's on request (BLAZAR_EVENT_LOOP)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import openai
import pytest

from blazar.serve.event_loop import EventLoopError, choose
from blazar.testing.tiny import is_tiny_text
from tests.conftest import run_blazar
from tests.fixtures import ENGINE, model_block, write_manifest, write_models
from tests.serving import Served


@pytest.mark.parametrize(
    ("asked", "installed", "chosen"),
    [
        (None, True, "uvloop"),
        ("", True, "uvloop"),
        (None, False, "asyncio"),
        ("asyncio", True, "asyncio"),
        (" UVLOOP ", True, "uvloop"),
        ("asyncio", False, "asyncio"),
    ],
)
def test_choose(asked: str | None, installed: bool, chosen: str) -> None:
    assert choose(asked, installed) == chosen


@pytest.mark.parametrize(
    ("asked", "installed", "says"),
    [
        ("trio", True, "names no event loop: use one of uvloop, asyncio"),
        ("uvloop", False, "uvloop is not installed: `pip install uvloop`"),
    ],
)
def test_choose_refuses(asked: str, installed: bool, says: str) -> None:
    with pytest.raises(EventLoopError, match=says.replace("(", r"\(")):
        choose(asked, installed)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_serve_answers_on_either_loop(loop: str, tmp_path: Path, blazar_home: Path) -> None:
    """Both loops serve the relay and the interpreted lane (an ollama-shaped route)."""
    models = write_models(tmp_path, "tiny")
    manifest = write_manifest(tmp_path, ENGINE + model_block("tiny", models["tiny"]))
    with Served(manifest, blazar_home, env={"BLAZAR_EVENT_LOOP": loop}) as served:
        client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused")
        answer = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert is_tiny_text(answer.choices[0].message.content or "")
        generated = served.post("/api/generate", {"model": "tiny", "prompt": "hi", "stream": False})
        assert is_tiny_text(generated["response"])
        assert f"event loop: {loop}" in served.log


def test_serve_refuses_an_unknown_loop(tmp_path: Path, blazar_home: Path) -> None:
    models = write_models(tmp_path, "tiny")
    manifest = write_manifest(tmp_path, ENGINE + model_block("tiny", models["tiny"]))
    done = run_blazar("serve", str(manifest), env={"BLAZAR_EVENT_LOOP": "trio"})
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "BLAZAR_EVENT_LOOP='trio' names no event loop" in said
    assert "Traceback" not in said


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_large_uploads_arrive_whole_on_either_loop(
    loop: str, tmp_path: Path, blazar_home: Path
) -> None:
    """Multipart uploads of 2-3 MB to a route aiohttp reads (not the relay's): aiohttp
    pauses its parser when its buffer fills and re-reads what it holds on resume (a call
    with no bytes), which the gateway's connection handler once swallowed once the whole
    request had been handed over, so an upload waited for serving.body_timeout (408)."""
    models = write_models(tmp_path, "tiny")
    text = '[serving]\nbody_timeout = "20s"\n' + ENGINE + model_block("tiny", models["tiny"])
    manifest = write_manifest(tmp_path, text)
    with (
        Served(manifest, blazar_home, env={"BLAZAR_EVENT_LOOP": loop}) as served,
        httpx.Client(timeout=60) as client,
    ):
        for size in range(2_000_000, 3_200_000, 150_000):
            started = time.monotonic()
            answer = client.post(
                served.url + "/v1/audio/transcriptions",
                files={"file": ("clip.wav", os.urandom(size))},
                data={"model": "no-such-model"},
            )
            assert answer.status_code == 404, (size, answer.text)  # read whole, then refused
            assert "no-such-model" in answer.json()["error"]["message"]
            assert time.monotonic() - started < 10
