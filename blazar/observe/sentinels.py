"""Sentinels: checks on each answer, the gateway's quality gate.

Pure: `expectation` reads what a request asked for from its engine body (JSON or a
JSON schema through `response_format`, llama-server's `json_schema`, ollama's
`format` as translated; `ignore_eos` for a client that wants the token limit
reached) and `check` tells what is wrong with an `Outcome`:

- `empty`: no text and no tool call;
- `truncated`: the engine stopped at the token limit on an answer that was meant to
  end by itself;
- `invalid_json`: JSON was asked for and the text does not parse;
- `schema_mismatch`: it parses, and does not match the schema asked for.

`blazar.serve.state.tracing` records the detections on the trace and counts them
(unless serving.sentinel is false: then no check runs); with
`serving.sentinel_enforce` a non-streamed answer that fails is replaced by a 422
that names them (`gate_message`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blazar.observe.outcome import Outcome

EMPTY, TRUNCATED, INVALID_JSON, SCHEMA_MISMATCH = (
    "empty",
    "truncated",
    "invalid_json",
    "schema_mismatch",
)
CHECKS = (EMPTY, TRUNCATED, INVALID_JSON, SCHEMA_MISMATCH)


@dataclass(frozen=True)
class Expectation:
    """What the client asked of the answer."""

    json: bool = False
    schema: Mapping[str, Any] | None = None
    ends: bool = True  # the answer should end by itself (no ignore_eos)


@dataclass(frozen=True)
class Detection:
    check: str  # one of CHECKS
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"check": self.check, "detail": self.detail}


NOTHING = Expectation()


def expectation(body: Mapping[str, Any]) -> Expectation:
    """What an engine body (OpenAI, llama-server native, Anthropic) asks of the answer."""
    ends = not body.get("ignore_eos")
    fmt = body.get("response_format")
    schema: Any = None
    wants_json = False
    if isinstance(fmt, dict):
        kind = fmt.get("type")
        if kind == "json_object":
            wants_json = True
            schema = fmt.get("schema")
        elif kind == "json_schema":
            wants_json = True
            inner = fmt.get("json_schema")
            schema = inner.get("schema") if isinstance(inner, dict) else fmt.get("schema")
    elif isinstance(body.get("json_schema"), dict):  # llama-server's native field
        wants_json, schema = True, body["json_schema"]
    if not wants_json:
        return NOTHING if ends else Expectation(ends=False)
    return Expectation(True, schema if isinstance(schema, dict) else None, ends)


def check(expect: Expectation, outcome: Outcome) -> list[Detection]:
    """The detections for one answer (none for answers that are not text)."""
    text = outcome.text
    if text is None:
        return []
    found = []
    if not text.strip() and not outcome.tool_calls:
        found.append(Detection(EMPTY, "the model produced no output"))
    if outcome.truncated and expect.ends:
        limit = f" after {outcome.generated_tokens} tokens" if outcome.generated_tokens else ""
        found.append(
            Detection(
                TRUNCATED,
                f"generation stopped at the token limit{limit} (finish reason "
                f"{outcome.finish}) before the answer ended: raise max_tokens",
            )
        )
    if expect.json and text.strip() and outcome.complete:
        try:
            value = json.loads(text)
        except ValueError as exc:
            found.append(
                Detection(INVALID_JSON, f"JSON was requested; the output is not JSON: {exc}")
            )
        else:
            if expect.schema is not None and (problem := schema_problem(value, expect.schema)):
                found.append(Detection(SCHEMA_MISMATCH, problem))
    return found


def schema_problem(value: Any, schema: Mapping[str, Any]) -> str | None:
    """Why `value` does not match `schema` (None when it does, or the schema is unusable)."""
    import jsonschema  # only for requests that asked for a schema

    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
        error = jsonschema.exceptions.best_match(validator_class(schema).iter_errors(value))
    except jsonschema.exceptions.SchemaError:
        return None  # the engine accepted it as a grammar; not ours to judge
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "the top level"
    return f"the output does not match the requested schema at {where}: {error.message}"


def gate_message(detections: list[Detection]) -> str:
    """The 422 message with serving.sentinel_enforce: every detection, named."""
    named = "; ".join(f"{d.check}: {d.detail}" for d in detections)
    return (
        f"the model's answer failed Blazar's response checks ({named}); "
        "serving.sentinel_enforce is on, so it was not returned"
    )
