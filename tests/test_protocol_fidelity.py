"""What real clients rely on beyond the basic calls, through the official SDKs (issue 10).

One `blazar serve` for the module, with the tiny model under two names: `tiny`
(its GGUF's ChatML template, which renders no tools and has no thinking switch)
and `tooled` (Blazar's `chatml` template, which renders tools; llama.cpp's
`/props` agrees: `supports_tools`). Each test is one point of the issue: the SDK
call that used to fail (a crash in the SDK, a silently ignored field, a 500 the
SDK retries) now succeeds, or gets the documented 400 in the protocol's shape.
Gemma 3 270M, whose vocabulary the grammar engine can constrain (so a JSON
schema is followed, and ends the answer: `response.completed`), is in the slow test
at the end.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from blazar.launch.served_template import builtin_text
from blazar.testing.tiny import CHATML_TEMPLATE, is_tiny_text, write_tiny_model
from tests.fixtures import ENGINE, WHEELS
from tests.serving import Served

LICENSE = "Apache-2.0 (the tiny test model)"
HI = [{"role": "user", "content": "hi"}]
OPENAI_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


class Clients:
    def __init__(self, served: Served) -> None:
        self.served = served
        self.url = served.url
        self.openai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
        self.anthropic = anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0)
        self.ollama = ollama.Client(host=served.url)

    def raw(self, method: str, path: str, body: bytes | None = None, **headers: str) -> Any:
        return httpx.request(method, self.url + path, content=body, headers=headers, timeout=60)


@pytest.fixture(scope="module", params=[True, False], ids=["relay", "interpreted"])
def clients(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Clients]:
    """Each test on both lanes (issue 30): what the SDKs see is the same."""
    root = tmp_path_factory.mktemp("fidelity")
    tiny = write_tiny_model(root / "tiny.gguf", license=LICENSE)
    relay = "true" if request.param else "false"
    text = f"[serving]\nmax_loaded_models = 4\nrelay = {relay}\n\n" + ENGINE
    text += f'[models.tiny]\nsource = "{tiny.as_uri()}"\nctx = 1024\n\n'
    text += f'[models.tooled]\nsource = "{tiny.as_uri()}"\nctx = 1024\nchat_template = "chatml"\n'
    manifest = root / "blazar.toml"
    manifest.write_text(text)
    home = root / "home"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BLAZAR_HOME", str(home))
        env.setenv("BLAZAR_WHEEL_CACHE", str(WHEELS))
        with Served(manifest, home) as served:
            yield Clients(served)


def openai_error(error: openai.APIStatusError) -> dict[str, Any]:
    body = error.body
    assert isinstance(body, dict) and set(body) >= {"message", "type", "code"}, body
    return body


def anthropic_error(error: anthropic.APIStatusError) -> dict[str, Any]:
    body = error.body
    assert isinstance(body, dict) and body["type"] == "error", body
    return dict(body["error"])


# --- OpenAI ---------------------------------------------------------------------------------


def test_models_retrieve(clients: Clients) -> None:
    model = clients.openai.models.retrieve("tooled")
    assert (model.id, model.object, model.owned_by) == ("tooled", "model", "blazar")
    with pytest.raises(openai.NotFoundError) as missing:
        clients.openai.models.retrieve("nope")
    assert openai_error(missing.value)["code"] == "model_not_found"
    assert "tiny, tooled" in missing.value.message


def test_unknown_routes_wrong_methods_and_big_bodies_answer_in_the_protocols_shape(
    clients: Clients,
) -> None:
    with pytest.raises(openai.NotFoundError) as unknown:
        clients.openai.get("/fine_tuning/jobs", cast_to=object)
    assert openai_error(unknown.value)["code"] == "unknown_endpoint"
    with pytest.raises(openai.APIStatusError) as wrong:
        clients.openai.get("/chat/completions", cast_to=object)
    assert wrong.value.status_code == 405 and wrong.value.response.headers["Allow"] == "POST"
    assert openai_error(wrong.value)["code"] == "method_not_allowed"
    for method, path in (("POST", "/api/nope"), ("GET", "/api/chat"), ("DELETE", "/api/tags")):
        answer = clients.raw(method, path, b"{}")
        assert answer.status_code in (404, 405), (method, path)
        assert answer.headers["content-type"].startswith("application/json")
        assert set(answer.json()) == {"error"}
    with pytest.raises(anthropic.APIStatusError) as get_messages:
        clients.anthropic.get("/v1/messages", cast_to=object)
    assert anthropic_error(get_messages.value)["type"] == "invalid_request_error"
    # A body over the gateway's 64 MiB: Anthropic's 413 type, the SDK's own exception.
    with pytest.raises(anthropic.ContentTooLargeError) as big:
        clients.anthropic.messages.create(
            model="tiny", max_tokens=1, messages=[{"role": "user", "content": "x" * (65 << 20)}]
        )
    assert anthropic_error(big.value)["type"] == "request_too_large"
    assert clients.openai.models.retrieve("tiny").id == "tiny"  # still serving


def test_image_parts_without_a_projector_are_a_400(clients: Clients) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    with pytest.raises(openai.BadRequestError) as refused:
        clients.openai.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": [{"type": "text", "text": "what?"}, image]}],
            max_tokens=2,
        )
    assert openai_error(refused.value)["type"] == "invalid_request_error"
    assert "no vision or audio projector" in refused.value.message


def test_responses_stream_and_status(clients: Clients) -> None:
    with clients.openai.responses.stream(
        model="tiny", input="hello", max_output_tokens=4, instructions="be brief"
    ) as stream:
        events = list(stream)  # raised TypeError in the SDK on the engine's events
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.incomplete"  # the tiny model always runs to the limit
    last = events[-1].response
    assert last.incomplete_details is not None
    assert last.incomplete_details.reason == "max_output_tokens"
    assert last.usage is not None and last.usage.output_tokens == 4
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert is_tiny_text(text, allow=()) and last.output_text == text
    assert last.instructions == "be brief" and last.model == "tiny"
    whole = clients.openai.responses.create(model="tiny", input="hello", max_output_tokens=3)
    assert whole.status == "incomplete" and whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.id.startswith("resp_") and is_tiny_text(whole.output_text, allow=())
    assert last.store is True, last
    assert clients.openai.responses.retrieve(last.id).output_text == text  # streamed, kept


def test_responses_are_kept_listed_continued_and_deleted(clients: Clients) -> None:
    oai = clients.openai
    first = oai.responses.create(model="tiny", input="hello", max_output_tokens=3)
    assert first.store is True
    kept = oai.responses.retrieve(first.id)
    assert kept.id == first.id and kept.output_text == first.output_text
    items = oai.responses.input_items.list(first.id).data
    assert [(i.type, i.role) for i in items] == [("message", "user")]  # type: ignore[union-attr]
    assert items[0].content[0].text == "hello"  # type: ignore[union-attr]
    # A continuation: the engine gets the first turn and its answer before the new input.
    alone = oai.responses.create(model="tiny", input="again", max_output_tokens=3)
    chained = oai.responses.create(
        model="tiny", input="again", max_output_tokens=3, previous_response_id=first.id
    )
    assert chained.previous_response_id == first.id
    assert chained.usage is not None and alone.usage is not None
    assert chained.usage.input_tokens > alone.usage.input_tokens + 3
    with pytest.raises(openai.BadRequestError) as cancel:
        oai.responses.cancel(first.id)
    assert "only background responses can be cancelled" in cancel.value.message
    oai.responses.delete(first.id)
    for gone_id in (first.id, "resp_nope"):
        with pytest.raises(openai.NotFoundError) as gone:
            oai.responses.retrieve(gone_id)
        assert "store: false, deleted" in gone.value.message
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model="tiny", input="x", previous_response_id=first.id)
    unkept = oai.responses.create(model="tiny", input="hi", max_output_tokens=2, store=False)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(unkept.id)


def test_responses_text_format_is_enforced_or_refused_with_the_reason(clients: Clients) -> None:
    """The grammar engine cannot build a sampler over the tiny vocabulary: a 400 that says
    so, never a free-text answer that ignored the schema (Gemma's check is the slow test)."""
    text_format = {"format": {"type": "json_schema", "name": "city", "schema": SCHEMA}}
    with pytest.raises(openai.BadRequestError) as refused:
        clients.openai.responses.create(
            model="tiny", input="a city?", max_output_tokens=8, text=text_format
        )
    assert "Failed to initialize samplers" in refused.value.message


def test_legacy_completions_logprobs_echo_and_ids(clients: Clients) -> None:
    done = clients.openai.completions.create(
        model="tiny", prompt="the quick", max_tokens=3, logprobs=2, temperature=0
    )
    assert done.id.startswith("cmpl-")
    choice = done.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert "".join(logprobs.tokens) == choice.text and len(logprobs.tokens) == 3
    assert logprobs.token_logprobs is not None and all(p < 0 for p in logprobs.token_logprobs)
    assert logprobs.top_logprobs is not None and [len(t) for t in logprobs.top_logprobs] == [2] * 3
    assert logprobs.text_offset == [0, len(logprobs.tokens[0]), len("".join(logprobs.tokens[:2]))]
    echoed = clients.openai.completions.create(
        model="tiny", prompt="the quick", max_tokens=2, echo=True, temperature=0
    )
    assert echoed.choices[0].text.startswith("the quick ")
    assert is_tiny_text(echoed.choices[0].text[len("the quick") :].strip(), allow=())
    streamed = list(
        clients.openai.completions.create(
            model="tiny", prompt="the quick", max_tokens=2, echo=True, stream=True
        )
    )
    assert all(c.id.startswith("cmpl-") for c in streamed)
    assert "".join(c.choices[0].text for c in streamed if c.choices).startswith("the quick ")
    with pytest.raises(openai.BadRequestError) as both:
        clients.openai.completions.create(
            model="tiny", prompt="a", max_tokens=1, echo=True, logprobs=1
        )
    assert "cannot score the prompt" in both.value.message
    chat = clients.openai.chat.completions.create(
        model="tiny", messages=HI, max_tokens=3, logprobs=True
    )
    content = chat.choices[0].logprobs and chat.choices[0].logprobs.content
    assert content and len(content) == 3 and all(t.top_logprobs == [] for t in content)


def test_tools_need_a_template_with_tools_on_every_protocol(clients: Clients) -> None:
    with pytest.raises(openai.BadRequestError) as chat:
        clients.openai.chat.completions.create(
            model="tiny", messages=HI, max_tokens=2, tools=[OPENAI_TOOL]
        )
    assert '"tiny" does not support tools' in chat.value.message
    with pytest.raises(openai.BadRequestError) as responses:
        clients.openai.responses.create(
            model="tiny",
            input="hi",
            max_output_tokens=2,
            tools=[{"type": "function", "name": "get_weather", "parameters": {}, "strict": False}],
        )
    assert '"tiny" does not support tools' in responses.value.message
    with pytest.raises(anthropic.BadRequestError) as messages:
        clients.anthropic.messages.create(
            model="tiny", max_tokens=2, messages=HI, tools=[ANTHROPIC_TOOL]
        )
    assert '"tiny" does not support tools' in anthropic_error(messages.value)["message"]
    with pytest.raises(ollama.ResponseError) as native:
        clients.ollama.chat(model="tiny", messages=HI, tools=[OPENAI_TOOL])
    assert native.value.status_code == 400
    assert native.value.error.startswith('"tiny" does not support tools')
    # The template that renders them: the tools reach the prompt, on all three.
    bare = clients.openai.chat.completions.create(model="tooled", messages=HI, max_tokens=1)
    tooled = clients.openai.chat.completions.create(
        model="tooled", messages=HI, max_tokens=1, tools=[OPENAI_TOOL]
    )
    assert bare.usage and tooled.usage
    assert tooled.usage.prompt_tokens > bare.usage.prompt_tokens + 20
    counted = clients.anthropic.messages.count_tokens(
        model="tooled", messages=HI, tools=[ANTHROPIC_TOOL]
    )
    assert counted.input_tokens > bare.usage.prompt_tokens + 20
    native_ok = clients.ollama.chat(
        model="tooled", messages=HI, tools=[OPENAI_TOOL], options={"num_predict": 1}
    )
    assert (native_ok.prompt_eval_count or 0) > bare.usage.prompt_tokens + 20
    caps = clients.ollama.show("tooled").capabilities or []
    assert "tools" in caps and "tools" not in (clients.ollama.show("tiny").capabilities or [])


def test_forced_tool_choice_is_refused_and_says_why(clients: Clients) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        with pytest.raises(openai.BadRequestError) as forced:
            clients.openai.chat.completions.create(
                model="tooled",
                messages=HI,
                max_tokens=2,
                tools=[OPENAI_TOOL],
                tool_choice=choice,
            )
        assert "cannot force a tool call" in forced.value.message
    for kind in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        with pytest.raises(anthropic.BadRequestError) as any_tool:
            clients.anthropic.messages.create(
                model="tooled",
                max_tokens=2,
                messages=HI,
                tools=[ANTHROPIC_TOOL],
                tool_choice=kind,
            )
        assert "cannot force a tool call" in anthropic_error(any_tool.value)["message"]
    auto = clients.openai.chat.completions.create(
        model="tooled", messages=HI, max_tokens=2, tools=[OPENAI_TOOL], tool_choice="auto"
    )
    assert auto.choices[0].finish_reason == "length"


# --- Anthropic ------------------------------------------------------------------------------


def test_anthropic_models_in_anthropics_shapes(clients: Clients) -> None:
    listed = clients.anthropic.models.list()
    assert [m.id for m in listed.data] == ["tiny", "tooled"]
    assert listed.has_more is False and (listed.first_id, listed.last_id) == ("tiny", "tooled")
    model = clients.anthropic.models.retrieve("tooled")
    assert (model.type, model.display_name, model.max_input_tokens) == ("model", "tooled", 1024)
    assert model.created_at.year >= 2025
    page = clients.anthropic.models.list(limit=1)
    assert [m.id for m in page.data] == ["tiny"] and page.has_more
    assert [m.id for m in page.get_next_page().data] == ["tooled"]
    with pytest.raises(anthropic.NotFoundError) as missing:
        clients.anthropic.models.retrieve("nope")
    assert anthropic_error(missing.value)["type"] == "not_found_error"
    # The same path without anthropic-version: OpenAI's shapes.
    assert clients.raw("GET", "/v1/models").json()["object"] == "list"


def test_anthropic_structured_output_and_foreign_fields_are_refused(clients: Clients) -> None:
    with pytest.raises(anthropic.BadRequestError) as structured:
        clients.anthropic.messages.create(
            model="tiny",
            max_tokens=8,
            messages=HI,
            output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
        )
    assert "output_config.format: structured output is not supported" in str(structured.value)
    foreign = [
        {"role": "assistant", "content": "x", "tool_calls": [{"id": "a", "type": "function"}]},
        {"role": "user", "content": "hi"},
    ]
    with pytest.raises(anthropic.BadRequestError) as extra:
        clients.anthropic.messages.create(model="tiny", max_tokens=2, messages=foreign)
    error = anthropic_error(extra.value)
    assert error["type"] == "invalid_request_error"
    assert error["message"] == "messages.0.tool_calls: Extra inputs are not permitted"
    with pytest.raises(anthropic.BadRequestError) as role:
        clients.anthropic.messages.create(
            model="tiny", max_tokens=2, messages=[{"role": 1, "content": "hi"}]
        )
    assert "messages.0.role" in anthropic_error(role.value)["message"]
    block = [{"role": "user", "content": [{"type": "text", "text": "hi", "foo": 1}]}]
    with pytest.raises(anthropic.BadRequestError) as block_field:
        clients.anthropic.messages.create(model="tiny", max_tokens=2, messages=block)
    assert "messages.0.content.0.foo" in anthropic_error(block_field.value)["message"]


# --- ollama ---------------------------------------------------------------------------------


def test_ollama_think_needs_a_thinking_template(clients: Clients) -> None:
    with pytest.raises(ollama.ResponseError) as chat:
        clients.ollama.chat(model="tiny", messages=HI, think=True)
    assert chat.value.status_code == 400
    assert chat.value.error.startswith('"tiny" does not support thinking')
    with pytest.raises(ollama.ResponseError) as generate:
        clients.ollama.generate(model="tooled", prompt="hi", think="high")
    assert generate.value.error.startswith('"tooled" does not support thinking')
    plain = clients.ollama.chat(model="tiny", messages=HI, think=False, options={"num_predict": 1})
    assert plain.done


def test_ollama_generate_context_round_trip(clients: Clients) -> None:
    first = clients.ollama.generate(model="tiny", prompt="hi", options={"num_predict": 3})
    context = list(first.context or [])
    # The conversation's tokens: what the model saw (BOS, the rendered prompt), then said.
    assert context[0] == 1 and len(context) == int(first.prompt_eval_count or 0) + 3
    second = clients.ollama.generate(
        model="tiny", prompt="and then?", context=context, options={"num_predict": 3}
    )
    alone = clients.ollama.generate(model="tiny", prompt="and then?", options={"num_predict": 3})
    # The second prompt is the context, then the new turn (whose BOS the context holds).
    assert second.prompt_eval_count == len(context) + int(alone.prompt_eval_count or 0) - 1
    assert list(second.context or [])[: len(context)] == context
    streamed = list(
        clients.ollama.generate(
            model="tiny", prompt="hi", stream=True, context=context, options={"num_predict": 2}
        )
    )
    assert streamed[-1].done and list(streamed[-1].context or [])[: len(context)] == context
    assert all(p.context is None for p in streamed[:-1])
    raw = clients.ollama.generate(model="tiny", prompt="a", raw=True, options={"num_predict": 1})
    assert raw.context is None  # as ollama: raw prompts carry no context
    with pytest.raises(ollama.ResponseError) as foreign:
        clients.ollama.generate(model="tiny", prompt="x", context=[10**6])
    assert foreign.value.status_code == 400


def test_ollama_suffix_without_fim_is_does_not_support_insert(clients: Clients) -> None:
    with pytest.raises(ollama.ResponseError) as refused:
        clients.ollama.generate(model="tiny", prompt="def f():", suffix="    return 1")
    assert refused.value.status_code == 400
    assert refused.value.error.startswith('"tiny" does not support insert')


def test_ollama_show_template_text_and_license(clients: Clients) -> None:
    shown = clients.ollama.show("tiny")
    assert shown.template == CHATML_TEMPLATE and shown.license == LICENSE
    assert clients.ollama.show("tooled").template == builtin_text("chatml")


def test_ollama_delete_missing_is_404_and_copy_to_itself_is_refused(clients: Clients) -> None:
    with pytest.raises(ollama.ResponseError) as missing:
        clients.ollama.delete("nope")
    assert missing.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as itself:
        clients.ollama.copy("tiny", "tiny")
    assert itself.value.status_code == 400 and "copy it to a new name" in itself.value.error
    with pytest.raises(ollama.ResponseError):
        clients.ollama.copy("tiny", "tiny:latest")
    names = [m.model for m in clients.ollama.list().models]
    assert names.count("tiny:latest") == 1, names


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/chat/completions", {"error"}),
        ("/v1/responses", {"error"}),
        ("/api/chat", {"error"}),
        ("/v1/messages", {"type", "error"}),
    ],
)
def test_deep_nesting_is_a_400_in_the_protocols_shape(
    clients: Clients, path: str, shape: set[str]
) -> None:
    answer = clients.raw("POST", path, b"[" * 100_000)
    assert answer.status_code == 400 and set(answer.json()) == shape
    assert "nests deeper than 128 levels" in json.dumps(answer.json())
    nested = b'{"model": "tiny", "messages": ' + b"[" * 200 + b"]" * 200 + b"}"
    assert clients.raw("POST", path, nested).status_code == 400
    assert clients.raw("GET", "/health").status_code == 200


def test_non_finite_numbers_are_refused_and_never_break_a_route(clients: Clients) -> None:
    # The SDKs cannot send these (their encoders refuse NaN); other clients can.
    for path, body in (
        ("/v1/chat/completions", b'{"model": "tiny", "messages": [], "temperature": NaN}'),
        ("/api/generate", b'{"model": "tiny", "prompt": "hi", "keep_alive": 1e999}'),
        ("/v1/messages", b'{"model": "tiny", "max_tokens": 1, "top_p": -Infinity}'),
    ):
        answer = clients.raw("POST", path, body)
        assert answer.status_code == 400, (path, answer.text)
        assert "JSON" in json.dumps(answer.json()) or "range" in answer.text
    for forever in ("inf", "-inf", "nan"):
        with pytest.raises(ollama.ResponseError) as refused:
            clients.ollama.generate(model="tiny", prompt="hi", keep_alive=forever)
        assert refused.value.status_code == 400 and "finite" in refused.value.error
    # Absurdly long is forever; /api/ps and /api/blazar/ps keep working for everyone.
    clients.ollama.generate(model="tiny", prompt="hi", keep_alive=1e300, options={"num_predict": 1})
    running = {m.model: m for m in clients.ollama.ps().models}
    expires = running["tiny:latest"].expires_at
    assert expires is not None and expires.year > 2100
    rows = json.loads(clients.raw("GET", "/api/blazar/ps").text, parse_constant=_no_constants)
    assert any(r["model"] == "tiny" for r in rows["instances"])
    clients.ollama.generate(model="tiny", prompt="hi", keep_alive="5m", options={"num_predict": 1})


def _no_constants(token: str) -> None:
    raise AssertionError(f"{token} in a JSON answer")


def test_a_grammar_the_vocabulary_cannot_take_is_a_400_with_the_reason(clients: Clients) -> None:
    with pytest.raises(ollama.ResponseError) as native:
        clients.ollama.chat(model="tooled", messages=HI, format=SCHEMA)
    assert native.value.status_code == 400 and "Failed to initialize samplers" in native.value.error
    assert "cannot constrain this model's vocabulary" in native.value.error
    with pytest.raises(ollama.ResponseError) as streamed:
        list(clients.ollama.chat(model="tooled", messages=HI, format="json", stream=True))
    assert streamed.value.status_code == 400
    with pytest.raises(openai.BadRequestError) as chat:
        clients.openai.chat.completions.create(
            model="tooled",
            messages=HI,
            max_tokens=2,
            response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}},
        )
    assert "Failed to initialize samplers" in chat.value.message


@pytest.mark.slow
def test_gemma_responses_follow_the_schema_and_complete(
    tmp_path: Path, blazar_home: Path, gemma_gguf: Path
) -> None:
    """A real vocabulary: `text.format` is enforced by the grammar, which also ends the
    answer, so the stream ends `response.completed` and the SDK's final response parses
    (the tiny model never ends by itself; a base model rarely does)."""
    manifest = tmp_path / "blazar.toml"
    manifest.write_text(
        ENGINE + f'[models.gemma]\nsource = "{gemma_gguf.as_uri()}"\nctx = 1024\n'
        'chat_template = "chatml"\nargs = ["--threads", "1", "--threads-batch", "1"]\n'
    )
    text = {"format": {"type": "json_schema", "name": "city", "schema": SCHEMA}}
    with Served(manifest, blazar_home) as served:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
        with client.responses.stream(
            model="gemma",
            input="Name a city in France, in JSON.",
            max_output_tokens=60,
            temperature=0,
            text=text,
        ) as stream:
            final = stream.get_final_response()  # needs response.completed
        assert final.status == "completed" and final.incomplete_details is None
        assert isinstance(json.loads(final.output_text)["city"], str)
        whole = client.responses.create(
            model="gemma",
            input="Name a city in Italy, in JSON.",
            max_output_tokens=60,
            temperature=0,
            text=text,
        )
        assert whole.status == "completed"
        assert isinstance(json.loads(whole.output_text)["city"], str)
