"""Every example manifest loads, and applies against a hub the test serves on loopback."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from blazar.paths import resolve_paths
from blazar.store.db import Store
from blazar.testing.tiny import write_tiny_model
from specs.loader import SUFFIXES, load_manifest
from tests.conftest import Blazar
from tests.hf_endpoint import FakeHub

TEAM_BOX_KEY = "plm_team-box-example-key-public-do-not-use"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MANIFESTS = sorted(
    p for p in EXAMPLES.iterdir() if (p.is_dir() and any(p.glob("*.toml"))) or p.suffix == ".toml"
)


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_example_manifests_load_and_name_the_schema(path: Path) -> None:
    manifest = load_manifest(path)
    assert manifest.models
    # Every manifest file and host overlay; not the blazar.lock an apply writes beside them
    # (`make run` applies examples/quickstart, and `make test` may follow in that tree).
    found = path.rglob("*") if path.is_dir() else [path]
    files = sorted(f for f in found if f.is_file() and f.suffix in SUFFIXES)
    for file in files:
        assert "manifest.schema.json" in file.read_text(), f"{file} does not reference the schema"


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[FakeHub]:
    with FakeHub() as served:
        qwen = write_tiny_model(tmp_path / "q.gguf", seed=1).read_bytes()
        smol = write_tiny_model(tmp_path / "s.gguf", seed=2).read_bytes()
        served.add_repo("Qwen/Qwen3-0.6B-GGUF", {"Qwen3-0.6B-Q8_0.gguf": qwen})
        served.add_repo(
            "bartowski/SmolLM2-135M-Instruct-GGUF",
            {
                "SmolLM2-135M-Instruct-Q4_K_M.gguf": smol,
                "SmolLM2-135M-Instruct-Q8_0.gguf": qwen,
            },
        )
        yield served


def test_the_fleet_example_applies_on_one_host_with_a_lock_and_previews_another(
    blazar: Blazar, hub: FakeHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    repo = tmp_path / "fleet"
    shutil.copytree(EXAMPLES / "fleet", repo)
    out = blazar("apply", "--host", "laptop", str(repo)).output
    assert "Apply complete! Resources: 2 added" in out  # the engine and qwen3; no smollm2
    assert f"wrote {repo / 'blazar.lock'}" in out
    assert blazar("diff", "--host", "laptop", "--detailed-exitcode", str(repo)).exit_code == 0
    assert "No changes." in blazar("apply", "--locked", "--host", "laptop", str(repo)).output
    gpu = blazar("diff", "--host", "gpu-box", str(repo)).output
    assert "engines.llamacpp" in gpu and "+ models.smollm2" in gpu and "+ keys.fleet" in gpu


def test_team_box_applies_and_converges(
    blazar: Blazar, hub: FakeHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    shutil.copytree(EXAMPLES / "team-box", tmp_path / "team-box")  # apply writes a lock there
    path = str(tmp_path / "team-box")
    assert "Plan: 4 to add" in blazar("diff", path).output
    assert "Apply complete! Resources: 4 added" in blazar("apply", path).output
    assert blazar("diff", path, "--detailed-exitcode").exit_code == 0
    listing = blazar("list").output
    assert "qwen3-0.6b" in listing and "smollm2" in listing
    # The ci key is the hash of a key the tests know; it may use qwen3-0.6b only.
    ci = load_manifest(EXAMPLES / "team-box").keys["ci"]
    assert ci.sha256 == hashlib.sha256(TEAM_BOX_KEY.encode()).hexdigest()
    assert (ci.scope, ci.models, ci.rpm) == ("inference", ["qwen3-0.6b"], 600)
    with Store(resolve_paths().db) as store:
        assert [(k.name, k.sha256) for k in store.list_keys()] == [("ci", ci.sha256)]
