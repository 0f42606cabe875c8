"""The one request path with the real engine: what each protocol's client now gets alike.

One `blazar serve` with the tiny model, an adapter of it (fox: its requests say "fox")
and an alias, with serving.sentinel_enforce and serving.singleflight on, asked through
the official clients. Each test pins a defect the routes had while each assembled the
path itself:

- a templated `/api/generate` traced its helper call (`/tokenize`) as the exchange, so
  the trace showed no tokens and a false `empty` sentinel, and with sentinel_enforce a
  streamed generate was cut by a 422;
- `tiny+fox` and aliases were answered as `"model": "tiny"` on OpenAI's routes;
- `/v1/responses` skipped the preflight, the sessions and keep_alive;
- ollama's routes ignored the `x-blazar-keep-alive` header;
- singleflight's shared call skipped the trace and the sentinel gate, and (its own
  sequence of the steps) said no speculative mode (`x-blazar-spec`) on its answers.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest

from blazar.testing.tiny import write_tiny_lora, write_tiny_model
from tests.fixtures import ENGINE, WHEELS
from tests.serving import Served

HI = [{"role": "user", "content": "hello"}]


class Host:
    def __init__(self, served: Served) -> None:
        self.served = served
        self.openai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
        self.anthropic = anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0)
        self.ollama = ollama.Client(host=served.url)

    def why(self, trace: str) -> dict[str, Any]:
        # `wait`: the request's end, which may trail its answer's last byte.
        return dict(self.served.get(f"/api/why/{trace}?wait=10"))

    def loaded(self, model: str) -> bool:
        return any(r["model"] == model for r in self.served.ps() if r["state"] == "ready")

    def wait_unloaded(self, model: str) -> None:
        deadline = time.monotonic() + 10
        while self.loaded(model):
            assert time.monotonic() < deadline, f"{model} is still loaded"
            time.sleep(0.05)


def _env(home: Path) -> dict[str, str]:
    return {"BLAZAR_HOME": str(home), "BLAZAR_WHEEL_CACHE": str(WHEELS)}


def _serve(root: Path, serving: str) -> Iterator[Host]:
    tiny = write_tiny_model(root / "tiny.gguf")
    fox = write_tiny_lora(root / "fox.gguf", tiny, word="fox")
    manifest = root / "manifest" / "blazar.toml"
    manifest.parent.mkdir()
    home = root / "home"
    text = f"[serving]\n{serving}\n\n" + ENGINE
    text += f'[models.tiny]\nsource = "{tiny.as_uri()}"\naliases = ["mini"]\nctx = 512\n'
    text += "slots = 2\n\n"
    text += f'[models.small]\nsource = "{tiny.as_uri()}"\nctx = 256\n\n'
    text += f'[models.lookup]\nsource = "{tiny.as_uri()}"\nctx = 512\nspec = "ngram"\n\n'
    text += f'[loras.fox]\nmodel = "tiny"\nsource = "{fox.as_uri()}"\n'
    manifest.write_text(text)
    with Served(manifest, home, env=_env(home)) as served:
        yield Host(served)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    yield from _serve(tmp_path_factory.mktemp("pipeline"), "singleflight = true")


@pytest.fixture(scope="module")
def enforcing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """serving.sentinel_enforce: a whole answer that fails a sentinel is a 422."""
    root = tmp_path_factory.mktemp("enforcing")
    yield from _serve(root, "sentinel_enforce = true\nsingleflight = true")


def _generate(url: str, body: dict[str, Any], trace: str) -> list[dict[str, Any]]:
    request = urllib.request.Request(
        url + "/api/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "x-request-id": trace},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        return [json.loads(line) for line in resp.read().decode().splitlines() if line]


def test_a_templated_generate_is_traced_as_its_generation_not_its_helper_calls(
    host: Host, enforcing: Host
) -> None:
    for stream in (False, True):
        trace = uuid.uuid4().hex
        body = {"model": "tiny", "prompt": "hello", "stream": stream, "options": {"num_predict": 5}}
        lines = _generate(host.served.url, body, trace)
        final = lines[-1]
        assert final["done"] is True and final["context"], final
        text = "".join(line.get("response", "") for line in lines)
        assert text.strip(), lines
        record = host.why(trace)
        assert record["status"] == 200, record
        assert record["generated_tokens"] == 5 and record["prompt_tokens"], record
        checks = [s["check"] for s in record["sentinels"]]
        assert checks == ["truncated"], record  # the generation's own; no false "empty"
        assert record["output"]["excerpt"].strip() == text.strip()
        # The context a client sends back continues after those tokens, traced the same.
        again = uuid.uuid4().hex
        follow = {**body, "prompt": "and", "context": final["context"], "stream": False}
        more = _generate(host.served.url, follow, again)[-1]
        assert len(more["context"]) > len(final["context"])
        assert host.why(again)["generated_tokens"] == 5
    # With sentinel_enforce, a streamed generate runs to its end (its context included):
    # the tokenizer's answer is no longer read as the generation's and found empty.
    body = {"model": "tiny", "prompt": "hello", "stream": True, "options": {"num_predict": 5}}
    lines = _generate(enforcing.served.url, body, uuid.uuid4().hex)
    assert lines[-1]["done"] is True and lines[-1]["context"], lines
    assert all("error" not in line for line in lines), lines


def test_the_answer_names_the_model_as_the_client_asked_for_it(host: Host) -> None:
    for name in ("tiny+fox", "mini", "tiny:latest"):
        whole = host.openai.chat.completions.create(model=name, messages=HI, max_tokens=3)  # type: ignore[arg-type]
        assert whole.model == name
        chunks = list(
            host.openai.chat.completions.create(model=name, messages=HI, max_tokens=3, stream=True)  # type: ignore[arg-type]
        )
        assert {c.model for c in chunks} == {name}
        legacy = host.openai.completions.create(model=name, prompt="x", max_tokens=2)
        assert legacy.model == name and legacy.id.startswith("cmpl-")
        assert host.ollama.chat(model=name, messages=HI, options={"num_predict": 2}).model == name
        said = host.anthropic.messages.create(model=name, max_tokens=2, messages=HI)  # type: ignore[arg-type]
        assert said.model == name
        assert (
            host.openai.responses.create(model=name, input="hi", max_output_tokens=16).model == name
        )
    # ... and the adapter really was on: its word, in every protocol.
    fox = host.openai.chat.completions.create(model="tiny+fox", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert set((fox.choices[0].message.content or "").split()) == {"fox"}


def test_responses_take_the_whole_path(host: Host) -> None:
    # The preflight: a prompt that cannot fit the slot is refused before the engine.
    with pytest.raises(openai.BadRequestError) as too_long:
        host.openai.responses.create(model="small", input="word " * 400, max_output_tokens=16)
    assert too_long.value.code == "context_length_exceeded"
    # ... an output that cannot fit is capped, and said.
    capped = host.openai.responses.with_raw_response.create(
        model="small", input="hello", max_output_tokens=5000
    )
    assert 0 < int(capped.headers["x-blazar-max-tokens-capped"]) < 256
    # keep_alive: 0 unloads the model after the request, as on every other route.
    host.openai.responses.create(
        model="small",
        input="hi",
        max_output_tokens=16,
        extra_headers={"x-blazar-keep-alive": "0"},
    )
    host.wait_unloaded("small")


def test_ollama_honours_the_keep_alive_header(host: Host) -> None:
    client = ollama.Client(host=host.served.url, headers={"x-blazar-keep-alive": "0"})
    client.chat(model="small", messages=HI, options={"num_predict": 2})
    host.wait_unloaded("small")


def test_a_shared_singleflight_answer_is_traced_and_gated_for_every_client(
    host: Host, enforcing: Host
) -> None:
    body = {"model": "tiny", "prompt": "the quick", "max_tokens": 6, "temperature": 0}
    results: dict[str, Any] = {}
    modes: dict[str, str | None] = {}

    def ask(trace: str) -> None:
        request = urllib.request.Request(
            host.served.url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "x-request-id": trace},
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            results[trace] = json.load(resp)
            modes[trace] = resp.headers.get("x-blazar-spec")

    traces = [uuid.uuid4().hex for _ in range(4)]
    threads = [threading.Thread(target=ask, args=(t,)) for t in traces]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    texts = {results[t]["choices"][0]["text"] for t in traces}
    assert len(texts) == 1  # deterministic, whether shared or not
    assert len({results[t]["id"] for t in traces}) == 4  # each its own id
    assert set(modes.values()) == {"off"}  # shared or not, the answer says its mode
    for trace in traces:
        record = host.why(trace)
        assert record["generated_tokens"] == 6 and record["status"] == 200, record
    # The sentinel gate applies to a shared answer too: JSON asked for, cut short, 422.
    shared = {**body, "json_schema": {"type": "object"}, "max_tokens": 3}
    codes = []

    def gated() -> None:
        request = urllib.request.Request(
            enforcing.served.url + "/v1/completions",
            data=json.dumps(shared).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(request, timeout=60).read()
            codes.append(200)
        except urllib.error.HTTPError as exc:
            codes.append(exc.code)

    threads = [threading.Thread(target=gated) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert codes == [422, 422, 422]


def test_the_answer_says_which_speculative_mode_served_it(host: Host) -> None:
    """x-blazar-spec: the mode, and for a whole answer the share of drafted tokens the
    model accepted (the engine's timings), on every protocol the pipeline answers."""
    dense = host.openai.chat.completions.with_raw_response.create(
        model="tiny",
        messages=HI,
        max_tokens=4,  # type: ignore[arg-type]
    )
    assert dense.headers["x-blazar-spec"] == "off"
    prompt = "one two three four one two three four one two three four one two"
    looked = host.openai.completions.with_raw_response.create(
        model="lookup", prompt=prompt, max_tokens=24
    )
    mode, _, accepted = looked.headers["x-blazar-spec"].partition("; accepted=")
    assert mode == "ngram"
    timings = looked.http_response.json()["timings"]
    if timings.get("draft_n"):  # the lookup drafted: its rate is the engine's
        assert float(accepted) == pytest.approx(
            timings["draft_n_accepted"] / timings["draft_n"], abs=0.01
        )
    with host.openai.chat.completions.with_streaming_response.create(
        model="lookup",
        messages=HI,
        max_tokens=4,
        stream=True,  # type: ignore[arg-type]
    ) as streamed:
        assert streamed.headers["x-blazar-spec"] == "ngram"
    said = host.ollama.chat(model="lookup", messages=HI, options={"num_predict": 2})
    assert said.message.content is not None
