"""The realtime protocol's pure parts, by table: events and settings, sentences, PCM16.

`blazar.protocols.openai_realtime` (what a client event may say, what a session
becomes) and `blazar.protocols.realtime_audio` (the input buffer, WAV in and out,
resampling, and where streamed text is cut into sentences to speak).
"""

from __future__ import annotations

import base64
import io
import math
import wave
from typing import Any

import numpy as np
import pytest

from blazar.protocols.openai_realtime import (
    Conversation,
    EventError,
    Item,
    Settings,
    Transcription,
    for_response,
    parse_event,
    parse_item,
    updated,
)
from blazar.protocols.realtime_audio import (
    AudioBuffer,
    AudioError,
    Sentences,
    chunks,
    decode_pcm,
    pcm_of_wav,
    resample,
    wav,
)

BASE = Settings("tiny", voice="joe", transcription=Transcription("whisper-base"))


@pytest.mark.parametrize(
    ("session", "expected"),
    [
        ({}, BASE),
        (
            {"model": "gemma", "instructions": "Be brief."},
            Settings("gemma", "joe", Transcription("whisper-base"), "Be brief."),
        ),
        ({"modalities": ["audio", "text"]}, BASE),
        (
            {"modalities": ["text"], "voice": ""},
            Settings("tiny", None, Transcription("whisper-base"), modalities=("text",)),
        ),
        ({"input_audio_transcription": None}, Settings("tiny", "joe", None)),
        (
            {"input_audio_transcription": {"model": "w", "language": "French", "prompt": "Paris"}},
            Settings("tiny", "joe", Transcription("w", "fr", "Paris")),
        ),
        (
            {
                "turn_detection": None,
                "tools": [],
                "input_audio_format": "pcm16",
                "output_audio_format": "pcm16",
                "tracing": "auto",
            },
            BASE,
        ),
        (
            {"temperature": 0, "max_response_output_tokens": 40, "speed": 1.5},
            Settings(
                "tiny",
                "joe",
                Transcription("whisper-base"),
                temperature=0.0,
                max_tokens=40,
                speed=1.5,
            ),
        ),
        ({"max_response_output_tokens": "inf"}, BASE),
    ],
)
def test_session_updates(session: dict[str, Any], expected: Settings) -> None:
    assert updated(BASE, session) == expected


@pytest.mark.parametrize(
    ("session", "param", "says"),
    [
        ("voice", "session", "must be an object"),
        ({"speed_of_light": 1}, "session.speed_of_light", "Unknown parameter"),
        ({"modalities": ["audio"]}, "session.modalities", 'must include "text"'),
        ({"modalities": []}, "session.modalities", '["text"]'),
        ({"input_audio_format": "g711_alaw"}, "session.input_audio_format", "pcm16"),
        ({"turn_detection": {"type": "semantic_vad"}}, "session.turn_detection", "null"),
        ({"tools": [{"type": "function", "name": "f"}]}, "session.tools", "/v1/chat/completions"),
        ({"temperature": "hot"}, "session.temperature", "from 0 to 2"),
        ({"temperature": True}, "session.temperature", "from 0 to 2"),
        ({"max_response_output_tokens": 0}, "session.max_response_output_tokens", "'inf'"),
        (
            {"input_audio_transcription": {"language": "en"}},
            "session.input_audio_transcription",
            "naming a transcription model",
        ),
        (
            {"input_audio_transcription": {"model": "w", "language": "klingon"}},
            "session.input_audio_transcription.language",
            "ISO 639-1",
        ),
        (
            {"input_audio_noise_reduction": {"type": "near_field"}},
            "session.input_audio_noise_reduction",
            "not available",
        ),
        ({"instructions": 3}, "session.instructions", "must be a string"),
    ],
)
def test_bad_session_updates(session: Any, param: str, says: str) -> None:
    with pytest.raises(EventError) as refused:
        updated(BASE, session)
    assert refused.value.param == param and says in refused.value.message


def test_a_response_overrides_the_session_for_itself() -> None:
    options = for_response(
        BASE,
        {
            "modalities": ["text"],
            "instructions": "Shout.",
            "max_output_tokens": 8,
            "metadata": {"turn": 2},
        },
    )
    assert options.settings == Settings(
        "tiny", "joe", Transcription("whisper-base"), "Shout.", ("text",), max_tokens=8
    )
    assert options.metadata == {"turn": 2} and for_response(BASE, None).settings == BASE
    bad = [
        ({"conversation": "none"}, "'auto'"),
        ({"rate": 1}, "Unknown"),
        ({"metadata": []}, "must be an object"),
        ([], "must be an object"),
    ]
    for response, says in bad:
        with pytest.raises(EventError, match=says):
            for_response(BASE, response)


@pytest.mark.parametrize(
    ("event", "code"),
    [
        ([], "invalid_json"),
        ({"event_id": "e"}, "missing_required_parameter"),
        ({"type": "transcription_session.update"}, "invalid_value"),
        ({"type": "response.create", "event_id": 7}, "invalid_type"),
    ],
)
def test_bad_events(event: Any, code: str) -> None:
    with pytest.raises(EventError) as refused:
        parse_event(event)
    assert refused.value.code == code


def test_items_and_the_messages_they_make() -> None:
    parts = [
        {"type": "input_text", "text": "what is"},
        {"type": "input_audio", "transcript": "the capital"},
    ]
    text = {"role": "user", "content": parts}
    item = parse_item(text, lambda: "item_1")
    assert (item.id, item.role, item.text) == ("item_1", "user", "what is\nthe capital")
    assert parse_item({**text, "id": "mine"}, lambda: "x").id == "mine"
    for bad, says in (
        ({"role": "user", "content": [{"type": "input_audio", "audio": "AAAA"}]}, "append"),
        ({"role": "tool", "content": [{"type": "input_text", "text": "x"}]}, "item.role"),
        ({"role": "user", "content": []}, "list of parts"),
        ({"role": "user", "content": [{"type": "image", "url": "x"}]}, "input_text or text"),
    ):
        with pytest.raises(EventError, match=says):
            parse_item(bad, lambda: "x")
    conversation = Conversation(limit=3)
    heard = Item("a", "user", "audio", "hello")
    assert conversation.add(heard) is None
    assert conversation.add(Item("b", "assistant", "audio", "hi there")) == "a"
    conversation.add(Item("c", "user", "audio", None, failed=True))  # transcription failed
    conversation.add(Item("d", "user", "text", "and you?"))
    assert [i.id for i in conversation.items] == ["b", "c", "d"]  # the oldest dropped
    assert conversation.messages("Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": "hi there"},
        {"role": "user", "content": "and you?"},
    ]
    with pytest.raises(EventError, match="already in the conversation"):
        conversation.add(Item("d", "user"))
    assert heard.to_api()["content"] == [{"type": "input_audio", "transcript": "hello"}]
    short = Conversation(char_limit=10)
    for name, text in (("a", "12345"), ("b", "123456"), ("c", "x" * 30)):
        short.add(Item(name, "user", "text", text))
        assert [i.id for i in short.items] == {"a": ["a"], "b": ["b"], "c": ["c"]}[name]


@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        (
            ["Hello", " there.", " How are", " you?", " Fine"],
            ["Hello there.", "How are you?", "Fine"],
        ),
        (["Hi. How are you today?"], ["Hi. How are you today?"]),  # "Hi." alone is too short
        (
            ["Dr. Smith lives at 3.14 Main St. in Paris. Yes."],
            ["Dr. Smith lives at 3.14 Main St.", "in Paris.", "Yes."],
        ),
        (
            ['He said "stop." Then', " left!\nNext line"],
            ['He said "stop."', "Then left!", "Next line"],
        ),
        (
            ["Well, the capital of France, as you know, is Paris"],
            ["Well, the capital of France,", "as you know, is Paris"],
        ),
        (["Ni hao ma\u3002Zai jian\u3002"], ["Ni hao ma\u3002", "Zai jian\u3002"]),
        (["...", " !"], []),
        (["word " * 40], ["word " * 30 + "word", "word " * 8 + "word"]),  # cut at a space
    ],
)
def test_sentences_are_cut_as_the_text_streams(pieces: list[str], expected: list[str]) -> None:
    cutter = Sentences()
    out = []
    for piece in pieces:
        out += cutter.feed(piece)
    assert out + cutter.close() == [e.strip() for e in expected]
    assert all(len(p) <= cutter.max_chars for p in out)


def test_the_first_sentence_is_out_before_the_text_ends() -> None:
    cutter = Sentences()
    assert cutter.feed("The capital of France is Paris.") == []  # the next token may be "5"
    assert cutter.feed(" It") == ["The capital of France is Paris."]
    assert cutter.feed(" is large") == [] and cutter.close() == ["It is large"]


def tone(rate: int, seconds: float, hz: float = 440.0) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * math.pi * hz * t) * 12000).astype("<i2").tobytes()


def test_pcm16_in_and_out() -> None:
    pcm = tone(24000, 0.5)
    assert pcm_of_wav(wav(pcm, 24000)) == (pcm, 24000)
    stereo = io.BytesIO()
    with wave.open(stereo, "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(22050)
        out.writeframes(np.repeat(np.frombuffer(tone(22050, 0.1), "<i2"), 2).tobytes())
    mono, rate = pcm_of_wav(stereo.getvalue())
    assert rate == 22050 and mono == tone(22050, 0.1)
    with pytest.raises(AudioError, match="not a WAV"):
        pcm_of_wav(b"RIFF nonsense")
    up = resample(tone(22050, 1.0), 22050, 24000)
    assert len(up) == 2 * 24000
    expected = np.frombuffer(tone(24000, 1.0), "<i2").astype(float)
    got = np.frombuffer(up, "<i2").astype(float)
    assert np.abs(got - expected).max() < 200  # the same 440 Hz tone at the new rate
    assert resample(b"", 22050, 24000) == b"" and resample(pcm, 24000, 24000) is pcm
    parts = chunks(up, 24000, 0.25)
    assert [len(p) for p in parts] == [12000] * 4 and b"".join(parts) == up
    assert decode_pcm(base64.b64encode(pcm).decode()) == pcm


def test_the_input_buffer_is_bounded_in_seconds() -> None:
    buffer = AudioBuffer(24000, 1.0)
    buffer.append(tone(24000, 0.6))
    with pytest.raises(AudioError, match=r"at most 1 s of audio at 24000 Hz and has 0\.60 s"):
        buffer.append(tone(24000, 0.6))
    buffer.append(tone(24000, 0.4))
    assert buffer.seconds == 1.0 and len(buffer.take()) == 48000 and len(buffer) == 0
