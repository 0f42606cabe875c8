"""The mistralrs lane end to end: installed from the wheel cache into its own venv, its
launcher supervised by `blazar serve`, a GGUF and a safetensors model (pulled from the
loopback hub) answering through the gateway with the official openai client (and the
ollama and anthropic ones: the gateway translates for an engine that speaks only
OpenAI's API), and what mistral.rs cannot do refused with a 400 that names the reason.

The models are the tiny ones (`blazar.testing.tiny`, `blazar.testing.tiny_safetensors`):
random weights whose output is readable word pieces (`is_tiny_text`), so an answer
that is not the model's own fails the test.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest

from blazar.engines.launchers import launcher_common
from blazar.engines.launchers import mistralrs_launcher as launcher
from blazar.paths import Paths
from blazar.testing.tiny import is_tiny_text, write_tiny_model
from blazar.testing.tiny_safetensors import tiny_safetensors_files
from tests.conftest import Blazar
from tests.hf_endpoint import FakeHub
from tests.serving import Served

VERSION = "0.9.5"
TAG = f"mistralrs-{VERSION}"
REPO = "blazar/tiny-llama-safetensors"


# -- the launcher's translation, pure ---------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        ({"lora": [{"id": 0, "scale": 1}]}, "LoRA adapters per request"),
        ({"id_slot": 0}, "KV sessions and slots are llama-server's"),
        ({"grammar": 'root ::= "a"'}, "GBNF grammars are llama.cpp's"),
        ({"json_schema": {"type": "object"}}, "response_format {type: json_schema"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools are not"),
        ({"logprobs": True}, "logprobs are not returned"),
        ({"seed": 7}, "a seed per engine, not per request"),
        ({"mirostat": 2}, "mirostat sampling is llama.cpp's"),
        ({"response_format": {"type": "xml"}}, "text, json_object or json_schema"),
        ({"max_tokens": "ten"}, "'max_tokens' must be an integer"),
    ],
)
def test_the_launcher_refuses_what_mistral_rs_cannot_do(body: dict[str, Any], refused: str) -> None:
    with pytest.raises(launcher_common.BadRequest, match=refused.replace("{", r"\{")):
        launcher.keywords(body)


def test_the_launcher_maps_what_it_can() -> None:
    mapped = launcher.keywords(
        {
            "n_predict": 7,
            "repeat_penalty": 1.1,
            "stop": "x",
            "temperature": 0,
            "n": 2,
            "logprobs": False,
            "seed": None,
            "tools": [],
            "tool_choice": "none",
            "response_format": {
                "type": "json_schema",
                "json_schema": {"schema": {"type": "array"}},
            },
            "cache_prompt": True,
            "user": "u",
        }
    )
    assert mapped == {
        "max_tokens": 7,
        "repetition_penalty": 1.1,
        "stop_seqs": ["x"],
        "temperature": 0,
        "n_choices": 2,
        "grammar": '{"type": "array"}',
        "grammar_type": "json_schema",
    }
    assert launcher.keywords({"max_tokens": -1}) == {"max_tokens": None}  # as long as it takes


# -- kinds Blazar does not have, and `engine use --kind` -------------------------------------


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("sglang", "GPUs through PyTorch"),
        ("mlx", "Apple silicon"),
        ("tgi", "CUDA container"),
        ("nope", "no engine kind Blazar knows"),
    ],
)
def test_engine_update_of_a_kind_blazar_does_not_have_says_which_exist(
    blazar: Blazar, kind: str, why: str
) -> None:
    r = blazar("engine", "update", "--kind", kind, ok=False)
    assert r.exit_code == 1 and why in r.output
    for offered in ("llamacpp (", "mistralrs (", "whisper (", "piper ("):
        assert offered in r.output
    assert "open an issue" in r.output and "[remotes.NAME]" in r.output


def test_engine_use_kind_refuses_what_cannot_serve(blazar: Blazar) -> None:
    r = blazar("engine", "use", ok=False)
    assert r.exit_code == 2 and "give a TAG" in r.output
    r = blazar("engine", "use", "--kind", "mistralrs", ok=False)
    assert r.exit_code == 1 and "`blazar engine install --kind mistralrs`" in r.output
    assert (
        "only kind that serves transcription" in blazar("engine", "use", "--kind", "whisper").output
    )
    r = blazar("engine", "use", "--kind", "vllm", ok=False)
    assert r.exit_code == 1 and "no vllm engine lane" in r.output


# -- served -----------------------------------------------------------------------------------


def chat(client: openai.OpenAI, model: str, **extra: Any) -> str:
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=6, **extra
    )
    return reply.choices[0].message.content or ""


def test_served_gguf_and_safetensors_models_and_the_refusals(
    blazar: Blazar,
    paths: Paths,
    tmp_path: Path,
    blazar_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gguf = write_tiny_model(tmp_path / "tiny.gguf")
    later = write_tiny_model(tmp_path / "later.gguf", seed=1)
    nova = write_tiny_model(tmp_path / "nova.gguf", architecture="nova")  # mistral.rs has none
    paths.manifest.parent.mkdir(parents=True, exist_ok=True)
    paths.manifest.write_text(
        f'[engines.mistralrs]\nkind = "mistralrs"\nversion = "{VERSION}"\n\n'
        f'[models.tiny]\nsource = "{gguf.as_uri()}"\nengine = "mistralrs"\n\n'
        f'[models.st]\nsource = "hf://{REPO}"\nengine = "mistralrs"\n\n'
        f'[models.stray]\nsource = "hf://{REPO}"\n\n'  # no engine: llama.cpp's, GGUF only
        f'[models.later]\nsource = "{later.as_uri()}"\n\n'
        f'[models.nova]\nsource = "{nova.as_uri()}"\nengine = "mistralrs"\n'
    )
    with FakeHub() as hub:
        hub.add_repo(REPO, {**tiny_safetensors_files(), "README.md": b"# tiny\n"})
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        out = blazar("apply", "--yes").output
        assert "engines.mistralrs" in out and "models.st" in out
        fitted = blazar("fit", REPO).output
        assert "serve with a mistralrs lane: `blazar engine install --kind mistralrs`" in fitted
        row = json.loads(blazar("fit", REPO, "--json").output)
        assert (row["format"], row["lane"]) == ("safetensors", "mistralrs")
        assert row["weights_bytes"] == len(tiny_safetensors_files()["model.safetensors"])
        fetched = {s.path.rsplit("/", 1)[-1] for s in hub.seen("GET", "/resolve/")}
    assert "README.md" not in fetched and "model.safetensors" in fetched  # the model's files only
    listed = {r["name"]: r for r in map(json.loads, blazar("list", "--json").output.splitlines())}
    assert {"tiny", "st", "stray", "later"} <= set(listed)
    engine = json.loads(blazar("engine", "list", "--json").output)
    assert (engine["kind"], engine["tag"], engine["active"]) == ("mistralrs", TAG, True)
    assert engine["details"]["dialect"] == "openai"  # it speaks OpenAI's API only
    assert (Path(engine["path"]) / "venv" / "bin" / "python").exists()  # its own venv

    with Served(paths.manifest, blazar_home) as served:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
        assert is_tiny_text(chat(client, "tiny"))  # GGUF
        assert is_tiny_text(chat(client, "st"))  # safetensors, from the hub
        lanes = {r["model"]: (r["lane"], r["engine"], r["slots"]) for r in served.ps()}
        assert lanes["tiny"] == lanes["st"] == ("mistralrs", TAG, 1)

        parts = list(
            client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
        assert is_tiny_text(text.strip()) and parts[-1].usage is not None
        assert parts[-1].usage.completion_tokens == 5
        done = client.completions.create(model="tiny", prompt="the quick", max_tokens=5)
        assert is_tiny_text(done.choices[0].text.strip()) and done.usage is not None
        assert done.usage.completion_tokens == 5
        streamed = client.completions.create(
            model="st", prompt="the quick", max_tokens=4, stream=True
        )
        assert is_tiny_text("".join(c.choices[0].text for c in streamed).strip())

        # ollama's and Anthropic's APIs, translated by the gateway for an OpenAI-only engine.
        talk = ollama.Client(host=served.url)
        said = talk.chat(
            model="st", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 4}
        )
        assert is_tiny_text(said.message.content or "") and said.eval_count == 4
        made = talk.generate(model="tiny", prompt="the quick", options={"num_predict": 4})
        assert is_tiny_text(made.response.strip())
        claude = anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0)
        reply = claude.messages.create(
            model="tiny", max_tokens=5, messages=[{"role": "user", "content": "hello"}]
        )
        assert is_tiny_text(reply.content[0].text) and reply.usage.output_tokens == 5  # type: ignore[union-attr]

        # What mistral.rs cannot do: a 400 naming the reason, never a silent difference.
        for model, extra, reason in [
            ("tiny+fox", {}, "applies no LoRA adapters per request"),
            ("tiny", {"extra_body": {"grammar": 'root ::= "a"'}}, "GBNF grammars"),
            ("tiny", {"seed": 3}, "a seed per engine, not per request"),
            ("tiny", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
            ("stray", {}, "serve with a mistralrs lane: `blazar engine install --kind mistralrs`"),
            ("nova", {}, "'nova', which the mistralrs lane does not load (its load probe"),
        ]:
            with pytest.raises(openai.BadRequestError) as caught:
                chat(client, model, **extra)
            assert reason in caught.value.message, caught.value.message
        r = blazar("session", "save", "tiny", "s1", "--url", served.url, ok=False)
        assert r.exit_code == 1 and "keeps no KV slots" in r.output
        assert not {"stray", "nova"} & {r["model"] for r in served.ps()}  # refused, not spawned

        # `engine use --kind mistralrs`: chat models that name no engine move to mistral.rs.
        with pytest.raises(openai.NotFoundError):  # no llama.cpp engine is installed
            chat(client, "later")
        said = blazar("engine", "use", "--kind", "mistralrs").output
        assert "now run on mistralrs (was llamacpp)" in said
        assert 'chat_kind = "mistralrs"' in paths.manifest.read_text()
        deadline = time.monotonic() + 30
        while True:
            try:
                assert is_tiny_text(chat(client, "later"))
                break
            except openai.NotFoundError:
                assert time.monotonic() < deadline, served.log
                time.sleep(0.2)
        assert {r["model"]: r["lane"] for r in served.ps()}["later"] == "mistralrs"

    # The lane's figure: decode tokens/s from the launcher's timings, as the gate reads it.
    bench = json.loads(blazar("bench", "tiny", "--engine", TAG, "--json").output)
    assert bench["tag"] == TAG and bench["decode_tps"] > 0 and bench["predicted_n"] == 64
