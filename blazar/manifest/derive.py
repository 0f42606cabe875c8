"""Derived models: `blazar create NAME --from MODEL`, as `ollama create` makes one.

A derived model is a declaration of its own in the manifest: the base model's
declaration (its aliases and how it is hosted left out: `HOSTING`) or, for a model
only held, its source and sha256, changed by what `create` was given (chat template, system prompt,
parameters, context) and with the adapters of a Modelfile's `ADAPTER` lines
declared always on for it. It goes through the one declare -> reconcile ->
restore-on-failure flow (`manifest_ops.declare_and_reconcile`); bytes Blazar
holds already are linked again rather than fetched (`wiring.StoreModels`).
`blazar.cli.imperative` calls it; `blazar.manifest.modelfile` reads Modelfiles for it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blazar.errors import InvalidInput, NotFound
from blazar.manifest import ops as manifest_ops
from blazar.manifest.edit import ManifestFile
from blazar.paths import Paths
from blazar.store.db import Store
from specs.names import parse_name

# What a derived model does not take from its base: its other names, and how the base is
# kept on this host (a copied `pin` or `replicas` started a second pinned child for it).
HOSTING = ("aliases", "pin", "replicas")


@dataclass(frozen=True)
class Derived:
    """What `blazar create` changes of its base model (None: the base's, kept)."""

    chat_template: str | None = None
    system: str | None = None
    params: dict[str, Any] | None = None  # merged over the base's
    ctx: int | None = None
    adapters: tuple[Path, ...] = ()  # declared always on for the new model


def create_model(
    paths: Paths,
    manifest_path: Path,
    name: str,
    base: str,
    derived: Derived,
    *,
    base_file: bool = False,
    force: bool = False,
    notify: Callable[[str], None] | None = None,
) -> list[str]:
    """`blazar create`: declare model `name` from `base` (a model, whose declaration or
    held bytes it starts from, or a GGUF file) with `derived`'s changes and its adapters,
    and reconcile them; the manifest is put back if that fails. Returns the adapters
    declared. The same bytes held already are linked again, not fetched."""
    name = parse_name(name).short
    adapters: list[str] = []

    def declare(manifest: ManifestFile) -> list[str]:
        taken = manifest_ops.declared_key(manifest, name) or manifest_ops.alias_owner(
            manifest, name
        )
        if taken is not None and not force:
            raise InvalidInput(
                f"model '{name}' is declared already ({taken}): pass --force to replace it, "
                "or choose another name"
            )
        fields = _base_fields(paths, manifest, base, base_file)
        for key, value in (
            ("chat_template", derived.chat_template),
            ("system", derived.system),
            ("ctx", derived.ctx),
        ):
            if value is not None:
                fields[key] = value
        if derived.params:
            fields["params"] = {**fields.get("params", {}), **derived.params}
        manifest.remove_resource("models", taken or name)
        manifest.add_resource("models", name, fields)
        targets = [f"models.{name}"]
        for path in derived.adapters:
            lora = _lora_name(f"{name}-{path.name.removesuffix('.gguf')}")
            manifest.remove_resource("loras", lora)
            source = {"model": name, "source": path.as_uri(), "always_on": True}
            manifest.add_resource("loras", lora, source)
            adapters.append(lora)
            targets.append(f"loras.{lora}")
        return targets

    manifest_ops.declare_and_reconcile(
        paths,
        manifest_path,
        declare,
        f"create {name}",
        True,
        progress_for=None,
        on_event=None,
        notify=notify,
    )
    return adapters


def _base_fields(
    paths: Paths, manifest: ManifestFile, base: str, base_file: bool
) -> dict[str, Any]:
    """The declaration a derived model starts from: the base's (no aliases), with the sha256
    of the bytes held for it, or a GGUF file's source."""
    if base_file:
        if not Path(base).is_file():
            raise InvalidInput(f"FROM {base}: no such file")
        return {"source": Path(base).as_uri()}
    key = manifest_ops.declared_key(manifest, base) or manifest_ops.alias_owner(manifest, base)
    fields = manifest_ops.declaration(manifest, key) if key is not None else {}
    for where in HOSTING:  # how the base is kept on this host is not what it answers
        fields.pop(where, None)
    with Store(paths.db) as store:
        held = store.find_model(parse_name(key or base))
    if held is not None:
        fields.setdefault("source", held.source)
        if fields["source"] == held.source or "sha256" not in fields:
            fields["sha256"] = held.sha256
    if "source" not in fields:
        raise NotFound(
            f"model '{base}' is neither declared in the manifest nor in the store: pull it "
            "first (`blazar pull`), or create from a GGUF file"
        )
    return fields


def _lora_name(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._") or "adapter"
