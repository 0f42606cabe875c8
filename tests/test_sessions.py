"""Sessions and the session bank end to end: the real engine, tiny models, the official clients.

What a user would notice is asserted: the next turn of a conversation after an unload
is served from the cache (`usage.prompt_tokens_details.cached_tokens`), and without the
session it is not; a session is never restored into a model it was not saved from.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from blazar.testing.tiny import TINY_WORDS, write_tiny_model
from tests.conftest import Blazar
from tests.serving import Served

ENGINE = '[engines.llamacpp]\nversion = "2026.10.11549"\n\n'
# A long first message of tiny-model words (about one token each), and the next one.
FIRST = " ".join(TINY_WORDS[i % 60] for i in range(240))
SECOND = "tell me more about the river and the old stone house"


def model_block(name: str, path: Path, **fields: object) -> str:
    lines = [f'[models."{name}"]', f'source = "{path.as_uri()}"']
    lines += [f"{key} = {json.dumps(value)}" for key, value in fields.items()]
    return "\n".join(lines) + "\n\n"


def write_manifest(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "manifest" / "blazar.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)


def chat(oai: openai.OpenAI, model: str, messages: list[dict[str, str]], **extra: Any) -> Any:
    return oai.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0, **extra
    )  # type: ignore[call-overload]


def cached(response: Any) -> int:
    details = response.usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details else 0


def wait_unloaded(served: Served, model: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while any(r["model"] == model for r in served.ps()):
        assert time.monotonic() < deadline, f"{model} is still loaded: {served.ps()}"
        time.sleep(0.05)


def sessions(blazar: Blazar, served: Served) -> list[dict[str, Any]]:
    out = blazar("session", "list", "--json", "--url", served.url).output
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    src = tmp_path / "models"
    src.mkdir()
    return {
        "tiny": write_tiny_model(src / "tiny.gguf"),
        "other": write_tiny_model(src / "other.gguf", seed=4),
    }


def test_saved_session_survives_an_unload_and_is_refused_elsewhere(
    tmp_path: Path, blazar_home: Path, blazar: Blazar, models: dict[str, Path]
) -> None:
    text = ENGINE + model_block("tiny", models["tiny"], slots=2, ctx=1024)
    text += model_block("other", models["other"])
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        oai, url = client(served), served.url
        turn1 = [{"role": "user", "content": FIRST}]
        first = chat(oai, "tiny", turn1)
        saved = blazar("session", "save", "tiny", "talk", "--url", url).output
        assert saved.startswith("saved talk:")
        [record] = sessions(blazar, served)
        assert record["model"] == "tiny" and record["kind"] == "saved"
        assert record["n_tokens"] >= first.usage.prompt_tokens  # the prompt and the answer
        file = blazar_home / "data" / "sessions" / record["file"]
        assert file.stat().st_size == record["size"] > 0
        # Blazar checks the slot number itself (the engine would save slot 1 as 7).
        bad = blazar("session", "save", "tiny", "x", "--slot", "7", "--url", url, ok=False)
        assert bad.exit_code == 1 and "slot 7 does not exist" in bad.output
        turn2 = [*turn1, {"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": SECOND}]  # fmt: skip

        # Without the session, the next turn after an unload re-prefills everything.
        blazar("stop", "tiny", "--url", url)
        assert cached(chat(oai, "tiny", turn2)) == 0

        blazar("stop", "tiny", "--url", url)
        refused = blazar("session", "restore", "other", "talk", "--url", url, ok=False)
        assert "saved from model 'tiny', not 'other'" in refused.output
        assert not any(r["model"] == "other" for r in served.ps())  # refused before loading
        restored = blazar("session", "restore", "tiny", "talk", "--url", url).output
        assert restored.startswith("restored talk into slot ")
        reused = cached(chat(oai, "tiny", turn2))
        assert reused >= 0.8 * record["n_tokens"], (reused, record)

        assert blazar("session", "rm", "talk", "--url", url).output == "removed talk\n"
        assert sessions(blazar, served) == [] and not file.exists()
        gone = blazar("session", "restore", "tiny", "talk", "--url", url, ok=False)
        assert "no session 'talk'" in gone.output


def test_the_bank_continues_a_conversation_after_an_unload_and_a_restart(
    tmp_path: Path, blazar_home: Path, blazar: Blazar, models: dict[str, Path]
) -> None:
    serving = "[serving]\nsession_bank = true\n\n"
    manifest = write_manifest(tmp_path, serving + ENGINE + model_block("tiny", models["tiny"]))
    turn1 = [{"role": "user", "content": FIRST}]
    with Served(manifest, blazar_home) as served:
        oai = client(served)
        first = chat(oai, "tiny", turn1, extra_body={"keep_alive": 0})  # unloads after it
        wait_unloaded(served, "tiny")
        [banked] = sessions(blazar, served)  # saved before the unload, with no explicit save
        assert banked["kind"] == "bank" and banked["n_tokens"] >= first.usage.prompt_tokens
        turn2 = [*turn1, {"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": SECOND}]  # fmt: skip
        second = chat(oai, "tiny", turn2)
        assert cached(second) >= 0.8 * banked["n_tokens"], (cached(second), banked)
        # The next turn on Anthropic's route; its header unloads the model after it.
        turn3 = [*turn2, {"role": "assistant", "content": second.choices[0].message.content},
                 {"role": "user", "content": "and the garden"}]  # fmt: skip
        claude = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
        third = claude.messages.create(
            model="tiny", max_tokens=4, messages=turn3,  # type: ignore[arg-type]
            extra_headers={"x-blazar-keep-alive": "0"},
        )  # fmt: skip
        assert (third.usage.cache_read_input_tokens or 0) >= second.usage.prompt_tokens
        wait_unloaded(served, "tiny")
        # Banked now: the conversation at turn 3, which supersedes turn 1's.
        [banked] = sessions(blazar, served)
        assert banked["n_tokens"] > second.usage.prompt_tokens
    # serve stopped; the session stays on disk and in the store for the next one.
    with Served(manifest, blazar_home) as served:
        again = chat(client(served), "tiny", turn3)
        assert cached(again) >= 0.8 * banked["n_tokens"], (cached(again), banked)
        # A changed model file drops its banked sessions: their KV state no longer fits.
        changed = write_tiny_model(models["tiny"].with_name("changed.gguf"), seed=9)
        manifest.write_text(manifest.read_text().replace(models["tiny"].name, changed.name))
        deadline = time.monotonic() + 60
        while sessions(blazar, served):
            assert time.monotonic() < deadline, "banked sessions of a changed file were kept"
            time.sleep(0.2)
