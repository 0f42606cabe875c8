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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest

from blazar.testing.tiny import write_tiny_embedder, write_tiny_model
from tests.fixtures import ENGINE, WHEELS, model_block
from tests.serving import Served

SECRETS = {
    "app": "plm_app-" + "a" * 40,
    "other": "plm_other-" + "b" * 40,
    "gone": "plm_gone-" + "c" * 40,
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
        with sqlite3.connect(self.home / "blazar.db") as db:
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
    text += model_block("tiny", tiny, ctx=512)
    text += model_block("emb", emb, embeddings=True, pooling="mean", ctx=512)
    text += _key("app") + _key("other") + _key("gone")
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
