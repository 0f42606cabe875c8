"""Chat templates without an engine: how a declaration is read, validated and resolved.

What the engine renders with them, route by route, is in test_chat_templates_served.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

from blazar.launch.served_template import (
    MAX_TEMPLATE_BYTES,
    TEMPLATES_DIR,
    applied_template,
    builtin_text,
)
from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.testing.tiny import write_tiny_model
from specs.chat_templates import BUILTIN_TEMPLATES, classify_chat_template
from specs.loader import load_manifest_text
from specs.problems import ManifestError
from tests.conftest import Blazar


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("gemma", "builtin"),
        ("mistral-v7", "builtin"),
        ("Gemma", "builtin"),  # a name, refused at validation (names are lowercase)
        ("{{ messages }}", "jinja"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "jinja"),
        ("/etc/blazar/chat.jinja", "file"),  # jinja text wins only with {{ or {%
        ("templates/mine.jinja", "file"),
        ("mine.jinja", "file"),
        ("~/templates/mine.j2", "file"),
        ("./mine", "file"),
    ],
)
def test_a_declaration_is_a_name_jinja_text_or_a_path(text: str, kind: str) -> None:
    assert classify_chat_template(text).kind == kind


def model_toml(chat_template: str, args: list[str] | None = None) -> str:
    text = f'[models.m]\nsource = "file:///m.gguf"\nchat_template = {json.dumps(chat_template)}\n'
    return text + (f"args = {json.dumps(args)}\n" if args else "")


def problems(text: str) -> list[str]:
    with pytest.raises(ManifestError) as info:
        load_manifest_text(text)
    return [str(p) for p in info.value.problems]


def test_an_unknown_name_is_refused_listing_the_known_ones() -> None:
    [problem] = problems(model_toml("llama-3"))
    assert problem.startswith("blazar.toml:3: models.m.chat_template: unknown chat template")
    assert all(name in problem for name in BUILTIN_TEMPLATES)
    assert problem.endswith("did you mean 'llama3'?")
    [blank] = problems(model_toml("  "))
    assert "expected a chat template name, Jinja text or a .jinja file path" in blank


@pytest.mark.parametrize(
    "value",
    [*BUILTIN_TEMPLATES, "{{ messages[0].content }}", "/abs/t.jinja", "t.jinja", "~/t.jinja"],
)
def test_names_jinja_text_and_paths_are_accepted(value: str) -> None:
    assert load_manifest_text(model_toml(value)).models["m"].chat_template == value


@pytest.mark.parametrize("flag", ["--chat-template", "--chat-template-file"])
def test_the_engines_own_template_flags_are_refused_in_args(flag: str) -> None:
    [problem] = problems(model_toml("chatml", [flag, "x"]))
    assert f"args may not set {flag}; use chat_template" in problem


def test_every_name_has_a_shipped_template_that_parses() -> None:
    shipped = sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja"))
    assert shipped == sorted(BUILTIN_TEMPLATES)
    env = jinja2.Environment()
    for name in BUILTIN_TEMPLATES:
        text = builtin_text(name)
        env.parse(text)  # a syntax error names the file's line
        # /api/show reports "tools" for a template that mentions them: only those that do.
        assert ("tools" in text) == (name in ("chatml", "llama3", "mistral-v3", "mistral-v7"))


def test_applied_template_reads_each_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gemma = applied_template("gemma", "{{ gguf }}")
    assert (gemma.origin, gemma.text) == ("builtin", builtin_text("gemma"))  # beats the GGUF's
    assert "<start_of_turn>" in (gemma.text or "")
    text = applied_template("{{ messages }}", None)
    assert (text.origin, text.text, text.problem) == ("jinja", "{{ messages }}", None)

    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "mine.jinja").write_text("{{ mine }}")
    beside = applied_template("templates/mine.jinja", None, str(tmp_path / "blazar.toml"))
    assert (beside.origin, beside.text) == ("file", "{{ mine }}")  # beside its manifest file
    assert beside.source == f"the file {tmp_path / 'templates' / 'mine.jinja'}"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert applied_template("~/templates/mine.jinja", None).text == "{{ mine }}"

    missing = applied_template("gone.jinja", None, str(tmp_path / "blazar.toml"))
    assert missing.text is None
    assert missing.problem == (
        f"its chat_template file {tmp_path / 'gone.jinja'} cannot be read "
        "(No such file or directory)"
    )
    (tmp_path / "empty.jinja").write_text("\n")
    assert "is empty" in str(applied_template(str(tmp_path / "empty.jinja"), None).problem)
    big = "{{ x }}" + " " * MAX_TEMPLATE_BYTES
    assert "is over 120 KiB" in str(applied_template(big, None).problem)

    assert applied_template(None, "{{ gguf }}").origin == "gguf"
    assert applied_template(None, None).text is None


def runtime(**fields: object) -> ModelRuntime:
    base: dict[str, object] = dict(
        name="m",
        path="/m.gguf",
        aliases=(),
        ctx=512,
        slots=1,
        replicas=0,
        pin=False,
        keep_alive=300.0,
        engine_tag="b1-cpu",
        command=("llama-server",),
        has_template=False,
        chat_template=None,
        embeddings=False,
        pooling=None,
        extra_args=(),
    )
    base.update(fields)
    return ModelRuntime(**base)  # type: ignore[arg-type]  # fields of mixed types


def test_the_engine_gets_the_text_with_jinja_and_refusals_say_what_to_fix() -> None:
    text = builtin_text("llama3")
    args = runtime(chat_template=text).args()
    assert "--jinja" in args and args[args.index("--chat-template") + 1] == text
    assert "--chat-template" not in runtime(has_template=True).args()  # the GGUF's own

    none = runtime().chat_refusal("use /v1/completions, or ")
    assert none is not None and "has no chat template" in none
    assert "use /v1/completions, or set models.m.chat_template" in none
    broken = runtime(has_template=True, template_problem="its chat_template file /x is empty")
    assert not broken.can_chat  # the GGUF's template is not the one asked for
    assert broken.chat_refusal() == (
        "model 'm' cannot chat: its chat_template file /x is empty: fix "
        "models.m.chat_template in the manifest"
    )
    assert runtime(chat_template=text).chat_refusal() is None


def test_show_reports_the_template_it_is_served_with(blazar: Blazar, tmp_path: Path) -> None:
    plain = write_tiny_model(tmp_path / "plain.gguf", chat_template=None)
    blazar("import", str(plain), "--name", "plain")
    manifest = tmp_path / "blazar.toml"
    assert "chat template      none (the GGUF carries none)" in blazar("show", "plain").output

    manifest.write_text(f'[models.plain]\nsource = "{plain.as_uri()}"\nchat_template = "gemma"\n')
    shown = blazar("show", "plain", "--manifest", str(manifest)).output
    assert "chat template      gemma (shipped with Blazar)" in shown
    data = json.loads(blazar("show", "plain", "--manifest", str(manifest), "--json").output)
    assert data["chat_template"]["origin"] == "builtin"
    assert data["chat_template"]["text"] == builtin_text("gemma")

    manifest.write_text(manifest.read_text().replace('"gemma"', '"gone.jinja"'))
    shown = blazar("show", "plain", "--manifest", str(manifest)).output
    assert f"unusable: its chat_template file {tmp_path / 'gone.jinja'} cannot be read" in shown
    manifest.write_text("[models.plain]\n")
    assert (
        "has problems (`blazar diff" in blazar("show", "plain", "--manifest", str(manifest)).output
    )
