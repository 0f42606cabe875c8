"""ollama:// sources against a faithful ollama models directory (tests/ollama_store.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from blazar.errors import VerificationFailed
from blazar.sources import Fetched, FetchError, fetch
from blazar.testing.tiny import tiny_model_bytes
from specs.sources import OllamaSource
from tests.hf_endpoint import corrupt
from tests.ollama_store import write_ollama_model

TINY = tiny_model_bytes()
TINY_SHA = hashlib.sha256(TINY).hexdigest()


def snapshot(store: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in store.rglob("*")}


def get(source: str, store: Path, sha256: str | None = None) -> Fetched:
    env = {"OLLAMA_MODELS": str(store)}
    return fetch(source, sha256=sha256, downloads=store.parent / "dl", env=env)


def test_a_model_is_its_blob_verified_and_hardlinkable(tmp_path: Path) -> None:
    store = tmp_path / "models"
    blob = write_ollama_model(store, "tiny", "1m", gguf=TINY)
    before = snapshot(store)
    got = fetch(
        OllamaSource("tiny", "1m"),
        sha256=TINY_SHA,
        downloads=tmp_path / "dl",
        env={"OLLAMA_MODELS": str(store)},
    )
    assert got.files == [blob] and got.sha256 == TINY_SHA and got.size == len(TINY)
    assert not got.temporary and got.detail["digest"] == f"sha256:{TINY_SHA}"
    os.link(got.files[0], tmp_path / "linked.gguf")  # what the registry does with it
    assert (tmp_path / "linked.gguf").read_bytes() == TINY
    (tmp_path / "linked.gguf").unlink()
    assert snapshot(store) == before
    assert not (tmp_path / "dl").exists()


def test_latest_and_namespaced_models(tmp_path: Path) -> None:
    store = tmp_path / "models"
    write_ollama_model(store, "tiny", gguf=TINY)
    other = tiny_model_bytes(seed=7)
    write_ollama_model(store, "someone/tiny", "q8", gguf=other)
    assert get("ollama://tiny", store).files[0].read_bytes() == TINY
    got = get("ollama://someone/tiny:q8", store)
    assert got.files[0].read_bytes() == other


def test_missing_store_model_or_tag_says_what_to_pull(tmp_path: Path) -> None:
    store = tmp_path / "models"
    with pytest.raises(FetchError, match=r"no ollama model store at .*ollama pull tiny:latest"):
        get("ollama://tiny", store)
    write_ollama_model(store, "tiny", "1m", gguf=TINY)
    with pytest.raises(FetchError, match=r"no model 'qwen3'.*`ollama pull qwen3:0\.6b`"):
        get("ollama://qwen3:0.6b", store)
    with pytest.raises(FetchError, match=r"not tag 'big' \(it has: 1m\).*ollama pull tiny:big"):
        get("ollama://tiny:big", store)


def test_a_model_without_a_gguf_layer_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "models"
    write_ollama_model(store, "tiny", gguf=TINY, model_layer=False)
    with pytest.raises(FetchError, match="no GGUF model layer"):
        get("ollama://tiny", store)


def test_a_damaged_blob_is_detected_and_left_alone(tmp_path: Path) -> None:
    store = tmp_path / "models"
    blob = write_ollama_model(store, "tiny", gguf=TINY)
    blob.write_bytes(corrupt(TINY))
    with pytest.raises(VerificationFailed, match=r"damaged; run `ollama pull tiny:latest`"):
        get("ollama://tiny", store)
    blob.write_bytes(TINY[:-10])
    with pytest.raises(VerificationFailed, match="bytes but its manifest says"):
        get("ollama://tiny", store)
    assert blob.read_bytes() == TINY[:-10]
    blob.unlink()
    with pytest.raises(FetchError, match="is missing"):
        get("ollama://tiny", store)


def test_a_manifest_sha256_that_differs_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "models"
    blob = write_ollama_model(store, "tiny", gguf=TINY)
    with pytest.raises(VerificationFailed, match="nothing was kept"):
        get("ollama://tiny", store, sha256="1" * 64)
    assert blob.read_bytes() == TINY


def test_ollama_models_env_wins_over_the_home_store(tmp_path: Path) -> None:
    home_store = tmp_path / "home" / ".ollama" / "models"
    write_ollama_model(home_store, "tiny", gguf=TINY)
    elsewhere = tmp_path / "elsewhere"
    other = tiny_model_bytes(seed=8)
    write_ollama_model(elsewhere, "tiny", gguf=other)
    home = {"HOME": str(tmp_path / "home")}
    from_home = fetch("ollama://tiny", sha256=None, downloads=tmp_path / "dl", env=home)
    assert from_home.files[0].read_bytes() == TINY
    env = {**home, "OLLAMA_MODELS": str(elsewhere)}
    from_env = fetch("ollama://tiny", sha256=None, downloads=tmp_path / "dl", env=env)
    assert from_env.files[0].read_bytes() == other
