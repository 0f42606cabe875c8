"""What a model's chat template lets it do: call tools, think. Decided from the Jinja text.

ollama's `/api/show` lists capabilities from the template, and ollama refuses a
request for a capability the model lacks (`"<model>" does not support tools`);
clients such as `llm-ollama` rely on that to fall back. Blazar answers the same
way on all three protocols, so one function decides, for the listing and for the
refusals: `template_capabilities(text)`. `blazar.serve.supervisor.runtime` calls it with the
template a model is served with; `ollama_models.show` reports what it found.

Tools: the template is rendered (sandboxed, no I/O, a fixed date) with one probe
tool, as llama.cpp does to fill `chat_template_caps.supports_tools` in `/props`;
the model supports tools when the probe's name appears in the prompt. A template
that cannot be rendered here falls back to whether it mentions `tools` at all.
Thinking: the template has a thinking switch or thinking markup (`enable_thinking`,
`<think>`, `reasoning_content`, `thinking`), as `/api/show` has always reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NoReturn

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["NO_CAPABILITIES", "THINKING_MARKS", "TemplateCapabilities", "template_capabilities"]

THINKING_MARKS = ("enable_thinking", "<think>", "reasoning_content", "thinking")
_PROBE = "blazar_probe_tool_7f3a"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": _PROBE,
        "description": "probe",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
    },
}


@dataclass(frozen=True)
class TemplateCapabilities:
    """What the chat template can render: tool definitions, a thinking switch."""

    tools: bool
    thinking: bool


NO_CAPABILITIES = TemplateCapabilities(tools=False, thinking=False)


def _raise(message: str) -> NoReturn:
    raise TemplateError(message)


def _render(text: str, **context: Any) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals.update(raise_exception=_raise, strftime_now=lambda fmt: "01 Jan 2026")
    return env.from_string(text).render(
        bos_token="", eos_token="", add_generation_prompt=True, **context
    )


def _renders_tools(text: str) -> bool:
    messages = [{"role": "user", "content": "hi"}]
    try:
        return _PROBE in _render(text, messages=messages, tools=[_PROBE_TOOL])
    except Exception:  # any template error: Jinja's, or the template's own raise
        return "tools" in text


@lru_cache(maxsize=256)
def template_capabilities(text: str | None) -> TemplateCapabilities:
    """The capabilities of a chat template's Jinja text (None: no template, none)."""
    if not text:
        return NO_CAPABILITIES
    return TemplateCapabilities(
        tools=_renders_tools(text),
        thinking=any(mark in text for mark in THINKING_MARKS),
    )
