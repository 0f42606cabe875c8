"""Tools for the chat loop: OpenAI tool definitions from Python functions, and running a call.

`Client.chat(tools=[...])` takes OpenAI tool dicts, Python functions, or both;
`function_tool(fn)` is how a function becomes a definition (its name, its
docstring's first paragraph, a JSON Schema of its parameters from their
annotations; a parameter without a default is required). `run_call` is one step
of the loop in `blazar_sdk.chat`: find the handler for the name the model
called, parse the arguments, call it, and turn what it returned into the tool
message sent back (a string as it is, anything else as JSON). Anything that
goes wrong is a `ToolError` naming the tool and what to do.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

from blazar_sdk.errors import ToolError
from blazar_sdk.types import JSON

__all__ = ["Handler", "ToolSpec", "function_tool", "prepare_tools", "run_call"]

Handler = Callable[..., Any]
ToolSpec = Union[Mapping[str, Any], Handler]

_SCHEMA: dict[Any, JSON] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    list: {"type": "array"},
    dict: {"type": "object"},
}


# `X | None` is types.UnionType (Python 3.10+), `Optional[X]` typing.Union.
_UNIONS = (Union, getattr(types, "UnionType", Union))


def _schema(annotation: Any) -> JSON:
    if annotation in _SCHEMA:
        return dict(_SCHEMA[annotation])
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in _UNIONS and len(args) == 1:  # Optional[X], X | None
        return _schema(args[0])
    if origin in (list, Sequence, tuple) and args:
        return {"type": "array", "items": _schema(args[0])}
    if origin in _SCHEMA:
        return dict(_SCHEMA[origin])
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(annotation))}
    return {}  # any JSON value


def function_tool(fn: Handler) -> JSON:
    """An OpenAI function tool for `fn`: name, description (the docstring's first
    paragraph) and parameters (a JSON Schema object from its signature)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # annotations this Python cannot evaluate: no types, names still
        hints = {}
    properties: JSON = {}
    required: list[str] = []
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        properties[name] = _schema(hints.get(name, Any))
        if param.default is param.empty:
            required.append(name)
    doc = inspect.getdoc(fn) or ""
    function: JSON = {
        "name": fn.__name__,
        "description": doc.split("\n\n", 1)[0].replace("\n", " "),
        "parameters": {"type": "object", "properties": properties, "required": required},
    }
    return {"type": "function", "function": function}


def prepare_tools(
    tools: Sequence[ToolSpec] | None, handlers: Mapping[str, Handler] | None
) -> tuple[list[JSON] | None, dict[str, Handler] | None]:
    """The tool definitions to send and the handlers to run: functions in `tools` become
    definitions and handlers of their own names; None for handlers means no loop."""
    if tools is None:
        if handlers:
            raise ValueError("tool_handlers without tools: pass tools=[...] too (functions work)")
        return None, None
    definitions: list[JSON] = []
    run: dict[str, Handler] = dict(handlers or {})
    for tool in tools:
        if callable(tool):
            definitions.append(function_tool(tool))
            run.setdefault(tool.__name__, tool)
        elif isinstance(tool, Mapping):
            definitions.append(dict(tool))
        else:
            raise TypeError(f"tools: expected OpenAI tool dicts or functions, got {tool!r}")
    return definitions, (run or None)


def run_call(call: Mapping[str, Any], handlers: Mapping[str, Handler]) -> JSON:
    """Run one tool call the model made; the `tool` message that answers it."""
    function = call.get("function") or {}
    name = str(function.get("name") or "")
    raw = function.get("arguments") or "{}"
    handler = handlers.get(name)
    if handler is None:
        known = ", ".join(sorted(handlers)) or "none"
        raise ToolError(
            f"the model called tool {name!r}, which has no handler (handlers: {known}); pass "
            f"tool_handlers={{{name!r}: function}} or the function in tools",
            tool=name,
            arguments=raw,
        )
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        raise ToolError(
            f"the model called tool {name!r} with arguments that are not JSON ({exc}): {raw!r}",
            tool=name,
            arguments=raw,
        ) from None
    if not isinstance(arguments, dict):
        raise ToolError(
            f"the model called tool {name!r} with arguments that are not an object: {raw!r}",
            tool=name,
            arguments=arguments,
        )
    try:
        result = handler(**arguments)
    except Exception as exc:
        raise ToolError(
            f"tool {name!r} raised {type(exc).__name__}: {exc} (called with {arguments!r})",
            tool=name,
            arguments=arguments,
        ) from exc
    content = result if isinstance(result, str) else json.dumps(result, default=str)
    return {"role": "tool", "tool_call_id": call.get("id") or "", "content": content}
