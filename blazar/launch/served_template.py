"""The chat template a model is served with, as the Jinja text its engine is given.

`blazar.serve.supervisor.runtime` calls `model_template` when it builds each model's
runtime, at every pass of `blazar serve`'s loop (so an edited template file
restarts the model's instances at the next pass: their arguments changed);
`blazar show` calls it too, and ollama's `/api/show` reports the runtime's
text. A declared template wins over the GGUF's own.

A manifest's `chat_template` is classified by `specs.chat_templates`: a name
is one of the files shipped in `blazar/launch/templates/`; Jinja text is used as is;
a path is read here (the manifest layer does no I/O beyond the manifest). A
file that cannot be read is not an exception: the runtime carries the problem,
chat requests are refused with it, and completions keep working.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specs.chat_templates import BUILTIN_TEMPLATES, classify_chat_template

if TYPE_CHECKING:
    from specs.manifest import Manifest

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
# The text travels as one argv entry (--chat-template TEXT), which Linux caps at
# 128 KiB (MAX_ARG_STRLEN); the largest real templates are a few tens of KB.
MAX_TEMPLATE_BYTES = 120 * 1024


@dataclass(frozen=True)
class AppliedTemplate:
    """What a model's chats are rendered with.

    `origin` is "builtin", "jinja" or "file" (declared in the manifest), "gguf"
    (the GGUF's own), "none", or "unknown" (`blazar show` with an invalid
    manifest); `source` says it in words for `blazar show`;
    `text` is the Jinja text, None where there is none; `problem` says why a
    declared template cannot be used (its file is missing, say).
    """

    origin: str
    source: str
    text: str | None
    problem: str | None = None

    @property
    def declared(self) -> bool:
        return self.origin in ("builtin", "jinja", "file")


@cache
def builtin_text(name: str) -> str:
    """The Jinja text of a template Blazar ships (`name` is one of BUILTIN_TEMPLATES)."""
    if name not in BUILTIN_TEMPLATES:
        raise KeyError(name)
    return (TEMPLATES_DIR / f"{name}.jinja").read_text(encoding="utf-8")


def template_path(value: str, manifest_file: str | None) -> Path:
    """Where a declared path points: `~` expanded, a relative one beside its manifest file."""
    path = Path(value).expanduser()
    if not path.is_absolute() and manifest_file is not None:
        path = Path(manifest_file).parent / path
    return path


def model_template(
    manifest: Manifest | None, key: str | None, facts: Mapping[str, Any]
) -> AppliedTemplate:
    """The template applied for the model declared as `key` (None: undeclared), GGUF `facts`."""
    gguf = facts.get("chat_template")
    gguf = gguf if isinstance(gguf, str) else None
    if manifest is None or key is None or key not in manifest.models:
        return applied_template(None, gguf)
    where = manifest.location_of("models", key, "chat_template")
    declared = manifest.models[key].chat_template
    return applied_template(declared, gguf, where.file if where else None)


def applied_template(
    declared: str | None, gguf_template: str | None, manifest_file: str | None = None
) -> AppliedTemplate:
    """The template applied for a model: the manifest's `declared` one, else the GGUF's.

    `manifest_file` is the manifest file that declares it (relative paths start there).
    """
    if declared is None:
        if gguf_template:
            return AppliedTemplate("gguf", "the GGUF's own", gguf_template)
        return AppliedTemplate("none", "none (the GGUF carries none)", None)
    form = classify_chat_template(declared)
    text: str | None
    if form.kind == "builtin":
        text = builtin_text(declared)
        return AppliedTemplate("builtin", f"{declared} (shipped with Blazar)", text)
    if form.kind == "jinja":
        problem = _unusable(declared, "its chat_template")
        text = None if problem else declared
        return AppliedTemplate("jinja", "Jinja text in the manifest", text, problem)
    path = template_path(declared, manifest_file)
    what = f"its chat_template file {path}"
    try:
        text = path.read_text(encoding="utf-8")
        problem = _unusable(text, what)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        text, problem = None, f"{what} cannot be read ({reason})"
    return AppliedTemplate("file", f"the file {path}", None if problem else text, problem)


def _unusable(text: str, what: str) -> str | None:
    """Why `text` cannot be given to the engine, if it cannot."""
    if not text.strip():
        return f"{what} is empty"
    if "\0" in text:  # cannot travel in argv
        return f"{what} has a NUL byte"
    if len(text.encode()) > MAX_TEMPLATE_BYTES:
        return f"{what} is over {MAX_TEMPLATE_BYTES // 1024} KiB"
    return None
