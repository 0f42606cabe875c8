"""The ollama adapter: golden translations, option and error tables, live engine checks.

Goldens (tests/golden/ollama/*.json, see tests/golden/runner.py) pin requests in ->
engine requests out, and real llama-server output in -> ollama objects out; rewrite
them with BLAZAR_UPDATE_GOLDEN=1, recapture engine output with
`python -m tests.golden.capture`. The live tests send translated requests to a real
llama-server (the tiny model; Gemma 3 270M for JSON-schema output, which needs a
real vocabulary) and check that the engine accepts them and honours them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from ollama import _types as ollama_types

from blazar.protocols import EngineRequest, LoadOnly, ProtocolError, ollama
from blazar.protocols.sse import DONE
from blazar.testing.tiny import write_tiny_model
from tests.fixtures import write_gemma
from tests.golden import runner
from tests.golden.capture import CITY_SCHEMA, STOP_WORDS
from tests.golden.engine import Engine, running_engine

HI = [{"role": "user", "content": "hi"}]
WHEN = "2026-01-02T03:04:05Z"


def chat(options: dict[str, Any] | None = None, **body: Any) -> dict[str, Any]:
    req = ollama.chat_request(
        {"model": "m", "messages": HI, "options": options, **body}, model_ctx=1024
    )
    assert isinstance(req, EngineRequest)
    return req.body


# --- goldens ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", runner.names("ollama"))
def test_golden(name: str) -> None:
    expected, actual = runner.check("ollama", name)
    assert actual == expected


def test_goldens_parse_with_the_official_ollama_client() -> None:
    """What the adapter answers is what the `ollama` Python package expects."""
    models = {
        "chat_response": ollama_types.ChatResponse,
        "chat_stream": ollama_types.ChatResponse,
        "generate_response": ollama_types.GenerateResponse,
        "generate_stream": ollama_types.GenerateResponse,
        "embed_response": ollama_types.EmbedResponse,
        "embeddings_response": ollama_types.EmbeddingsResponse,
        "tags": ollama_types.ListResponse,
        "ps": ollama_types.ProcessResponse,
        "show": ollama_types.ShowResponse,
    }
    for name in runner.names("ollama"):
        case = runner.load("ollama", name)
        model = models.get(case["translator"])
        if model is None:
            continue
        for obj in case["expected"] if isinstance(case["expected"], list) else [case["expected"]]:
            model.model_validate(obj)


# --- option mapping -----------------------------------------------------------------------

OPTIONS = [
    ("temperature", 0.3, "temperature", 0.3),
    ("top_k", 7, "top_k", 7),
    ("top_k", 7.0, "top_k", 7),
    ("top_p", 0.8, "top_p", 0.8),
    ("min_p", 0.1, "min_p", 0.1),
    ("typical_p", 0.9, "typical_p", 0.9),
    ("seed", 42, "seed", 42),
    ("repeat_penalty", 1.2, "repeat_penalty", 1.2),
    ("repeat_last_n", 33, "repeat_last_n", 33),
    ("presence_penalty", 0.5, "presence_penalty", 0.5),
    ("frequency_penalty", 0.25, "frequency_penalty", 0.25),
    ("mirostat", 2, "mirostat", 2),
    ("mirostat_tau", 4.5, "mirostat_tau", 4.5),
    ("mirostat_eta", 0.2, "mirostat_eta", 0.2),
    ("num_keep", 4, "n_keep", 4),
    ("stop", ["a", "b"], "stop", ["a", "b"]),
    ("stop", "a", "stop", ["a"]),
    ("num_predict", 8, "max_tokens", 8),
    ("num_predict", 0, "max_tokens", 0),
    ("num_predict", -1, "max_tokens", -1),
    ("num_predict", -2, "max_tokens", -1),
]


@pytest.mark.parametrize(("option", "value", "field", "expected"), OPTIONS)
def test_option_maps_to_engine_field(option: str, value: Any, field: str, expected: Any) -> None:
    assert chat({option: value})[field] == expected


@pytest.mark.parametrize(("option", "value", "field", "expected"), OPTIONS)
def test_option_maps_the_same_for_native_completion(
    option: str, value: Any, field: str, expected: Any
) -> None:
    body = {"model": "m", "prompt": "x", "raw": True, "options": {option: value}}
    req = ollama.generate_request(body, model_ctx=1024)
    assert isinstance(req, EngineRequest) and req.path == "/completion"
    assert req.body["n_predict" if field == "max_tokens" else field] == expected


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("num_ctx", 512),
        ("num_ctx", 1024),
        ("num_thread", 4),
        ("num_gpu", 99),
        ("numa", True),
        ("num_batch", 8),
        ("main_gpu", 0),
        ("low_vram", True),
        ("use_mmap", False),
        ("use_mlock", True),
        ("vocab_only", False),
        ("tfs_z", 1.0),
        ("penalize_newline", False),
        ("temperature", None),
    ],
)
def test_options_accepted_without_effect(option: str, value: Any) -> None:
    assert chat({option: value}) == chat()


def test_stream_defaults_to_true_and_asks_for_usage() -> None:
    assert chat()["stream"] is True
    assert chat()["stream_options"] == {"include_usage": True}
    assert chat(stream=False)["stream"] is False
    assert "stream_options" not in chat(stream=False)


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("json", {"type": "json_object"}),
        (CITY_SCHEMA, {"type": "json_schema", "json_schema": {"schema": CITY_SCHEMA}}),
    ],
)
def test_format(fmt: Any, expected: dict[str, Any]) -> None:
    assert chat(format=fmt)["response_format"] == expected
    assert "response_format" not in chat(format="")


@pytest.mark.parametrize(
    ("think", "kwargs"),
    [
        (True, {"enable_thinking": True}),
        (False, {"enable_thinking": False}),
        ("low", {"enable_thinking": True, "reasoning_effort": "low"}),
    ],
)
def test_think(think: Any, kwargs: dict[str, Any]) -> None:
    assert chat(think=think)["chat_template_kwargs"] == kwargs


def test_keep_alive_is_not_forwarded() -> None:
    assert "keep_alive" not in chat(keep_alive="5m")


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("90s", 90.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        (300, 300.0),
        (2.5, 2.5),
        ("0", 0.0),
        (0, 0.0),
        ("300", 300.0),
        (-1, None),
        ("-1", None),
        ("-1m", None),
        ("-5s", None),
        # a hundred years or more is forever: an expiry that far would overflow /api/ps
        (1e300, None),
        (10**400, None),
        ("1e300", None),
        ("876000h", None),
        (3.0e9, 3.0e9),
    ],
)
def test_keep_alive_seconds(value: Any, seconds: float | None) -> None:
    assert ollama.keep_alive_seconds(value) == seconds


@pytest.mark.parametrize(
    "value", ["5 minutes", "m5", "", "5x", True, None, [1], "inf", "-inf", "nan", float("inf")]
)
def test_keep_alive_seconds_refuses_what_ollama_refuses(value: Any) -> None:
    with pytest.raises(ProtocolError) as err:
        ollama.keep_alive_seconds(value)
    assert err.value.status == 400 and "keep_alive" in err.value.message


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (268098176, "268.10M"),
        (8030261248, "8.0B"),
        (7000000000, "7B"),
        (135000000, "135M"),
        (500123, "500K"),
        (999, "999"),
        (None, ""),
    ],
)
def test_parameter_size_reads_like_ollama(count: int | None, text: str) -> None:
    assert ollama.parameter_size(count) == text


# --- refusals -----------------------------------------------------------------------------

ERRORS: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    ("chat_request", {"messages": HI}, {}, "model is required"),
    (
        "chat_request",
        {"model": "m", "messages": HI, "options": {"num_ctx": 4096}},
        {},
        "set `ctx = 4096` under [models.m]",
    ),
    (
        "chat_request",
        {"model": "m", "messages": HI, "options": {"nmu_ctx": 1, "foo": 2}},
        {},
        "unknown option(s): foo, nmu_ctx",
    ),
    (
        "chat_request",
        {"model": "m", "messages": HI, "options": {"top_k": "x"}},
        {},
        "options.top_k must be a number",
    ),
    (
        "chat_request",
        {"model": "m", "messages": HI, "options": {"top_k": 1.5}},
        {},
        "options.top_k must be an integer",
    ),
    (
        "chat_request",
        {"model": "m", "messages": HI, "options": {"num_predict": -3}},
        {},
        "options.num_predict must be -1",
    ),
    (
        "chat_request",
        {"model": "m", "messages": HI, "options": {"stop": [1]}},
        {},
        "options.stop must be",
    ),
    (
        "chat_request",
        {"model": "m", "messages": HI, "options": {"tfs_z": 0.5}},
        {},
        "tail-free sampling was removed",
    ),
    (
        "chat_request",
        {"model": "m", "messages": HI, "options": {"penalize_newline": True}},
        {},
        "no longer penalizes newlines",
    ),
    ("chat_request", {"model": "m", "messages": HI, "options": [1]}, {}, "options must be"),
    (
        "chat_request",
        {"model": "m", "messages": [{"role": "user", "content": "x", "images": ["iVBORw0KGgo="]}]},
        {},
        "messages[0].images: this model has no vision projector",
    ),
    (
        "chat_request",
        {"model": "m", "messages": [{"role": "bot", "content": "x"}]},
        {},
        "messages[0].role must be",
    ),
    (
        "chat_request",
        {"model": "m", "messages": [{"role": "user", "content": 3}]},
        {},
        "content must be a string",
    ),
    ("chat_request", {"model": "m", "messages": "hi"}, {}, "messages must be a list"),
    (
        "chat_request",
        {"model": "m", "messages": HI, "format": "xml"},
        {},
        'format must be "json" or a JSON schema',
    ),
    ("chat_request", {"model": "m", "messages": HI, "think": "max"}, {}, "think must be"),
    (
        "chat_request",
        {"model": "m", "messages": HI, "stream": "yes"},
        {},
        "stream must be true or false",
    ),
    (
        "chat_request",
        {"model": "m", "messages": HI, "tools": [{"type": "web"}]},
        {},
        "tools[0] must be",
    ),
    (
        "chat_request",
        {"model": "m", "messages": HI, "tools": [{"function": {}}]},
        {},
        "tools[0].function.name is required",
    ),
    (
        "chat_request",
        {
            "model": "m",
            "messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}],
        },
        {},
        "tool_calls[0] needs function.name",
    ),
    (
        "chat_request",
        {"model": "m", "messages": HI, "logprobs": True},
        {},
        "logprobs are not supported",
    ),
    (
        "generate_request",
        {"model": "m", "prompt": "x", "images": ["iVBORw0KGgo="]},
        {},
        "images: this model has no vision projector",
    ),
    (
        "generate_request",
        {"model": "m", "prompt": "x", "template": "{{ .Prompt }}"},
        {},
        "per-request templates are not supported",
    ),
    (
        "generate_request",
        {"model": "m", "prompt": "x", "context": [1, -2]},
        {},
        "context must be the list of token ids",
    ),
    (
        "generate_request",
        {"model": "m", "prompt": "x", "context": "1 2"},
        {},
        "context must be the list of token ids",
    ),
    (
        "generate_request",
        {"model": "m", "prompt": "x", "context": [1], "raw": True},
        {},
        "context cannot be used with raw",
    ),
    (
        "generate_request",
        {"model": "m", "prompt": "x", "context": [1], "think": True},
        {},
        "context cannot be used with think",
    ),
    (
        "generate_request",
        {"model": "m", "prompt": "x", "raw": True, "system": "s"},
        {},
        "system cannot be used with raw mode",
    ),
    (
        "generate_request",
        {"model": "m", "prompt": "x", "raw": True, "think": True},
        {},
        "think cannot be used with raw mode",
    ),
    (
        "generate_request",
        {"model": "m", "prompt": "x", "suffix": "y", "system": "s"},
        {},
        "system cannot be used with suffix",
    ),
    (
        "generate_request",
        {"model": "m", "prompt": "x", "suffix": "y"},
        {"has_infill": False},
        "no fill-in-the-middle tokens",
    ),
    ("generate_request", {"model": "m", "prompt": 5}, {}, "prompt must be a string"),
    ("embed_request", {"model": "m", "input": [1]}, {}, "input must be a string or a list"),
    (
        "embed_request",
        {"model": "m", "input": "x", "dimensions": 0},
        {},
        "dimensions must be a positive integer",
    ),
    (
        "embed_request",
        {"model": "m", "input": "x", "truncate": "no"},
        {},
        "truncate must be true or false",
    ),
    (
        "embed_request",
        {"model": "m", "input": "x", "options": {"bogus": 1}},
        {},
        "unknown option(s): bogus",
    ),
]


@pytest.mark.parametrize(("translator", "body", "kwargs", "fragment"), ERRORS)
def test_refusals_are_400_and_say_why(
    translator: str, body: dict[str, Any], kwargs: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ProtocolError) as err:
        getattr(ollama, translator)(body, model_ctx=1024, **kwargs)
    assert err.value.status == 400
    assert fragment in err.value.message
    assert ollama.error(err.value.message) == {"error": err.value.message}


def test_num_ctx_refusal_teaches_the_manifest_fix() -> None:
    with pytest.raises(ProtocolError) as err:
        ollama.chat_request(
            {"model": "gemma3-270m:latest", "messages": HI, "options": {"num_ctx": 8192}},
            model_ctx=4096,
        )
    assert err.value.message == (
        "options.num_ctx=8192 asks for more context than model 'gemma3-270m:latest' is served "
        "with (4096 tokens). The context size is set per model in the manifest: set "
        "`ctx = 8192` under [models.gemma3-270m] and run `blazar apply`."
    )


@pytest.mark.parametrize(
    ("translator", "body", "endpoint"),
    [
        ("chat_request", {"model": "m"}, "chat"),
        ("chat_request", {"model": "m", "messages": []}, "chat"),
        ("generate_request", {"model": "m", "prompt": ""}, "generate"),
        ("embed_request", {"model": "m", "input": []}, "embed"),
        ("embeddings_request", {"model": "m", "prompt": ""}, "embeddings"),
    ],
)
def test_nothing_to_generate_means_load_only(translator: str, body: Any, endpoint: str) -> None:
    assert getattr(ollama, translator)(body, model_ctx=1024) == LoadOnly(endpoint)


# --- stream edge cases (hand-made chunks: a fault the real engine is not asked to make) ---


def test_stream_without_usage_chunk_ends_at_done() -> None:
    """Without include_usage the engine puts timings on the finish chunk."""
    state = ollama.StreamState(model="m", created_at=WHEN)
    finish = {
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "timings": {
            "prompt_n": 3,
            "cache_n": 2,
            "prompt_ms": 1.5,
            "predicted_n": 1,
            "predicted_ms": 2.0,
        },
    }
    assert ollama.chat_chunks(finish, state) == []
    (final,) = ollama.chat_chunks(DONE, state)
    assert final["done"] and final["prompt_eval_count"] == 5 and final["eval_count"] == 1
    assert final["prompt_eval_duration"] == 1_500_000 and final["total_duration"] == 3_500_000
    assert ollama.finish_stream(state) == []


def test_reasoning_content_becomes_thinking() -> None:
    chunk = {"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]}
    state = ollama.StreamState(model="m", created_at=WHEN)
    (out,) = ollama.chat_chunks(chunk, state)
    assert out["message"] == {"role": "assistant", "content": "", "thinking": "hmm"}
    state = ollama.StreamState(model="m", created_at=WHEN, endpoint="generate")
    (out,) = ollama.generate_chunks(chunk, state)
    assert (out["response"], out["thinking"]) == ("", "hmm")
    whole = {
        "choices": [
            {"finish_reason": "stop", "message": {"content": "hi", "reasoning_content": "hmm"}}
        ]
    }
    assert ollama.generate_response(whole, model="m", created_at=WHEN)["thinking"] == "hmm"


def test_engine_error_mid_stream_becomes_an_ollama_error_line() -> None:
    state = ollama.StreamState(model="m", created_at=WHEN)
    chunk = {"error": {"code": 500, "message": "slot crashed", "type": "server_error"}}
    assert ollama.chat_chunks(chunk, state) == [{"error": "slot crashed"}]
    assert ollama.finish_stream(state) == []


def test_tool_call_with_cut_off_arguments_stays_in_content() -> None:
    engine = {
        "choices": [
            {
                "finish_reason": "length",
                "message": {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"city": "pa'},
                        }
                    ],
                },
            }
        ]
    }
    out = ollama.chat_response(engine, model="m", created_at=WHEN)
    assert "tool_calls" not in out["message"]
    assert out["message"]["content"] == '{"name": "f", "arguments": {"city": "pa'


def test_engine_errors_keep_their_status_and_message() -> None:
    body = {"error": {"code": 501, "message": "Infill is not supported", "type": "x"}}
    assert ollama.error_from_engine(501, body) == (501, {"error": "Infill is not supported"})


# --- live: the real engine accepts and honours what the translators send ------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    model = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    with running_engine(model, "--embeddings", "--pooling", "mean") as running:
        yield running


def test_live_engine_accepts_every_translated_request(engine: Engine) -> None:
    sent = 0
    for name in runner.names("ollama"):
        case = runner.load("ollama", name)
        expected = case["expected"]
        if not case["translator"].endswith("_request") or "path" not in expected:
            continue
        if not case.get("live", True):
            continue
        request = EngineRequest(expected["path"], expected["body"], expected["stream"])
        status, body = engine.send(request)
        assert status == 200, (name, body)
        sent += 1
    assert sent >= 12


def test_live_options_reach_the_engine(engine: Engine) -> None:
    body = chat(
        {
            "temperature": 0.3,
            "top_k": 7,
            "min_p": 0.1,
            "repeat_penalty": 1.2,
            "num_keep": 4,
            "seed": 42,
            "num_predict": 3,
        },
        stream=False,
    )
    status, _ = engine.post("/v1/chat/completions", body)
    assert status == 200
    params = engine.get("/slots")[0]["params"]
    assert (params["top_k"], params["n_keep"], params["seed"], params["n_predict"]) == (7, 4, 42, 3)
    assert params["temperature"] == pytest.approx(0.3) and params["min_p"] == pytest.approx(0.1)


def test_live_stop_sequences_end_generation(engine: Engine) -> None:
    body = chat({"stop": STOP_WORDS, "num_predict": 60, "seed": 7}, stream=False)
    status, out = engine.post("/v1/chat/completions", body)
    assert status == 200
    reply = ollama.chat_response(out, model="m", created_at=WHEN)
    assert reply["done_reason"] == "stop" and reply["eval_count"] < 60
    assert not any(word in reply["message"]["content"] for word in STOP_WORDS)


def test_live_stream_translates_to_complete_ndjson(engine: Engine) -> None:
    status, chunks = engine.stream("/v1/chat/completions", chat({"num_predict": 5}))
    assert status == 200 and chunks[-1] == DONE
    state = ollama.StreamState(model="m", created_at=WHEN)
    out = [obj for chunk in chunks for obj in ollama.chat_chunks(chunk, state)]
    out += ollama.finish_stream(state)
    lines = b"".join(ollama.ndjson(obj) for obj in out).splitlines()
    replies = [ollama_types.ChatResponse.model_validate_json(line) for line in lines]
    assert [r.done for r in replies] == [False] * 5 + [True]
    last = replies[-1]
    assert last.done_reason == "length" and last.eval_count == 5
    assert last.prompt_eval_count == 23 and last.eval_duration and last.prompt_eval_duration


def test_live_raw_generate_and_embeddings(engine: Engine) -> None:
    req = ollama.generate_request(
        {
            "model": "m",
            "prompt": "hello",
            "raw": True,
            "stream": False,
            "options": {"num_predict": 4},
        },
        model_ctx=1024,
    )
    assert isinstance(req, EngineRequest)
    status, out = engine.send(req)
    reply = ollama.generate_response(out, model="m", created_at=WHEN)
    assert status == 200 and reply["eval_count"] == 4 and reply["done_reason"] == "length"
    req = ollama.embed_request(
        {"model": "m", "input": ["a b", "c"], "dimensions": 5}, model_ctx=1024
    )
    assert isinstance(req, EngineRequest)
    status, out = engine.send(req)
    vectors = ollama.embed_response(out, model="m", **req.hints)["embeddings"]
    assert status == 200 and [len(v) for v in vectors] == [5, 5]
    assert sum(x * x for x in vectors[0]) == pytest.approx(1.0)


def test_live_suffix_on_a_model_without_fim_gets_the_engines_reason(engine: Engine) -> None:
    req = ollama.generate_request(
        {"model": "m", "prompt": "a", "suffix": "b", "stream": False}, model_ctx=1024
    )
    assert isinstance(req, EngineRequest)
    status, body = engine.send(req)
    code, error = ollama.error_from_engine(status, body)
    assert code == 501 and "Infill is not supported by this model" in error["error"]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    path = write_gemma(tmp_path_factory.mktemp("gemma"))
    with running_engine(path, "--chat-template", "chatml", ctx=512) as running:
        yield running


def _matches_city_schema(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"city", "sunny"}
    assert value["city"] in ("paris", "rome") and isinstance(value["sunny"], bool)


def test_live_format_schema_constrains_output(gemma: Engine) -> None:
    """A JSON-schema `format` yields JSON matching it, through chat and through raw mode.

    Gemma, not the tiny model: llama-server cannot build its grammar sampler over the
    tiny vocabulary ("Failed to initialize samplers")."""
    for body in (
        {"messages": [{"role": "user", "content": "Weather in Paris, as JSON?"}]},
        {"prompt": "Weather in Paris as JSON:", "raw": True},
    ):
        body = {
            "model": "g",
            "format": CITY_SCHEMA,
            "stream": False,
            "options": {"num_predict": 30, "temperature": 0},
            **body,
        }
        translate = ollama.chat_request if "messages" in body else ollama.generate_request
        req = translate(body, model_ctx=512)
        assert isinstance(req, EngineRequest)
        status, out = gemma.send(req)
        assert status == 200, out
        reply = ollama.generate_response(out, model="g", created_at=WHEN)
        _matches_city_schema(reply["response"])
