"""Imperative manifest edits, each followed by a reconcile of just what it touched.

The one declare -> targeted reconcile -> restore-on-failure flow, used by the
CLI (`blazar pull`, `blazar rm` in `blazar.cli.imperative`, `blazar lora` in
`blazar.cli.lora`, `blazar mmproj` in `blazar.cli.vision`) and by the gateway's
management routes (`/api/pull`, `/api/create`, `/api/delete`, `/api/copy` in
`blazar.serve.routes.ollama_admin` and `ollama_pull`; `/api/blazar/pin` in
`ui_admin`). Edits go through `ManifestFile` (comments and order kept, validated whole
before writing); only the model (or the adapter or projector, with its model) named is
reconciled; when that fails the manifest is put back, so nothing is half-applied. `x`
and `x:latest` are one model, and an alias names its model. The functions block
(downloads, hashing, the apply lock): the gateway runs them in a worker thread, each
with its own store connection, then asks the daemon for a pass so the scheduler serves
the result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blazar.errors import BlazarError, Conflict, InvalidInput, InvalidManifest, NotFound
from blazar.host.locking import apply_lock
from blazar.manifest.edit import ManifestError, ManifestFile
from blazar.models.registry import Registry
from blazar.paths import Paths
from blazar.reconcile.apply import Pass, forget_undeclared, reconcile, supported
from blazar.store.db import Store
from reconcilers.apply import Event
from reconcilers.desired import desired_from_manifest
from reconcilers.plan import Action
from reconcilers.ports import Progress
from specs.loader import load_manifest_text
from specs.names import InvalidName, closest_name, parse_name
from specs.sources import (
    PULL_FORMS,
    InvalidSource,
    RegistrySource,
    default_name,
    expand_shorthand,
    parse_source,
)

__all__ = [
    "Removed",
    "add_alias",
    "alias_owner",
    "apply_lora",
    "apply_model",
    "apply_projector",
    "declaration",
    "declare_and_reconcile",
    "declared_key",
    "open_manifest",
    "remove_lora",
    "remove_model",
    "set_pin",
    "source_declaration",
]


def open_manifest(path: Path) -> ManifestFile:
    """The manifest serve watches, for editing; only a single TOML file can be edited."""
    if path.is_dir() or path.suffix.lower() in (".yaml", ".yml"):
        raise InvalidInput(
            f"{path} is not a single TOML manifest, so Blazar cannot edit it for you: declare "
            "the model in it yourself; serve applies the change as soon as it is saved"
        )
    return ManifestFile(path)


def _table(manifest: ManifestFile, section: str) -> dict[str, Any]:
    table = manifest.doc.get(section)
    return table if isinstance(table, dict) else {}


def _models(manifest: ManifestFile) -> dict[str, Any]:
    return _table(manifest, "models")


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
    notify: Callable[[str], None] | None = None,
) -> Pass:
    """Declare model `name` with `fields` (replacing its declaration; None keeps the one
    there) and reconcile it; the manifest is restored if the reconcile fails. Returns the
    pass (its report is None when nothing had to change)."""

    def declare(manifest: ManifestFile) -> list[str]:
        if fields is not None:
            manifest.remove_resource("models", declared_key(manifest, name) or name)
            manifest.add_resource("models", name, fields)
        return [f"models.{declared_key(manifest, name) or name}"]

    return declare_and_reconcile(
        paths,
        manifest_path,
        declare,
        f"pull of {name}",
        fields is not None,
        progress_for=progress_for,
        on_event=on_event,
        notify=notify,
    )


def apply_lora(
    paths: Paths,
    manifest_path: Path,
    name: str,
    fields: dict[str, Any],
    *,
    progress_for: Callable[[Action], Progress | None] | None = None,
    on_event: Event | None = None,
    notify: Callable[[str], None] | None = None,
) -> Pass:
    """`blazar lora add`: declare `[loras.NAME]` with `fields` (replacing a declaration of
    that name) and reconcile it, with its model when that is not fetched yet; the manifest
    is restored if the reconcile fails."""

    def declare(manifest: ManifestFile) -> list[str]:
        model = str(fields.get("model", ""))
        key = declared_key(manifest, model) or alias_owner(manifest, model)
        if key is None:
            raise NotFound(
                f"model '{model}' is not declared in {manifest_path}, so it cannot have a "
                "LoRA adapter there: declare it first (`blazar pull SOURCE --name "
                f"{model}`), then add the adapter"
            )
        manifest.remove_resource("loras", name)
        manifest.add_resource("loras", name, {**fields, "model": key})
        return [f"loras.{name}", f"models.{key}"]

    return declare_and_reconcile(
        paths,
        manifest_path,
        declare,
        f"lora add {name}",
        True,
        progress_for=progress_for,
        on_event=on_event,
        notify=notify,
    )


def apply_projector(
    paths: Paths,
    manifest_path: Path,
    model: str,
    mmproj: str | None,
    sha256: str | None = None,
    *,
    progress_for: Callable[[Action], Progress | None] | None = None,
    on_event: Event | None = None,
    notify: Callable[[str], None] | None = None,
) -> Pass:
    """`blazar mmproj`: set (or, with None, drop) `models.MODEL.mmproj` and its sha256, then
    reconcile the model and its projector; the manifest is restored if that fails. A
    dropped projector's bytes go too (as `blazar lora rm` drops an adapter's)."""
    key_of: list[str] = []

    def declare(manifest: ManifestFile) -> list[str]:
        key = declared_key(manifest, model) or alias_owner(manifest, model)
        if key is None:
            raise NotFound(
                f"model '{model}' is not declared in {manifest_path}, so it cannot have a "
                f"projector there: declare it first (`blazar pull SOURCE --name {model}`)"
            )
        table = _models(manifest)[key]
        for field, value in (("mmproj", mmproj), ("mmproj_sha256", sha256)):
            if value is None:
                table.pop(field, None)
            else:
                table[field] = value
        key_of.append(key)
        if mmproj is None:
            return [f"models.{key}"]
        return [f"models.{key}", f"projectors.{parse_name(key).short}"]

    result = declare_and_reconcile(
        paths,
        manifest_path,
        declare,
        f"mmproj for {model}",
        True,
        progress_for=progress_for,
        on_event=on_event,
        notify=notify,
    )
    if mmproj is None:
        from blazar.sources.projectors import remove_projector

        with Store(paths.db) as store:
            remove_projector(Registry(store, paths), parse_name(key_of[0]).short)
            store.delete_conditions("projector", parse_name(key_of[0]).short)
    return result


def declare_and_reconcile(
    paths: Paths,
    manifest_path: Path,
    declare: Callable[[ManifestFile], list[str]],
    what: str,
    edits: bool,
    *,
    progress_for: Callable[[Action], Progress | None] | None,
    on_event: Event | None,
    notify: Callable[[str], None] | None,
) -> Pass:
    """The one flow: edit (`declare` returns the addresses to reconcile), save (validated
    whole), reconcile only those, and put the manifest back when anything fails."""
    manifest = open_manifest(manifest_path)
    targets = declare(manifest)
    if edits:
        _save(manifest, f"{what}: nothing declared")
    try:
        try:
            loaded = supported(load_manifest_text(manifest.text(), str(manifest_path)))
        except ManifestError as exc:
            raise InvalidManifest(f"{manifest_path}: nothing was changed:\n{exc}") from None
        with Store(paths.db) as store:
            result = reconcile(
                store,
                paths,
                loaded,
                apply=True,
                targets=targets,
                notify=notify,
                on_event=on_event,
                progress_for=progress_for,
            )
    except BaseException:
        if edits:
            manifest.restore()
            _forget_taken_back(paths, manifest_path, targets)
        raise
    if result.report is not None and not result.report.ok:
        if edits:
            manifest.restore()
            _forget_taken_back(paths, manifest_path, targets)
        errors = "; ".join(o.error or "" for o in result.report.failed)
        raise BlazarError(f"{what} failed, the manifest is unchanged: {errors}")
    return result


def _forget_taken_back(paths: Paths, manifest_path: Path, targets: Sequence[str]) -> None:
    """After a failed edit is taken back, the conditions its pass wrote for what is no
    longer declared go too: "the manifest is unchanged" leaves no failure behind."""
    try:
        text = open_manifest(manifest_path).text()
        restored = supported(load_manifest_text(text, str(manifest_path)))
    except ManifestError:
        return
    with Store(paths.db) as store:
        forget_undeclared(store, desired_from_manifest(restored), only=targets)


def source_declaration(
    source: str, name: str | None = None, sha256: str | None = None
) -> tuple[str, dict[str, Any]]:
    """The model name (given, or derived from the source as ollama would) and the fields
    that declare a model fetched from `source`; `owner/repo[:QUANT]` is recorded as
    `hf://owner/repo[:QUANT]`, and a name that is neither a short name Blazar knows nor
    owner/repo is refused with the forms that work."""
    source = expand_shorthand(source)
    try:
        parsed = parse_source(source)
    except InvalidSource as exc:
        raise InvalidInput(f"{exc} (or owner/repo:QUANT for a Hugging Face repo)") from None
    if isinstance(parsed, RegistrySource):
        from blazar.sources import REGISTRY

        if parsed.name.partition(":")[0] not in REGISTRY:
            raise InvalidInput(
                f"{source!r} is neither one of Blazar's short names ({', '.join(sorted(REGISTRY))})"
                f" nor owner/repo: use {PULL_FORMS}"
            )
    model = parse_name(name or default_name(parsed)).short
    fields: dict[str, Any] = {"source": source}
    if sha256:
        fields["sha256"] = sha256
    return model, fields


@dataclass(frozen=True)
class Removed:
    """What `remove_model` removed: an alias of `alias_of`, or a model's declaration
    (`declared`) and what the store held of it (`held`: how, or None)."""

    name: str
    declared: bool = False
    held: str | None = None
    alias_of: str | None = None


def _edit_lock(paths: Paths, notify: Callable[[str], None] | None) -> Any:
    """The apply lock, held from an edit's save to the end of its store changes: a pass of
    `blazar serve` that the save starts finds it held, and runs again once it is released
    (`blazar.serve.triggers`), so it never serves half of the edit."""
    return apply_lock(paths.state / "apply.lock", notify=notify)


def remove_model(
    paths: Paths, manifest_path: Path, name: str, *, notify: Callable[[str], None] | None = None
) -> Removed:
    """`blazar rm`: drop the declaration and what Blazar holds of a model (Blazar's own
    link or copy, never the user's file); for an alias, drop only the alias."""
    with _edit_lock(paths, notify):
        return _remove_model(paths, manifest_path, name)


def _remove_model(paths: Paths, manifest_path: Path, name: str) -> Removed:
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
        return Removed(_short(name) or name, alias_of=owner)
    ref = parse_name(name)
    key = declared_key(manifest, name)
    with Store(paths.db) as store:
        held = store.find_model(ref)
        if key is None and held is None:
            known = [*_models(manifest), *(r.ref.short for r in store.list_models())]
            close = closest_name(ref.short, known)
            meant = f"did you mean '{close}'? " if close else ""
            raise NotFound(
                f"model '{ref.short}' not found: it is neither declared nor in the store "
                f"({meant}`blazar list` shows models)"
            )
        if key is not None:
            manifest.remove_resource("models", key)
            _save(manifest, f"not removed: {ref.short} is still referenced in the manifest")
        if held is not None:
            Registry(store, paths).remove(ref)
        store.delete_conditions("model", ref.short)  # declared and never fetched: its too
    return Removed(ref.short, declared=key is not None, held=held.held if held else None)


def remove_lora(
    paths: Paths, manifest_path: Path, name: str, *, notify: Callable[[str], None] | None = None
) -> Removed:
    """`blazar lora rm`: drop `[loras.NAME]` and what Blazar holds of the adapter (its own
    link or copy). A running `blazar serve` sees the model's adapters change and starts
    new instances without it; requests in flight finish on the old ones, which keep the
    adapter loaded until then (`Scheduler.update` drains before it stops)."""
    with _edit_lock(paths, notify):
        manifest = open_manifest(manifest_path)
        declared = manifest.declares("loras", name)
        with Store(paths.db) as store:
            held = store.find_lora(name)
            if not declared and held is None:
                known = sorted({*_table(manifest, "loras"), *(r.name for r in store.list_loras())})
                raise NotFound(
                    f"LoRA adapter '{name}' not found: it is neither declared nor in the store "
                    f"(adapters: {', '.join(known) or 'none'}; `blazar lora list` shows them)"
                )
            if declared:
                manifest.remove_resource("loras", name)
                _save(manifest, f"adapter {name} not removed")
            if held is not None:
                Registry(store, paths).remove_lora(name)
            store.delete_conditions("lora", name)
    return Removed(name, declared=declared, held="adapter" if held else None)


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


def set_pin(manifest_path: Path, model: str, pinned: bool) -> bool:
    """Pin a declared model (never evicted, `pin = true`) or unpin it; a pass applies it in
    place. Returns whether the manifest changed."""
    manifest = open_manifest(manifest_path)
    key = declared_key(manifest, model) or alias_owner(manifest, model)
    if key is None:
        raise Conflict(
            f"model '{model}' is served but not declared in {manifest_path}, so it cannot be "
            f"pinned there: declare it first (`blazar pull` names it), then pin it"
        )
    table = _models(manifest)[key]
    if bool(table.get("pin", False)) == pinned:
        return False
    if pinned:
        table["pin"] = True
    else:
        del table["pin"]
    _save(manifest, f"model {key} not {'pinned' if pinned else 'unpinned'}")
    return True
