"""The catalogs of speech models: whisper sizes and piper voices, shipped with Blazar.

`blazar whisper --search` and `blazar tts --search` (`blazar.cli.audio`) read
them; `--pull` turns an entry into a model's source. Both ship as package data
(`blazar/sources/catalogs/whisper.json`, `piper.json`): the whisper sizes faster-whisper
itself names (tiny to large-v3, large-v3-turbo, the `.en` and distil variants)
with their repos, languages, parameters and disk bytes; the piper voices of
`rhasspy/piper-voices` by locale, name and quality, with speakers and size.
Sizes not measured yet are marked inexact. `refresh_whisper` and `refresh_voices`
read the hub (the models' file sizes; the voices' `voices.json`) when it is
reachable and cache the result under `<cache>/catalogs/`, which the search then
prefers; the tests never refresh from the real hub.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from blazar.sources.base import FetchError

VOICES_REPO, VOICES_REVISION = "rhasspy/piper-voices", "v1.0.0"


@dataclass(frozen=True)
class WhisperSize:
    name: str  # base, large-v3, distil-large-v3 ...
    repo: str  # Systran/faster-whisper-base
    languages: str  # multilingual | en
    parameters: str  # 74M
    bytes: int  # model.bin's
    exact: bool  # measured (else close to it)
    stored: str = "float16"

    @property
    def source(self) -> str:
        return f"hf://{self.repo}"

    @property
    def model_name(self) -> str:
        """The model name `blazar whisper --pull` declares it under."""
        return f"whisper-{self.name}"

    def words(self) -> str:
        return " ".join((self.name, self.repo, self.languages, self.stored, "int8")).lower()


@dataclass(frozen=True)
class Voice:
    key: str  # en_US-joe-medium
    locale: str  # en_US
    language: str  # English
    region: str  # United States
    name: str  # joe
    quality: str  # x_low | low | medium | high
    speakers: int
    path: str  # en/en_US/joe/medium: its directory in the voices repo
    bytes: int  # the .onnx file's
    exact: bool

    @property
    def source(self) -> str:
        return f"hf://{VOICES_REPO}/{self.path}@{VOICES_REVISION}"

    @property
    def model_name(self) -> str:
        """The model name `blazar tts --pull` declares it under (names are lower case)."""
        return self.key.lower()

    def words(self) -> str:
        return " ".join(
            (self.key, self.locale, self.language, self.region, self.name, self.quality)
        ).lower()


def _shipped(name: str) -> dict[str, Any]:
    text = resources.files("blazar.sources").joinpath("catalogs", name).read_text(encoding="utf-8")
    return dict(json.loads(text))


def _read(cache: Path | None, name: str) -> dict[str, Any]:
    """The refreshed copy in the cache when there is a good one, else the shipped one."""
    if cache is not None:
        path = cache / "catalogs" / name
        try:
            return dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            pass
    return _shipped(name)


def whisper_sizes(cache: Path | None = None) -> list[WhisperSize]:
    return [WhisperSize(**m) for m in _read(cache, "whisper.json")["models"]]


def voices(cache: Path | None = None) -> list[Voice]:
    return [Voice(**v) for v in _read(cache, "piper.json")["voices"]]


def search(entries: Sequence[Any], text: str | None) -> list[Any]:
    """The entries whose name, language, locale or quality contain `text` (any case)."""
    wanted = (text or "").strip().lower()
    return [e for e in entries if wanted in e.words()]


def find_size(name: str, cache: Path | None = None) -> WhisperSize | None:
    wanted = name.lower().removeprefix("whisper-")
    return next((s for s in whisper_sizes(cache) if s.name == wanted), None)


def find_voice(key: str, cache: Path | None = None) -> Voice | None:
    wanted = key.lower()
    return next((v for v in voices(cache) if v.key.lower() == wanted), None)


# -- refreshing from the hub ------------------------------------------------------------------


def _write(cache: Path, name: str, doc: Mapping[str, Any]) -> Path:
    path = cache / "catalogs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def refresh_whisper(cache: Path, env: Mapping[str, str] = os.environ) -> list[WhisperSize]:
    """Each size's model.bin size from the hub; a size the hub lacks keeps its entry."""
    from huggingface_hub import HfApi

    from blazar.sources.hf import TIMEOUT, _hub, hub_endpoint, hub_token
    from specs.sources import HFSource

    endpoint = hub_endpoint(env)
    api = HfApi(endpoint=endpoint, token=hub_token(env), library_name="blazar")
    doc = _shipped("whisper.json")
    fresh = []
    for size in whisper_sizes():
        source = HFSource(size.repo)

        def info_of(repo: str = size.repo) -> Any:
            return api.model_info(repo, files_metadata=True, timeout=TIMEOUT)

        try:
            info = _hub(info_of, source, endpoint)
        except FetchError:
            fresh.append(size)
            continue
        found = {s.rfilename: s.size for s in info.siblings or [] if s.size is not None}
        model_bin = found.get("model.bin")
        fresh.append(
            WhisperSize(**{**asdict(size), "bytes": model_bin, "exact": True})
            if model_bin
            else size
        )
    _write(cache, "whisper.json", {**doc, "models": [asdict(s) for s in fresh]})
    return fresh


def voices_from_hub_json(data: Mapping[str, Any]) -> list[Voice]:
    """piper-voices' `voices.json` as catalog entries (each voice's .onnx size exact)."""
    out = []
    for key, entry in sorted(data.items()):
        language = entry.get("language") or {}
        files = entry.get("files") or {}
        onnx = next((p for p in files if p.endswith(".onnx")), None)
        if onnx is None:
            continue
        out.append(
            Voice(
                key=key,
                locale=str(language.get("code") or key.split("-", 1)[0]),
                language=str(language.get("name_english") or ""),
                region=str(language.get("country_english") or ""),
                name=str(entry.get("name") or ""),
                quality=str(entry.get("quality") or ""),
                speakers=int(entry.get("num_speakers") or 1),
                path=onnx.rsplit("/", 1)[0],
                bytes=int(files[onnx].get("size_bytes") or 0),
                exact=True,
            )
        )
    return out


def refresh_voices(cache: Path, env: Mapping[str, str] = os.environ) -> list[Voice]:
    """The voices the hub's `voices.json` lists, at the catalog's revision."""
    from huggingface_hub import hf_hub_download

    from blazar.sources.hf import _hub, hub_endpoint, hub_token
    from specs.sources import HFSource

    endpoint = hub_endpoint(env)
    path = _hub(
        lambda: hf_hub_download(
            VOICES_REPO,
            "voices.json",
            revision=VOICES_REVISION,
            cache_dir=cache / "hf",
            endpoint=endpoint,
            token=hub_token(env),
            library_name="blazar",
        ),
        HFSource(VOICES_REPO, revision=VOICES_REVISION),
        endpoint,
        "voices.json",
    )
    try:
        found = voices_from_hub_json(json.loads(Path(path).read_text(encoding="utf-8")))
    except (ValueError, TypeError, AttributeError) as exc:
        raise FetchError(f"{VOICES_REPO}'s voices.json is not what it should be: {exc}") from exc
    doc = _shipped("piper.json")
    _write(cache, "piper.json", {**doc, "voices": [asdict(v) for v in found]})
    return found
