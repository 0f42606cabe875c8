"""Observability across serve's lifetime and its settings: `blazar why` after serve stopped
and after it restarted (traces in the store), `blazar doctor` on a healthy host and on one
whose model file was deleted, and serving.sentinel_enforce with serving.pii_scrub."""

from __future__ import annotations

import json
import sqlite3
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import anthropic
import ollama
import openai
import pytest

from blazar.paths import Paths
from blazar.store.db import Store
from blazar.testing.ports import free_port
from specs.names import parse_name
from tests.conftest import Blazar
from tests.fixtures import ENGINE
from tests.serving import Served


def manifest(tmp_path: Path, model: Path, serving: str = "") -> Path:
    # A port of its own: doctor checks the manifest's port, and 11435 may be anyone's here.
    text = f"[serving]\nport = {free_port()}\n{serving}\n" + ENGINE
    text += f'[models.tiny]\nsource = "{model.as_uri()}"\nctx = 512\n'
    path = tmp_path / "manifest" / "blazar.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_why_after_serve_stopped_and_restarted_and_doctor(
    tmp_path: Path, blazar_home: Path, paths: Paths, blazar: Blazar, tiny_model: Path
) -> None:
    path = manifest(tmp_path, tiny_model)
    trace = uuid.uuid4().hex
    with Served(path, blazar_home) as served:
        oai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
        oai.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=3,
            extra_headers={"x-request-id": trace},
        )
    nobody = f"http://127.0.0.1:{free_port()}"  # no daemon: `why` reads the store
    shown = blazar("why", trace, "--url", nobody).output
    assert shown.startswith(f"trace {trace}")
    assert "asked for 'tiny' -> model tiny" in shown and "status 200" in shown
    with Served(path, blazar_home) as served:
        record = served.get(f"/api/why/{trace}")  # the new serve has not seen it: the store has
        assert record["id"] == trace and record["generated_tokens"] == 3
        assert record["decision"] == "spawned" and record["load_ms"] > 0

    healthy = blazar("doctor", str(path), "--url", nobody, ok=False)
    assert healthy.exit_code == 0, healthy.output
    assert "model 'tiny': present with its recorded size" in healthy.output
    assert "llamacpp b11549-cpu runs and reports build 11549" in healthy.output
    with Store(paths.db) as store:
        stored = Path(store.get_model(parse_name("tiny")).path)
    stored.unlink()
    broken = blazar("doctor", str(path), "--url", nobody, ok=False)
    assert broken.exit_code == 1
    assert f"XX model 'tiny': its file {stored} is missing" in broken.output
    assert "fix: `blazar apply` to fetch it again" in broken.output
    as_json = [
        json.loads(line)
        for line in blazar(
            "doctor", str(path), "--json", "--url", nobody, ok=False
        ).output.splitlines()
    ]
    [error] = [f for f in as_json if f["severity"] == "error"]
    assert error["group"] == "MODELS" and "tiny" in error["what"] and error["fix"]
    blazar("apply", str(path))  # the fix it names
    assert stored.is_file()
    assert blazar("doctor", str(path), "--deep", "--url", nobody, ok=False).exit_code == 0


def test_sentinel_enforce_answers_422_in_each_protocol_and_pii_scrub(
    tmp_path: Path, blazar_home: Path, paths: Paths, tiny_model: Path
) -> None:
    path = manifest(tmp_path, tiny_model, "sentinel_enforce = true\npii_scrub = true\n")
    secret = "my secret question about turnips"
    messages = [{"role": "user", "content": secret}]
    with Served(path, blazar_home) as served:
        oai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            oai.completions.create(
                model="tiny",
                prompt=secret,
                max_tokens=4,
                extra_body={"json_schema": {"type": "object"}},
            )
        assert refused.value.code == "sentinel_failed"
        assert "truncated" in refused.value.message and "invalid_json" in refused.value.message
        trace = refused.value.response.headers["x-request-id"]
        with pytest.raises(ollama.ResponseError) as refused_ollama:
            ollama.Client(host=served.url).chat(
                model="tiny", messages=messages, options={"num_predict": 3}
            )
        assert refused_ollama.value.status_code == 422
        assert "truncated" in refused_ollama.value.error
        claude = anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.UnprocessableEntityError) as refused_anthropic:
            claude.messages.create(model="tiny", max_tokens=3, messages=messages)
        assert refused_anthropic.value.body["type"] == "error"  # type: ignore[index]
        assert "truncated" in str(refused_anthropic.value)
        # A stream is only recorded; an answer meant to reach the limit passes.
        streamed = list(oai.completions.create(model="tiny", prompt="x", max_tokens=3, stream=True))
        assert streamed
        done = oai.completions.create(
            model="tiny", prompt="x", max_tokens=3, extra_body={"ignore_eos": True}
        )
        assert done.choices[0].finish_reason == "length"
        record = served.get(f"/api/why/{trace}")
        assert record["status"] == 422 and record["code"] == "sentinel_failed"
        assert [s["check"] for s in record["sentinels"]] == ["truncated", "invalid_json"]
        assert record["prompt"] == {"chars": len(secret), "hash": record["prompt"]["hash"]}
        assert "excerpt" not in record["output"]
        with pytest.raises(urllib.error.HTTPError) as missing:
            served.get("/api/why/not-a-trace")
        assert missing.value.code == 404 and "no trace" in json.load(missing.value)["error"]
    with sqlite3.connect(paths.db) as db:
        rows = [row[0] for row in db.execute("SELECT record FROM traces")]
    assert len(rows) == 5
    assert not any("turnips" in row for row in rows)  # no message text in the store
