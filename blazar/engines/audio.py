"""Package lanes: engines installed from one PyPI package into a venv of their own.

The speech lanes: a `whisper` engine is faster-whisper (CTranslate2, speech to
text); a `piper` engine is piper-tts (ONNX Runtime, text to speech). And one chat
lane: a `mistralrs` engine is mistral.rs (its Python package; chat and completions
from GGUF or safetensors models). Each version gets its own virtual environment
under `<data>/engines/<kind>/<tag>/`, with the package and its dependencies
installed from the wheel cache (`BLAZAR_WHEEL_CACHE`; what is missing there is
downloaded into it first, so a second install of a version fetches nothing), and
its launcher (`blazar/engines/launchers/`: `whisper_launcher.py`, `piper_launcher.py`,
`mistralrs_launcher.py`, each with `launcher_common.py`: the engine's Python, the
engine package and the standard library only) copied beside it. The launcher serves
HTTP with a `/health` endpoint and prints the "listening on" line the supervisor
reads, as llama-server does; the serve scheduler supervises it like any other child.

Tags name the package and its version (`faster-whisper-1.2.1`, `piper-tts-1.8.0`,
`mistralrs-0.9.5`), so they are unique across lanes. `blazar.engines.service.Engines`
installs, gates (`blazar.engines.audio_bench`; mistralrs: `blazar.engines.bench`) and
switches them.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from blazar.engines import launchers, wheel
from blazar.engines.base import InstalledEngine, publish, staging
from blazar.engines.kinds import OPENAI_ONLY
from blazar.engines.wheel import WheelInstallError, _pip, _tail, place_launcher
from blazar.errors import InvalidInput
from reconcilers.engines import audio_tag
from specs.engines import PACKAGE_ENGINES

_VERSION = re.compile(r"^[0-9]+(\.[0-9]+){1,3}$")


@dataclass(frozen=True)
class AudioLane:
    """One package lane: the package it installs and the launcher that serves it."""

    kind: str  # whisper | piper | mistralrs
    package: str  # the PyPI package
    launcher: str  # the launcher's file name in blazar/engines/launchers/, and in the engine
    serves: str  # the kind of model it loads: transcription | speech | chat
    figure: str  # what its gate compares, in words

    def tag(self, version: str) -> str:
        if not _VERSION.match(version):
            raise InvalidInput(f"{self.package} version {version!r} is not a version such as 1.2.1")
        return audio_tag(self.kind, version)


LANES = {
    "whisper": AudioLane(
        "whisper",
        PACKAGE_ENGINES["whisper"],
        "whisper_launcher.py",
        "transcription",
        "real-time factor (audio seconds per second of work)",
    ),
    "piper": AudioLane(
        "piper",
        PACKAGE_ENGINES["piper"],
        "piper_launcher.py",
        "speech",
        "synthesis speed (audio seconds per second of work)",
    ),
    "mistralrs": AudioLane(
        "mistralrs",
        PACKAGE_ENGINES["mistralrs"],
        "mistralrs_launcher.py",
        "chat",
        "decode tokens/s",
    ),
}


def lane(kind: str) -> AudioLane:
    found = LANES.get(kind)
    if found is None:
        raise InvalidInput(f"{kind!r} is not a package engine lane: {', '.join(LANES)}")
    return found


def latest_version(kind: str) -> str:
    """The newest release of the lane's package on the index pip is configured for."""
    return wheel.latest_version(lane(kind).package)


def _install_from_cache(
    python: Path, cache: Path, requirement: str
) -> subprocess.CompletedProcess[str]:
    return _pip(
        "--python",
        str(python),
        "install",
        "--no-index",
        "--find-links",
        str(cache),
        "--only-binary",
        ":all:",
        "--quiet",
        requirement,
    )


def install_audio(
    engines_root: Path, cache: Path, kind: str, version: str | None = None
) -> InstalledEngine:
    """Install the lane's package at `version` (default: the newest) as a new engine."""
    spec = lane(kind)
    version = version or latest_version(kind)
    tag = spec.tag(version)
    requirement = f"{spec.package}=={version}"
    cache.mkdir(parents=True, exist_ok=True)
    with staging(engines_root, tag, kind) as (tmp, final):
        python = wheel.make_venv(tmp) / "bin" / "python"
        result = _install_from_cache(python, cache, requirement)
        if result.returncode != 0:  # something is not cached yet: fetch it, then again
            fetched = _pip(
                "download", "--only-binary", ":all:", "--quiet", "-d", str(cache), requirement
            )
            if fetched.returncode != 0:
                raise WheelInstallError(
                    f"could not download {requirement} and its dependencies:\n"
                    f"{_tail(fetched.stderr or fetched.stdout)}"
                )
            result = _install_from_cache(python, cache, requirement)
        if result.returncode != 0:
            raise WheelInstallError(
                f"could not install {requirement}:\n{_tail(result.stderr or result.stdout)}"
            )
        launcher_version = place_launcher(
            launchers.FOLDER / spec.launcher,
            tmp,
            spec.launcher,
            requirement,
            timeout=120,
        )
        publish(tmp, final)
    return InstalledEngine(
        kind=kind,
        tag=tag,
        method="wheel",
        version=version,
        path=final,
        command=[str(final / "venv" / "bin" / "python"), str(final / spec.launcher)],
        details={
            "package": spec.package,
            "launcher_version": launcher_version,
            # What its server speaks (the request pipeline translates for an OpenAI-only one).
            "dialect": "openai" if kind in OPENAI_ONLY else kind,
        },
    )
