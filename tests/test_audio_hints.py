"""`blazar tts` and `blazar whisper` name the command that pulls what they lack: a voice or
size that is not pulled got the gateway's "Declare it in the manifest (or `blazar pull`)",
and `--local` said "run `blazar list`" (issue 33, day one 5)."""

from __future__ import annotations

import wave
from pathlib import Path

import pytest

from blazar.paths import Paths
from tests.conftest import Blazar
from tests.serving import Served


@pytest.fixture
def clip(tmp_path: Path) -> Path:
    path = tmp_path / "file.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(b"\0\0" * 1600)
    return path


def test_local_names_the_pull(blazar: Blazar, clip: Path) -> None:
    said = blazar("tts", "hello", "--voice", "en_US-amy-medium", "--local", ok=False).output
    assert "voice 'en_US-amy-medium' is not pulled" in said
    assert "`blazar tts --pull en_US-amy-medium`" in said and "blazar list" not in said
    said = blazar("whisper", str(clip), "--model", "tiny", "--local", ok=False).output
    assert "`blazar whisper --pull tiny`" in said and "blazar list" not in said


def test_through_the_daemon_names_the_pull(
    blazar: Blazar, paths: Paths, blazar_home: Path, clip: Path
) -> None:
    paths.manifest.parent.mkdir(parents=True, exist_ok=True)
    paths.manifest.write_text("[serving]\n")
    with Served(paths.manifest, blazar_home) as served:
        said = blazar(
            "tts", "hello", "--voice", "en_US-amy-medium", "--url", served.url, ok=False
        ).output
        assert "`blazar tts --pull en_US-amy-medium`" in said, said
        assert "blazar pull`" not in said
        said = blazar("whisper", str(clip), "--model", "tiny", "--url", served.url, ok=False)
        assert "`blazar whisper --pull tiny`" in said.output, said.output
