"""Message batches on a live `blazar serve`, driven by the official `anthropic` package.

The client reaches Blazar by its base URL alone (`client.messages.batches.create`,
`retrieve`, `list`, `results`, `cancel`, `delete`); the model is the tiny test model on
the real engine. What a user would notice is checked: each result is the answer to its
own request (the tiny model's words, its custom_id, the usage its max_tokens allows), a
bad request refuses the whole batch naming its custom_id, an interactive request does
not wait behind a batch, a cancel leaves the rest `canceled`, and a batch survives a
restart of serve (the results made before it are kept as they were, the rest run after).
"""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anthropic
import pytest

from blazar.testing.tiny import is_tiny_text, write_tiny_model
from tests.serving import Served
from tests.test_serve import ENGINE, model_block, write_manifest

HI = [{"role": "user", "content": "hello"}]


def params(max_tokens: int, model: str = "tiny", **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "messages": HI, **extra}


def client(served: Served) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)


def wait_for(what: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def ended(api: anthropic.Anthropic, batch_id: str) -> Any:
    return wait_for(
        lambda: (b := api.messages.batches.retrieve(batch_id)).processing_status == "ended" and b
    )


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    return write_tiny_model(tmp_path / "models" / "tiny.gguf", n_ctx_train=4096)


def test_a_batch_with_the_anthropic_client(tmp_path: Path, blazar_home: Path, tiny: Path) -> None:
    text = ENGINE + model_block("tiny", tiny, ctx=4096, slots=1)
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        api = client(served)
        # One bad request refuses the whole batch, naming it; nothing is queued.
        for bad, says in (
            (params(4) | {"max_tokens": None}, "requests[1] (custom_id 'b').params.max_tokens"),
            (params(4, model="nope"), "requests[1] (custom_id 'b'): model 'nope' not found"),
            (params(4, stream=True), "a batch's requests are not streamed"),
        ):
            with pytest.raises(anthropic.BadRequestError) as refused:
                pair = [{"custom_id": "a", "params": params(4)}, {"custom_id": "b", "params": bad}]
                api.messages.batches.create(requests=pair)  # type: ignore[arg-type]
            assert says in refused.value.message, refused.value.message
        assert api.messages.batches.list().data == []

        # Eight long requests on a model with one slot; an interactive request sent
        # while the first runs waits for that one only, not for the batch.
        requests = [{"custom_id": f"r{i}", "params": params(300 + i)} for i in range(8)]
        batch = api.messages.batches.create(requests=requests)  # type: ignore[arg-type]
        assert batch.processing_status == "in_progress" and batch.results_url is None
        assert batch.request_counts.processing == 8 and batch.type == "message_batch"
        assert batch.expires_at.timestamp() - batch.created_at.timestamp() == pytest.approx(86400)
        wait_for(lambda: served.ps() and any(r["in_flight"] for r in served.ps()))
        reply = api.messages.create(model="tiny", max_tokens=8, messages=HI)  # type: ignore[arg-type]
        counts = api.messages.batches.retrieve(batch.id).request_counts
        assert is_tiny_text(reply.content[0].text)  # type: ignore[union-attr]
        assert counts.processing >= 4, counts  # it went ahead of most of the batch

        done = ended(api, batch.id)
        assert done.request_counts.succeeded == 8 and done.ended_at is not None
        assert done.results_url == f"{served.url}/v1/messages/batches/{batch.id}/results"
        results = list(api.messages.batches.results(batch.id))
        assert sorted(r.custom_id for r in results) == sorted(r["custom_id"] for r in requests)
        for result in results:
            assert result.result.type == "succeeded"
            message = result.result.message  # type: ignore[union-attr]
            asked = int(result.custom_id[1:]) + 300
            assert message.model == "tiny" and is_tiny_text(message.content[0].text)  # type: ignore[union-attr]
            assert message.usage.output_tokens == asked  # each answered its own request
        assert [b.id for b in api.messages.batches.list()] == [batch.id]

        # Cancel: what has not started ends canceled; then it can be deleted.
        many = [{"custom_id": f"c{i}", "params": params(300)} for i in range(20)]
        second = api.messages.batches.create(requests=many)  # type: ignore[arg-type]
        with pytest.raises(anthropic.AnthropicError, match="No `results_url`"):
            list(api.messages.batches.results(second.id))  # the client asks only once ended
        early = urllib.request.Request(f"{served.url}/v1/messages/batches/{second.id}/results")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(early, timeout=10)
        assert refused.value.code == 400
        assert "its results come once it has ended" in json.load(refused.value)["error"]["message"]
        canceling = api.messages.batches.cancel(second.id)
        assert canceling.processing_status in ("canceling", "ended")
        assert canceling.cancel_initiated_at is not None
        gone = ended(api, second.id)
        assert gone.request_counts.canceled >= 18, gone.request_counts
        kinds = {r.result.type for r in api.messages.batches.results(second.id)}
        assert "canceled" in kinds and kinds <= {"canceled", "succeeded"}
        page = api.messages.batches.list(limit=1)
        assert [b.id for b in page.data] == [second.id] and page.has_more
        assert [b.id for b in api.messages.batches.list(limit=1, after_id=second.id)] == [batch.id]
        deleted = api.messages.batches.delete(second.id)
        assert deleted.type == "message_batch_deleted"
        with pytest.raises(anthropic.NotFoundError):
            api.messages.batches.retrieve(second.id)


def test_a_batch_survives_a_restart_of_serve(tmp_path: Path, blazar_home: Path, tiny: Path) -> None:
    text = ENGINE + model_block("tiny", tiny, ctx=4096, slots=1)
    manifest = write_manifest(tmp_path, text)
    requests = [{"custom_id": f"r{i}", "params": params(200 + i)} for i in range(10)]
    with Served(manifest, blazar_home) as served:
        api = client(served)
        batch = api.messages.batches.create(requests=requests)  # type: ignore[arg-type]
        wait_for(lambda: api.messages.batches.retrieve(batch.id).request_counts.succeeded >= 2)
    # Serve has stopped mid-batch: what the store kept.
    with sqlite3.connect(blazar_home / "data" / "blazar.db") as db:
        rows = db.execute(
            "SELECT custom_id, state, result FROM message_batch_requests WHERE batch_id = ?",
            [batch.id],
        ).fetchall()
    before = {c: json.loads(r) for c, state, r in rows if state == "succeeded"}
    assert 2 <= len(before) < 10, rows
    assert all(state == "queued" for _, state, r in rows if r is None)

    with Served(manifest, blazar_home) as served:
        api = client(served)
        done = ended(api, batch.id)
        assert done.request_counts.succeeded == 10
        results = {r.custom_id: r.result for r in api.messages.batches.results(batch.id)}
        assert sorted(results) == sorted(r["custom_id"] for r in requests)
        for custom_id, kept in before.items():  # the results made before the restart, as made
            assert results[custom_id].message.id == kept["message"]["id"]  # type: ignore[union-attr]
        for custom_id, result in results.items():
            assert result.message.usage.output_tokens == 200 + int(custom_id[1:])  # type: ignore[union-attr]


def test_batches_need_serve_s_store_and_are_a_key_s_own(
    tmp_path: Path, blazar_home: Path, tiny: Path
) -> None:
    import hashlib

    keys = ""
    for name in ("one", "two"):
        digest = hashlib.sha256(f"plm_{name}-{'x' * 32}".encode()).hexdigest()
        keys += f'[keys.{name}]\nsha256 = "{digest}"\nscope = "inference"\n\n'
    text = ENGINE + model_block("tiny", tiny) + keys
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        one = anthropic.Anthropic(base_url=served.url, api_key=f"plm_one-{'x' * 32}")
        two = anthropic.Anthropic(base_url=served.url, api_key=f"plm_two-{'x' * 32}")
        batch = one.messages.batches.create(requests=[{"custom_id": "a", "params": params(3)}])  # type: ignore[list-item]
        assert [b.id for b in one.messages.batches.list()] == [batch.id]
        assert two.messages.batches.list().data == []
        with pytest.raises(anthropic.NotFoundError):
            two.messages.batches.retrieve(batch.id)
        with pytest.raises(anthropic.NotFoundError):
            two.messages.batches.cancel(batch.id)
        ended(one, batch.id)
        request = urllib.request.Request(f"{served.url}/v1/messages/batches")
        with pytest.raises(urllib.error.HTTPError) as refused:  # no key: 401
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 401
