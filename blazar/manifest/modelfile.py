"""ollama's Modelfile, read for `blazar create --modelfile`: what Blazar can honour, or a refusal.

Pure: text in, a `Modelfile` value out (`blazar.cli.imperative` declares it through
`manifest_ops.create_model`). Honoured: `FROM` (a model name, or a GGUF path,
relative to the Modelfile), `PARAMETER` (the sampling defaults of the manifest's
`params`; `num_ctx` becomes `ctx`), `SYSTEM` (the model's `system`) and `ADAPTER`
(a LoRA adapter, declared always on for the new model). Refused with the line and
what to do instead: `TEMPLATE` (a Go template; Blazar applies Jinja chat
templates, so `--chat-template` replaces it), `MESSAGE`, `LICENSE`, `REQUIRES`
and anything else. Values are bare text, "quoted", or \"\"\"triple-quoted\"\"\"
across lines, as ollama writes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blazar.errors import InvalidInput
from specs.fields import MODEL_PARAMS

REFUSED = {
    "template": "a Go template, and Blazar applies Jinja chat templates: give --chat-template "
    "(a template Blazar ships such as chatml, Jinja text or a .jinja file) instead",
    "message": "Blazar keeps no conversation with a model: send the messages with each request",
    "license": "Blazar keeps no license text with a model: remove the LICENSE lines",
    "requires": "Blazar checks no ollama version: remove the REQUIRES line",
}
_INSTRUCTION = re.compile(r"\s*([A-Za-z]+)\s*(.*)", re.DOTALL)


@dataclass
class Modelfile:
    """What a Modelfile asks for, as Blazar will declare it."""

    base: str | None = None  # FROM: a model name, or an absolute GGUF path (`base_file`)
    base_file: bool = False
    params: dict[str, Any] = field(default_factory=dict)
    ctx: int | None = None
    system: str | None = None
    adapters: list[Path] = field(default_factory=list)
    template: int | None = None  # the line of a TEMPLATE, refused unless replaced


def param_value(key: str, text: str, where: str) -> Any:
    """A PARAMETER's (or `--param k=v`'s) value as its type says; InvalidInput otherwise."""
    text = _unquote(text.strip())
    if key == "num_ctx" or MODEL_PARAMS.get(key) is int:
        try:
            return int(text)
        except ValueError:
            raise InvalidInput(f"{where}: {key} takes an integer, not {text!r}") from None
    kind = MODEL_PARAMS.get(key)
    if kind is None:
        known = ", ".join(["num_ctx", *sorted(MODEL_PARAMS)])
        raise InvalidInput(f"{where}: unknown parameter {key!r}; Blazar keeps {known}")
    if kind is list:
        return text
    try:
        return float(text)
    except ValueError:
        raise InvalidInput(f"{where}: {key} takes a number, not {text!r}") from None


def add_param(out: Modelfile, key: str, value: Any) -> None:
    if key == "num_ctx":
        out.ctx = value
    elif key == "stop":
        out.params.setdefault("stop", []).append(value)
    else:
        out.params[key] = value


def parse_modelfile(text: str, path: Path) -> Modelfile:
    """Read a Modelfile; relative FROM and ADAPTER paths are taken from its directory."""
    out = Modelfile()
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start = i
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _INSTRUCTION.fullmatch(line)
        if match is None:
            raise InvalidInput(f"{path}:{start + 1}: cannot read {line.strip()!r}")
        word, rest = match.group(1).lower(), match.group(2).strip()
        if rest.startswith('"""'):  # a value over several lines, up to the closing quotes
            body = rest[3:]
            while '"""' not in body and i < len(lines):
                body += "\n" + lines[i]
                i += 1
            if '"""' not in body:
                raise InvalidInput(
                    f'{path}:{start + 1}: {word.upper()} opens """ but never closes it'
                )
            rest = body[: body.index('"""')]
        where = f"{path}:{start + 1}"
        _instruction(out, word, rest, where, path.parent)
    if out.base is None:
        raise InvalidInput(f"{path}: no FROM line: name the model (or GGUF file) to start from")
    return out


def _instruction(out: Modelfile, word: str, rest: str, where: str, root: Path) -> None:
    if word == "from":
        value = _unquote(rest)
        out.base_file = value.endswith(".gguf") or value.startswith(("/", "./", "../", "~"))
        out.base = str(_path(value, root)) if out.base_file else value
    elif word == "parameter":
        key, _, value = rest.partition(" ")
        add_param(out, key.strip().lower(), param_value(key.strip().lower(), value, where))
    elif word == "system":
        out.system = _unquote(rest)
    elif word == "adapter":
        out.adapters.append(_path(_unquote(rest), root))
    elif word == "template":
        out.template = int(where.rsplit(":", 1)[1])
    elif word in REFUSED:
        raise InvalidInput(f"{where}: {word.upper()} is not supported: {REFUSED[word]}")
    else:
        raise InvalidInput(
            f"{where}: unknown instruction {word.upper()}; a Modelfile has FROM, PARAMETER, "
            "SYSTEM, ADAPTER, TEMPLATE, MESSAGE, LICENSE and REQUIRES"
        )


def _path(value: str, root: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (root / path).resolve()


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    return text
