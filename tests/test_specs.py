"""The manifest: good TOML, YAML and directory manifests, defaults, durations, schema, docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from specs.durations import FOREVER, InvalidDuration, format_duration, parse_duration
from specs.engines import Engine
from specs.loader import load_manifest, load_manifest_text
from specs.manifest import Manifest
from specs.models import Model
from specs.problems import Location, ManifestError
from specs.schema import DOCS_FILE, SCHEMA_FILE, render_manifest_docs, schema_text
from specs.serving import Serving
from specs.toml_locations import toml_locations

ROOT = Path(__file__).resolve().parent.parent
GOOD = ROOT / "tests" / "manifests" / "good"
SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def test_full_toml_manifest_loads_to_the_declared_values() -> None:
    m = load_manifest(GOOD / "full.toml")
    assert m.schema_url == "../../../specs/manifest.schema.json"
    assert m.serving == Serving(
        host="0.0.0.0",
        port=8080,
        max_loaded_models=2,
        default_ctx=2048,
        default_slots=2,
        keep_alive=600.0,
        max_queue=16,
        queue_timeout=45.0,
        cors_origins=["http://localhost:3000"],
        tls_cert="/etc/blazar/cert.pem",
        tls_key="/etc/blazar/key.pem",
    )
    assert m.engines["llamacpp"] == Engine(
        install="release", version="b11549", rollback_on_drop=0.05, feed="http://127.0.0.1:8000"
    )
    assert m.engines["built"].source == "https://github.com/ggml-org/llama.cpp@b11549"
    assert m.engines["built"].backend == "cuda"
    gemma = m.models["gemma3-270m"]
    assert (gemma.sha256, gemma.ctx, gemma.slots, gemma.replicas, gemma.pin) == (
        SHA,
        8192,
        4,
        1,
        True,
    )
    assert gemma.keep_alive == FOREVER
    assert gemma.aliases == ["gemma", "g3:small"]
    assert gemma.args == ["--batch-size", "1024"]
    assert (gemma.flash_attn, gemma.cache_type) == ("on", "q8_0")
    assert gemma.chat_template == "chatml"
    assert list(m.models) == ["gemma3-270m", "qwen3:0.6b", "nomic-embed"]
    assert m.models["nomic-embed"].embeddings and m.models["nomic-embed"].pooling == "mean"
    assert m.loras["fox"].model == "gemma" and m.loras["fox"].scale == 0.5
    assert m.keys["ci"].models == ["gemma3-270m", "qwen3:0.6b"]
    assert m.keys["admin"].models == ["*"]
    assert m.remotes["openai"].key_env == "OPENAI_API_KEY"


def test_yaml_manifest_equals_its_toml_twin() -> None:
    assert load_manifest(GOOD / "full.yaml") == load_manifest(GOOD / "full.toml")


def test_origins_point_at_each_declaration() -> None:
    toml = load_manifest(GOOD / "full.toml")
    name = str(GOOD / "full.toml")
    assert toml.origins[("models", "qwen3:0.6b")] == Location(name, 45, 1)
    assert toml.origins[("models", "gemma3-270m", "aliases", 1)] == Location(name, 40, 21)
    assert toml.location_of("models", "qwen3:0.6b", "ctx") == Location(name, 45, 1)
    yaml = load_manifest(GOOD / "full.yaml")
    assert yaml.origins[("models", "qwen3:0.6b")] == Location(str(GOOD / "full.yaml"), 42, 3)
    assert str(yaml.origins[("loras", "fox", "model")]) == f"{GOOD / 'full.yaml'}:53"


def test_a_directory_merges_its_manifest_files_in_name_order() -> None:
    m = load_manifest(GOOD / "merged")
    assert (m.serving.port, m.serving.keep_alive) == (9000, 0.0)  # from two files
    assert m.engines["llamacpp"].version == "2026.10.11549"
    assert list(m.models) == ["tiny", "gemma"]
    assert m.models["tiny"].ctx == 512
    assert m.models["gemma"].aliases == ["g"]
    assert m.resolve_model(m.loras["fox"].model) == "gemma"
    where = {path: str(loc) for path, loc in m.origins.items() if len(path) == 2}
    assert where[("serving", "keep_alive")] == f"{GOOD / 'merged' / '10-engines.yaml'}:6"
    assert where[("models", "gemma")] == f"{GOOD / 'merged' / '20-models.toml'}:5"
    assert where[("loras", "fox")] == f"{GOOD / 'merged' / '30-loras.yml'}:2"


def test_defaults() -> None:
    m = load_manifest_text('[models.tiny]\nsource = "file:///m/tiny.gguf"\n')
    assert m.version == 1
    assert m.serving == Serving()
    s = m.serving
    assert (s.host, s.port, s.max_loaded_models, s.default_ctx, s.default_slots) == (
        "127.0.0.1",
        11435,
        3,
        4096,
        1,
    )
    assert (s.keep_alive, s.max_queue, s.queue_timeout, s.cors_origins) == (300.0, 64, 30.0, [])
    assert s.tls_cert is None and s.tls_key is None
    tiny = m.models["tiny"]
    assert tiny == Model(source="file:///m/tiny.gguf")
    assert (tiny.replicas, tiny.pin, tiny.embeddings, tiny.aliases, tiny.args) == (
        0,
        False,
        False,
        [],
        [],
    )
    assert (m.ctx_for("tiny"), m.slots_for("tiny"), m.keep_alive_for("tiny")) == (4096, 1, 300.0)
    engine = Engine()
    assert (engine.kind, engine.install, engine.version, engine.backend) == (
        "llamacpp",
        "wheel",
        "latest",
        "cpu",
    )
    assert engine.rollback_on_drop == 0.10


@pytest.mark.parametrize(
    ("engines", "model_engine", "expected"),
    [
        ("", "", "llamacpp"),  # none declared: the default lane
        ("", 'engine = "llamacpp"', "llamacpp"),
        ("[engines.fast]\n", "", "fast"),  # exactly one declared: that one
        ("[engines.fast]\n[engines.slow]\n", 'engine = "slow"', "slow"),
    ],
)
def test_engine_defaulting(engines: str, model_engine: str, expected: str) -> None:
    text = f'{engines}[models.m]\nsource = "file:///m.gguf"\n{model_engine}\n'
    assert load_manifest_text(text).engine_for("m") == expected


def test_model_settings_fall_back_to_serving() -> None:
    m = load_manifest_text(
        "serving:\n  default_ctx: 1024\n  default_slots: 3\n  keep_alive: 1h\n"
        "models:\n  a: {source: file:///a.gguf, ctx: 64, slots: 1, keep_alive: 0}\n"
        "  b: {source: file:///b.gguf}\n",
        "blazar.yaml",
    )
    assert [m.ctx_for("a"), m.slots_for("a"), m.keep_alive_for("a")] == [64, 1, 0.0]
    assert [m.ctx_for("b"), m.slots_for("b"), m.keep_alive_for("b")] == [1024, 3, 3600.0]


def test_names_and_aliases_resolve_with_or_without_the_default_tag() -> None:
    m = load_manifest(GOOD / "full.toml")
    assert m.resolve_model("gemma3-270m:latest") == "gemma3-270m"
    assert m.resolve_model("g3:small") == "gemma3-270m"
    assert m.resolve_model("qwen3:0.6b") == "qwen3:0.6b"
    assert m.resolve_model("qwen3") is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5m", 300.0),
        ("30s", 30.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        ("1h2m3s4ms", 3723.004),
        ("1.5h", 5400.0),
        ("0", 0.0),
        (0, 0.0),
        ("300", 300.0),
        (300, 300.0),
        (2.5, 2.5),
        ("-1", FOREVER),
        (-1, FOREVER),
        ("-5m", FOREVER),
        (-0.5, FOREVER),
        (" 5m ", 300.0),
    ],
)
def test_durations(text: str | int | float, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["5 minutes", "", "m", "5x", "1m1m", "5m1h", "1d", "--1", True, None, "inf"]
)
def test_bad_durations_say_what_is_expected(text: object) -> None:
    with pytest.raises(
        InvalidDuration, match="expected a duration such as '5m', '30s', '0' or '-1'"
    ):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(300.0, "5m"), (5400.0, "1h30m"), (0.25, "250ms"), (0.0, "0"), (FOREVER, "-1"), (45, "45s")],
)
def test_durations_format_back(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "source",
    [
        "file:///srv/models/gemma.gguf",
        "hf://unsloth/gemma-3-270m-it-GGUF:Q4_K_M",
        "hf://owner/repo/sub/model.gguf@abc123",
        "ollama://qwen3:0.6b",
        "ollama://library/qwen3",
        "qwen3-0.6b",
        "https://example.com/m.gguf",
    ],
)
def test_sources_accepted(source: str) -> None:
    model = Model(source=source, sha256=SHA)
    assert model.source == source
    assert load_manifest_text(f'[models.m]\nsource = "{source}"\nsha256 = "{SHA}"\n')


def test_python_construction_validates_too() -> None:
    with pytest.raises(ValidationError, match="sha256 is required for an https:// source"):
        Model(source="https://example.com/m.gguf")
    with pytest.raises(ValidationError, match="lora 'fox' names model 'gemm'"):
        Manifest.model_validate(
            {
                "models": {"gemma": {"source": "file:///g.gguf"}},
                "loras": {"fox": {"model": "gemm", "source": "file:///f.gguf"}},
            }
        )


@pytest.mark.parametrize(
    ("text", "filename"),
    [
        ('"$schema" = "../specs/manifest.schema.json"\n', "blazar.toml"),
        ("$schema: ../specs/manifest.schema.json\n", "blazar.yaml"),
        ('"$schema" = "https://example.com/manifest.schema.json"\n', "blazar.toml"),
    ],
)
def test_schema_reference_is_accepted(text: str, filename: str) -> None:
    assert load_manifest_text(text, filename).schema_url


def test_schema_may_be_named_in_every_file_of_a_directory(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text('"$schema" = "s.json"\nversion = 1\n')
    (tmp_path / "b.yaml").write_text("$schema: s.json\nversion: 1\n")
    assert load_manifest(tmp_path).schema_url == "s.json"


@pytest.mark.parametrize("name", ["blazar.toml", "blazar.yaml", "blazar.yml"])
def test_an_empty_file_is_an_empty_manifest(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_text("# nothing yet\n")
    assert load_manifest(tmp_path / name) == Manifest()


def test_an_empty_directory_is_an_empty_manifest(tmp_path: Path) -> None:
    assert load_manifest(tmp_path) == Manifest()
    assert load_manifest(str(tmp_path)) == Manifest()


def test_a_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path / "nope.toml")
    assert str(info.value) == f"{tmp_path / 'nope.toml'}: no such manifest file or directory"


def test_a_file_of_another_kind_is_refused(tmp_path: Path) -> None:
    (tmp_path / "blazar.json").write_text("{}")
    with pytest.raises(ManifestError, match=r"a \.toml, \.yaml or \.yml file, or a directory"):
        load_manifest(tmp_path / "blazar.json")


def test_yaml_keys_are_names_as_written() -> None:
    m = load_manifest_text(
        "models:\n  yes: {source: file:///y.gguf}\n  1.0: {source: file:///o.gguf}\n", "m.yaml"
    )
    assert list(m.models) == ["yes", "1.0"]


def test_committed_schema_is_current() -> None:
    assert SCHEMA_FILE.read_text() == schema_text(), (
        "specs/manifest.schema.json is stale: python -m specs.schema"
    )


def test_manifest_reference_is_current() -> None:
    assert DOCS_FILE.read_text() == render_manifest_docs(), (
        "docs/manifest.md is stale: python -m specs.schema"
    )


def test_reference_documents_every_field() -> None:
    docs = DOCS_FILE.read_text()
    for model in (Manifest, *(Serving, Engine, Model)):
        for name, info in model.model_fields.items():
            assert f"| `{info.alias or name}` |" in docs
            assert info.description, f"{model.__name__}.{name} has no description"


def test_the_reference_example_loads() -> None:
    example = re.search(r"```toml\n(.*?)```", DOCS_FILE.read_text(), re.S)
    assert example is not None
    m = load_manifest_text(example.group(1))
    assert m.resolve_model("gemma") == "gemma3-270m"


def test_toml_locations_follow_quoting_strings_and_inline_tables() -> None:
    text = (
        '[models."qwen3:0.6b"]\n'
        'source = """a\n# not a comment\n[not.a.table]\n"""\n'
        "aliases = [\n  'q', # c\n  \"r\",\n]\n"
        "inline = { x = 1, 'y.z' = [1, { q = 2 }] }\n"
        "[[runs]]\nn = 1\n[[runs]]\nn = 2\n[runs.sub]\nk = 'v'\n"
        "[serving]\nport.x = 1\n"
    )
    found = toml_locations(text)
    assert found[("models", "qwen3:0.6b")] == (1, 1)
    assert found[("models", "qwen3:0.6b", "source")] == (2, 1)
    assert ("not", "a", "table") not in found
    assert found[("models", "qwen3:0.6b", "aliases", 1)] == (8, 3)
    assert found[("models", "qwen3:0.6b", "inline", "y.z", 1, "q")] == (10, 33)
    assert found[("runs", 1, "n")] == (14, 1)
    assert found[("runs", 1, "sub", "k")] == (16, 1)
    assert found[("serving", "port", "x")] == (18, 1)
