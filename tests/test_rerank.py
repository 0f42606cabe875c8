"""Rerank (`POST /v1/rerank`, `/rerank`) served by a real reranker child, and its parts.

The model is a tiny reranker the tests write (`blazar.testing.tiny.write_tiny_reranker`):
a `qwen3` GGUF with a classification head (`cls.output.weight`), run by the engine with
`--embeddings --pooling rank` as `pooling = "rank"` declares. Its weights count, at the
prompt's last token, how many tokens already occurred earlier in `[BOS] query document`,
so a document that repeats the query's words scores near 1 and one that shares none
about 0.1, deterministically, for any query. Gemma 3 270M was not used: it has no
classification head, so llama.cpp's rank pooling has nothing to score with, and a
per-token bias (one boosted word) would not show that the score depends on the query.

One `blazar serve` with keys carries the served checks: the ordering, top_n and
return_documents, both spellings, the 400s in OpenAI's error shape (a model that is not
a reranker says to declare `pooling = "rank"`), the keys (401 without one, 404 for a key
whose models leave the reranker out), and the trace `blazar why` shows. The translator's
checks and shaping are property-tested over hostile bodies and engine answers.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.engines.launchers import llama_launcher as launcher
from blazar.protocols import ProtocolError
from blazar.protocols.rerank import rerank_request, rerank_response
from blazar.testing.tiny import write_tiny_model, write_tiny_reranker
from tests.conftest import run_blazar
from tests.fixtures import ENGINE, WHEELS, model_block
from tests.serving import Served

SECRETS = {
    "ops": "plm_ops-" + "a" * 40,  # admin: reads traces
    "app": "plm_app-" + "b" * 40,  # inference, the reranker and tiny
    "chat": "plm_chat-" + "c" * 40,  # inference, tiny only
}
QUERY = "river water"
DOCUMENTS = [
    "the cat sat on a red door",  # shares no word with the query
    "the river has cold water",  # repeats both of the query's words
    "a small green bird",  # shares no word
]


def _block(name: str, secret: str, **fields: object) -> str:
    lines = [f"[keys.{name}]", f'sha256 = "{hashlib.sha256(secret.encode()).hexdigest()}"']
    lines += [f"{key} = {json.dumps(value)}" for key, value in fields.items()]
    return "\n".join(lines) + "\n\n"


class Host:
    def __init__(self, served: Served) -> None:
        self.served = served

    def post(
        self, body: dict[str, Any], *, key: str = "app", path: str = "/v1/rerank", trace: str = ""
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {SECRETS[key]}"} if key else {}
        if trace:
            headers["x-request-id"] = trace
        return httpx.post(self.served.url + path, json=body, headers=headers, timeout=60)

    def rerank(self, **body: Any) -> dict[str, Any]:
        answer = self.post({"model": "rr", "query": QUERY, "documents": DOCUMENTS, **body})
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    root = tmp_path_factory.mktemp("rerank")
    reranker = write_tiny_reranker(root / "rr.gguf")
    tiny = write_tiny_model(root / "tiny.gguf")
    text = ENGINE + model_block("rr", reranker, embeddings=True, pooling="rank", ctx=512)
    text += model_block("tiny", tiny, ctx=256)
    text += _block("ops", SECRETS["ops"], scope="admin")
    text += _block("app", SECRETS["app"], models=["rr", "tiny"])
    text += _block("chat", SECRETS["chat"], models=["tiny"])
    (root / "manifest").mkdir()
    manifest = root / "manifest" / "blazar.toml"
    manifest.write_text(text)
    home = root / "home"
    env = {"BLAZAR_HOME": str(home), "BLAZAR_WHEEL_CACHE": str(WHEELS)}
    with Served(manifest, home, env=env) as served:
        yield Host(served)


# -- served -----------------------------------------------------------------------------


def test_a_document_repeating_the_query_outranks_the_others(host: Host) -> None:
    answer = host.rerank()
    results = answer["results"]
    assert results[0]["index"] == 1, results
    assert sorted(r["index"] for r in results) == [0, 1, 2]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert scores[0] > 0.9 > 0.5 > scores[1], scores
    assert all("document" not in r for r in results)  # only when asked for
    assert answer["model"] == "rr" and answer["object"] == "list"
    assert answer["id"].startswith("rerank-")
    assert answer["usage"]["prompt_tokens"] > 0
    # The score follows the query: the same documents, another query, another winner.
    other = host.post({"model": "rr", "query": "a green bird", "documents": DOCUMENTS})
    assert other.status_code == 200, other.text
    assert other.json()["results"][0]["index"] == 2, other.json()


def test_top_n_and_return_documents_are_honoured_on_both_spellings(host: Host) -> None:
    answer = host.rerank(top_n=1, return_documents=True)
    assert answer["results"] == [
        {
            "index": 1,
            "relevance_score": answer["results"][0]["relevance_score"],
            "document": {"text": DOCUMENTS[1]},
        }
    ]
    assert len(host.rerank(top_n=2)["results"]) == 2
    assert len(host.rerank(top_n=50)["results"]) == 3  # more than there are: all
    body = {"model": "rr", "query": QUERY, "documents": DOCUMENTS, "top_n": 2}
    same = host.post(body, path="/rerank")
    assert same.status_code == 200, same.text
    assert [r["index"] for r in same.json()["results"]] == [
        r["index"] for r in host.rerank(top_n=2)["results"]
    ]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"query": None}, "'query' is required"),
        ({"query": ""}, "'query' is required"),
        ({"query": ["river"]}, "'query' is required"),
        ({"documents": "the river"}, "'documents' must be a non-empty list of strings"),
        ({"documents": []}, "'documents' must be a non-empty list of strings"),
        ({"documents": ["ok", 3]}, "'documents' must be a non-empty list of strings"),
        ({"documents": [{"text": "ok"}]}, "'documents' must be a non-empty list of strings"),
        ({"top_n": 0}, "'top_n' must be a positive integer"),
        ({"top_n": -2}, "'top_n' must be a positive integer"),
        ({"top_n": "2"}, "'top_n' must be a positive integer"),
        ({"top_n": True}, "'top_n' must be a positive integer"),
        ({"top_n": 1.5}, "'top_n' must be a positive integer"),
        ({"return_documents": "yes"}, "'return_documents' must be true or false"),
        ({"model": "tiny"}, 'declare models.tiny.pooling = "rank"'),
    ],
)
def test_a_request_it_cannot_serve_is_a_400_in_openai_shape(
    host: Host, fields: dict[str, Any], words: str
) -> None:
    body = {"model": "rr", "query": QUERY, "documents": DOCUMENTS, **fields}
    body = {k: v for k, v in body.items() if v is not None}
    answer = host.post(body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and words in error["message"], error


def test_a_reranker_on_the_embeddings_route_is_sent_to_rerank(host: Host) -> None:
    # llama-server answers /v1/embeddings of a rank-pooled model with nulls, not vectors.
    answer = host.post({"model": "rr", "input": "river"}, path="/v1/embeddings")
    assert answer.status_code == 400, answer.text
    assert "send it to /v1/rerank" in answer.json()["error"]["message"]


def test_rerank_is_keyed_like_the_other_inference_routes(host: Host) -> None:
    body = {"model": "rr", "query": QUERY, "documents": DOCUMENTS}
    anonymous = host.post(body, key="")
    assert anonymous.status_code == 401 and "error" in anonymous.json(), anonymous.text
    hidden = host.post(body, key="chat")  # its models leave rr out: as if absent
    assert hidden.status_code == 404, hidden.text
    assert hidden.json()["error"]["code"] == "model_not_found"
    assert "rr" not in hidden.json()["error"]["message"].replace("'rr'", "")


def test_a_rerank_is_traced_and_blazar_why_shows_it(host: Host) -> None:
    trace = uuid.uuid4().hex
    body = {"model": "rr", "query": QUERY, "documents": DOCUMENTS}
    assert host.post(body, trace=trace).status_code == 200
    ops = {"Authorization": f"Bearer {SECRETS['ops']}"}
    url = f"{host.served.url}/api/why/{trace}?wait=10"
    record = httpx.get(url, headers=ops, timeout=30).json()  # its end, which may trail
    assert record["status"] == 200 and record["model"] == "rr", record
    assert record["prompt_tokens"] > 0 and not record["sentinels"], record
    shown = run_blazar(
        "why", trace, "--json", "--url", host.served.url, env={"BLAZAR_API_KEY": SECRETS["ops"]}
    )
    assert shown.returncode == 0, shown.stderr
    seen = json.loads(shown.stdout)
    assert seen["id"] == trace and seen["route"] == "/v1/rerank" and seen["model"] == "rr", seen
    assert seen["key"] == "app" and seen["protocol"] == "openai", seen
    metrics = httpx.get(f"{host.served.url}/metrics", headers=ops, timeout=30).text
    assert any(
        line.startswith("blazar_requests_total{") and 'model="rr"' in line
        for line in metrics.splitlines()
    ), metrics


# -- the launcher -----------------------------------------------------------------------


def test_the_wheel_launcher_takes_llama_servers_reranking_flag() -> None:
    import xllamacpp

    for flag in ("--reranking", "--rerank"):
        params = launcher.parse_args(["-m", "m.gguf", flag])
        assert params.embedding is True
        assert params.pooling_type == xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_RANK


# -- the translator, over hostile input -------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
FIELDS = st.sampled_from(["query", "documents", "top_n", "return_documents", "model", "x"])
WELL_FORMED = st.fixed_dictionaries(
    {
        "query": st.text(min_size=1, max_size=20),
        "documents": st.lists(st.text(max_size=20), min_size=1, max_size=8),
    },
    optional={
        "top_n": st.integers(min_value=1, max_value=20),
        "return_documents": st.booleans(),
        "model": st.text(max_size=8),
    },
)


@settings(max_examples=300)
@given(
    st.one_of(
        st.dictionaries(FIELDS, JSON),
        WELL_FORMED,
        st.builds(lambda good, bad: {**good, **bad}, WELL_FORMED, st.dictionaries(FIELDS, JSON)),
    )
)
def test_any_body_is_either_an_engine_request_or_a_400(body: dict[str, Any]) -> None:
    try:
        engine = rerank_request(body)
    except ProtocolError as refused:
        assert refused.status == 400 and refused.code == "invalid_request_error"
        return
    assert engine.path == "/v1/rerank" and engine.stream is False
    assert isinstance(engine.body["query"], str) and engine.body["query"]
    documents = engine.body["documents"]
    assert documents and all(isinstance(d, str) for d in documents)
    assert set(engine.body) <= {"model", "query", "documents"}  # all scored, shaped here
    top_n = engine.hints["top_n"]
    assert top_n is None or (type(top_n) is int and top_n >= 1)
    assert type(engine.hints["return_documents"]) is bool


SCORES = st.floats(allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=300)
@given(
    documents=st.lists(st.text(max_size=6), min_size=1, max_size=8),
    data=st.data(),
)
def test_the_answer_is_best_first_cut_to_top_n_whatever_order_the_engine_sends(
    documents: list[str], data: st.DataObject
) -> None:
    n = len(documents)
    scores = data.draw(st.lists(SCORES, min_size=n, max_size=n))
    order = data.draw(st.permutations(range(n)))
    top_n = data.draw(st.none() | st.integers(min_value=1, max_value=n + 3))
    wanted = data.draw(st.booleans())
    engine = {
        "results": [{"index": i, "relevance_score": scores[i]} for i in order],
        "usage": {"prompt_tokens": 7, "total_tokens": 7},
    }
    hints = {"documents": documents, "top_n": top_n, "return_documents": wanted}
    answer = rerank_response(engine, hints, model="rr", id_="rerank-1")
    results = answer["results"]
    assert len(results) == min(n, top_n or n)
    got = [(r["relevance_score"], r["index"]) for r in results]
    best = sorted(((scores[i], i) for i in range(n)), key=lambda p: (-p[0], p[1]))
    assert got == best[: len(results)]
    for r in results:
        assert ("document" in r) is wanted
        if wanted:
            assert r["document"] == {"text": documents[r["index"]]}
    assert answer["usage"] == {"prompt_tokens": 7, "total_tokens": 7}


@settings(max_examples=200)
@given(engine=st.dictionaries(st.sampled_from(["results", "usage"]), JSON))
def test_an_engine_answer_missing_scores_is_a_502_never_a_wrong_ranking(
    engine: dict[str, Any],
) -> None:
    hints = {"documents": ["a", "b"], "top_n": None, "return_documents": False}
    try:
        answer = rerank_response(engine, hints, model="rr", id_="rerank-1")
    except ProtocolError as failed:
        assert failed.status == 502
        return
    assert sorted(r["index"] for r in answer["results"]) == [0, 1]
    assert all(math.isfinite(r["relevance_score"]) for r in answer["results"])


def test_the_reranker_file_is_the_same_for_the_same_seed(tmp_path: Path) -> None:
    first = write_tiny_reranker(tmp_path / "a.gguf").read_bytes()
    assert first == write_tiny_reranker(tmp_path / "b.gguf").read_bytes()
    assert first != write_tiny_reranker(tmp_path / "c.gguf", seed=1).read_bytes()
