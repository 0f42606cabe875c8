"""`blazar import --scan`: models in ollama's store, the Hugging Face cache and LM Studio's
folders, laid out here as those runtimes lay them out, listed with their facts and adopted
with the exact command printed: hardlinked, verified, and the originals left untouched
(same inode, same mtime, same bytes), before and after `blazar rm`."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from blazar.paths import Paths
from blazar.testing.tiny import tiny_model_bytes, write_tiny_lora, write_tiny_model
from tests.conftest import Blazar
from tests.ollama_store import write_ollama_model

REV = "0123456789abcdef0123456789abcdef01234567"
OLD_REV = "89abcdef0123456789abcdef0123456789abcdef"


@cache
def tiny(seed: int) -> bytes:
    return tiny_model_bytes(seed=seed)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Mark:
    """What must not change about another runtime's file."""

    inode: int
    mtime_ns: int
    size: int
    sha256: str

    @classmethod
    def of(cls, path: Path) -> Mark:
        st = path.stat()
        return cls(st.st_ino, st.st_mtime_ns, st.st_size, sha(path.read_bytes()))


def hf_file(cache_dir: Path, repo: str, rev: str, name: str, data: bytes) -> Path:
    """A file as huggingface_hub caches it: a snapshot symlink to a blob named by sha256."""
    owner, _, short = repo.partition("/")
    root = cache_dir / f"models--{owner}--{short}"
    blob = root / "blobs" / sha(data)
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    link = root / "snapshots" / rev / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(REV)
    return link


@pytest.fixture
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """ollama (in ~/.ollama/models), an HF cache (HF_HUB_CACHE) and LM Studio (~/.lmstudio)."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    hf = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(hf))
    ollama = home / ".ollama" / "models"
    files = {
        "qwen3": write_ollama_model(ollama, "qwen3", "0.6b", gguf=tiny(1)),
        "mine": write_ollama_model(ollama, "me/mine", "v1", gguf=tiny(2)),
        "hf-q4": hf_file(hf, "acme/Tiny-GGUF", REV, "tiny-Q4_K_M.gguf", tiny(3)),
        "split-1": hf_file(hf, "acme/Split-GGUF", REV, "split-Q8_0-00001-of-00002.gguf", tiny(4)),
        "split-2": hf_file(hf, "acme/Split-GGUF", REV, "split-Q8_0-00002-of-00002.gguf", tiny(5)),
    }
    hf_file(hf, "acme/Tiny-GGUF", OLD_REV, "tiny-Q4_K_M.gguf", tiny(3))  # same blob: listed once
    hf_file(hf, "acme/Tiny-GGUF", REV, "mmproj-tiny-f16.gguf", b"GGUF\x03\x00\x00\x00broken")
    studio = home / ".lmstudio" / "models" / "lmstudio-community" / "Owl-GGUF"
    studio.mkdir(parents=True)
    files["owl"] = write_tiny_model(studio / "owl-Q8_0.gguf", seed=6)
    write_tiny_lora(studio / "owl-lora-f16.gguf", files["owl"])  # an adapter: not a model
    (studio / "notes.gguf").write_bytes(b"not a gguf at all")
    held = home / ".cache" / "lm-studio" / "models" / "bartowski" / "Held-GGUF"
    held.mkdir(parents=True)
    files["held"] = write_tiny_model(held / "held-Q4_K_M.gguf", seed=7)
    return files


def scanned(blazar: Blazar) -> dict[str, dict[str, Any]]:
    out = blazar("import", "--scan", "--json").output
    return {row["name"]: row for row in map(json.loads, out.splitlines())}


def test_scan_lists_what_other_runtimes_hold_and_adopts_by_hardlink(
    blazar: Blazar, paths: Paths, stores: dict[str, Path]
) -> None:
    blazar("import", str(stores["held"]), "--name", "already")
    marks = {key: Mark.of(path) for key, path in stores.items()}

    found = scanned(blazar)
    assert sorted((r["runtime"], n) for n, r in found.items()) == [
        ("huggingface", "split:q8_0"),
        ("huggingface", "tiny:q4_k_m"),
        ("lmstudio", "held:q4_k_m"),
        ("lmstudio", "owl:q8_0"),
        ("ollama", "mine:v1"),
        ("ollama", "qwen3:0.6b"),
    ]
    qwen = found["qwen3:0.6b"]
    assert qwen["command"] == "blazar pull ollama://qwen3:0.6b" and qwen["origin"] == "qwen3:0.6b"
    assert qwen["size"] == len(tiny(1)) and qwen["sha256"] == sha(tiny(1))
    assert qwen["architecture"] == "llama" and qwen["quantization"] and qwen["held"] is None
    assert found["mine:v1"]["command"] == "blazar pull ollama://me/mine:v1"
    q4 = found["tiny:q4_k_m"]
    assert q4["path"] == str(stores["hf-q4"]) and q4["origin"].startswith("acme/Tiny-GGUF/")
    assert q4["command"] == shlex.join(
        [
            "blazar",
            "import",
            str(stores["hf-q4"]),
            "--name",
            "tiny:q4_k_m",
            "--sha256",
            sha(tiny(3)),
        ]
    )
    split = found["split:q8_0"]
    assert split["size"] == len(tiny(4)) + len(tiny(5)) and len(split["shards"]) == 2
    assert found["held:q4_k_m"]["held"] == "already"  # Blazar holds these bytes already
    assert found["owl:q8_0"]["path"] == str(stores["owl"])

    text = blazar("import", "--scan").output
    assert "as already" in text and "Adopt one" in text
    assert "blazar pull ollama://qwen3:0.6b" in text and "held-Q4_K_M" not in text.split("Adopt")[1]

    for row in found.values():  # the exact commands, as a user would paste them
        if row["held"] is None:
            blazar(*shlex.split(row["command"])[1:])
    listed = {r["model"]: r for r in map(json.loads, blazar("list", "--json").output.splitlines())}
    for name in ("qwen3:0.6b", "mine:v1", "tiny:q4_k_m", "split:q8_0", "owl:q8_0"):
        assert listed[name]["held"] == "hardlink", listed[name]
    assert Path(listed["qwen3:0.6b"]["path"]).samefile(stores["qwen3"])
    assert Path(listed["tiny:q4_k_m"]["path"]).samefile(stores["hf-q4"].resolve())
    assert Path(listed["owl:q8_0"]["path"]).samefile(stores["owl"])
    shards = sorted(Path(listed["split:q8_0"]["path"]).parent.iterdir())
    assert [s.name for s in shards] == [stores["split-1"].name, stores["split-2"].name]
    assert shards[1].samefile(stores["split-2"].resolve())
    assert all(row["held"] for row in scanned(blazar).values())  # now every one is marked
    assert {key: Mark.of(path) for key, path in stores.items()} == marks

    for name in ("qwen3:0.6b", "mine:v1", "tiny:q4_k_m", "split:q8_0", "owl:q8_0", "already"):
        blazar("rm", name)
    assert {key: Mark.of(path) for key, path in stores.items()} == marks  # still untouched
    assert not [p for p in paths.blobs.iterdir() if not p.name.startswith(".")]


def test_adopting_checks_the_bytes_and_scan_copes_with_nothing(
    blazar: Blazar, paths: Paths, stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "0" * 64
    r = blazar("import", str(stores["hf-q4"]), "--name", "x", "--sha256", wrong, ok=False)
    assert r.exit_code == 1 and f"not the {wrong} expected; nothing was kept" in r.output
    assert blazar("list", "--json").output == ""
    r = blazar("import", "--scan", str(stores["owl"]), ok=False)
    assert r.exit_code == 2 and "--scan takes no PATH" in r.output
    r = blazar("import", str(stores["owl"]), ok=False)
    assert r.exit_code == 2 and "--name NAME" in r.output
    monkeypatch.setenv("HOME", str(paths.cache / "empty-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(paths.cache / "no-hf"))
    assert "No GGUF models found" in blazar("import", "--scan").output
    assert blazar("import", "--scan", "--json").output == ""
