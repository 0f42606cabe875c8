"""Anthropic's Messages API on a live `blazar serve`, driven by the official `anthropic` SDK.

The SDK reaches Blazar by its base URL alone (it sends `x-api-key` and
`anthropic-version`, which Blazar accepts). The model is the tiny test model on
the real engine; the stream's event grammar is read raw (the SDK hides `ping`),
token counts are checked against the engine's own tokenizer, and saturation, a
client that leaves and a child that dies are checked in Anthropic's error shape.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from blazar.testing.tiny import is_tiny_text, write_tiny_model
from tests.fixtures import ENGINE, model_block, write_manifest
from tests.golden.capture import ANTHROPIC_TOOL, STOP_WORDS
from tests.serving import (
    Served,
    assert_generation_cancelled,
    tokens_in_progress,
    tokens_predicted,
)

HI = [{"role": "user", "content": "hello"}]
EVENTS = [
    "message_start",
    "content_block_start",
    "ping",
    *["content_block_delta"] * 5,
    "content_block_stop",
    "message_delta",
    "message_stop",
]


def post(url: str, body: bytes) -> tuple[int, dict[str, str], Any]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, dict(resp.headers), json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.load(exc)


def child(served: Served, model: str) -> dict[str, Any]:
    [row] = [r for r in served.ps() if r["model"] == model and not r["retired"]]
    return row


def engine_post(port: int, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.load(resp)


def test_messages_with_the_anthropic_sdk(tmp_path: Path, blazar_home: Path) -> None:
    src = tmp_path / "models"
    src.mkdir()
    tiny = write_tiny_model(src / "tiny.gguf", n_ctx_train=4096)  # room for a long answer
    plain = write_tiny_model(src / "plain.gguf", seed=5, chat_template=None)
    text = "[serving]\nmax_queue = 0\n\n" + ENGINE + model_block("tiny", tiny, ctx=4096)
    text += model_block("plain", plain)
    # The same model with a template that renders tools (its GGUF's own does not).
    text += model_block("tooled", tiny, ctx=4096, chat_template="chatml")
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        client = anthropic.Anthropic(base_url=served.url, api_key="any-key", max_retries=0)

        message = client.messages.create(model="tiny", max_tokens=6, messages=HI)
        assert message.model == "tiny" and message.id.startswith("msg_")
        assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 6
        assert message.usage.input_tokens + message.usage.cache_read_input_tokens > 0
        assert is_tiny_text(message.content[0].text, allow=())
        raw = client.messages.with_raw_response.create(model="tiny", max_tokens=1, messages=HI)
        assert raw.headers["request-id"] == raw.headers["x-request-id"]

        # system blocks, sampling (sent as extra body: this SDK no longer has the
        # arguments), metadata and stop sequences
        for _ in range(5):  # the tiny model's sampling is random; a stop word comes soon
            stopped = client.messages.create(
                model="tiny",
                max_tokens=60,
                system=[{"type": "text", "text": "be brief"}],
                messages=HI,
                stop_sequences=STOP_WORDS,
                metadata={"user_id": "u-1"},
                extra_body={"temperature": 0.9, "top_p": 0.95, "top_k": 40},
            )
            if stopped.stop_reason != "max_tokens":
                break
        assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence in STOP_WORDS

        # tools, and a conversation that used one
        history = [
            {"role": "user", "content": "Weather in paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}],
            },
        ]
        answer = client.messages.create(
            model="tooled",
            max_tokens=4,
            messages=history,
            tools=[ANTHROPIC_TOOL],
            tool_choice={"type": "auto"},
        )
        assert answer.stop_reason == "max_tokens" and answer.content[0].type == "text"

        # streaming: the SDK's view, then the raw event grammar (ping included)
        with client.messages.stream(model="tiny", max_tokens=5, messages=HI) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert is_tiny_text(streamed, allow=()) and final.content[0].text == streamed
        assert final.usage.output_tokens == 5 and final.stop_reason == "max_tokens"
        body = {"model": "tiny", "max_tokens": 5, "messages": HI, "stream": True}
        events = []
        with httpx.stream("POST", served.url + "/v1/messages", json=body, timeout=30) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            for line in resp.iter_lines():
                if line.startswith("event: "):
                    events.append(line.removeprefix("event: "))
        assert events == EVENTS

        # count_tokens: the engine's tokenizer over the chat template's prompt
        counted = client.messages.count_tokens(model="tiny", system="be brief", messages=HI)
        port = child(served, "tiny")["port"]
        full = [{"role": "system", "content": "be brief"}, *HI]
        prompt = engine_post(port, "/apply-template", {"messages": full})["prompt"]
        tokens = engine_post(
            port, "/tokenize", {"content": prompt, "add_special": True, "parse_special": True}
        )["tokens"]
        assert counted.input_tokens == len(tokens)

        # errors in Anthropic's shape
        with pytest.raises(anthropic.NotFoundError) as missing:
            client.messages.create(model="nope", max_tokens=2, messages=HI)
        assert missing.value.body["error"]["type"] == "not_found_error"
        assert "model 'nope' not found" in missing.value.message
        status, _, error = post(
            served.url + "/v1/messages", json.dumps({"model": "tiny", "messages": HI}).encode()
        )
        assert status == 400 and error["error"] == {
            "type": "invalid_request_error",
            "message": "max_tokens: Field required",
        }
        status, _, error = post(served.url + "/v1/messages", b"{not json")
        assert status == 400 and error["error"]["type"] == "invalid_request_error"
        with pytest.raises(anthropic.BadRequestError) as no_template:
            client.messages.create(model="plain", max_tokens=2, messages=HI)
        assert "no chat template" in no_template.value.message
        image = [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": "image/png",
                            "data": "iVBORw0KGgo=",
                        },
                    }
                ],
            }
        ]
        with pytest.raises(anthropic.BadRequestError) as no_vision:
            client.messages.create(model="tiny", max_tokens=2, messages=image)
        assert "vision projector" in no_vision.value.message

        # saturation (one slot, no queue): 503 overloaded_error with Retry-After;
        # then the client leaves mid-stream and the engine stops
        long = {"model": "tiny", "max_tokens": 4000, "messages": HI, "stream": True}
        with httpx.stream("POST", served.url + "/v1/messages", json=long, timeout=30) as resp:
            lines = resp.iter_lines()  # held: a dropped iterator would close the connection
            assert next(lines) == "event: message_start"
            with pytest.raises(anthropic.APIStatusError) as busy:
                client.messages.create(model="tiny", max_tokens=2, messages=HI)
            assert busy.value.status_code == 503
            assert busy.value.body["error"]["type"] == "overloaded_error"
            assert int(busy.value.response.headers["retry-after"]) >= 1
            in_progress = tokens_in_progress(port)
            assert in_progress > 0  # the child is generating for this client
            at_disconnect = tokens_predicted(port) + in_progress
        assert_generation_cancelled(port, at_disconnect, long["max_tokens"])

        # a child that dies mid-stream: an error event, which the SDK raises
        pid = child(served, "tiny")["pid"]
        with (
            pytest.raises(anthropic.APIStatusError) as died,
            client.messages.stream(model="tiny", max_tokens=1900, messages=HI) as stream,
        ):
            for index, _ in enumerate(stream):
                if index == 5:
                    os.kill(pid, signal.SIGKILL)
        assert "failed while answering" in str(died.value)
        deadline = time.monotonic() + 30
        while True:  # the child is respawned; requests succeed again
            try:
                again = client.messages.create(model="tiny", max_tokens=2, messages=HI)
                break
            except anthropic.APIStatusError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert again.stop_reason == "max_tokens"
