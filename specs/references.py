"""Cross-references between a manifest's resources, checked over the whole document.

A lora names a model, a model names an engine, its draft and the remotes it fails
over to, a key and a group name models (a model is in one exclusive group at most, and
not a pinned one), and a model's aliases must not collide with another model's name or
aliases. These
checks read plain data (the parsed document or `Manifest.model_dump()`) and
tolerate values of the wrong type, so the loader can report dangling
references in the same pass as type errors. `specs.manifest` runs them as the
Manifest's last validator; `specs.loader` runs them on the raw document too.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from specs.names import InvalidName, parse_name
from specs.problems import Finding

DEFAULT_ENGINE = "llamacpp"
"""The engine lane a model uses when the manifest declares no engine."""
# The kind of engine each kind of model runs on; it is also the lane a model of that kind
# uses when the manifest declares no engine of that kind (docs/audio.md).
ENGINE_FOR_KIND = {
    "chat": "llamacpp",
    "transcription": "whisper",
    "speech": "piper",
    "image": "sdcpp",
}
# Every kind of engine a model of each kind may run on (chat: llama.cpp or mistral.rs).
ENGINES_FOR_KIND = {
    "chat": ("llamacpp", "mistralrs"),
    "transcription": ("whisper",),
    "speech": ("piper",),
    "image": ("sdcpp",),
}


def default_kind(doc: Mapping[str, Any], kind: str = "chat") -> str:
    """The kind of engine a model of `kind` that names none runs on: for chat,
    `engine_routing.chat_kind` (`blazar engine use --kind`), else llamacpp."""
    routing = doc.get("engine_routing")
    chosen = routing.get("chat_kind") if isinstance(routing, Mapping) else None
    if kind == "chat" and isinstance(chosen, str) and chosen in ENGINES_FOR_KIND["chat"]:
        return chosen
    return ENGINE_FOR_KIND.get(kind, DEFAULT_ENGINE)


def canonical(name: str) -> str:
    """`gemma` and `gemma:latest` are the same model; an invalid name stays as written."""
    try:
        return str(parse_name(name))
    except InvalidName:
        return name


def _tables(doc: Mapping[str, Any], section: str) -> dict[str, Mapping[str, Any]]:
    value = doc.get(section)
    if not isinstance(value, Mapping):
        return {}
    return {k: v if isinstance(v, Mapping) else {} for k, v in value.items()}


def _strings(value: object) -> list[tuple[int, str]]:
    if not isinstance(value, list):
        return []
    return [(i, v) for i, v in enumerate(value) if isinstance(v, str)]


def _suggest(word: str, candidates: list[str]) -> str | None:
    close = difflib.get_close_matches(word, candidates, n=1)
    return f"did you mean {close[0]!r}?" if close else None


def model_kind(model: Mapping[str, Any]) -> str:
    """chat, transcription or speech (anything else counts as chat: the schema refuses it)."""
    kind = model.get("kind")
    return kind if isinstance(kind, str) and kind in ENGINE_FOR_KIND else "chat"


def engine_kind(engine: Mapping[str, Any]) -> str:
    kind = engine.get("kind")
    return kind if isinstance(kind, str) else DEFAULT_ENGINE


def resolve_engine(
    model: Mapping[str, Any], engines: list[str], default: str | None = None
) -> str | None:
    """The engine a model runs on: its own, the only one declared (of its kind: `engines`
    are the candidates for it), or the default lane of its kind (`default`, else the
    kind's own: `default_kind`).

    None when the model names none and several engines are declared.
    """
    named = model.get("engine")
    if isinstance(named, str):
        return named
    if not engines:
        return default or ENGINE_FOR_KIND[model_kind(model)]
    return engines[0] if len(engines) == 1 else None


def _engine_tables(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The `[engines.NAME]` tables (`engines.catalog`, a string, is not one)."""
    raw = doc.get("engines")
    catalog = isinstance(raw, Mapping) and isinstance(raw.get("catalog"), str)
    return {e: b for e, b in _tables(doc, "engines").items() if not (catalog and e == "catalog")}


def default_candidates(doc: Mapping[str, Any], kind: str = "chat") -> list[str]:
    """The engines a model of `kind` that names none may default to: those of the engine
    kind it runs on; for chat, every one declared with `engine_routing.mode = "manual"`,
    with "auto" only the mainstream ones (fork lanes take the models whose architecture
    they add by themselves)."""
    routing = doc.get("engine_routing")
    manual = isinstance(routing, Mapping) and routing.get("mode") == "manual"
    wanted = default_kind(doc, kind)
    return [
        e
        for e, body in _engine_tables(doc).items()
        if engine_kind(body) == wanted and (manual or body.get("lane") is None)
    ]


def reference_findings(doc: Mapping[str, Any]) -> list[Finding]:
    """Every dangling or ambiguous reference in the document, in declaration order."""
    models = _tables(doc, "models")
    found: list[Finding] = []
    owner: dict[str, str] = {}  # canonical model name or alias -> declared model name
    for name in models:
        first = owner.setdefault(canonical(name), name)
        if first != name:
            found.append(
                Finding(
                    ("models", name),
                    f"model {name!r} is the same model as {first!r} (the tag defaults to 'latest')",
                    "declare it once",
                )
            )
    names = dict(owner)
    for name, body in models.items():
        for i, alias in _strings(body.get("aliases")):
            key = canonical(alias)
            other = owner.setdefault(key, name)
            if other == name:
                continue
            what = "the name of model" if key in names else "already an alias of model"
            found.append(
                Finding(
                    ("models", name, "aliases", i),
                    f"alias {alias!r} of model {name!r} is {what} {other!r}",
                    "choose another alias",
                )
            )
    found += _engine_findings(doc, models)
    targets = list(models) + [
        alias for body in models.values() for _, alias in _strings(body.get("aliases"))
    ]

    def check(path: tuple[str | int, ...], who: str, ref: str) -> None:
        if canonical(ref) not in owner:
            found.append(
                Finding(
                    path,
                    f"{who} names model {ref!r}, which is not declared",
                    _suggest(ref, targets) or "declare it under [models] first",
                )
            )

    for name, body in _tables(doc, "loras").items():
        ref = body.get("model")
        if isinstance(ref, str):
            check(("loras", name, "model"), f"lora {name!r}", ref)
            base = owner.get(canonical(ref))
            if base is not None and model_kind(models[base]) != "chat":
                found.append(
                    Finding(
                        ("loras", name, "model"),
                        f"lora {name!r} names model {ref!r}, a {model_kind(models[base])} "
                        "model; LoRA adapters apply to chat models only",
                        "name a chat model",
                    )
                )
    for name, body in _tables(doc, "keys").items():
        for i, ref in _strings(body.get("models")):
            if ref != "*":
                check(("keys", name, "models", i), f"key {name!r}", ref)
    for name, body in models.items():
        ref = body.get("draft")
        if isinstance(ref, str):
            check(("models", name, "draft"), f"the draft of model {name!r}", ref)
            base = owner.get(canonical(ref))
            if base is not None and model_kind(models[base]) != "chat":
                found.append(
                    Finding(
                        ("models", name, "draft"),
                        f"the draft of model {name!r} names model {ref!r}, a "
                        f"{model_kind(models[base])} model; a draft is a chat model",
                        "name a chat model of the same family",
                    )
                )
    exclusive_of: dict[str, str] = {}  # declared model -> the exclusive group it is in
    for name, body in _tables(doc, "groups").items():
        members: set[str] = set()
        for i, ref in _strings(body.get("models")):
            path = ("groups", name, "models", i)
            check(path, f"group {name!r}", ref)
            model = owner.get(canonical(ref))
            if model is None:
                continue
            if model in members:
                found.append(Finding(path, f"group {name!r} names model {model!r} twice"))
                continue
            members.add(model)
            if body.get("exclusive") is not True:
                continue
            first = exclusive_of.setdefault(model, name)
            if first != name:
                found.append(
                    Finding(
                        path,
                        f"model {model!r} is in exclusive groups {first!r} and {name!r}: a "
                        "model is in one exclusive group at most",
                        "take it out of one of them",
                    )
                )
            replicas = models[model].get("replicas")
            if models[model].get("pin") is True or (isinstance(replicas, int) and replicas > 0):
                why = "pinned (pin = true)" if models[model].get("pin") is True else "kept warm"
                found.append(
                    Finding(
                        path,
                        f"model {model!r} is {why} and in exclusive group {name!r}: loading "
                        "another of the group would have to unload it",
                        "take it out of the group, or unpin it",
                    )
                )
    remotes = list(_tables(doc, "remotes"))
    for name, body in models.items():
        for i, ref in _strings(body.get("failover")):
            if ref not in remotes:
                found.append(
                    Finding(
                        ("models", name, "failover", i),
                        f"model {name!r} fails over to remote {ref!r}, which is not declared",
                        _suggest(ref, remotes) or f"declare [remotes.{ref}] first",
                    )
                )
    cache = (doc.get("serving") or {}).get("cache") or {}
    ref = cache.get("model")
    if isinstance(ref, str):  # the response cache's embeddings model (docs/cache.md)
        check(("serving", "cache", "model"), "serving.cache", ref)
        model = owner.get(canonical(ref))
        if model is not None and models[model].get("embeddings") is not True:
            found.append(
                Finding(
                    ("serving", "cache", "model"),
                    f"serving.cache names model {ref!r}, which is not served for embeddings",
                    f"set models.{model}.embeddings = true, or name an embeddings model",
                )
            )
    return found


def _engine_findings(doc: Mapping[str, Any], models: dict[str, Mapping[str, Any]]) -> list[Finding]:
    tables = _engine_tables(doc)
    engines = list(tables)
    found: list[Finding] = []
    for name, body in models.items():
        kind = model_kind(body)
        allowed = ENGINES_FOR_KIND[kind]
        candidates = default_candidates(doc, kind)
        named = body.get("engine")
        if isinstance(named, str):
            default = default_kind(doc, kind)
            if named not in engines and (engines or named != default):
                hint = _suggest(named, engines or [default])
                found.append(
                    Finding(
                        ("models", name, "engine"),
                        f"model {name!r} names engine {named!r}, which is not declared",
                        hint or f"declare [engines.{named}] or leave engine out",
                    )
                )
            elif named in tables and engine_kind(tables[named]) not in allowed:
                lanes = " or ".join(allowed)
                found.append(
                    Finding(
                        ("models", name, "engine"),
                        f"model {name!r} is a {kind} model, but engine {named!r} is a "
                        f"{engine_kind(tables[named])} lane; {kind} models run on a {lanes} "
                        "lane",
                        f"name a {lanes} engine, or leave engine out",
                    )
                )
        elif resolve_engine(body, candidates, default_kind(doc, kind)) is None:
            found.append(
                Finding(
                    ("models", name, "engine"),
                    f"model {name!r} names no engine and {len(candidates)} are declared "
                    f"({', '.join(candidates)})",
                    "set engine to one of them",
                )
            )
    return found
