"""The manifest's JSON Schema and its generated reference, docs/manifest.md.

`blazar schema` prints `manifest_schema()`; editors read the committed copy,
specs/manifest.schema.json, through a manifest's `$schema` key. Both files
are generated from the pydantic models in `specs.manifest` and their field
descriptions, and tests fail when a committed copy is stale:

    python -m specs.schema      # rewrites specs/manifest.schema.json and docs/manifest.md

Writing those two files (only when run as that script) is this module's only I/O.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specs.aliases import ALIASES
from specs.durations import PATTERN as DURATION_PATTERN
from specs.manifest import Manifest
from specs.sizes import PATTERN as SIZE_PATTERN

SCHEMA_ID = "urn:blazar:manifest:1"
SCHEMA_FILE = Path(__file__).with_name("manifest.schema.json")
DOCS_FILE = Path(__file__).resolve().parent.parent / "docs" / "manifest.md"

# Sections in the order the reference shows them: (property, heading, definition).
SECTIONS = [
    ("serving", "[serving]", "Serving"),
    ("serving.trace_retention", "[serving.trace_retention]", "TraceRetention"),
    ("serving.cache", "[serving.cache]", "ResponseCache"),
    ("engines", "[engines.NAME]", "Engine"),
    ("engine_routing", "[engine_routing]", "EngineRouting"),
    ("models", "[models.NAME]", "Model"),
    ("loras", "[loras.NAME]", "Lora"),
    ("groups", "[groups.NAME]", "Group"),
    ("keys", "[keys.NAME]", "Key"),
    ("remotes", "[remotes.NAME]", "Remote"),
    ("mcp", "[mcp.NAME]", "McpServer"),
    ("kubernetes", "[kubernetes]", "Kubernetes"),
]


def manifest_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a manifest, as editors and `blazar schema` use it."""
    schema = Manifest.model_json_schema(by_alias=True)
    _tidy(schema)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **schema,
        "title": "Blazar manifest",
    }


def schema_text() -> str:
    """The committed form of the schema: sorted keys, two-space indent, trailing newline."""
    return json.dumps(manifest_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _tidy(node: Any) -> None:
    """Drop pydantic's per-field titles; name tables by `propertyNames`, not patterns."""
    if isinstance(node, list):
        for item in node:
            _tidy(item)
        return
    if not isinstance(node, dict):
        return
    for prop in (node.get("properties") or {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict) and len(patterns) == 1:
        ((pattern, value),) = patterns.items()
        del node["patternProperties"]
        node["propertyNames"] = {"pattern": pattern}
        node["additionalProperties"] = value
    for value in node.values():
        _tidy(value)


HEADER = """\
# Manifest reference

<!-- Generated from the manifest's models (specs/manifest.py and the tables it holds) by
`python -m specs.schema`, which also writes specs/manifest.schema.json. Do not edit by
hand: a test fails when this file is stale. -->

A manifest declares what a host should have: engines, models, LoRA adapters,
API keys and how the gateway serves them. `blazar apply` makes the host match
it; `blazar diff` shows what that would change.

**Files.** A manifest is one `.toml`, `.yaml` or `.yml` file, or a directory
of them merged into one document in sorted name order (only the files directly
in it; other files, subdirectories and names starting with `.` are ignored).
Resources are tables keyed by name, so a name declared in two files is an
error naming both places, never a silent override. `[serving]` merges field
by field: each field may be set in one file only. An empty file or directory
is a valid, empty manifest.

**Errors.** A manifest is checked whole before anything acts on it: syntax,
unknown fields (with a suggestion), types (`ctx = "4096"` is an error, not
4096), values, duplicates and references between resources. Every problem is
reported at once, one line each, with file and line:

```
blazar.toml:15: unknown field 'ctxx' in models.other; did you mean 'ctx'?
blazar.toml:21: lora 'fox' names model 'gemm', which is not declared; did you mean 'gemma'?
```

**Editors.** The JSON Schema is `specs/manifest.schema.json` (`blazar schema`
prints it). Point an editor at it with a `$schema` key, which Blazar ignores:
`"$schema" = "path/to/manifest.schema.json"` in TOML (taplo, Even Better
TOML), `$schema: path/to/manifest.schema.json` in YAML.

**Names.** Models are `name[:tag]` (tag `latest` when omitted; `gemma` and
`gemma:latest` are one model): lowercase letters, digits, `.`, `-`, `_`. In
TOML, quote a name with `:` or `.` in it: `[models."qwen3:0.6b"]`. Engine,
adapter, key and remote names use the same characters without a tag.

**Durations** (`keep_alive`, `queue_timeout`): `"5m"`, `"30s"`, `"1h30m"`,
`"250ms"`, plain seconds (`300`), `0` (now) or any negative such as `-1`
(forever, as in ollama).

**Sizes** (`max_upload`, `max_buffered`): `"64GiB"`, `"512MiB"` (powers of
1024), `"10GB"`, `"500MB"` (powers of 1000), or a number of bytes.

**Planned** fields are checked now and acted on by later releases; their
descriptions say so.

```toml
[serving]
port = 11435

[engines.llamacpp]
install = "wheel"
version = "latest"

[models.gemma3-270m]
source = "file:///srv/models/gemma-3-270m-q4_k_m.gguf"
sha256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
ctx = 8192
aliases = ["gemma"]

[loras.fox]
model = "gemma3-270m"
source = "file:///srv/adapters/fox.gguf"
```
"""


def render_manifest_docs() -> str:
    """docs/manifest.md: every section and field with type, default, constraints, meaning."""
    schema = manifest_schema()
    defs: dict[str, Any] = schema["$defs"]
    out = [HEADER, "## Top level\n", _table(schema)]
    for _, heading, name in SECTIONS:
        definition = defs[name]
        out.append(f"## `{heading}`\n\n{definition['description']}\n")
        out.append(_table(definition))
    out.append(_aliases())
    return "\n".join(out)


ALIASES_INTRO = """\
## The user guide's names

The user guide names settings flat, as its `~/.config/blazar/config.toml` does
(`port = 11434`, `slots = 2`, `[model_overrides.gemma] pin = true`). Blazar does
not read that file (`blazar serve`, `blazar doctor` and `blazar config path` say
so while it exists); `blazar migrate config [PATH]` turns it into manifest content
(`--merge`: into your manifest) with this table (docs/migrate.md).
`blazar config get|set|unset` takes either name and answers with the manifest's
key (`port -> serving.port = 11434`); a name that is neither gets the closest
keys (`did you mean ...?`), and so does a flat name written into a manifest.
`<model>` is one model's name. A name whose key is per model only is refused for
the whole server, naming the per-model key; a name of a feature this version does
not have is refused, saying what to use instead.

`[[keys]]` and `[[remotes]]` may also be written as arrays of tables, each entry
naming itself (`name = "alice"`): the same as `[keys.alice]`. An entry without a
name, or a name given twice, is an error at its line.
"""


def _aliases() -> str:
    """The table of `specs.aliases`: each of the guide's names and the key it stands for."""
    rows = ["| guide's name | manifest key | note |", "|---|---|---|"]
    for alias in ALIASES:
        notes = [alias.note] if alias.note else []
        if alias.per_model:
            notes.insert(0, "per model only: refused for the whole server")
        if alias.missing is not None:
            notes.append(f"not in this version: {alias.missing}")
        note = "; ".join(notes)
        cells = [f"`{alias.name}`", f"`{alias.key}`", note]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return ALIASES_INTRO + "\n" + "\n".join(rows) + "\n"


def _table(definition: dict[str, Any]) -> str:
    required = set(definition.get("required", []))
    rows = [
        "| field | type | default | constraints | description |",
        "|---|---|---|---|---|",
    ]
    for name, prop in definition["properties"].items():
        default = "**required**" if name in required else _default(prop)
        cells = [f"`{name}`", _type(prop), default, _constraints(prop), prop.get("description", "")]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def _variants(prop: dict[str, Any]) -> list[dict[str, Any]]:
    """The non-null alternatives of a property (null only means 'not set')."""
    if "anyOf" not in prop:
        return [prop]
    return [v for o in prop["anyOf"] if o.get("type") != "null" for v in _variants(o)]


def _type(prop: dict[str, Any]) -> str:
    options = _variants(prop)
    if any(o.get("pattern") == DURATION_PATTERN for o in options):
        return "duration"
    if any(o.get("pattern") == SIZE_PATTERN for o in options):
        return "size"
    return " or ".join(_one_type(o) for o in options)


def _one_type(option: dict[str, Any]) -> str:
    if "$ref" in option:
        return "table"
    if "const" in option:
        return json.dumps(option["const"])
    if "enum" in option:
        return " | ".join(json.dumps(v) for v in option["enum"])
    kind = str(option.get("type", "any"))
    if kind == "array":
        return f"list of {_one_type(option.get('items', {}))}"
    if kind == "object":
        value = option.get("additionalProperties")
        return "tables by name" if isinstance(value, dict) else "table"
    return kind


def _default(prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return ""
    value = prop["default"]
    if value is None:
        return "not set"
    if value in ({}, []):
        return "empty"
    return f"`{json.dumps(value)}`"


def _constraints(prop: dict[str, Any]) -> str:
    found: list[str] = []
    if any(o.get("pattern") == SIZE_PATTERN for o in _variants(prop)):
        return ""  # the Sizes paragraph says what a size may be
    for option in _variants(prop):
        if option.get("pattern") == DURATION_PATTERN:
            continue
        for key, words in (
            ("minimum", ">= {}"),
            ("exclusiveMinimum", "> {}"),
            ("maximum", "<= {}"),
            ("exclusiveMaximum", "< {}"),
            ("pattern", "matches `{}`"),
        ):
            if key in option:
                found.append(words.format(option[key]))
        if option.get("minLength") == 1:
            found.append("not empty")
        names = option.get("propertyNames", {}).get("pattern")
        if names:
            found.append(f"names match `{names}`")
        items = option.get("items", {})
        if isinstance(items, dict) and "pattern" in items:
            found.append(f"items match `{items['pattern']}`")
    return "; ".join(found)


def main() -> None:
    """Rewrite the committed schema and reference from the models."""
    SCHEMA_FILE.write_text(schema_text(), encoding="utf-8")
    DOCS_FILE.write_text(render_manifest_docs(), encoding="utf-8")
    print(f"wrote {SCHEMA_FILE} and {DOCS_FILE}")


if __name__ == "__main__":
    main()
