"""Speech models from the hub: hf:// directories of files with the real huggingface_hub
client against a hub on loopback, `blazar whisper --pull` and `blazar tts --pull`, and the
catalogs refreshed from that hub."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from blazar.errors import VerificationFailed
from blazar.models.filesets import set_digest
from blazar.paths import Paths
from blazar.sources import fetch
from blazar.store.db import Store
from specs.names import parse_name
from tests.conftest import Blazar
from tests.hf_endpoint import FakeHub

WHISPER_FILES = {
    "config.json": b'{"alignment_heads": [], "lang_ids": []}',
    "model.bin": bytes(range(256)) * 64,
    "tokenizer.json": b'{"model": {}}',
    "vocabulary.txt": b"a\nb\n",
    "README.md": b"# faster-whisper-base\n",
    ".gitattributes": b"*.bin filter=lfs\n",
}
AMY = "en/en_US/amy/medium"
VOICE_FILES = {
    f"{AMY}/en_US-amy-medium.onnx": b"onnx" * 500,
    f"{AMY}/en_US-amy-medium.onnx.json": b'{"audio": {"sample_rate": 22050}}',
    f"{AMY}/MODEL_CARD": b"# amy\n",
    "en/en_US/ryan/low/en_US-ryan-low.onnx": b"other voice",
    "en/en_US/ryan/low/en_US-ryan-low.onnx.json": b"{}",
    "voices.json": json.dumps(
        {
            "en_US-amy-medium": {
                "name": "amy",
                "quality": "medium",
                "num_speakers": 1,
                "language": {
                    "code": "en_US",
                    "name_english": "English",
                    "country_english": "United States",
                },
                "files": {
                    f"{AMY}/en_US-amy-medium.onnx": {"size_bytes": 2000},
                    f"{AMY}/en_US-amy-medium.onnx.json": {"size_bytes": 33},
                },
            }
        }
    ).encode(),
}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as hub:
        hub.add_repo("Systran/faster-whisper-base", WHISPER_FILES)
        hub.add_repo("rhasspy/piper-voices", VOICE_FILES, ref="v1.0.0")
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_repo_is_a_set_of_files_each_verified(hub: FakeHub, tmp_path: Path) -> None:
    got = fetch(
        "hf://Systran/faster-whisper-base",
        sha256=None,
        downloads=tmp_path,
        env={"HF_ENDPOINT": hub.url},
        kind="transcription",
    )
    assert got.names == ("config.json", "model.bin", "tokenizer.json", "vocabulary.txt")
    assert [f.read_bytes() for f in got.files] == [WHISPER_FILES[n] for n in got.names]
    assert got.hashes == {n: sha(WHISPER_FILES[n]) for n in got.names}
    assert got.sha256 == set_digest(got.hashes)
    assert got.detail["revision"] == hub.repos["Systran/faster-whisper-base"].refs["main"]
    hub.wrong_bytes.add("model.bin")
    with pytest.raises(VerificationFailed, match=r"model\.bin from .* nothing was kept"):
        fetch(
            "hf://Systran/faster-whisper-base",
            sha256=None,
            downloads=tmp_path / "again",
            env={"HF_ENDPOINT": hub.url},
            kind="transcription",
        )


def test_a_directory_is_the_files_under_it(hub: FakeHub, tmp_path: Path) -> None:
    got = fetch(
        f"hf://rhasspy/piper-voices/{AMY}@v1.0.0",
        sha256=None,
        downloads=tmp_path,
        env={"HF_ENDPOINT": hub.url},
    )
    assert got.names == ("MODEL_CARD", "en_US-amy-medium.onnx", "en_US-amy-medium.onnx.json")
    assert got.detail["directory"] == AMY


def test_pull_declares_and_fetches_the_catalogs_models(
    hub: FakeHub, blazar: Blazar, paths: Paths, tmp_path: Path
) -> None:
    manifest = tmp_path / "blazar.toml"
    blazar("whisper", "--pull", "base", "--manifest", str(manifest))
    blazar("tts", "--pull", "en_US-amy-medium", "--manifest", str(manifest))
    text = manifest.read_text()
    assert '[models.whisper-base]\nsource = "hf://Systran/faster-whisper-base"' in text
    assert 'kind = "transcription"' in text and 'kind = "speech"' in text
    assert f'source = "hf://rhasspy/piper-voices/{AMY}@v1.0.0"' in text
    with Store(paths.db) as store:
        ears = store.get_model(parse_name("whisper-base"))
        amy = store.get_model(parse_name("en_us-amy-medium"))
    assert ears.kind == "transcription" and Path(ears.path).name.endswith(".set")
    assert (Path(ears.path) / "model.bin").read_bytes() == WHISPER_FILES["model.bin"]
    assert amy.kind == "speech" and "en_US-amy-medium.onnx" in amy.facts["files"]
    found = blazar("tts", "--search", "amy", "--json").output.splitlines()
    pulled = {json.loads(v)["key"]: json.loads(v)["pulled"] for v in found}
    assert pulled["en_US-amy-medium"] == "en_us-amy-medium" and pulled["en_US-amy-low"] is None
    unknown = blazar("tts", "--pull", "xx_XX-nobody-low", ok=False)
    assert unknown.exit_code == 1 and "no voice 'xx_XX-nobody-low' in the catalog" in unknown.output


def test_the_catalogs_refresh_from_the_hub(hub: FakeHub, blazar: Blazar) -> None:
    voices = blazar("tts", "--search", "amy", "--refresh", "--json").output.splitlines()
    assert [json.loads(v)["bytes"] for v in voices] == [2000]  # from the hub's voices.json
    again = blazar("tts", "--search", "amy", "--json").output.splitlines()  # cached now
    assert [json.loads(v)["bytes"] for v in again] == [2000]
    sizes = blazar("whisper", "--search", "base", "--refresh", "--json").output.splitlines()
    base = next(json.loads(s) for s in sizes if json.loads(s)["name"] == "base")
    assert base["bytes"] == len(WHISPER_FILES["model.bin"]) and base["exact"]
