"""The response cache's decisions and shapes, without a serve (docs/cache.md).

Tables for the pure decisions (which tiers a request may use, what is reproducible, what
names an entry and a prefix bucket); the replay shapes round-tripped through the readers
for every engine endpoint, whole and streamed (Hypothesis over texts and tool calls); and
the store's bounds (TTL, max_bytes least recently used out, a model's identity changed,
a key removed, clear) on a real SQLite store. The served behaviour is
tests/test_cache_served.py's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.protocols.replay import (
    CHAT,
    COMPLETIONS,
    MESSAGES,
    NATIVE,
    Collector,
    Recorded,
    engine_stream,
    engine_whole,
    recorded,
)
from blazar.protocols.sse import SSEDecoder
from blazar.serve.request.cache import (
    Lookup,
    ResponseCache,
    bucket_key,
    bypass_reason,
    cache_applies,
    canonical,
    exact_key,
    last_user_text,
    not_reproducible,
    unit,
    wanted_tiers,
)
from specs.serving import ResponseCache as Settings

ON = Settings(enabled=True, model="emb")


@pytest.mark.parametrize(
    ("settings", "headers", "tiers", "reason"),
    [
        (Settings(), {}, (), "no tier"),
        (ON, {}, ("exact", "semantic"), None),
        (Settings(enabled=True), {}, ("exact",), None),  # no embeddings model: exact only
        (Settings(enabled=True, model="emb", tiers=["exact"]), {}, ("exact",), None),
        (ON, {"x-blazar-cache": "exact"}, ("exact",), None),
        (ON, {"x-blazar-cache": "semantic"}, ("exact", "semantic"), None),
        (ON, {"x-blazar-cache": "off"}, (), "off"),
        (ON, {"Cache-Control": "no-cache"}, (), "no-cache"),
        (ON, {"Cache-Control": "max-age=0, no-store"}, (), "no-store"),
    ],
)
def test_the_tiers_a_request_may_use(
    settings: Settings, headers: dict[str, str], tiers: tuple[str, ...], reason: str | None
) -> None:
    assert wanted_tiers(settings, headers) == tiers
    if reason is not None:
        assert bypass_reason(settings, headers) == reason
    assert cache_applies(settings, "tiny", headers) == bool(tiers)
    if settings.model is not None:  # the embeddings model itself: never
        assert not cache_applies(settings, settings.model, headers)


@pytest.mark.parametrize(
    ("body", "params", "deterministic", "why"),
    [
        ({"temperature": 0}, {}, False, None),
        ({"temperature": 0.0, "seed": 3}, {}, False, None),
        ({}, {"temperature": 0}, False, None),  # the model's default
        ({"temperature": 0.7}, {"temperature": 0}, False, "not reproducible"),
        ({}, {}, False, "not reproducible"),  # the engine's default samples
        ({"seed": 7, "temperature": 0.8}, {}, True, None),  # a seed on a deterministic model
        ({"seed": 7, "temperature": 0.8}, {}, False, "not reproducible"),
        ({"seed": True, "temperature": 0.8}, {}, True, "not reproducible"),
        ({"temperature": 0, "n": 2}, {}, False, "n > 1"),
        ({"temperature": 0, "logprobs": True}, {}, False, "logprobs"),
        ({"temperature": 0, "n_probs": 3}, {}, False, "logprobs"),
        ({"temperature": False}, {}, False, "not reproducible"),
    ],
)
def test_only_reproducible_requests_are_cached(
    body: dict[str, Any], params: dict[str, Any], deterministic: bool, why: str | None
) -> None:
    found = not_reproducible(body, params, deterministic)
    assert (found is None) if why is None else (found is not None and found.startswith(why))


CONVERSATION = {
    "temperature": 0,
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is the weather"},
        {"role": "assistant", "content": "rain"},
        {"role": "user", "content": "and tomorrow"},
    ],
}


def _with(**changes: Any) -> dict[str, Any]:
    return orjson.loads(orjson.dumps({**CONVERSATION, **changes}))


def test_an_exact_key_names_everything_that_changes_the_answer_and_nothing_else() -> None:
    key = exact_key("app", "id", canonical(CHAT, CONVERSATION))
    same = [
        _with(stream=True, stream_options={"include_usage": True}),
        _with(model="another-alias"),
    ]
    for body in same:
        assert exact_key("app", "id", canonical(CHAT, body)) == key
    other = [
        ("other", "id", CHAT, CONVERSATION),  # another API key
        ("app", "id2", CHAT, CONVERSATION),  # another model identity
        ("app", "id", COMPLETIONS, CONVERSATION),  # another endpoint
        ("app", "id", CHAT, _with(temperature=0.0, max_tokens=5)),
        ("app", "id", CHAT, _with(tools=[{"type": "function"}])),
    ]
    for scope, model, path, body in other:
        assert exact_key(scope, model, canonical(path, body)) != key


def test_the_prefix_bucket_is_everything_but_the_last_user_message() -> None:
    bucket = bucket_key("app", "id", canonical(CHAT, CONVERSATION))
    reworded = _with()
    reworded["messages"][-1]["content"] = "and the day after"
    assert bucket_key("app", "id", canonical(CHAT, reworded)) == bucket
    for changed in ("be long", None):
        earlier = _with()
        if changed:
            earlier["messages"][0]["content"] = changed
        else:
            earlier["messages"][2]["content"] = "sun"  # an earlier turn changed
        assert bucket_key("app", "id", canonical(CHAT, earlier)) != bucket
    assert bucket_key("app", "id", canonical(CHAT, _with(max_tokens=9))) != bucket


@pytest.mark.parametrize(
    ("messages", "text"),
    [
        ([{"role": "user", "content": "hi"}], "hi"),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
            "a\nb",
        ),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], None),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], None),
        ([{"role": "tool", "content": "42"}], None),
        ([], None),
    ],
)
def test_the_last_user_text(messages: list[Any], text: str | None) -> None:
    assert last_user_text({"messages": messages}) == text


# -- the replay shapes --------------------------------------------------------------


calls = st.lists(
    st.builds(
        lambda i, name, city: {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": name, "arguments": orjson.dumps({"city": city}).decode()},
        },
        st.integers(0, 99),
        st.text("abcxyz_", min_size=1, max_size=8),
        st.text(max_size=12),
    ),
    max_size=2,
)
records = st.builds(
    Recorded,
    text=st.text(max_size=40),
    tool_calls=calls,
    finish=st.sampled_from(["stop", "length", "tool_calls"]),
    prompt_tokens=st.integers(0, 5000),
    completion_tokens=st.integers(0, 5000),
)


def _events(stream: bytes) -> list[Any]:
    return [event.data for event in SSEDecoder().feed(stream)]  # parsed JSON, or [DONE]


def _expected(path: str, rec: Recorded) -> Recorded:
    """What the endpoint can say of `rec`: a completion has no tool calls."""
    if path in (COMPLETIONS, NATIVE):
        finish = "length" if rec.finish == "length" else "stop"
        return Recorded(
            rec.text,
            [],
            finish if path == NATIVE else rec.finish,
            rec.prompt_tokens,
            rec.completion_tokens,
        )
    return rec


@settings(max_examples=60, deadline=None)
@given(rec=records, path=st.sampled_from([CHAT, COMPLETIONS, NATIVE, MESSAGES]))
def test_an_answer_written_back_reads_as_it_was_whole_and_streamed(
    rec: Recorded, path: str
) -> None:
    if path in (COMPLETIONS, NATIVE):
        rec.tool_calls = []
    want = _expected(path, rec)
    whole = orjson.loads(engine_whole(path, rec, "tiny", "x1", 1))
    assert recorded(path, whole) == want
    collector = Collector(path)
    events = _events(engine_stream(path, rec, "tiny", "x1", 1))
    for data in events:
        collector.feed(data)
    assert collector.result() == want
    if path in (CHAT, COMPLETIONS):
        assert events[-1] == "[DONE]"
        assert whole["usage"]["prompt_tokens_details"]["cached_tokens"] == rec.prompt_tokens
    if path == MESSAGES:
        assert events[-1]["type"] == "message_stop"
        assert whole["usage"]["cache_read_input_tokens"] == rec.prompt_tokens


def test_a_stream_cut_short_or_failed_is_not_stored() -> None:
    rec = Recorded("hello", [], "stop", 3, 1)
    events = _events(engine_stream(CHAT, rec, "tiny", "x", 1))
    cut = Collector(CHAT)
    for data in events[:2]:  # no finish reason yet
        cut.feed(data)
    assert cut.result() is None
    failed = Collector(CHAT)
    for data in [*events[:2], {"error": {"message": "boom"}}, *events[2:]]:
        failed.feed(data)
    assert failed.result() is None
    thinking = Collector(CHAT)
    thinking.feed({"choices": [{"delta": {"reasoning_content": "hmm"}}]})
    for data in events:
        thinking.feed(data)
    assert thinking.result() is None


# -- the store's bounds ---------------------------------------------------------------


def _look(key: str, model: str = "tiny", scope: str = "app", identity: str = "id") -> Lookup:
    return Lookup(
        "miss",
        stores=True,
        key=key,
        scope=scope,
        model=model,
        identity=identity,
        request='{"r": 1}',
        path=CHAT,
    )


def _keys(cache: ResponseCache) -> set[str]:
    table = cache._opened()
    assert table is not None
    return {row[0] for row in table.conn.execute("SELECT key FROM cache_entries")}


def test_least_recently_used_entries_go_past_max_bytes(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path / "blazar.db")
    rec = Recorded("x" * 300, [], "stop", 1, 1)
    bounded = Settings(enabled=True, max_bytes=2400)  # four entries of about 590 bytes
    for n in range(4):
        cache.store(_look(f"k{n}"), rec, f"trace-{n}", bounded)
    table = cache._opened()
    assert table is not None
    table.touch("k0", 1e12)  # k0 used last
    for n in range(4, 7):
        cache.store(_look(f"k{n}"), rec, f"trace-{n}", bounded)
    kept = _keys(cache)
    assert table.totals()[1] <= 2400 and "k0" in kept and "k1" not in kept, kept
    assert cache.counters.evictions["max_bytes"] >= 1


def test_ttl_a_changed_identity_a_removed_key_and_clear(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path / "blazar.db")
    rec = Recorded("hi", [], "stop", 1, 1)
    forever = Settings(enabled=True, ttl=-1)
    cache.store(_look("a", scope="app"), rec, "t", forever)
    cache.store(_look("b", scope="gone"), rec, "t", forever)
    cache.store(_look("c", model="other", scope=""), rec, "t", forever)
    cache.store(_look("d", model="other", scope="*"), rec, "t", forever)
    table = cache._opened()
    assert table is not None
    cache.keep_keys({"app"})  # "gone" removed; no key ("") and global ("*") stay
    assert _keys(cache) == {"a", "c", "d"}
    cache._same_model(table, "tiny", "id2")  # tiny's identity changed
    assert _keys(cache) == {"c", "d"}
    cache.store(_look("f", model="removed"), rec, "t", forever)
    cache.keep_models({"tiny", "other"})  # "removed" is no longer declared
    assert _keys(cache) == {"c", "d"}
    assert cache.clear("other") == 2 and _keys(cache) == set()
    stale = Settings(enabled=True, ttl=0)
    cache.store(_look("e"), rec, "t", forever)
    entry = table.get("e")
    assert entry is not None and not cache._fresh(table, entry, entry.created + 1, stale)
    assert _keys(cache) == set()
    assert cache.counters.evictions == {
        "key removed": 1,
        "model removed": 1,
        "model changed": 1,
        "cleared": 2,
        "ttl": 1,
    }


def test_semantic_vectors_are_found_by_cosine_and_survive_a_restart(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path / "blazar.db")
    rec = Recorded("hi", [], "stop", 1, 1)
    look = _look("s")
    look.bucket, look.vector = "b1", unit([1.0, 0.0, 0.2]).tobytes()  # type: ignore[union-attr]
    cache.store(look, rec, "t", ON)
    again = ResponseCache(tmp_path / "blazar.db")
    buckets = asyncio.run(again._vectors())  # loaded in a thread
    near = buckets["b1"].best(unit([1.0, 0.05, 0.2]))  # type: ignore[arg-type]
    assert near is not None and near[0] == "s" and near[1] > 0.99
    assert unit([0.0, 0.0]) is None


def test_the_vectors_load_in_a_thread_and_what_is_stored_meanwhile_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load from the store runs off the event loop; an entry stored and one deleted
    while it runs are applied once it is in, whichever side of its read they fell."""
    import threading

    from blazar.serve.request import cache as module

    cache = ResponseCache(tmp_path / "blazar.db")
    rec = Recorded("hi", [], "stop", 1, 1)
    for key, values in (("a", [1.0, 0.0, 0.0]), ("b", [0.0, 1.0, 0.0])):
        look = _look(key)
        look.bucket, look.vector = "b1", unit(values).tobytes()  # type: ignore[union-attr]
        cache.store(look, rec, "t", ON)
    again = ResponseCache(tmp_path / "blazar.db")
    release, loader = threading.Event(), module.load_buckets
    threads: list[str] = []

    def slow_load(db: Path) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        release.wait(10)
        return loader(db)

    monkeypatch.setattr(module, "load_buckets", slow_load)

    async def scenario() -> dict[str, Any]:
        first = asyncio.ensure_future(again._vectors())
        second = asyncio.ensure_future(again._vectors())  # the same load
        await asyncio.sleep(0.05)  # the loop is free while the load waits
        assert not first.done() and again._loading is not None
        look = _look("c")
        look.bucket, look.vector = "b1", unit([0.0, 0.0, 1.0]).tobytes()  # type: ignore[union-attr]
        again.store(look, rec, "t", ON)
        again.clear(key="nobody")  # deletes nothing
        assert again._forget([("b1", "a")], "cleared") == 1
        release.set()
        buckets = await first
        assert await second is buckets
        return buckets

    buckets = asyncio.run(scenario())
    assert len(threads) == 1 and threads[0] != threading.main_thread().name
    assert set(buckets["b1"].rows) == {"b", "c"}
    found = buckets["b1"].best(unit([0.0, 0.1, 1.0]))  # type: ignore[arg-type]
    assert found is not None and found[0] == "c"
    assert again.stats()["semantic"] == {
        "loaded": True,
        "buckets": 1,
        "rows": 2,
        "indexes_built": 0,
        "indexes_building": 0,
        "build_s": None,
    }


def test_a_bucket_loaded_past_its_threshold_builds_its_index_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("usearch")
    import numpy as np

    from blazar.serve.request.cache import _Bucket

    monkeypatch.setattr(_Bucket, "INDEX_AT", 100)
    rng = np.random.default_rng(2)
    vectors = rng.normal(size=(150, 16)).astype(np.float32) * 3  # not unit: normalized
    vectors[5] = 0.0  # a zero vector is left out
    blobs = [v.tobytes() for v in vectors] + [np.ones(8, np.float32).tobytes()]  # other width
    bucket = _Bucket.of([f"k{n}" for n in range(151)], blobs)
    assert len(bucket.rows) == 149 and "k5" not in bucket.rows and "k150" not in bucket.rows
    assert bucket._building is not None
    bucket._building.join(30)
    found = bucket.best(vectors[77] / np.linalg.norm(vectors[77]))
    assert bucket.index is not None and bucket.built_s is not None
    assert found is not None and found[0] == "k77" and found[1] == pytest.approx(1.0, abs=1e-5)


def test_past_its_threshold_a_bucket_answers_from_an_index_as_the_scan_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("usearch")
    import numpy as np

    from blazar.serve.request.cache import _Bucket

    monkeypatch.setattr(_Bucket, "INDEX_AT", 100)
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(300, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    bucket = _Bucket()
    for n, vector in enumerate(vectors[:200]):
        bucket.add(f"k{n}", vector)
    assert bucket.best(vectors[7]) == (
        "k7",
        pytest.approx(1.0, abs=1e-5),
    )  # the scan; a build starts
    assert bucket._building is not None
    bucket._building.join(30)
    bucket.remove("k3")  # after the snapshot: removed from the index when adopted
    for n, vector in enumerate(vectors[200:], 200):  # after the snapshot too
        bucket.add(f"k{n}", vector)
    found = bucket.best(vectors[250])
    assert bucket.index is not None and found is not None and found[0] == "k250"
    assert bucket.best(vectors[3]) != ("k3", pytest.approx(1.0, abs=1e-5))
    bucket.remove("k42")
    near = bucket.best(vectors[42])
    assert near is not None and near[0] != "k42" and near[1] < 0.99
    for probe in rng.normal(size=(20, 16)).astype(np.float32):
        probe /= np.linalg.norm(probe)
        live = [r for r, k in enumerate(bucket.keys) if k is not None]
        scores = bucket.matrix[live] @ probe
        best = bucket.best(probe)
        assert best is not None and best[1] == pytest.approx(float(scores.max()), abs=1e-5)


def test_the_embeddings_model_must_be_declared_for_embeddings() -> None:
    from specs.loader import load_manifest_text
    from specs.problems import ManifestError

    chat = '[models.tiny]\nsource = "file:///m/tiny.gguf"\n\n'
    emb = '[models.emb]\nsource = "file:///m/emb.gguf"\nembeddings = true\n\n'
    ok = load_manifest_text(f'[serving.cache]\nenabled = true\nmodel = "emb"\n\n{chat}{emb}')
    assert ok.serving.cache.model == "emb" and ok.serving.cache.threshold == 0.95
    with pytest.raises(ManifestError, match="names model 'emm', which is not declared"):
        load_manifest_text(f'[serving.cache]\nmodel = "emm"\n\n{chat}{emb}')
    with pytest.raises(ManifestError, match="not served for embeddings"):
        load_manifest_text(f'[serving.cache]\nmodel = "tiny"\n\n{chat}{emb}')
    with pytest.raises(ManifestError, match="threshold"):
        load_manifest_text(f"[serving.cache]\nthreshold = 1.5\n\n{chat}")


def test_the_guides_semantic_cache_names_are_the_cache_keys() -> None:
    from specs.aliases import resolve

    for name in ("enabled", "threshold", "ttl", "model"):
        found = resolve(f"semantic_cache.{name}", ["semantic_cache", name])
        assert found.parts == ("serving", "cache", name) and found.refusal is None, found
