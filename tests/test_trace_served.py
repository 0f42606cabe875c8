"""A relayed answer's trace against a real `blazar serve` and llama-server child (issue 30):
a stream long enough to have a middle (its pieces past the 64 KiB head and before the
last 4 KiB are only counted) and a whole answer over 8 KiB (read at its two ends) give
`blazar why` the token counts, finish and excerpt the client's own copy says. It also
pins the shape the trace reads without parsing: this engine's chat token event starts
with `trace.TOKEN_START` (were that to change, the trace would still be right, only
slower: it would parse each event).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from blazar.observe.trace import HEAD_BYTES, TAIL_BYTES, TOKEN_START, WHOLE_BYTES
from blazar.testing.tiny import write_tiny_model
from tests.fixtures import ENGINE, WHEELS
from tests.serving import Served

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("trace")
    tiny = write_tiny_model(root / "tiny.gguf", n_ctx_train=4096)
    manifest = root / "blazar.toml"
    manifest.write_text(ENGINE + f'[models.tiny]\nsource = "{tiny.as_uri()}"\nctx = 4096\n')
    home = root / "home"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BLAZAR_HOME", str(home))
        env.setenv("BLAZAR_WHEEL_CACHE", str(WHEELS))
        with Served(manifest, home) as served:
            yield served.url


def why(url: str, trace: str) -> dict[str, Any]:
    found = httpx.get(f"{url}/api/why/{trace}?wait=10", timeout=30)
    assert found.status_code == 200, found.text
    return dict(found.json())


def ask(tokens: int, *, stream: bool) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": HI,
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": stream,
        "temperature": 0,
    }


def test_a_long_relayed_stream_is_traced_from_its_head_and_tail(url: str) -> None:
    headers = {"x-request-id": "long-stream"}
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=ask(1500, stream=True), headers=headers
    ) as answer:
        assert answer.status_code == 200 and "server" not in answer.headers  # the relay
        body = b"".join(answer.iter_bytes())
    assert len(body) > HEAD_BYTES + 2 * TAIL_BYTES  # so it has a middle
    events = [e for e in body.split(b"\n\n") if e.startswith(b"data: {")]
    tokens = [e for e in events if e.startswith(TOKEN_START)]
    assert len(tokens) >= 1400  # this engine's token events: read without parsing
    text = "".join(
        (json.loads(e[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for e in events
    )
    record = why(url, "long-stream")
    assert (record["generated_tokens"], record["finish_reason"]) == (1500, "length")
    assert record["prompt_tokens"] and record["ttft_ms"] and record["tokens_per_second"]
    excerpt = record["output"]["excerpt"]
    assert len(excerpt) == min(200, len(text)) and text.startswith(excerpt)
    assert record["sentinels"] == [] and record["status"] == 200


def test_a_long_whole_relayed_answer_is_traced_from_its_ends(url: str) -> None:
    headers = {"x-request-id": "long-whole"}
    answer = httpx.post(
        f"{url}/v1/chat/completions", json=ask(2500, stream=False), headers=headers, timeout=60
    )
    assert answer.status_code == 200 and "server" not in answer.headers
    assert len(answer.content) > WHOLE_BYTES
    body = answer.json()
    record = why(url, "long-whole")
    assert record["generated_tokens"] == body["usage"]["completion_tokens"] == 2500
    assert record["prompt_tokens"] == body["usage"]["prompt_tokens"]
    assert record["finish_reason"] == body["choices"][0]["finish_reason"] == "length"
    text = body["choices"][0]["message"]["content"]
    assert record["output"]["excerpt"] == text[:200]
    assert record["ttft_ms"] is not None and record["tokens_per_second"]
