"""The lane decision (issue 30): every request that needs a rewrite goes to the interpreted
pipeline; a plain chat, completion or embeddings request for the model as it is served
takes the relay. A table, one row per case (`blazar.serve.gateway.lanes.decide`)."""

from __future__ import annotations

from typing import Any

import pytest

from blazar.serve.gateway.lanes import RELAY, Head, Interpret, Model, Settings, decide

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]
PLAIN = {"model": "tiny", "messages": HI}
STREAM = {**PLAIN, "stream": True}


def head(path: str = CHAT, method: str = "POST", **headers: str) -> Head:
    return Head(method, path, {k.replace("_", "-"): v for k, v in headers.items()})


M = Model("tiny")
S = Settings()

# (case, head, body, model, settings, images, the reason's words or None for the relay)
ROWS: list[tuple[str, Head, dict[str, Any], Model, Settings, bool, str | None]] = [
    ("a plain chat", head(), PLAIN, M, S, False, None),
    ("a plain stream", head(), STREAM, M, S, False, None),
    ("a priority header is fine", head(x_blazar_priority="high"), PLAIN, M, S, False, None),
    ("a keep_alive is fine", head(), {**PLAIN, "keep_alive": 0}, M, S, False, None),
    ("embeddings", head("/v1/embeddings"), {"model": "tiny", "input": "x"}, M, S, False, None),
    (
        "a plain completion",
        head("/v1/completions"),
        {"model": "tiny", "prompt": "x"},
        M,
        S,
        False,
        None,
    ),
    ("the relay off", head(), PLAIN, M, Settings(relay=False), False, "relay is off"),
    ("an ollama route", head("/api/chat"), PLAIN, M, S, False, "does not carry"),
    ("anthropic messages", head("/v1/messages"), PLAIN, M, S, False, "does not carry"),
    ("responses", head("/v1/responses"), PLAIN, M, S, False, "does not carry"),
    ("a GET", head(method="GET"), PLAIN, M, S, False, "does not carry"),
    ("CORS", head(origin="http://x"), PLAIN, M, S, False, "CORS"),
    ("expect", head(expect="100-continue"), PLAIN, M, S, False, "Expect"),
    ("gzip", head(content_encoding="gzip"), PLAIN, M, S, False, "compressed"),
    ("an alias", head(), {**PLAIN, "model": "tiny-alias"}, M, S, False, "as asked"),
    ("an adapter in the name", head(), {**PLAIN, "model": "tiny+fox"}, M, S, False, "as asked"),
    ("no model", head(), {"messages": HI}, M, S, False, "as asked"),
    (
        "an OpenAI-only engine",
        head(),
        PLAIN,
        Model("tiny", dialect="openai"),
        S,
        False,
        "OpenAI's API",
    ),
    ("no engine", head(), PLAIN, Model("tiny", refusal=True), S, False, "no engine"),
    ("failover", head(), PLAIN, Model("tiny", failover=True), S, False, "failover"),
    ("gateway-run MCP tools", head(), {**PLAIN, "mcp": ["weather"]}, M, S, False, "mcp"),
    ("images", head(), PLAIN, M, S, True, "images"),
    (
        "legacy completion shapes",
        head("/v1/completions"),
        {"model": "tiny", "prompt": "x"},
        Model("tiny", shaped=True),
        S,
        False,
        "reshaped",
    ),
    ("always-on adapters", head(), PLAIN, Model("tiny", adapters=True), S, False, "adapters"),
    ("a model system prompt", head(), PLAIN, Model("tiny", system=True), S, False, "defaults"),
    ("model parameters", head(), PLAIN, Model("tiny", params=True), S, False, "defaults"),
    (
        "the default output cap",
        head(),
        PLAIN,
        Model("tiny", max_tokens=128),
        S,
        False,
        "output limit",
    ),
    (
        "the cap, with the request's own limit",
        head(),
        {**PLAIN, "max_tokens": 5},
        Model("tiny", max_tokens=128),
        S,
        False,
        None,
    ),
    (
        "the cap, n_predict",
        head(),
        {**PLAIN, "n_predict": 5},
        Model("tiny", max_tokens=128),
        S,
        False,
        None,
    ),
    (
        "the cap, the child started with the same -n",
        head(),
        PLAIN,
        Model("tiny", max_tokens=128, child_max_tokens=128),
        S,
        False,
        None,
    ),
    (
        "the cap, the child with another -n",
        head(),
        PLAIN,
        Model("tiny", max_tokens=128, child_max_tokens=64),
        S,
        False,
        "output limit",
    ),
    (
        "the cap does not apply to embeddings",
        head("/v1/embeddings"),
        {"model": "tiny", "input": "x"},
        Model("tiny", max_tokens=128),
        S,
        False,
        None,
    ),
    ("sessions", head(), PLAIN, Model("tiny", sessions=True), S, False, "sessions"),
    (
        "singleflight, whole",
        head(),
        {**PLAIN, "temperature": 0},
        Model("tiny", singleflight=True),
        S,
        False,
        "singleflight",
    ),
    (
        "singleflight, a sampled request",
        head(),
        {**PLAIN, "temperature": 0.7},
        Model("tiny", singleflight=True),
        S,
        False,
        None,
    ),
    (
        "singleflight never shares a stream",
        head(),
        STREAM,
        Model("tiny", singleflight=True),
        S,
        False,
        None,
    ),
    ("the response cache", head(), PLAIN, M, Settings(cache=True), False, "cache"),
    (
        "sentinel_enforce",
        head(),
        PLAIN,
        M,
        Settings(sentinel_enforce=True),
        False,
        "sentinel_enforce",
    ),
    (
        "a schema",
        head(),
        {**PLAIN, "response_format": {"type": "json_object"}},
        M,
        S,
        False,
        "schema",
    ),
    ("a grammar", head(), {**PLAIN, "grammar": 'root ::= "a"'}, M, S, False, "schema"),
    (
        "a schema with the sentinels off",
        head(),
        {**PLAIN, "json_schema": {}},
        M,
        Settings(sentinel=False),
        False,
        None,
    ),
    ("speculative, whole", head(), PLAIN, Model("tiny", spec="ngram"), S, False, "speculative"),
    ("speculative, streamed", head(), STREAM, Model("tiny", spec="ngram"), S, False, None),
]


@pytest.mark.parametrize(
    ("head_", "body", "model", "settings", "images", "reason"),
    [pytest.param(*row[1:], id=row[0]) for row in ROWS],
)
def test_the_lane(
    head_: Head,
    body: dict[str, Any],
    model: Model,
    settings: Settings,
    images: bool,
    reason: str | None,
) -> None:
    lane = decide(head_, body, model, settings, images=images)
    if reason is None:
        assert lane is RELAY
    else:
        assert isinstance(lane, Interpret), lane
        assert reason in lane.reason


def test_the_relays_access_checks_count_a_keys_rate_once() -> None:
    """relay_grant checks Host, key and scope without taking from the key's rate; only a
    request the relay then carries is taken (relay_take), so a request it hands to
    aiohttp is counted once, by guard."""
    import hashlib

    from blazar.serve.gateway.access import Access
    from specs.keys import Key
    from specs.serving import Serving

    access = Access()
    secret = "plm_" + "r" * 40
    key = Key(sha256=hashlib.sha256(secret.encode()).hexdigest(), rpm=2)
    access.configure(Serving(), {"slow": key})
    headers = {"host": "127.0.0.1:1", "authorization": f"Bearer {secret}"}
    for _ in range(5):  # checked, never taken
        allowed, name, grant = access.relay_grant(headers)
        assert allowed and name == "slow" and grant is not None
    assert access.relay_take(grant) and access.relay_take(grant)
    assert not access.relay_take(grant)  # the third within the minute: guard refuses it
    assert access.relay_grant({**headers, "authorization": "Bearer plm_wrong"})[0] is False
    assert access.relay_grant({**headers, "host": "evil.example"})[0] is False
    assert access.relay_grant({"host": "127.0.0.1"})[0] is False  # no key
