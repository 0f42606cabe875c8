"""The responses the gateway keeps (`routes.responses_api.Recent`): by owner, bounded."""

from __future__ import annotations

from typing import Any

import orjson

from blazar.protocols.openai_responses import input_items
from blazar.serve.routes.responses_api import Recent


def response(n: int, text: str = "x") -> dict[str, Any]:
    message = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }
    return {"id": f"resp_{n}", "store": True, "output": [message, {"type": "web_search_call"}]}


def test_a_response_is_read_only_with_the_key_that_made_it() -> None:
    recent = Recent()
    recent.keep("ci", response(1), [], [])
    assert recent.find("resp_1", "ci") is not None
    assert recent.find("resp_1", None) is None and recent.find("resp_1", "other") is None
    assert not recent.drop("resp_1", "other") and recent.find("resp_1", "ci") is not None
    assert recent.drop("resp_1", "ci") and recent.find("resp_1", "ci") is None


def test_the_oldest_go_first_by_count_and_by_bytes() -> None:
    small = len(orjson.dumps([response(0), []]))
    big = len(orjson.dumps([response(9, "y" * 6_000), []]))
    recent = Recent(count=3, size=big + small + small // 2)
    for n in range(5):
        recent.keep(None, response(n), [], [])
    assert [n for n in range(5) if recent.find(f"resp_{n}", None)] == [2, 3, 4]
    recent.keep(None, response(9, "y" * 6_000), [], [])  # with it, 2 and 3 no longer fit
    assert [n for n in (2, 3, 4, 9) if recent.find(f"resp_{n}", None)] == [4, 9]
    recent.keep(None, response(10, "z" * 20_000), [], [])  # larger than all: not kept
    assert recent.find("resp_10", None) is None and recent.find("resp_9", None) is not None


def test_a_continuation_starts_from_the_history_and_the_output_it_can_read() -> None:
    recent = Recent()
    asked = input_items({"input": "hello"}, lambda prefix: f"{prefix}_1")
    assert asked == [
        {
            "type": "message",
            "role": "user",
            "id": "msg_1",
            "content": [{"type": "input_text", "text": "hello"}],
        }
    ]
    recent.keep(None, response(1, "hi"), asked, asked)
    kept = recent.find("resp_1", None)
    assert kept is not None
    assert [i["type"] for i in kept.conversation()] == ["message", "message"]  # no hosted call
    assert kept.conversation()[1]["content"][0]["text"] == "hi"
