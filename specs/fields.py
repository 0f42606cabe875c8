"""Field types of the manifest: names, sources, digests, URLs, versions, chat templates.

Each is an `Annotated` type whose validator raises `specs.problems.Invalid`
with a message that says what was expected; `specs.manifest` builds its
models from them, and the loader turns their errors into file:line problems.
Pure: the source, name and chat template grammars live in `specs.sources`,
`specs.names` and `specs.chat_templates`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any
from urllib.parse import urlparse

from pydantic import AfterValidator, Field

from specs.chat_templates import check_chat_template
from specs.names import NO_ADAPTERS, InvalidName, parse_name
from specs.problems import Invalid
from specs.sources import HttpsSource, InvalidSource, Source, parse_source

_SIMPLE = re.compile(r"[a-z0-9][a-z0-9._-]*")
_HEX = re.compile(r"[0-9a-f]{64}")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
WHEEL_VERSION = re.compile(r"[0-9]{4}\.[0-9]{1,2}\.[0-9]+(\.[0-9]+)?")
RELEASE_VERSION = re.compile(r"b[0-9]+")
COMMIT = re.compile(r"[0-9a-f]{7,40}")
SHA256_PATTERN = r"^[0-9a-f]{64}$"
SIMPLE_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
MODEL_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*(:[a-z0-9][a-z0-9._-]*)?$"


def check_model_name(text: str) -> str:
    """A model name or alias (`name[:tag]`); kept as written, validated by `parse_name`."""
    try:
        parse_name(text)
    except InvalidName as exc:
        raise Invalid(str(exc)) from None
    return text


def _simple(what: str) -> AfterValidator:
    def check(text: str) -> str:
        if not _SIMPLE.fullmatch(text) or len(text) > 128:
            hint = f"try {text.lower()!r}" if text and text.lower() != text else None
            raise Invalid(
                f"invalid {what} name {text!r}: use lowercase letters, digits, '.', '-' and "
                "'_', starting with a letter or digit",
                hint,
            )
        return text

    return AfterValidator(check)


def check_lora_name(text: str) -> str:
    """`none` is reserved: a request for `model+none` turns every adapter off."""
    if text == NO_ADAPTERS:
        raise Invalid(
            f"the LoRA adapter name {NO_ADAPTERS!r} is reserved (a request for "
            f"'model+{NO_ADAPTERS}' turns every adapter off)",
            "choose another name",
        )
    return text


def check_source(text: str) -> str:
    """A model or adapter source, validated by `specs.sources.parse_source`."""
    try:
        parse_source(text)
    except InvalidSource as exc:
        raise Invalid(str(exc)) from None
    return text


def is_download(source: str) -> bool:
    """Whether a (valid) source is fetched over http(s), so its sha256 is required."""
    parsed: Source = parse_source(source)
    return isinstance(parsed, HttpsSource)


def check_sha256(text: str) -> str:
    """64 lowercase hex digits; what is wrong is said precisely."""
    if _HEX.fullmatch(text):
        return text
    expected = "expected a sha256: 64 lowercase hex digits"
    if _HEX.fullmatch(text.lower()):
        raise Invalid(f"{expected}, got uppercase letters", "write it in lowercase")
    bad = sorted({c for c in text.lower() if c not in "0123456789abcdef"})
    if bad:
        shown = ", ".join(repr(c) for c in bad[:5])
        raise Invalid(f"{expected}, got a string with non-hex characters {shown}")
    raise Invalid(f"{expected}, got {len(text)} characters")


def check_http_url(text: str) -> str:
    parsed = urlparse(text)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise Invalid(f"expected an http:// or https:// URL, got {text!r}")
    return text


def check_env_name(text: str) -> str:
    if not _ENV.fullmatch(text):
        raise Invalid(
            f"expected an environment variable name such as 'OPENAI_API_KEY', got {text!r}"
        )
    return text


def check_nonempty(text: str) -> str:
    if not text.strip():
        raise Invalid("expected a non-empty string")
    return text


def check_key_models(names: list[str]) -> list[str]:
    """`["*"]` (every model) or model names; `*` does not mix with names."""
    if "*" in names and len(names) > 1:
        raise Invalid("'*' means every model and stands alone", 'write ["*"] or list names')
    for name in names:
        if name != "*":
            check_model_name(name)
    return names


# ollama's Modelfile PARAMETERs a model may set as defaults (`params`): applied to each
# request that does not set them itself. num_ctx is the model's `ctx` instead.
MODEL_PARAMS: dict[str, type] = {
    "temperature": float,
    "top_k": int,
    "top_p": float,
    "min_p": float,
    "typical_p": float,
    "seed": int,
    "repeat_penalty": float,
    "repeat_last_n": int,
    "presence_penalty": float,
    "frequency_penalty": float,
    "mirostat": int,
    "mirostat_tau": float,
    "mirostat_eta": float,
    "num_keep": int,
    "num_predict": int,
    "stop": list,
}


def check_model_params(params: dict[str, Any]) -> dict[str, Any]:
    """Known keys only, each of its type (an int is a fine float; stop is a list of strings)."""
    for key, value in params.items():
        kind = MODEL_PARAMS.get(key)
        if kind is None:
            hint = "num_ctx is the model's ctx" if key == "num_ctx" else None
            raise Invalid(f"unknown parameter {key!r}: use {', '.join(sorted(MODEL_PARAMS))}", hint)
        if kind is list:
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        elif kind is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok:
            what = {list: "a list of strings", float: "a number", int: "an integer"}[kind]
            raise Invalid(f"parameter {key!r} must be {what}, got {value!r}")
    return params


def _doc(**schema: Any) -> Any:
    """Constraints shown in the JSON Schema only: the validators above say what is wrong."""
    return Field(json_schema_extra=schema)


ModelName = Annotated[str, AfterValidator(check_model_name), _doc(pattern=MODEL_NAME_PATTERN)]
EngineName = Annotated[str, _simple("engine"), _doc(pattern=SIMPLE_NAME_PATTERN)]
LoraName = Annotated[
    str,
    _simple("LoRA adapter"),
    AfterValidator(check_lora_name),
    _doc(pattern=SIMPLE_NAME_PATTERN),
]
KeyName = Annotated[str, _simple("key"), _doc(pattern=SIMPLE_NAME_PATTERN)]
RemoteName = Annotated[str, _simple("remote"), _doc(pattern=SIMPLE_NAME_PATTERN)]
McpName = Annotated[str, _simple("MCP server"), _doc(pattern=SIMPLE_NAME_PATTERN)]
GroupName = Annotated[str, _simple("group"), _doc(pattern=SIMPLE_NAME_PATTERN)]
LaneId = Annotated[str, _simple("fork lane"), _doc(pattern=SIMPLE_NAME_PATTERN)]
SourceText = Annotated[str, AfterValidator(check_source), _doc(minLength=1)]
Sha256 = Annotated[str, AfterValidator(check_sha256), _doc(pattern=SHA256_PATTERN)]
HttpUrl = Annotated[str, AfterValidator(check_http_url), _doc(pattern=r"^https?://")]
EnvName = Annotated[str, AfterValidator(check_env_name), _doc(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
KeyModels = Annotated[list[str], AfterValidator(check_key_models)]
NonEmpty = Annotated[str, AfterValidator(check_nonempty), _doc(minLength=1)]
ChatTemplate = Annotated[str, AfterValidator(check_chat_template), _doc(minLength=1)]
ModelParams = Annotated[dict[str, Any], AfterValidator(check_model_params)]
