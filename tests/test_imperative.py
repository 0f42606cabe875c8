"""Imperative commands edit the manifest with tomlkit, then reconcile what they touched."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from blazar.manifest.edit import split_key
from blazar.paths import Paths
from blazar.store.db import Store
from blazar.testing.tiny import write_tiny_model
from specs.sources import default_name, parse_source
from tests.conftest import Blazar
from tests.hf_endpoint import FakeHub

COMMENTED = """# Blazar manifest for the team box.
[serving]
port = 11435  # the default, written down on purpose

# Models we serve
[models.tiny]
source = "{uri}"
ctx = 2048  # small on purpose
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "tiny.gguf")


@pytest.fixture
def manifest(paths: Paths, tiny: Path) -> Path:
    paths.manifest.write_text(COMMENTED.format(uri=tiny.as_uri()))
    return paths.manifest


def test_config_set_keeps_comments_and_order(blazar: Blazar, manifest: Path) -> None:
    blazar("config", "set", "serving.port", "11436")
    blazar("config", "set", "models.tiny.ctx", "4096")
    blazar("config", "set", 'models."qwen3:0.6b".source', "qwen3-0.6b")
    text = manifest.read_text()
    assert text.startswith("# Blazar manifest for the team box.\n[serving]\n")
    assert "port = 11436  # the default, written down on purpose" in text
    assert "ctx = 4096  # small on purpose" in text
    assert "# Models we serve" in text
    assert '[models."qwen3:0.6b"]' in text and 'source = "qwen3-0.6b"' in text
    assert blazar("config", "get", "serving.port").output.strip() == "11436"
    assert blazar("config", "get", 'models."qwen3:0.6b".source').output.strip() == "qwen3-0.6b"


def test_config_set_refuses_an_invalid_result(blazar: Blazar, manifest: Path) -> None:
    before = manifest.read_text()
    bad = blazar("config", "set", "serving.port", "99999", ok=False)
    assert bad.exit_code == 1 and "not written" in bad.output and "serving.port" in bad.output
    bad = blazar("config", "set", "models.tiny.ctxx", "1", ok=False)
    assert "did you mean 'ctx'" in bad.output
    assert manifest.read_text() == before
    missing = blazar("config", "get", "serving.host", ok=False)
    assert "is not set" in missing.output


def test_config_set_takes_pairs_validated_together(
    blazar: Blazar, manifest: Path, tmp_path: Path
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    before = manifest.read_text()
    # either half alone leaves the manifest invalid, so each is refused on its own
    for field, value in (("serving.tls_cert", cert), ("serving.tls_key", key)):
        alone = blazar("config", "set", field, str(value), ok=False)
        assert alone.exit_code == 1 and "not written" in alone.output, alone.output
        assert manifest.read_text() == before
    # both in one call: one manifest, validated whole, written once
    out = blazar("config", "set", "serving.tls_cert", str(cert), "serving.tls_key", str(key))
    assert f'serving.tls_cert = "{cert}"' in out.output
    assert f'serving.tls_key = "{key}"' in out.output
    text = manifest.read_text()
    assert "port = 11435  # the default, written down on purpose" in text  # comments kept
    assert blazar("config", "get", "serving.tls_key").output.strip() == str(key)
    # one bad pair refuses every pair: nothing of the call is written
    after = manifest.read_text()
    bad = blazar("config", "set", "models.tiny.ctx", "4096", "serving.port", "99999", ok=False)
    assert bad.exit_code == 1 and "serving.port" in bad.output
    assert manifest.read_text() == after
    # a key without its value, or a key given twice: a usage error, nothing written
    odd = blazar("config", "set", "models.tiny.ctx", "4096", "serving.port", ok=False)
    assert odd.exit_code == 2 and "'serving.port' has none" in odd.output, odd.output
    twice = blazar("config", "set", "serving.port", "1", "serving.port", "2", ok=False)
    assert twice.exit_code == 2 and "serving.port given twice" in twice.output
    assert manifest.read_text() == after


@pytest.mark.parametrize(
    ("key", "parts"),
    [
        ("serving.port", ["serving", "port"]),
        ('models."qwen3:0.6b".ctx', ["models", "qwen3:0.6b", "ctx"]),
        ("models.'a.b'.ctx", ["models", "a.b", "ctx"]),
        ("models.gemma3-270m.pin", ["models", "gemma3-270m", "pin"]),
    ],
)
def test_dotted_keys(key: str, parts: list[str]) -> None:
    assert split_key(key) == parts


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("hf://Qwen/Qwen3-0.6B-GGUF:Q8_0", "qwen3-0.6b:q8_0"),
        ("hf://org/Tiny-GGUF/sub/tiny-F16.gguf", "tiny:tiny-f16"),
        ("ollama://qwen3:0.6b", "qwen3:0.6b"),
        ("ollama://library/llama3.2", "llama3.2"),
        ("file:///models/Gemma-3-270M.Q4_K_M.gguf", "gemma-3-270m.q4_k_m"),
        ("qwen3-0.6b", "qwen3-0.6b"),
    ],
)
def test_default_names(source: str, name: str) -> None:
    assert default_name(parse_source(source)) == name


def test_pull_declares_then_fetches(
    blazar: Blazar, paths: Paths, manifest: Path, tmp_path: Path
) -> None:
    other = write_tiny_model(tmp_path / "other.gguf", seed=5)
    out = blazar("pull", other.as_uri(), "--name", "other").output
    assert "pulled other" in out
    text = manifest.read_text()
    assert "# Models we serve" in text and "[models.other]" in text
    record = json.loads(blazar("show", "other", "--json").output)
    assert record["managed"] and record["source"] == other.as_uri()
    assert "up to date" in blazar("pull", other.as_uri(), "--name", "other").output


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as served:
        yield served


def test_pull_from_the_hub_and_a_failed_pull_changes_nothing(
    blazar: Blazar,
    paths: Paths,
    manifest: Path,
    hub: FakeHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = write_tiny_model(tmp_path / "q.gguf", seed=9).read_bytes()
    hub.add_repo("Qwen/Qwen3-0.6B-GGUF", {"Qwen3-0.6B-Q8_0.gguf": data})
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    out = blazar("pull", "qwen3-0.6b").output
    assert "pulled qwen3-0.6b" in out
    record = json.loads(blazar("show", "qwen3-0.6b", "--json").output)
    assert record["sha256"] == hashlib.sha256(data).hexdigest()

    before = manifest.read_text()
    hub.wrong_bytes.add("Qwen3-0.6B-Q8_0.gguf")
    newer = write_tiny_model(tmp_path / "q2.gguf", seed=10).read_bytes()
    hub.add_repo("Qwen/Qwen3-0.6B-GGUF", {"Qwen3-0.6B-Q8_0.gguf": newer}, ref="v2")
    bad = blazar("pull", "hf://Qwen/Qwen3-0.6B-GGUF:Q8_0@v2", "--name", "broken", ok=False)
    assert bad.exit_code == 1 and "the manifest is unchanged" in bad.output
    assert manifest.read_text() == before
    assert "broken" not in blazar("list").output


def test_rm_removes_declaration_and_bytes(
    blazar: Blazar, paths: Paths, manifest: Path, tiny: Path
) -> None:
    blazar("apply")
    out = blazar("rm", "tiny").output
    assert "removed tiny and its declaration" in out
    assert "[models.tiny]" not in manifest.read_text()
    assert "# Blazar manifest" in manifest.read_text()
    assert blazar("list", "--json").output == ""
    assert tiny.exists()
    assert "No changes." in blazar("diff").output


def test_a_failed_pull_leaves_no_failure_behind(
    blazar: Blazar, paths: Paths, manifest: Path, tmp_path: Path, tiny: Path
) -> None:
    """ "The manifest is unchanged" after a failed pull means no condition either: doctor
    and status showed `model 'ghost' is not ready (ApplyFailed)` forever, which neither
    diff, rm nor apply --prune cleared (issue 33, day one 1). The same for an adapter."""
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a model")
    failed = blazar("pull", not_gguf.as_uri(), "--name", "ghost", ok=False)
    assert "the manifest is unchanged" in failed.output
    failed = blazar("lora", "add", "tiny", str(not_gguf), "--name", "bad", ok=False)
    assert "unchanged" in failed.output
    status = blazar("status").output
    assert "ghost" not in status and "bad" not in status
    assert "ghost" not in blazar("doctor", ok=False).output
    # A condition left by an earlier version goes at the next full pass.
    with Store(paths.db) as store:
        store.set_condition("model", "stale", "Ready", "False", "ApplyFailed", "old")
        store.set_condition("model", "tiny", "Ready", "False", "ApplyFailed", "kept")
    blazar("apply")
    with Store(paths.db) as store:
        left = {(c.name, c.reason) for c in store.conditions() if c.kind == "model"}
    assert not any(name == "stale" for name, _ in left)
    assert any(name == "tiny" for name, _ in left)  # declared: its own pass decides
