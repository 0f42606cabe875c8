"""ollama's request options, `format`, `think` and `keep_alive`, as llama-server fields.

Part of the ollama adapter: `blazar.protocols.ollama` builds engine requests with
these and re-exports `keep_alive_seconds`, which the gateway's scheduler uses (the
engine never sees `keep_alive`). Each function refuses what llama-server cannot
honour with a `ProtocolError(400, ...)` that says why and what to do instead.

Options (ollama's Modelfile parameters) fall in four groups:

- sampling options, forwarded under llama-server's names (`SAMPLING_OPTIONS`;
  `num_predict` becomes `max_tokens` or `n_predict`, `stop` passes as is);
- `num_ctx`, accepted up to the context the model is served with, refused above it
  with the manifest change that raises it;
- load-time options (`LOAD_OPTIONS`), accepted and ignored: the manifest decides how
  a model is loaded, and many clients send them on every request;
- options llama.cpp dropped (`tfs_z`, `penalize_newline`), accepted only at their
  "off" value; any other key is refused, by name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from blazar.protocols import ProtocolError

__all__ = [
    "INT_OPTIONS",
    "LOAD_OPTIONS",
    "SAMPLING_OPTIONS",
    "THINK_LEVELS",
    "bad",
    "closed_objects",
    "format_fields",
    "keep_alive_seconds",
    "model_name",
    "sampling_fields",
    "think_fields",
]

# ollama option -> llama-server field; the same names serve /v1/chat/completions,
# /completion and /infill (llama-server reads its own sampling fields on all three).
SAMPLING_OPTIONS: dict[str, str] = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "seed": "seed",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "mirostat": "mirostat",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
    "num_keep": "n_keep",
}
INT_OPTIONS = frozenset({"top_k", "seed", "repeat_last_n", "mirostat", "num_keep"})
# Options that choose how ollama loads a model. Blazar's manifest decides those per
# model, so a request may name them (many clients always do) but they change nothing.
LOAD_OPTIONS = frozenset(
    {
        "numa",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "low_vram",
        "vocab_only",
        "use_mmap",
        "use_mlock",
        "num_thread",
        "logits_all",
        "embedding_only",
        "f16_kv",
    }
)
THINK_LEVELS = ("low", "medium", "high")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def bad(message: str) -> ProtocolError:
    """A 400 refusal."""
    return ProtocolError(400, message)


def model_name(body: Mapping[str, Any]) -> str:
    """The request's `model`, which ollama requires."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model is required")
    return model


def _number(key: str, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(f"options.{key} must be a number, got {value!r}")
    if key in INT_OPTIONS or key in ("num_predict", "num_ctx"):
        if isinstance(value, float) and not value.is_integer():
            raise bad(f"options.{key} must be an integer, got {value!r}")
        return int(value)
    return value


def _stop(value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("options.stop must be a string or a list of strings")
    return stops


def sampling_fields(body: Mapping[str, Any], *, model_ctx: int, limit_key: str) -> dict[str, Any]:
    """ollama `options` -> llama-server sampling fields; refuse what cannot be honoured."""
    options = body.get("options")
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise bad("options must be an object")
    known = {
        *SAMPLING_OPTIONS,
        *LOAD_OPTIONS,
        "num_predict",
        "num_ctx",
        "stop",
        "tfs_z",
        "penalize_newline",
    }
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise bad(f"unknown option(s): {', '.join(unknown)}. Supported: {', '.join(sorted(known))}")
    out: dict[str, Any] = {}
    for key, value in options.items():
        if value is None or key in LOAD_OPTIONS:
            continue
        if key == "stop":
            out["stop"] = _stop(value)
        elif key == "num_ctx":
            _check_ctx(model_name(body), int(_number(key, value)), model_ctx)
        elif key == "num_predict":
            n = int(_number(key, value))
            if n < -2:
                raise bad(f"options.num_predict must be -1 (no limit) or at least 0, got {n}")
            out[limit_key] = -1 if n < 0 else n  # ollama: -1 no limit, -2 fill the context
        elif key == "tfs_z":
            if _number(key, value) != 1.0:  # 1.0 is "off", the only value llama.cpp can honour
                raise bad("options.tfs_z: tail-free sampling was removed from llama.cpp")
        elif key == "penalize_newline":
            if value is not False:
                raise bad("options.penalize_newline: llama.cpp no longer penalizes newlines")
        else:
            out[SAMPLING_OPTIONS[key]] = _number(key, value)
    return out


def _check_ctx(model: str, num_ctx: int, model_ctx: int) -> None:
    if num_ctx > model_ctx:
        name = model.removesuffix(":latest")
        raise bad(
            f"options.num_ctx={num_ctx} asks for more context than model '{model}' is served "
            f"with ({model_ctx} tokens). The context size is set per model in the manifest: "
            f"set `ctx = {num_ctx}` under [models.{name}] and run `blazar apply`."
        )


def format_fields(body: Mapping[str, Any], *, native: bool) -> dict[str, Any]:
    """ollama `format` -> a constraint llama-server enforces with a grammar."""
    fmt = body.get("format")
    if fmt is None or fmt == "":
        return {}
    if fmt == "json":
        schema: dict[str, Any] | None = None
    elif isinstance(fmt, Mapping):
        schema = dict(fmt)
    else:
        raise bad(f'format must be "json" or a JSON schema object, got {fmt!r}')
    if native:  # /completion and /infill take the schema itself
        return {"json_schema": closed_objects(schema) if schema else {"type": "object"}}
    if schema is None:
        return {"response_format": {"type": "json_object"}}
    return {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}


_SUBSCHEMAS = ("items", "additionalItems", "not", "if", "then", "else")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def closed_objects(schema: Any) -> Any:
    """The schema with `additionalProperties: false` wherever an object leaves it unsaid.

    On `/v1/chat/completions` llama-server compiles a schema to a GBNF grammar, and
    its converter (like ollama's) allows no properties beyond those listed unless
    `additionalProperties` says so. `/completion` hands the schema to llguidance,
    which follows JSON Schema and lets the model add keys until the token limit. So
    the raw path states the default the chat path assumes: same output either way.
    """
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMAS + _SCHEMA_LISTS:
        if key in out:
            out[key] = closed_objects(out[key])
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {name: closed_objects(sub) for name, sub in out[key].items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def think_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """ollama `think` -> the chat template's thinking switch (templates that have one)."""
    think = body.get("think")
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"chat_template_kwargs": {"enable_thinking": think}}
    if think in THINK_LEVELS:
        return {"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": think}}
    raise bad(f"think must be true, false or one of {', '.join(THINK_LEVELS)}; got {think!r}")


FOREVER_SECONDS = 100 * 365 * 24 * 3600.0  # a keep_alive this long (or longer) is "forever"


def keep_alive_seconds(value: str | float | int) -> float | None:
    """ollama's `keep_alive` in seconds; None means "keep loaded forever".

    Accepts what ollama accepts: a number of seconds (`300`, `0`), a Go duration
    string (`"5m"`, `"1h30m"`, `"0"`, `"500ms"`) or a bare number as a string
    (`"300"`). Any negative value (`-1`, `"-1m"`) means forever, and so does anything
    of a hundred years or more (`1e300`); 0 unloads now. Not a finite number (`"inf"`,
    `"nan"`): refused.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise bad(f'keep_alive must be a duration such as "5m" or a number, got {value!r}')
    try:
        seconds = _parse_duration(value.strip()) if isinstance(value, str) else float(value)
    except OverflowError:  # an integer too large for a float: as long as forever
        return None
    if not math.isfinite(seconds):
        raise bad(f'keep_alive must be a finite duration such as "5m" or -1, got {value!r}')
    return None if seconds < 0 or seconds >= FOREVER_SECONDS else seconds


def _parse_duration(text: str) -> float:
    try:
        return float(text)  # "300", "-1", "0"
    except ValueError:
        pass
    sign = -1.0 if text.startswith("-") else 1.0
    rest = text.lstrip("+-")
    total, pos = 0.0, 0
    for match in _DURATION_PART.finditer(rest):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if not rest or pos != len(rest):
        raise bad(f'keep_alive: invalid duration {text!r} (examples: "5m", "1h30m", "-1", 0)')
    return sign * total
