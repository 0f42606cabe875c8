"""Manifest edits for the ollama management routes, each followed by a reconcile of what it touched.

`blazar serve`'s `/api/pull`, `/api/create`, `/api/delete` and `/api/copy`
(`blazar.serve.ollama_admin`) take the path `blazar pull` and `blazar rm` take
(`blazar.cli.imperative`): they edit the manifest that serve watches with
`ManifestFile` (comments and order kept, validated whole before writing),
reconcile only the model named, and put the manifest back when that fails, so
nothing is half-applied. The functions here block (downloads, hashing, the apply
lock): the routes run them in a worker thread, each with its own store
connection, then ask the daemon for a pass so the scheduler serves the result.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from blazar.errors import BlazarError, InvalidInput, NotFound
from blazar.manifest_edit import ManifestError, ManifestFile
from blazar.paths import Paths
from blazar.reconcile import InvalidManifest, reconcile
from blazar.registry import Registry
from blazar.store import Store
from reconcilers.apply import Event
from reconcilers.plan import Action
from reconcilers.ports import Progress
from specs.loader import load_manifest_text
from specs.names import InvalidName, parse_name

__all__ = [
    "add_alias",
    "alias_owner",
    "apply_model",
    "declaration",
    "declared_key",
    "open_manifest",
    "remove_model",
]


def open_manifest(path: Path) -> ManifestFile:
    """The manifest serve watches, for editing; only a single TOML file can be edited."""
    if path.is_dir() or path.suffix.lower() in (".yaml", ".yml"):
        raise InvalidInput(
            f"{path} is not a single TOML manifest, so Blazar cannot edit it for you: declare "
            "the model in it yourself; serve applies the change as soon as it is saved"
        )
    return ManifestFile(path)


def _models(manifest: ManifestFile) -> dict[str, Any]:
    table = manifest.doc.get("models")
    return table if isinstance(table, dict) else {}


def _short(name: str) -> str | None:
    try:
        return parse_name(name).short
    except InvalidName:
        return None


def declared_key(manifest: ManifestFile, name: str) -> str | None:
    """The manifest's key for model `name` (`x` and `x:latest` are one model), if declared."""
    short = _short(name)
    return next((k for k in _models(manifest) if short and _short(k) == short), None)


def alias_owner(manifest: ManifestFile, name: str) -> str | None:
    """The key of the declared model that lists `name` among its aliases, if any."""
    short = _short(name)
    for key, table in _models(manifest).items():
        aliases = table.get("aliases") if isinstance(table, dict) else None
        if short and any(_short(str(a)) == short for a in aliases or []):
            return str(key)
    return None


def declaration(manifest: ManifestFile, key: str) -> dict[str, Any]:
    """A declared model's fields as plain values."""
    table = _models(manifest)[key]
    return dict(table.unwrap()) if hasattr(table, "unwrap") else dict(table)


def _save(manifest: ManifestFile, what: str) -> None:
    try:
        manifest.save()
    except ManifestError as exc:
        raise InvalidManifest(f"{what}: the manifest would not be valid:\n{exc}") from None


def apply_model(
    paths: Paths,
    manifest_path: Path,
    name: str,
    fields: dict[str, Any] | None,
    *,
    progress_for: Callable[[Action], Progress | None] | None = None,
    on_event: Event | None = None,
) -> None:
    """Declare model `name` with `fields` (replacing its declaration; None keeps the one
    there) and reconcile it; the manifest is restored if the reconcile fails."""
    manifest = open_manifest(manifest_path)
    if fields is not None:
        manifest.remove_resource("models", declared_key(manifest, name) or name)
        manifest.add_resource("models", name, fields)
        _save(manifest, f"{name} not declared")
    try:
        loaded = load_manifest_text(manifest.text(), str(manifest_path))
        with Store(paths.db) as store:
            result = reconcile(
                store,
                paths,
                loaded,
                apply=True,
                targets=[declared_key(manifest, name) or name],
                on_event=on_event,
                progress_for=progress_for,
            )
    except BaseException:
        if fields is not None:
            manifest.restore()
        raise
    if result.report is not None and not result.report.ok:
        if fields is not None:
            manifest.restore()
        errors = "; ".join(o.error or "" for o in result.report.failed)
        raise BlazarError(f"pull of {name} failed, the manifest is unchanged: {errors}")


def remove_model(paths: Paths, manifest_path: Path, name: str) -> str:
    """As `blazar rm`: drop the declaration and what Blazar holds of a model; for an alias,
    drop only the alias. Returns what was removed."""
    manifest = open_manifest(manifest_path)
    owner = alias_owner(manifest, name)
    if owner is not None:
        table = _models(manifest)[owner]
        short = _short(name)
        kept = [a for a in table["aliases"] if _short(str(a)) != short]
        if kept:
            table["aliases"] = kept
        else:
            del table["aliases"]
        _save(manifest, f"alias {name} not removed")
        return f"alias {name} of {owner}"
    ref = parse_name(name)
    key = declared_key(manifest, name)
    with Store(paths.db) as store:
        held = store.find_model(ref)
        if key is None and held is None:
            raise NotFound(f"model '{name}' not found")
        if key is not None:
            manifest.remove_resource("models", key)
            _save(manifest, f"{ref.short} not removed")
        if held is not None:
            Registry(store, paths).remove(ref)
            store.delete_conditions("model", ref.short)
    return ref.short


def add_alias(manifest_path: Path, model: str, alias: str) -> None:
    """Give declared model `model` another name (`aliases`); a pass makes it servable."""
    manifest = open_manifest(manifest_path)
    key = declared_key(manifest, model) or alias_owner(manifest, model)
    if key is None:
        raise NotFound(
            f"model '{model}' is not declared in {manifest_path}, so it cannot get another "
            "name there: declare it first (`blazar pull` or /api/pull)"
        )
    short = parse_name(alias).short
    if alias_owner(manifest, short) == key:
        return  # already an alias of this model: nothing to do
    table = _models(manifest)[key]
    aliases = table.get("aliases")
    if aliases is None:
        table["aliases"] = [short]
    else:
        aliases.append(short)
    _save(manifest, f"{short} not added")
