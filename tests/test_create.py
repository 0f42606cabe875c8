"""`blazar create` (flags and ollama Modelfiles) and `blazar cp`: derived models and other
names in the manifest, and what a derived model's defaults do in the real engine."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import ollama
import openai
import pytest
import tomlkit

from blazar.paths import Paths
from blazar.testing.tiny import write_tiny_lora, write_tiny_model
from tests.conftest import Blazar
from tests.fixtures import ENGINE
from tests.serving import Served

HI = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def tiny(blazar: Blazar, paths: Paths, tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    model = write_tiny_model(tmp_path / "src" / "tiny.gguf")
    write_tiny_lora(tmp_path / "src" / "fox.gguf", model)
    paths.manifest.parent.mkdir(parents=True, exist_ok=True)
    paths.manifest.write_text(f"# mine\n{ENGINE}")
    blazar("pull", model.as_uri(), "--name", "tiny")
    return model


def manifest(paths: Paths) -> dict:  # type: ignore[type-arg]
    return tomlkit.parse(paths.manifest.read_text()).unwrap()


def listed(blazar: Blazar) -> dict[str, dict]:  # type: ignore[type-arg]
    return {r["model"]: r for r in map(json.loads, blazar("list", "--json").output.splitlines())}


def test_create_from_flags_derives_a_declaration(blazar: Blazar, paths: Paths, tiny: Path) -> None:
    out = blazar(
        "create",
        "brief",
        "--from",
        "tiny",
        "--system",
        "Be brief.",
        "--param",
        "temperature=0.2",
        "--param",
        "stop=<|im_end|>",
        "--param",
        "num_ctx=512",
    ).output
    assert "created brief from tiny" in out
    brief = manifest(paths)["models"]["brief"]
    held = listed(blazar)
    assert brief == {
        "source": tiny.as_uri(),
        "sha256": held["tiny"]["sha256"],
        "system": "Be brief.",
        "ctx": 512,
        "params": {"temperature": 0.2, "stop": ["<|im_end|>"]},
    }
    assert held["brief"]["path"] == held["tiny"]["path"]  # the same bytes, linked once
    assert paths.manifest.read_text().startswith("# mine\n")

    again = blazar("create", "brief", "--from", "tiny", ok=False)
    assert again.exit_code == 1 and "declared already" in again.output and "--force" in again.output
    blazar("create", "brief", "--from", "brief", "--param", "seed=7", "--force")
    assert manifest(paths)["models"]["brief"]["params"] == {
        "temperature": 0.2,
        "stop": ["<|im_end|>"],
        "seed": 7,
    }
    for args, needle in [
        (("--from", "nothing"), "neither declared in the manifest nor in the store"),
        (("--from", "tiny", "--param", "top_k=lots"), "top_k takes an integer"),
        (("--from", "tiny", "--param", "mood=happy"), "unknown parameter 'mood'"),
        (("--from", "tiny", "--param", "temperature"), "write KEY=VALUE"),
        ((), "give --from MODEL"),
    ]:
        r = blazar("create", "other", *args, ok=False)
        assert r.exit_code in (1, 2) and needle in r.output, r.output
    assert "other" not in manifest(paths)["models"]


def test_modelfile_instructions_honoured_or_refused(
    blazar: Blazar, paths: Paths, tiny: Path, tmp_path: Path
) -> None:
    modelfile = tmp_path / "src" / "Modelfile"
    modelfile.write_text(
        "# a fox that answers in four words\nFROM tiny\nPARAMETER num_predict 4\n"
        'PARAMETER stop "<|im_end|>"\nSYSTEM """You are a fox.\nSay fox."""\nADAPTER ./fox.gguf\n'
    )
    out = blazar("create", "foxy", "--modelfile", str(modelfile)).output
    assert "with always-on adapters foxy-fox" in out
    declared = manifest(paths)
    assert declared["models"]["foxy"]["system"] == "You are a fox.\nSay fox."
    assert declared["models"]["foxy"]["params"] == {"num_predict": 4, "stop": ["<|im_end|>"]}
    fox = (tmp_path / "src" / "fox.gguf").as_uri()
    assert declared["loras"]["foxy-fox"] == {"model": "foxy", "source": fox, "always_on": True}

    before = paths.manifest.read_text()
    for text, needle in [
        ("FROM tiny\nTEMPLATE {{ .Prompt }}\n", "Modelfile:2: TEMPLATE is a Go template"),
        ("FROM tiny\nLICENSE MIT\n", "Modelfile:2: LICENSE is not supported"),
        ("FROM tiny\nMESSAGE user hi\n", "MESSAGE is not supported"),
        ("FROM tiny\nPARAMETER tfs_z 1\n", "Modelfile:2: unknown parameter 'tfs_z'"),
        ("FROM tiny\nQUANTIZE q4\n", "unknown instruction QUANTIZE"),
        ('FROM tiny\nSYSTEM """never closed\n', 'SYSTEM opens """ but never closes it'),
        ("PARAMETER seed 1\n", "no FROM line"),
    ]:
        modelfile.write_text(text)
        r = blazar("create", "bad", "--modelfile", str(modelfile), ok=False)
        assert r.exit_code == 1 and needle in r.output, r.output
    assert paths.manifest.read_text() == before
    # a TEMPLATE is replaced when a chat template is given
    modelfile.write_text("FROM tiny\nTEMPLATE {{ .Prompt }}\n")
    blazar("create", "chatty", "--modelfile", str(modelfile), "--chat-template", "chatml")
    assert manifest(paths)["models"]["chatty"]["chat_template"] == "chatml"


def test_cp_gives_another_name(blazar: Blazar, paths: Paths, tiny: Path) -> None:
    assert "copied tiny to small" in blazar("cp", "tiny", "small").output
    assert manifest(paths)["models"]["tiny"]["aliases"] == ["small"]
    r = blazar("cp", "ghost", "boo", ok=False)
    assert r.exit_code == 1 and "model 'ghost' is not declared" in r.output
    blazar("create", "other", "--from", "tiny")
    r = blazar("cp", "tiny", "other", ok=False)
    assert r.exit_code == 1 and "other" in r.output
    assert "removed alias small of tiny" in blazar("rm", "small").output


def test_a_created_model_serves_with_its_defaults(
    blazar: Blazar, paths: Paths, blazar_home: Path, tiny: Path, tmp_path: Path
) -> None:
    modelfile = tmp_path / "src" / "Modelfile"
    modelfile.write_text(
        "FROM tiny\nPARAMETER num_predict 4\nSYSTEM You are a fox.\nADAPTER fox.gguf\n"
    )
    blazar("create", "foxy", "--modelfile", str(modelfile))
    with Served(paths.manifest, blazar_home) as served:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="-", max_retries=0)

        def chat(model: str, messages: list[dict[str, str]], **kw: object) -> object:
            return client.chat.completions.create(model=model, messages=messages, **kw)  # type: ignore[arg-type,call-overload]

        base = chat("tiny", HI, max_tokens=4)
        foxy = chat("foxy", HI)  # no limit: the model's num_predict; its system prompt
        assert foxy.choices[0].message.content.split() == ["fox"] * 4  # type: ignore[attr-defined]
        assert foxy.usage.prompt_tokens > base.usage.prompt_tokens  # type: ignore[attr-defined]
        own = [{"role": "system", "content": "Be a cat."}, *HI]
        mine, theirs = chat("foxy", own), chat("tiny", own, max_tokens=4)
        assert mine.usage.prompt_tokens == theirs.usage.prompt_tokens  # type: ignore[attr-defined]
        longer = chat("foxy", HI, max_tokens=7)  # the request's own limit wins
        assert longer.usage.completion_tokens == 7  # type: ignore[attr-defined]
        plain = chat("foxy+none", HI)
        assert "fox" not in plain.choices[0].message.content  # type: ignore[attr-defined]

        reply = ollama.Client(host=served.url).chat(model="foxy", messages=HI)
        assert reply.eval_count == 4 and (reply.message.content or "").split() == ["fox"] * 4
        short = ollama.Client(host=served.url).chat(
            model="foxy", messages=HI, options={"num_predict": 2}
        )
        assert short.eval_count == 2
        message = anthropic.Anthropic(base_url=served.url, api_key="-", max_retries=0)
        answer = message.messages.create(model="foxy", max_tokens=3, messages=HI)  # type: ignore[arg-type]
        assert answer.usage.output_tokens == 3
        assert "".join(b.text for b in answer.content if b.type == "text").split() == ["fox"] * 3


def test_a_derived_model_is_not_pinned_or_replicated_with_its_base(
    blazar: Blazar, paths: Paths, tiny: Path
) -> None:
    """A base declared `pin = true` and `replicas = 1` is kept so on this host; a model
    derived from it answers differently and is not: copying them started a second pinned
    child (issue 33, day one 11)."""
    blazar("config", "set", "models.tiny.pin", "true", "models.tiny.replicas", "1")
    blazar("create", "brief", "--from", "tiny", "--system", "Be brief.")
    declared = manifest(paths)["models"]
    assert declared["tiny"]["pin"] is True and declared["tiny"]["replicas"] == 1
    assert "pin" not in declared["brief"] and "replicas" not in declared["brief"]
    assert declared["brief"]["system"] == "Be brief."
