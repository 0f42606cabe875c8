"""What a model's `chat_template` declares: a built-in name, Jinja text, or a file.

`specs.fields.ChatTemplate` validates the manifest field with
`check_chat_template`; `blazar.launch.served_template` calls `classify_chat_template`
to turn a declaration into the Jinja text the engine is given. The rule, in
order (it is also the field's documentation):

1. text containing `{{` or `{%` is a Jinja template;
2. otherwise text containing `/`, starting with `~`, or ending in `.jinja`
   is the path of a Jinja file (a relative one is read from the directory of
   the manifest file that declares it);
3. otherwise it is the name of a template Blazar ships, one of
   `BUILTIN_TEMPLATES`; another name is refused, listing them.

Why Blazar ships them rather than passing a name to llama.cpp: with `--jinja`
llama.cpp takes every `--chat-template` value but `chatml` as Jinja text, so
`gemma` rendered every prompt as the word "gemma" (see LLAMA_SERVER_FACTS.md).
Pure: the templates are files in `blazar/launch/templates/`, one per name below (a
test keeps the two lists equal).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

from specs.problems import Invalid

# The names follow llama.cpp's built-in templates (llama-server --chat-template NAME).
BUILTIN_TEMPLATES = (
    "chatml",
    "command-r",
    "deepseek",
    "deepseek3",
    "gemma",
    "llama2",
    "llama3",
    "llama4",
    "mistral-v1",
    "mistral-v3",
    "mistral-v7",
    "phi3",
    "phi4",
    "vicuna",
    "zephyr",
)

TemplateKind = Literal["builtin", "jinja", "file"]


@dataclass(frozen=True)
class TemplateDeclaration:
    """A classified `chat_template`: its kind, and the name, text or path as written."""

    kind: TemplateKind
    value: str


def classify_chat_template(text: str) -> TemplateDeclaration:
    """Which of the three forms `text` is (see the module docstring); names are not checked."""
    if "{{" in text or "{%" in text:
        return TemplateDeclaration("jinja", text)
    if "/" in text or text.startswith("~") or text.endswith(".jinja"):
        return TemplateDeclaration("file", text)
    return TemplateDeclaration("builtin", text)


def known_names() -> str:
    return ", ".join(BUILTIN_TEMPLATES)


def check_chat_template(text: str) -> str:
    """A valid declaration, kept as written; an unknown name is refused with the known ones."""
    if not text.strip():
        raise Invalid("expected a chat template name, Jinja text or a .jinja file path")
    declared = classify_chat_template(text)
    if declared.kind != "builtin" or text in BUILTIN_TEMPLATES:
        return text
    close = difflib.get_close_matches(text.strip().lower(), BUILTIN_TEMPLATES, n=1, cutoff=0.6)
    raise Invalid(
        f"unknown chat template {text!r}: Blazar ships {known_names()}; or give Jinja text "
        "(containing {{ or {%) or the path of a .jinja file",
        f"did you mean {close[0]!r}?" if close else None,
    )
