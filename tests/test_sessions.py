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

from blazar.serve.state.session_files import read_tokens
from blazar.testing.tiny import TINY_WORDS, write_tiny_lora, write_tiny_model
from tests.conftest import Blazar
from tests.fixtures import ENGINE, model_block
from tests.serving import Served

# A long first message of tiny-model words (about one token each), and the next one.
FIRST = " ".join(TINY_WORDS[i % 60] for i in range(240))
SECOND = "tell me more about the river and the old stone house"


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
        # The slot file's layout as this engine writes it: the bank matches prompts with it.
        tokens = read_tokens(file, record["n_tokens"])
        assert tokens is not None and len(tokens) == record["n_tokens"]
        # Blazar checks the slot number itself (the engine would save slot 1 as 7).
        bad = blazar("session", "save", "tiny", "x", "--slot", "7", "--url", url, ok=False)
        assert bad.exit_code == 1 and "slot 7 does not exist" in bad.output
        turn2 = [
            *turn1,
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": SECOND},
        ]

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
        turn2 = [
            *turn1,
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": SECOND},
        ]
        second = chat(oai, "tiny", turn2)
        assert cached(second) >= 0.8 * banked["n_tokens"], (cached(second), banked)
        # The next turn on Anthropic's route; its header unloads the model after it.
        turn3 = [
            *turn2,
            {"role": "assistant", "content": second.choices[0].message.content},
            {"role": "user", "content": "and the garden"},
        ]
        claude = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
        third = claude.messages.create(
            model="tiny",
            max_tokens=4,
            messages=turn3,  # type: ignore[arg-type]
            extra_headers={"x-blazar-keep-alive": "0"},
        )
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


def test_preflight_refuses_prompts_that_cannot_fit_and_caps_outputs_that_cannot(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path]
) -> None:
    import ollama

    text = ENGINE + model_block("tiny", models["tiny"], ctx=256)
    long = [{"role": "user", "content": FIRST}]  # about 263 tokens once templated
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        oai = client(served)
        with pytest.raises(openai.BadRequestError) as too_long:
            chat(oai, "tiny", long)
        message = str(too_long.value)
        assert too_long.value.code == "context_length_exceeded"
        for fix in (
            "256 tokens of context",
            "models.tiny.ctx",
            "num_ctx",
            "cache_type",
            "blazar fit tiny",
        ):
            assert fix in message, message
        # A short prompt with an output limit beyond the context (agent clients ask for
        # tens of thousands of tokens): served, the output capped to what fits, and said.
        hello = [{"role": "user", "content": "hello"}]
        capped = oai.chat.completions.with_raw_response.create(
            model="tiny",
            messages=hello,
            max_tokens=500,  # type: ignore[arg-type]
        )
        answer = capped.parse()
        cap = int(capped.headers["x-blazar-max-tokens-capped"])
        assert cap == 256 - answer.usage.prompt_tokens  # type: ignore[union-attr]
        assert answer.usage.completion_tokens <= cap  # type: ignore[union-attr]
        if answer.usage.completion_tokens == cap:  # type: ignore[union-attr]
            assert answer.choices[0].finish_reason == "length"
        claude_code = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
        with claude_code.messages.stream(
            model="tiny",
            max_tokens=32000,
            messages=hello,  # type: ignore[arg-type]
        ) as agent:  # as Claude Code asks: streamed, with a large output limit
            agent_cap = int(agent.response.headers["x-blazar-max-tokens-capped"])
            said = agent.get_final_message()
        assert 0 < agent_cap < 256 and said.usage.output_tokens <= agent_cap
        plain = oai.chat.completions.with_raw_response.create(
            model="tiny",
            messages=hello,
            max_tokens=8,  # type: ignore[arg-type]
        )
        assert "x-blazar-max-tokens-capped" not in plain.headers  # fits: served as asked
        assert chat(oai, "tiny", hello).choices[0].message.content
        with pytest.raises(openai.BadRequestError, match="keep_alive"):
            chat(oai, "tiny", hello, extra_body={"keep_alive": "soon"})
        with pytest.raises(openai.BadRequestError, match="prompt tokens"):
            oai.completions.create(model="tiny", prompt=FIRST + " " + FIRST, max_tokens=4)
        olla = ollama.Client(host=served.url)
        with pytest.raises(ollama.ResponseError) as refused:
            olla.chat(model="tiny", messages=long)
        assert refused.value.status_code == 400 and "num_ctx" in str(refused.value)
        with pytest.raises(ollama.ResponseError) as raw:
            olla.generate(
                model="tiny", prompt=FIRST + " " + FIRST, raw=True, options={"num_predict": 4}
            )
        assert raw.value.status_code == 400 and "prompt tokens" in str(raw.value)
        claude = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as denied:
            claude.messages.create(model="tiny", max_tokens=4, messages=long)  # type: ignore[arg-type]
        assert denied.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        assert "blazar fit tiny" in str(denied.value)

    # prompt_preflight = "strict": an output that cannot fit is refused, as a prompt is.
    strict = '[serving]\nprompt_preflight = "strict"\n\n' + text
    with (
        Served(write_manifest(tmp_path, strict), blazar_home) as served,
        pytest.raises(openai.BadRequestError, match="and 500 output tokens"),
    ):
        client(served).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=500
        )  # type: ignore[call-overload]

    # prompt_preflight = false: the engine gets the request and answers it as it can.
    off = "[serving]\nprompt_preflight = false\n\n" + text
    with Served(write_manifest(tmp_path, off), blazar_home) as served:
        done = client(served).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=500
        )  # type: ignore[call-overload]
        assert done.usage.prompt_tokens + done.usage.completion_tokens <= 256


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_cache_fields_reach_the_engine_and_are_refused_when_the_gguf_cannot_take_them(
    tmp_path: Path, blazar_home: Path
) -> None:
    src = tmp_path / "models"
    src.mkdir()
    narrow = write_tiny_model(src / "narrow.gguf")  # heads of 16
    wide = write_tiny_model(src / "wide.gguf", n_head=2, n_head_kv=2)  # heads of 32
    text = ENGINE + "[serving]\ncache_reuse = 16\n\n"  # a serving-wide default
    text += model_block(
        "wide",
        wide,
        cache_type="q8_0",
        flash_attn="on",
        kv_unified=True,
        cache_ram_mb=64,
        load_mode="none",
        slots=2,
        ctx=512,
    )
    text += model_block("long", wide, ctx=4096, ctx_extend=2, deterministic=True)
    text += model_block("narrow", narrow, cache_type="q8_0")
    text += model_block("nofa", wide, cache_type="q4_0", flash_attn="off")
    text += model_block("far", wide, ctx_extend=8)
    text += model_block("reuse", narrow, ctx=64, cache_reuse=64)
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        oai = client(served)
        hello = [{"role": "user", "content": "hello"}]
        for model in ("wide", "long"):
            assert chat(oai, model, hello).choices[0].message.content
        argv = {r["model"]: cmdline(r["pid"]) for r in served.ps()}
        w = argv["wide"]
        assert flag_value(w, "--cache-type-k") == flag_value(w, "--cache-type-v") == "q8_0"
        assert flag_value(w, "--flash-attn") == "on" and "--kv-unified" in w
        assert flag_value(w, "--cache-ram") == "64" and flag_value(w, "--load-mode") == "none"
        assert flag_value(w, "--cache-reuse") == "16"  # from [serving]
        long = argv["long"]
        assert (
            flag_value(long, "--rope-scaling") == "yarn" and flag_value(long, "--rope-scale") == "2"
        )
        assert flag_value(long, "--yarn-orig-ctx") == "2048"  # the training context
        assert flag_value(long, "--ctx-size") == "4096"  # allowed past 2048 by ctx_extend
        assert flag_value(long, "--seed") == "0" and flag_value(long, "--parallel") == "1"
        # deterministic: the same sampled answer twice, at temperature 1.
        answers = {
            oai.chat.completions.create(
                model="long",
                messages=hello,
                max_tokens=12,
                temperature=1.0,  # type: ignore[arg-type]
            )
            .choices[0]
            .message.content
            for _ in range(2)
        }
        assert len(answers) == 1
        refusals = {
            "narrow": "needs a head size that is a multiple of 32",
            "nofa": "needs flash attention",
            "far": "beyond what model 'far' supports (4x",
            "reuse": "cache_reuse = 64 is not below the model's ctx (64)",
        }
        for model, reason in refusals.items():
            with pytest.raises(openai.BadRequestError) as refused:
                chat(oai, model, hello)
            assert reason in str(refused.value) and refused.value.code == "model_misconfigured"
        # Refused before any spawn: no child, no log of one.
        assert sorted(r["model"] for r in served.ps()) == ["long", "wide"]
        logs = blazar_home / "state" / "logs"
        assert not any(logs.glob("narrow-*")) and not any(logs.glob("far-*"))
        assert "narrow: not started until its settings are fixed" in served.log


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"slots": 2, "deterministic": True}, "deterministic serves one slot"),
        ({"cache_type": "q5_1"}, "cache_type"),
        ({"kv_unified": "yes"}, "kv_unified"),
        ({"cache_ram_mb": -2}, "cache_ram_mb"),
        ({"cache_reuse": -1}, "cache_reuse"),
        ({"ctx_extend": 1.0}, "ctx_extend"),
        ({"load_mode": "fast"}, "load_mode"),
        ({"flash_attn": True}, "flash_attn"),
        ({"args": ["-ctk", "q8_0"]}, "use cache_type"),
        ({"args": ["--slot-save-path", "/tmp"]}, "Blazar keeps sessions"),
    ],
)
def test_the_manifest_refuses_bad_cache_values(
    tmp_path: Path, fields: dict[str, Any], reason: str
) -> None:
    from specs.loader import ManifestError, load_manifest

    path = write_manifest(tmp_path, model_block("m", tmp_path / "m.gguf", **fields))
    with pytest.raises(ManifestError, match=reason):
        load_manifest(path)


def test_singleflight_makes_one_engine_call_for_identical_concurrent_requests(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path]
) -> None:
    import asyncio

    from tests.serving import engine_metric, processing

    text = "[serving]\nsingleflight = true\n\n" + ENGINE
    text += model_block("tiny", models["tiny"], slots=1, ctx=2048)
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        oai = openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
        same = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "the river"}],
            "max_tokens": 16,
            "temperature": 0,
        }

        async def scenario() -> tuple[Any, list[Any], int]:
            await oai.chat.completions.create(**same)  # type: ignore[call-overload]  # loads it
            port = served.ps()[0]["port"]
            before = engine_metric(port, "tokens_predicted_total")
            # A long request holds the only slot, so the pair waits behind it, together.
            blocker = asyncio.ensure_future(
                oai.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": "a long story"}],
                    max_tokens=1500,
                    temperature=1.0,
                )
            )
            while not processing(port):
                await asyncio.sleep(0.01)
            pair = await asyncio.gather(*(oai.chat.completions.create(**same) for _ in range(2)))  # type: ignore[call-overload]
            done = await blocker
            after = engine_metric(port, "tokens_predicted_total")
            return done, list(pair), int(after - before)

        blocked, (a, b), predicted = asyncio.run(scenario())
        # One engine call for the pair: the blocker's tokens and one answer's, not two.
        assert predicted == blocked.usage.completion_tokens + a.usage.completion_tokens
        assert a.choices[0].message.content == b.choices[0].message.content
        assert a.id != b.id and a.id.startswith("chatcmpl-") and b.id.startswith("chatcmpl-")


def test_the_bank_keeps_every_slot_with_a_variant_beside(
    tmp_path: Path, blazar_home: Path, blazar: Blazar, models: dict[str, Path]
) -> None:
    """Every slot of every instance is banked when serve stops, an adapter variant's beside
    the dense conversation's: once, with `mymodel+rsmma` running beside `mymodel`, only
    the variant's short slot was banked and the long dense conversation came back 29%
    cached (issue 33, day one 9). Both are banked; the dense one comes back cached."""
    fox = write_tiny_lora(tmp_path / "fox.gguf", models["tiny"])
    serving = "[serving]\nsession_bank = true\n\n"
    text = serving + ENGINE + model_block("tiny", models["tiny"], slots=2)
    text += f'[loras.fox]\nmodel = "tiny"\nsource = "{fox.as_uri()}"\n'
    manifest = write_manifest(tmp_path, text)
    turn1 = [{"role": "user", "content": FIRST}]
    with Served(manifest, blazar_home) as served:
        oai = client(served)
        first = chat(oai, "tiny", turn1)
        variant = chat(oai, "tiny+fox", [{"role": "user", "content": "hello"}])
        assert variant.usage.prompt_tokens < first.usage.prompt_tokens / 4
    with Served(manifest, blazar_home) as served:
        banked = sorted(s["n_tokens"] for s in sessions(blazar, served))
        assert len(banked) == 2, banked  # the variant's slot and the dense conversation's
        assert banked[-1] >= first.usage.prompt_tokens
        turn2 = [
            *turn1,
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": SECOND},
        ]
        again = chat(client(served), "tiny", turn2)
        assert cached(again) >= 0.9 * first.usage.prompt_tokens, (cached(again), banked)
