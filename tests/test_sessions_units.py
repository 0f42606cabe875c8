"""The pure decisions of sessions, the preflight, the cache fields and singleflight, as tables."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest

from blazar.launch.cache_settings import CacheSettings, flags, problems, settings_for
from blazar.protocols import ProtocolError
from blazar.serve.request import prompts
from blazar.serve.request.singleflight import SingleFlight, deterministic
from blazar.serve.state import session_files
from blazar.serve.state.sessions import choose_slot, incompatibility
from blazar.store.db import SessionRecord
from specs.models import Model
from specs.serving import Serving
from tests.gateway_harness import runtime
from tests.waiting import until

MAGIC = session_files.MAGIC


def slot_file(ints: list[int], version: int = 4) -> bytes:
    return struct.pack(f"<III{len(ints)}i", MAGIC, version, len(ints), *ints) + b"\0" * 16


@pytest.mark.parametrize(
    ("head", "n_saved", "tokens"),
    [
        (slot_file([-1, 1, 3, 7, 8, 9, 0]), 3, (7, 8, 9)),  # llama-server's packed list
        (slot_file([-1, 1, 0, 0]), 0, ()),  # an empty slot
        (slot_file([5, 6, 7], version=2), 3, (5, 6, 7)),  # the plain form
        (slot_file([-1, 1, 3, 7, 8, 9, 0]), 4, None),  # the count disagrees: not trusted
        (slot_file([-1, 1, 9, 7]), None, None),  # claims more than the list holds
        (b"GGUF" + b"\0" * 20, None, None),  # not a slot file
        (b"qs", None, None),  # too short
    ],
)
def test_tokens_of_a_slot_file(head: bytes, n_saved: int | None, tokens: Any) -> None:
    assert session_files.parse_tokens(head, n_saved) == tokens


def test_best_match_takes_the_longest_shared_prefix() -> None:
    prompt = tuple(range(100))
    candidates = {"a": tuple(range(40)), "b": (*range(60), 999), "c": (5, 6, 7)}
    assert session_files.best_match(prompt, candidates) == ("b", 60)
    assert session_files.best_match((1000,) * 50, candidates) is None
    assert session_files.best_match(tuple(range(20)), candidates) is None  # under MIN_MATCH
    # A tie goes to the shorter session.
    tie = {"long": (*range(40), 1, 2, 3), "short": tuple(range(40))}
    assert session_files.best_match(tuple(range(40)), tie, minimum=1) == ("short", 40)


def test_superseded_and_redundant_saves() -> None:
    banked = {"old": (1, 2, 3), "other": (9, 9)}
    assert session_files.superseded((1, 2, 3, 4), banked) == (["old"], False)
    assert session_files.superseded((1, 2), banked) == ([], True)
    assert session_files.superseded((1, 2, 3), banked) == (["old"], False)  # the same again
    assert session_files.superseded((7,), banked) == ([], False)


def test_over_budget_drops_the_least_recently_used() -> None:
    sizes = [("new", 50), ("mid", 30), ("old", 40)]  # most recent first
    assert session_files.over_budget(sizes, 200) == []
    assert session_files.over_budget(sizes, 80) == ["old"]
    assert session_files.over_budget(sizes, 60) == ["old", "mid"]


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("talk", True),
        ("a.b-c_1", True),
        ("bank-x", False),
        ("", False),
        ("../x", False),
        ("-x", False),
        ("x" * 65, False),
    ],
)
def test_session_names(name: str, ok: bool) -> None:
    assert (session_files.check_name(name) is None) is ok


def test_choose_slot_prefers_idle_unused_then_oldest() -> None:
    slots = [{"id": 0, "id_task": 5}, {"id": 1}, {"id": 2, "id_task": 2, "is_processing": True}]
    assert choose_slot(slots, set()) == 1
    assert choose_slot(slots, {1}) == 0  # 1 holds a restored session awaiting its request
    assert choose_slot([{"id": 0, "id_task": 9}, {"id": 1, "id_task": 3}], set()) == 1
    assert choose_slot([{"id": 0, "is_processing": True}], set()) is None


def record(**fields: Any) -> SessionRecord:
    base = dict(
        name="s",
        model="tiny",
        kind="saved",
        file="f.slot",
        n_tokens=10,
        size=100,
        model_sha256="a" * 64,
        engine_tag="b1-cpu",
        cache_type="f16",
    )
    return SessionRecord(**{**base, **fields})


def test_a_session_is_refused_elsewhere_with_the_reason() -> None:
    rt = runtime("tiny", sha256="a" * 64)
    assert incompatibility(record(), rt) is None
    cases = {
        "saved from model 'other', not 'tiny'": record(model="other"),
        "another file of model 'tiny'": record(model_sha256="b" * 64),
        "saved by engine b0-cpu": record(engine_tag="b0-cpu"),
        "holds a q8_0 KV cache": record(cache_type="q8_0"),
    }
    for reason, rec in cases.items():
        found = incompatibility(rec, rt)
        assert found is not None and reason in found and "blazar session" in found


# -- the preflight --------------------------------------------------------------------------


def test_bound_and_fit() -> None:
    # A completion's prompt: at most one token per byte, plus BOS and EOS.
    assert prompts.bound(100, 0, 999) == 102
    # A chat: the template's probe overhead, and per message a share of it plus slack.
    assert prompts.bound(100, 2, 120) == 100 + 120 + 2 * (30 + 18) + 2
    assert prompts.fits(250, 6, 256) and not prompts.fits(251, 6, 256)
    assert prompts.fits(255, 0, 256) and not prompts.fits(256, 0, 256)  # one free position


@pytest.mark.parametrize(
    ("body", "out"),
    [
        ({"max_tokens": 9}, 9),
        ({"max_completion_tokens": 7, "max_tokens": 9}, 7),
        ({"n_predict": -1}, 0),
        ({}, 0),
        ({"max_tokens": True}, 0),
    ],
)
def test_requested_output(body: dict[str, Any], out: int) -> None:
    assert prompts.requested_output(body) == out


def test_messages_of_says_when_no_bound_applies() -> None:
    chat = {"messages": [{}, {}]}
    assert prompts.messages_of(prompts.CHAT, chat) == 2
    assert prompts.messages_of(prompts.CHAT, {**chat, "tools": [{}]}) is None  # counted
    assert prompts.messages_of(prompts.MESSAGES, {**chat, "system": "s"}) == 3
    assert prompts.messages_of(prompts.COMPLETION, {"prompt": "x"}) == 0
    assert prompts.messages_of(prompts.COMPLETION, {"prompt": ["a", "b"]}) is None


def test_too_long_names_the_sizes_and_the_fixes() -> None:
    error = prompts.too_long("gemma", 300, 100, 256)
    assert isinstance(error, ProtocolError) and error.status == 400
    assert error.code == "context_length_exceeded"
    for part in (
        "300 prompt tokens and 100 output tokens (400)",
        "256 tokens of context",
        "models.gemma.ctx",
        "num_ctx",
        "cache_type",
        "blazar fit gemma --ctx 400",
    ):
        assert part in error.message


def test_anthropic_body_as_chat_messages() -> None:
    body = {
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]}
        ],
    }
    assert prompts.anthropic_chat(body) == {
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    }


# -- the cache fields -----------------------------------------------------------------------

WIDE = {
    "head_count": 2,
    "embedding_length": 64,
    "context_length": 2048,
    "rope_freq_base": 1e4,
    "rope_dimension_count": 32,
    "rope_scaling_type": None,
    "rope_scaling_factor": None,
}
NARROW = {**WIDE, "head_count": 4}


@pytest.mark.parametrize(
    ("settings", "facts", "ctx", "reason"),
    [
        (CacheSettings(cache_type="q8_0"), WIDE, 512, None),
        (CacheSettings(cache_type="q8_0"), NARROW, 512, "multiple of 32"),
        (CacheSettings(cache_type="q4_0", flash_attn="off"), WIDE, 512, "flash attention"),
        (CacheSettings(cache_type="f16", flash_attn="off"), WIDE, 512, None),
        (CacheSettings(ctx_extend=4), WIDE, 8192, None),
        (CacheSettings(ctx_extend=5), WIDE, 8192, "beyond what model 'm' supports (4x"),
        (
            CacheSettings(ctx_extend=8),
            {**WIDE, "rope_scaling_type": "yarn", "rope_scaling_factor": 8.0},
            8192,
            None,
        ),
        (
            CacheSettings(ctx_extend=2),
            {**WIDE, "rope_freq_base": None, "rope_dimension_count": None},
            512,
            "no RoPE",
        ),
        (CacheSettings(cache_reuse=512), WIDE, 512, "not below the model's ctx"),
    ],
)
def test_cache_problems(
    settings: CacheSettings, facts: dict[str, Any], ctx: int, reason: str | None
) -> None:
    found = problems(settings, facts, name="m", ctx=ctx)
    if reason is None:
        assert found == []
    else:
        assert len(found) == 1 and reason in found[0]


def test_cache_flags_and_serving_defaults() -> None:
    model = Model(source="file:///m.gguf", cache_type="q8_0", ctx_extend=2.0)
    serving = Serving(kv_unified=False, cache_ram_mb=0, flash_attn="auto", cache_type="q4_0")
    settings = settings_for(model, serving)
    assert settings.cache_type == "q8_0" and settings.kv_unified is False  # own, then serving's
    assert flags(settings, train_ctx=2048) == [
        "--cache-type-k",
        "q8_0",
        "--cache-type-v",
        "q8_0",
        "--no-kv-unified",
        "--cache-ram",
        "0",
        "--rope-scaling",
        "yarn",
        "--rope-scale",
        "2",
        "--yarn-orig-ctx",
        "2048",
        "--flash-attn",
        "auto",
    ]
    assert flags(settings_for(None, Serving()), train_ctx=None) == []  # the engine's defaults
    assert flags(CacheSettings(deterministic=True, load_mode="mlock"), train_ctx=None) == [
        "--load-mode",
        "mlock",
        "--seed",
        "0",
    ]


# -- singleflight ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "shared"),
    [
        ({"temperature": 0}, True),
        ({"temperature": 0.0}, True),
        ({"seed": 3}, True),
        ({"temperature": 0.7}, False),
        ({}, False),
        ({"temperature": 0, "stream": True}, False),
        ({"temperature": 0, "n": 2}, False),
        ({"seed": -1}, False),
    ],
)
def test_what_singleflight_shares(body: dict[str, Any], shared: bool) -> None:
    assert deterministic(body) is shared


def test_singleflight_shares_one_call_and_survives_a_leaving_leader() -> None:
    async def scenario() -> None:
        flight, calls, gate = SingleFlight(), [], asyncio.Event()

        async def call() -> str:
            calls.append(1)
            await gate.wait()
            return "answer"

        leader = asyncio.ensure_future(flight.share("k", call))
        follower = asyncio.ensure_future(flight.share("k", call))
        await until(lambda: calls, "the leader's call to start")
        leader.cancel()  # its client went away: the call goes on for the follower
        gate.set()
        assert await follower == ("answer", False)
        assert calls == [1] and flight.shared == 1
        assert await flight.share("k", call) == ("answer", True)  # a new call once done

    asyncio.run(scenario())
