"""Rerank (`POST /v1/rerank`, `/rerank`): the request checked, llama-server's answer shaped.

The shape is the one llama-server, Cohere and Jina clients share: a `query`, a list of
`documents` (strings), an optional `top_n` and `return_documents`; the answer's
`results` each name a document by its `index` in the request, with its
`relevance_score`, best first, cut to `top_n`, and with `document: {"text": ...}` when
`return_documents` is true; `usage` counts the prompt tokens. llama-server's own
`/v1/rerank` (a child started with `--embeddings --pooling rank`) scores every document;
the order, the cut and the documents are put right here, so the answer is the same
whatever the engine does with `top_n` or `return_documents` (llama-server ignores the
latter).

`rerank_request` refuses (400, OpenAI's `invalid_request_error`) a request the engine
would misread: no query, documents that are not a non-empty list of strings, a `top_n`
that is not a positive integer, a `return_documents` that is not a boolean. The route is
`blazar.serve.routes.rerank_api`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from blazar.protocols import EngineRequest, ProtocolError

ENGINE_PATH = "/v1/rerank"
INVALID = "invalid_request_error"


def _refuse(message: str) -> ProtocolError:
    return ProtocolError(400, message, INVALID)


def rerank_request(body: Mapping[str, Any]) -> EngineRequest:
    """The client's rerank request -> llama-server's `/v1/rerank` (every document scored);
    `hints` carries what the answer needs back: the documents, `top_n`, `return_documents`."""
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise _refuse("'query' is required: a non-empty string")
    documents = body.get("documents")
    if (
        not isinstance(documents, list)
        or not documents
        or not all(isinstance(d, str) for d in documents)
    ):
        raise _refuse("'documents' must be a non-empty list of strings")
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise _refuse("'top_n' must be a positive integer (or left out: every document)")
    return_documents = body.get("return_documents", False)
    if not isinstance(return_documents, bool):
        raise _refuse("'return_documents' must be true or false")
    engine = {"query": query, "documents": documents}
    if isinstance(body.get("model"), str):
        engine["model"] = body["model"]
    hints = {"documents": documents, "top_n": top_n, "return_documents": return_documents}
    return EngineRequest(ENGINE_PATH, engine, False, hints)


def rerank_response(
    engine: Mapping[str, Any], hints: Mapping[str, Any], *, model: str, id_: str
) -> dict[str, Any]:
    """llama-server's `/v1/rerank` answer -> the client's: `results` best first (ties in
    the request's order), cut to `top_n`, with each document's text when asked for. An
    answer that does not score every document once is a 502, never a partial ranking."""
    documents: Sequence[str] = hints["documents"]
    scores = _scores(engine.get("results"), len(documents))
    if len(scores) != len(documents):
        raise ProtocolError(
            502,
            f"the engine scored {len(scores)} of {len(documents)} documents",
            "upstream_error",
        )
    ranked = sorted(scores.items(), key=_best_first)
    results = []
    for index, score in ranked[: hints.get("top_n")]:
        out: dict[str, Any] = {"index": index, "relevance_score": score}
        if hints.get("return_documents"):
            out["document"] = {"text": documents[index]}
        results.append(out)
    usage = engine.get("usage")
    prompt = _count(usage, "prompt_tokens") or 0
    total = _count(usage, "total_tokens")
    return {
        "id": id_,
        "object": "list",
        "model": model,
        "results": results,
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt if total is None else total},
    }


def _scores(results: Any, count: int) -> dict[int, float]:
    """Each document's score by its index, from the engine's `results` (what is not an
    index below `count` with a finite number is left out)."""
    out: dict[int, float] = {}
    for result in results if isinstance(results, list) else ():
        if not isinstance(result, Mapping):
            continue
        index, score = result.get("index"), result.get("relevance_score")
        if _integer(index) and 0 <= index < count and _number(score):
            out[index] = float(score)
    return out


def _count(usage: Any, key: str) -> int | None:
    value = usage.get(key) if isinstance(usage, Mapping) else None
    return value if _integer(value) and value >= 0 else None


def _best_first(item: tuple[int, float]) -> tuple[float, int]:
    return -item[1], item[0]


def _integer(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
