"""`Client` against a real `blazar serve`: chat, streams, best-of-N, operations, errors.

Each test checks what a user of the SDK would see: the words the tiny model
said, the trace the gateway recorded for the trace id the SDK handed back, the
candidate the pick kept recomputed from the engine's own log-probabilities, the
class and message of each error, the state a call changed as another call reads
it.
"""

from __future__ import annotations

import math
import time

import pytest

from blazar.testing.ports import free_port
from blazar.testing.tiny import is_tiny_text
from blazar_sdk import (
    APIConnectionError,
    AuthenticationError,
    BadRequestError,
    BusyError,
    Client,
    NotFoundError,
    PermissionDeniedError,
)
from blazar_sdk.chat import mean_logprob
from conftest import GEMMA, RERANKER, Gateway


def test_url_and_key_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BLAZAR_URL", raising=False)
    monkeypatch.delenv("BLAZAR_API_KEY", raising=False)
    default = Client()
    assert (default.url, default.key) == ("http://127.0.0.1:11435", None)
    monkeypatch.setenv("BLAZAR_URL", "http://box:9/v1")  # an OpenAI base URL works too
    monkeypatch.setenv("BLAZAR_API_KEY", "plm_secret")
    assert (Client().url, Client().key) == ("http://box:9", "plm_secret")
    assert (Client("http://other:1/", "j").url, Client(key="j").key) == ("http://other:1", "j")
    assert "plm_secret" not in repr(Client())


def test_chat_answers_and_its_trace_id_explains_it(client: Client) -> None:
    result = client.chat("tiny", "hello", max_tokens=5)
    assert is_tiny_text(result.text.strip(), allow=()), result.text
    assert result.finish_reason == "length" and result.rounds == 1
    assert result.usage is not None and result.usage["completion_tokens"] == 5
    assert result.messages == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": result.text},
    ]
    assert result.trace_id and result.trace_ids == (result.trace_id,)
    trail = client.explain(result.trace_id)
    assert (trail["id"], trail["model"], trail["generated_tokens"]) == (result.trace_id, "tiny", 5)
    again = client.chat("tiny", [*result.messages, {"role": "user", "content": "more"}])
    assert again.usage is not None and again.usage["prompt_tokens"] > result.usage["prompt_tokens"]


def test_a_stream_yields_content_then_a_finish_then_usage(client: Client) -> None:
    with client.chat("tiny", "hello", stream=True, max_tokens=6) as stream:
        deltas = list(stream)
    content = [d.content for d in deltas if d.content]
    assert len(content) == 6 and "".join(content) == stream.text
    assert is_tiny_text(stream.text.strip(), allow=())
    assert deltas[-2].finish_reason == "length" and stream.finish_reason == "length"
    assert deltas[-1].usage is not None and deltas[-1].usage["completion_tokens"] == 6
    assert stream.usage == deltas[-1].usage
    assert stream.trace_id and client.explain(stream.trace_id)["stream"] is True
    assert stream.messages[-1] == {"role": "assistant", "content": stream.text}


def test_best_of_keeps_the_candidate_the_engine_finds_likeliest(client: Client) -> None:
    result = client.chat("tiny", "hello", best_of=4, max_tokens=6, temperature=1.5)
    assert len(result.candidates) == 4 and result.rounds == 1
    scores = [c.mean_logprob for c in result.candidates]
    assert all(s is not None and s < 0 for s in scores)
    assert result.mean_logprob == max(s for s in scores if s is not None)
    # The score is the engine's: recomputed from the kept answer's own logprobs.
    engine = [t["logprob"] for t in result.raw["choices"][0]["logprobs"]["content"]]
    assert len(engine) == 6 and math.isclose(sum(engine) / 6, result.mean_logprob or 0)
    assert mean_logprob(result.raw["choices"][0]) == result.mean_logprob
    assert result.text in [c.text for c in result.candidates]
    assert len({c.trace_id for c in result.candidates}) == 4  # four requests


def test_errors_are_typed_and_carry_the_body_and_the_trace_id(
    client: Client, gateway: Gateway
) -> None:
    with pytest.raises(NotFoundError) as missing:
        client.chat("nope", "hi")
    error = missing.value
    assert error.status == 404 and error.code == "model_not_found"
    assert "model 'nope' not found" in error.message and "tiny" in error.message
    assert error.body["error"]["message"] == error.message  # OpenAI's envelope, whole
    assert error.trace_id and error.trace_id in str(error)
    assert client.explain(error.trace_id)["status"] == 404  # the refusal has its trace

    with pytest.raises(NotFoundError):  # a stream's refusal raises from chat itself
        client.chat("nope", "hi", stream=True)
    with pytest.raises(NotFoundError) as no_trace:  # ollama's envelope on /api/*
        client.explain("nope")
    assert no_trace.value.message.startswith("no trace 'nope'")
    with pytest.raises(BadRequestError) as forced:
        client.chat(
            "tiny",
            "hi",
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice="required",
        )
    assert "cannot force a tool call" in forced.value.message

    with pytest.raises(AuthenticationError) as unknown:
        Client(gateway.url, "plm_wrong-" + "c" * 32).models()
    assert unknown.value.status == 401 and unknown.value.trace_id
    with pytest.raises(PermissionDeniedError) as scope:  # an inference key on an admin route
        Client(gateway.url, gateway.app_key).ps()
    assert scope.value.status == 403
    listed = [m["id"] for m in Client(gateway.url, gateway.app_key).models()]
    assert listed == [GEMMA, RERANKER, "tiny"]

    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(APIConnectionError) as refused:
        Client(dead).models()
    assert dead in str(refused.value) and "blazar serve" in str(refused.value)


def test_a_full_model_is_busy_with_retry_after(client: Client) -> None:
    """Gemma has one slot and the queue none: while a stream holds the slot, another
    request is refused at once; leaving the stream frees the slot."""
    with client.chat(GEMMA, "Once upon a time", stream=True, max_tokens=400) as held:
        assert next(held).content  # the slot is taken: Gemma is answering
        with pytest.raises(BusyError) as busy:
            client.chat(GEMMA, "hi", max_tokens=1)
    assert busy.value.status == 503 and busy.value.code == "all_slots_busy"
    assert busy.value.retry_after is not None and busy.value.retry_after >= 1
    assert busy.value.trace_id
    deadline = time.monotonic() + 30
    while any(row["in_flight"] for row in client.ps() if row["model"] == GEMMA):
        assert time.monotonic() < deadline, "the held stream's generation did not stop"
        time.sleep(0.1)


def test_ps_models_and_failover_drain_and_undrain(client: Client) -> None:
    client.chat("tiny", "hi", max_tokens=1)
    rows = {row["model"]: row for row in client.ps()}
    assert rows["tiny"]["pid"] and rows["tiny"]["state"] == "ready"
    assert {"tiny", GEMMA} <= {m["id"] for m in client.models()}
    view = client.failover()
    [spare] = [r for r in view["remotes"] if r["name"] == "spare"]
    assert spare["drained"] is False
    assert client.drain("spare")["drained"] is True
    [spare] = [r for r in client.failover()["remotes"] if r["name"] == "spare"]
    assert spare["drained"] is True
    assert client.undrain("spare")["drained"] is False
    with pytest.raises(NotFoundError) as nope:
        client.drain("nope")
    assert "no remote 'nope'; remotes: spare" in nope.value.message


def test_metadata_of_a_stored_response_is_updated(client: Client) -> None:
    made = client.respond("tiny", "hello", max_output_tokens=2, metadata={"run": "1"})
    updated = client.metadata_update(made["id"], {"run": "2", "owner": "sdk"})
    assert updated["id"] == made["id"] and updated["metadata"] == {"run": "2", "owner": "sdk"}
    kept = client.request("GET", f"/v1/responses/{made['id']}")
    assert kept["metadata"] == {"run": "2", "owner": "sdk"} and kept["output"] == made["output"]
    with pytest.raises(BadRequestError) as long_key:
        client.metadata_update(made["id"], {"k" * 65: "v"})
    assert "longer than 64" in long_key.value.message
    with pytest.raises(NotFoundError):
        client.metadata_update("resp_nope", {})


def test_sessions_are_saved_listed_restored_and_removed(client: Client) -> None:
    talk = client.chat("tiny", "a long talk about the river and the sea", max_tokens=8)
    saved = client.session_save("tiny", "river")
    assert (saved["name"], saved["model"], saved["kind"]) == ("river", "tiny", "saved")
    assert talk.usage is not None and saved["n_tokens"] >= talk.usage["prompt_tokens"]
    assert "river" in [s["name"] for s in client.session_list()]
    restored = client.session_restore("river")
    assert restored["name"] == "river" and isinstance(restored["slot"], int)
    assert client.session_remove("river")["name"] == "river"
    assert "river" not in [s["name"] for s in client.session_list()]
    with pytest.raises(NotFoundError):
        client.session_restore("river")


def test_rerank_puts_the_document_repeating_the_query_first(client: Client) -> None:
    documents = ["a small green bird", "the river has cold water", "the cat sat"]
    ranked = client.rerank(RERANKER, "river water", documents)
    assert ranked["results"][0]["index"] == 1, ranked
    scores = [r["relevance_score"] for r in ranked["results"]]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    assert ranked["usage"]["prompt_tokens"] > 0 and client.last_trace_id
    assert client.explain(client.last_trace_id)["model"] == RERANKER
    top = client.rerank(RERANKER, "green bird", documents, top_n=1, return_documents=True)
    assert top["results"] == [
        {
            "index": 0,
            "relevance_score": top["results"][0]["relevance_score"],
            "document": {"text": "a small green bird"},
        }
    ]
    with pytest.raises(BadRequestError) as chat_model:
        client.rerank("tiny", "river", documents)
    assert 'pooling = "rank"' in chat_model.value.message
    with pytest.raises(BadRequestError) as no_top:
        client.rerank(RERANKER, "river", documents, top_n=0)
    assert "'top_n' must be a positive integer" in no_top.value.message
