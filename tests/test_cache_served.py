"""The response cache (docs/cache.md) on a real serve, through the official clients.

One `blazar serve` per module with `[serving.cache]` on: a tiny chat model and a tiny
embedder (`blazar.testing.tiny.write_tiny_embedder`: a bag of tokens, so texts sharing
most words have a cosine near 1) as the semantic tier's model, and three keys. The
tests ask on all three protocols (OpenAI, Anthropic, ollama): a miss then an exact hit,
whole and streamed, a semantic hit for a reworded last message and none for another
meaning, the bypass headers, key isolation, an agent's tool conversation with one
earlier turn changed (never a hit), and the invalidations (a model's settings changed,
a key removed), read from the store's table.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from blazar.paths import DB_NAME
from blazar.testing.tiny import write_tiny_embedder, write_tiny_model
from tests.conftest import run_blazar
from tests.fixtures import ENGINE, WHEELS, model_block
from tests.serving import Served

SECRETS = {
    "app": "plm_app-" + "a" * 40,
    "other": "plm_other-" + "b" * 40,
    "gone": "plm_gone-" + "c" * 40,
    "ops": "plm_ops-" + "d" * 40,
}
GREEDY = {"temperature": 0, "max_tokens": 6}


def _key(name: str) -> str:
    return f'[keys.{name}]\nsha256 = "{hashlib.sha256(SECRETS[name].encode()).hexdigest()}"\n\n'


class Host:
    def __init__(self, served: Served, manifest: Path, text: str, home: Path) -> None:
        self.served, self.manifest, self.text, self.home = served, manifest, text, home

    def openai(self, key: str = "app") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.served.url + "/v1", api_key=SECRETS[key])

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.served.url, api_key=SECRETS["app"])

    def ollama(self, headers: dict[str, str] | None = None) -> ollama.Client:
        auth = {"Authorization": f"Bearer {SECRETS['app']}", **(headers or {})}
        return ollama.Client(host=self.served.url, headers=auth)

    def chat(
        self, content: str, *, key: str = "app", headers: dict[str, str] | None = None, **body: Any
    ) -> tuple[str, dict[str, Any]]:
        """(x-blazar-cache, the answer) of an OpenAI chat request."""
        raw = self.openai(key).chat.completions.with_raw_response.create(
            model="tiny",
            messages=[{"role": "user", "content": content}],
            extra_headers=headers or {},
            **{**GREEDY, **body},
        )
        return raw.headers.get("x-blazar-cache", ""), raw.parse().model_dump()

    def entries(self, where: str = "1 = 1", args: tuple[Any, ...] = ()) -> int:
        with sqlite3.connect(next(self.home.rglob(DB_NAME))) as db:
            return int(
                db.execute(f"SELECT count(*) FROM cache_entries WHERE {where}", args).fetchone()[0]
            )


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    root = tmp_path_factory.mktemp("cache")
    tiny = write_tiny_model(root / "tiny.gguf")
    emb = write_tiny_embedder(root / "emb.gguf")
    text = ENGINE + (
        "[serving]\nmax_loaded_models = 3\n\n"
        '[serving.cache]\nenabled = true\nmodel = "emb"\nthreshold = 0.9\n\n'
    )
    text += model_block("tiny", tiny, ctx=2048, chat_template="chatml")
    text += model_block("emb", emb, embeddings=True, pooling="mean", ctx=512)
    text += _key("app") + _key("other") + _key("gone")
    text += _key("ops").replace("\n\n", '\nscope = "admin"\n\n')
    (root / "manifest").mkdir()
    manifest = root / "manifest" / "blazar.toml"
    manifest.write_text(text)
    home = root / "home"
    env = {"BLAZAR_HOME": str(home), "BLAZAR_WHEEL_CACHE": str(WHEELS)}
    with Served(manifest, home, env=env) as served:
        yield Host(served, manifest, text, home)


def test_openai_exact_hit_whole_and_streamed(host: Host) -> None:
    first, answer = host.chat("the river has cold water")
    assert first == "miss", first
    again, replayed = host.chat("the river has cold water")
    assert again == "hit-exact", again
    text = answer["choices"][0]["message"]["content"]
    assert replayed["choices"][0]["message"]["content"] == text
    assert replayed["choices"][0]["finish_reason"] == answer["choices"][0]["finish_reason"]
    usage = replayed["usage"]
    assert usage["prompt_tokens"] == answer["usage"]["prompt_tokens"] > 0
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"]
    # streamed: the same answer as chunks, ending as a real stream does
    stream = host.openai().chat.completions.with_raw_response.create(
        model="tiny",
        messages=[{"role": "user", "content": "the river has cold water"}],
        stream=True,
        **GREEDY,
    )
    assert stream.headers["x-blazar-cache"] == "hit-exact"
    chunks = list(stream.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_semantic_hit_for_a_reworded_question_and_none_for_another_meaning(host: Host) -> None:
    first, answer = host.chat("the old man can see the green field near the city")
    assert first == "miss", first
    close, replayed = host.chat("the old man can see the green field near city")
    assert close.startswith("hit-semantic; similarity=0.9"), close
    assert (
        replayed["choices"][0]["message"]["content"] == answer["choices"][0]["message"]["content"]
    )
    other, _ = host.chat("a quiet bird can sing a song in the morning rain")
    assert other == "miss", other
    # only the exact tier when the request says so
    exact_only, _ = host.chat(
        "the old man can see green field near the city", headers={"x-blazar-cache": "exact"}
    )
    assert exact_only == "miss", exact_only


def test_bypass_headers_and_unreproducible_requests(host: Host) -> None:
    host.chat("a small red door")
    assert host.chat("a small red door")[0] == "hit-exact"
    assert host.chat("a small red door", headers={"x-blazar-cache": "off"})[0] == "bypass (off)"
    no_cache = host.chat("a small red door", headers={"Cache-Control": "no-cache"})[0]
    assert no_cache == "bypass (no-cache)"
    sampled = host.chat("a small red door", temperature=0.8)[0]
    assert sampled.startswith("bypass (not reproducible"), sampled


def test_entries_never_cross_api_keys(host: Host) -> None:
    host.chat("the blue moon and the star", key="app")
    assert host.chat("the blue moon and the star", key="app")[0] == "hit-exact"
    assert host.chat("the blue moon and the star", key="other")[0] == "miss"
    assert host.chat("the blue moon and the star", key="other")[0] == "hit-exact"


def test_anthropic_exact_hit_whole_and_streamed(host: Host) -> None:
    client = host.anthropic()
    ask = {
        "model": "tiny",
        "max_tokens": 6,
        "messages": [{"role": "user", "content": "the cat sat on a warm stone"}],
        "extra_body": {"temperature": 0},
    }
    first = client.messages.with_raw_response.create(**ask)
    assert first.headers["x-blazar-cache"] == "miss"
    second = client.messages.with_raw_response.create(**ask)
    assert second.headers["x-blazar-cache"] == "hit-exact"
    a, b = first.parse(), second.parse()
    assert b.content[0].text == a.content[0].text and b.stop_reason == a.stop_reason
    assert b.usage.cache_read_input_tokens and b.usage.cache_read_input_tokens > 0
    with client.messages.stream(**ask) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == a.content[0].text and final.stop_reason == a.stop_reason


def test_ollama_chat_and_generate_hit_whole_and_streamed(host: Host) -> None:
    client = host.ollama()
    messages = [{"role": "user", "content": "the horse can run on the long road"}]
    options = {"temperature": 0, "num_predict": 6}
    first = client.chat(model="tiny", messages=messages, options=options)
    second = client.chat(model="tiny", messages=messages, options=options)
    assert second.message.content == first.message.content
    assert second.done_reason == first.done_reason
    streamed = list(client.chat(model="tiny", messages=messages, options=options, stream=True))
    assert "".join(part.message.content or "" for part in streamed) == first.message.content
    assert streamed[-1].done
    made = client.generate(model="tiny", prompt="the apple tree", options=options)
    again = client.generate(model="tiny", prompt="the apple tree", options=options)
    assert again.response == made.response and again.done
    headers = {"Authorization": f"Bearer {SECRETS['app']}"}
    body = {"model": "tiny", "prompt": "the apple tree", "options": options, "stream": False}
    raw = httpx.post(host.served.url + "/api/generate", json=body, headers=headers, timeout=60)
    assert raw.headers["x-blazar-cache"] == "hit-exact" and raw.json()["response"] == made.response


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "the weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def _agent(turn: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "what is the weather in the city"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": turn},
        {"role": "user", "content": "so is it a good day for a walk near the river"},
    ]


def test_agent_conversation_with_a_changed_earlier_turn_never_hits(host: Host) -> None:
    client = host.openai()

    def ask(turn: str) -> str:
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=_agent(turn), tools=TOOLS, **GREEDY
        )
        return raw.headers["x-blazar-cache"]

    assert ask("rain and cold wind") == "miss"
    assert ask("rain and cold wind") == "hit-exact"
    # the tool's answer changed, the last message did not: another bucket, no hit
    assert ask("warm sun and no rain") == "miss"


def test_a_changed_model_and_a_removed_key_drop_their_entries(host: Host) -> None:
    host.chat("the little bird in the garden", key="gone")
    assert host.chat("the little bird in the garden", key="gone")[0] == "hit-exact"
    assert host.entries("scope = ?", ("gone",)) >= 1
    before = host.entries("model = 'tiny'")
    assert before >= 2
    # a changed setting (a default system prompt) is a new identity: the old answers go
    text = host.text.replace(
        'chatml"\n\n[models."emb"]', 'chatml"\nsystem = "be brief"\n\n[models."emb"]'
    )
    text = text.replace(_key("gone"), "")
    host.manifest.write_text(text)
    deadline = time.monotonic() + 30
    while host.entries("scope = ?", ("gone",)):  # the key removed: its entries gone
        assert time.monotonic() < deadline
        time.sleep(0.2)
    while True:  # the reload reaches the gateway: the next request sees the new identity
        if host.chat("the blue moon and the star")[0] == "miss":
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert (
        host.entries(
            "model = 'tiny' AND identity != (SELECT identity FROM cache_entries "
            "ORDER BY created DESC LIMIT 1)"
        )
        == 0
    )


def test_stats_and_clear_through_the_admin_api(host: Host) -> None:
    admin = {"Authorization": f"Bearer {SECRETS['ops']}"}
    url = host.served.url + "/api/blazar/cache"
    host.chat("the sun and the sea")
    host.chat("the sun and the sea")
    stats = httpx.get(url, headers=admin, timeout=30).json()
    assert stats["enabled"] and stats["entries"] >= 1 and stats["bytes"] > 0
    assert stats["hits"]["exact"] >= 1 and stats["misses"]["exact"] >= 1
    assert 0 < stats["hit_ratio"] < 1
    assert any(m["model"] == "tiny" for m in stats["models"])
    refused = httpx.get(url, headers={"Authorization": f"Bearer {SECRETS['app']}"}, timeout=30)
    assert refused.status_code == 403
    cleared = httpx.post(url + "/clear", json={"model": "tiny"}, headers=admin, timeout=30)
    assert cleared.json()["cleared"] >= 1 and host.entries("model = 'tiny'") == 0
    assert host.chat("the sun and the sea")[0] == "miss"


def test_blazar_why_shows_the_lookup_and_metrics_count_it(host: Host) -> None:
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    host.chat("the dog and the cat", headers={"x-request-id": first})
    host.chat("the dog and the cat", headers={"x-request-id": second})
    ops = {"Authorization": f"Bearer {SECRETS['ops']}"}
    record = httpx.get(f"{host.served.url}/api/why/{second}?wait=10", headers=ops, timeout=30)
    looked = record.json()["response_cache"]
    assert looked["result"] == "hit-exact" and looked["tier"] == "exact", looked
    assert looked["produced_by"] == first and looked["age_s"] >= 0, looked
    shown = run_blazar(
        "why", second, "--url", host.served.url, env={"BLAZAR_API_KEY": SECRETS["ops"]}
    )
    assert shown.returncode == 0, shown.stderr
    assert "response cache: exact hit, an answer" in shown.stdout
    assert f"produced by trace {first}: no model was called" in shown.stdout
    metrics = httpx.get(f"{host.served.url}/metrics", headers=ops, timeout=30).text
    assert 'blazar_response_cache_hits_total{tier="exact"}' in metrics, metrics
    assert "blazar_response_cache_entries " in metrics and "blazar_response_cache_bytes " in metrics
    stats = run_blazar(
        "cache", "stats", "--url", host.served.url, env={"BLAZAR_API_KEY": SECRETS["ops"]}
    )
    assert stats.returncode == 0 and "hit ratio" in stats.stdout, stats.stderr
    cleared = run_blazar(
        "cache",
        "clear",
        "--key",
        "app",
        "--url",
        host.served.url,
        env={"BLAZAR_API_KEY": SECRETS["ops"]},
    )
    assert cleared.returncode == 0 and cleared.stdout.startswith("cleared "), cleared.stderr
    assert host.entries("scope = 'app'") == 0


def test_a_streamed_answer_is_stored_and_answers_a_whole_request(host: Host) -> None:
    content = "the warm bread and the milk"
    stream = host.openai().chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": content}], stream=True, **GREEDY
    )
    assert stream.headers["x-blazar-cache"] == "miss"
    text = "".join(c.choices[0].delta.content or "" for c in stream.parse() if c.choices)
    header, answer = host.chat(content)
    assert header == "hit-exact" and answer["choices"][0]["message"]["content"] == text
    client = host.anthropic()
    ask = {
        "model": "tiny",
        "max_tokens": 6,
        "messages": [{"role": "user", "content": content}],
        "extra_body": {"temperature": 0},
    }
    with client.messages.stream(**ask) as streamed:
        said = "".join(streamed.text_stream)
    whole = client.messages.with_raw_response.create(**ask)
    assert whole.headers["x-blazar-cache"] == "hit-exact"
    assert whole.parse().content[0].text == said


def test_semantic_hits_on_the_anthropic_and_ollama_routes(host: Host) -> None:
    client = host.anthropic()

    def ask(content: str) -> tuple[str, str]:
        raw = client.messages.with_raw_response.create(
            model="tiny",
            max_tokens=6,
            messages=[{"role": "user", "content": content}],
            extra_body={"temperature": 0},
        )
        return raw.headers["x-blazar-cache"], raw.parse().content[0].text

    first = ask("the small child can play in the snow with the dog")
    assert first[0] == "miss"
    close = ask("the small child can play in the snow with a dog")
    assert close[0].startswith("hit-semantic; similarity=0.9") and close[1] == first[1], close
    assert ask("a bright star over the quiet sea at night")[0] == "miss"
    headers = {"Authorization": f"Bearer {SECRETS['app']}"}

    def chat(content: str) -> tuple[str, str]:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": content}],
            "options": {"temperature": 0, "num_predict": 6},
            "stream": False,
        }
        raw = httpx.post(host.served.url + "/api/chat", json=body, headers=headers, timeout=60)
        return raw.headers["x-blazar-cache"], raw.json()["message"]["content"]

    made = chat("the good book and the letter on the table in the room")
    assert made[0] == "miss"
    near = chat("the good book and a letter on the table in the room")
    assert near[0].startswith("hit-semantic") and near[1] == made[1], near


def test_legacy_completions_hit_whole_and_streamed(host: Host) -> None:
    client = host.openai()
    ask = {"model": "tiny", "prompt": "the quiet evening song", **GREEDY}
    first = client.completions.with_raw_response.create(**ask)
    second = client.completions.with_raw_response.create(**ask)
    assert (first.headers["x-blazar-cache"], second.headers["x-blazar-cache"]) == (
        "miss",
        "hit-exact",
    )
    made, replayed = first.parse(), second.parse()
    assert replayed.choices[0].text == made.choices[0].text and replayed.id.startswith("cmpl-")
    assert replayed.usage is not None and replayed.usage.prompt_tokens == made.usage.prompt_tokens
    streamed = list(client.completions.create(**ask, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == made.choices[0].text
