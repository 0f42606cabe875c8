"""API keys in the manifest: made, listed and removed the way `blazar pull` edits models.

`blazar keys add|list|rm` (`blazar.cli.keys`) and the gateway's `/api/keys`
routes (`blazar.serve.routes.keys_api`) call these. A key is `plm_` and 32 random
bytes (url-safe base64); only its sha256 goes into the manifest, under
`[keys.NAME]` with its scope, models, rpm and creation time (tomlkit: comments
and order kept), and the caller shows the key once. The key is then reconciled
into the store (its hash, for `blazar status`), and a running `blazar serve`
picks the change up from the manifest without a restart. Removing the last key
is refused (`Conflict`) unless forced: the gateway would go back to serving
anyone who can reach it.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from blazar.errors import AlreadyExists, BlazarError, Conflict, InvalidManifest, NotFound
from blazar.host.locking import apply_lock
from blazar.manifest import ops as manifest_ops
from blazar.manifest.edit import ManifestError
from blazar.paths import Paths
from blazar.reconcile.apply import reconcile
from blazar.store.db import Store
from specs.loader import load_manifest
from specs.manifest import Manifest

PREFIX = "plm_"
SCOPES = ("inference", "admin")
LAST_KEY = (
    "the gateway refuses to go authless: '{name}' is the last key, and without one anyone "
    "who can reach the gateway could use it"
)


def new_secret() -> str:
    """A fresh key: `plm_` and 32 random bytes, url-safe (43 characters)."""
    return PREFIX + secrets.token_urlsafe(32)


def digest(secret: str) -> str:
    """The sha256 (hex) a key is known by in the manifest, the store and the gateway."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class KeyInfo:
    """A declared key as `keys list` and `GET /api/keys` show it: never the key itself."""

    name: str
    scope: str
    models: tuple[str, ...]
    rpm: int | None
    description: str | None
    created: str | None
    last_used: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "scope": self.scope,
            "models": list(self.models),
            "rpm": self.rpm,
            "description": self.description,
            "created": self.created,
            "last_used": self.last_used,
        }


def declared(manifest_path: Path) -> Manifest:
    """The manifest's keys as Blazar reads them (an absent manifest declares none)."""
    return load_manifest(manifest_path) if manifest_path.exists() else Manifest()


def list_keys(manifest: Manifest, usage: dict[str, str]) -> list[KeyInfo]:
    """The declared keys with their last use (`Store.key_usage`), by name."""
    return [
        KeyInfo(
            name,
            key.scope,
            tuple(key.models),
            key.rpm,
            key.description,
            key.created,
            usage.get(name),
        )
        for name, key in sorted(manifest.keys.items())
    ]


def unused_name(manifest_path: Path, stem: str = "key") -> str:
    """The first of `key-1`, `key-2`, ... that no key is declared as: the name `blazar keys
    add` chooses when none is given (the user guide's form)."""
    manifest = manifest_ops.open_manifest(manifest_path)
    n = 1
    while manifest.declares("keys", f"{stem}-{n}"):
        n += 1
    return f"{stem}-{n}"


def add_key(
    paths: Paths,
    manifest_path: Path,
    name: str,
    *,
    scope: str = "inference",
    models: Sequence[str] = ("*",),
    rpm: int | None = None,
    description: str | None = None,
) -> str:
    """Declare key `name` (only its sha256) and reconcile it; return the key, to show once.

    The manifest is put back when the key cannot be recorded."""
    manifest = manifest_ops.open_manifest(manifest_path)
    if manifest.declares("keys", name):
        raise AlreadyExists(
            f"key '{name}' already exists: remove it first (`blazar keys rm {name}`) or choose "
            "another name"
        )
    secret = new_secret()
    fields: dict[str, Any] = {"sha256": digest(secret), "scope": scope}
    if list(models) != ["*"]:
        fields["models"] = list(models)
    if rpm is not None:
        fields["rpm"] = rpm
    if description:
        fields["description"] = description
    fields["created"] = datetime.now(UTC).isoformat(timespec="seconds")
    manifest.add_resource("keys", name, fields)
    try:
        manifest.save()
    except ManifestError as exc:
        raise InvalidManifest(
            f"key {name} not added: the manifest would not be valid:\n{exc}"
        ) from None
    try:
        with Store(paths.db) as store:
            loaded = declared(manifest_path)
            result = reconcile(store, paths, loaded, apply=True, targets=[f"keys.{name}"])
    except BaseException:
        manifest.restore()
        raise
    if result.report is not None and not result.report.ok:
        manifest.restore()
        errors = "; ".join(o.error or "" for o in result.report.failed)
        raise BlazarError(f"key {name} not added, the manifest is unchanged: {errors}")
    return secret


def remove_key(paths: Paths, manifest_path: Path, name: str, *, force: bool = False) -> None:
    """Drop key `name` from the manifest and the store; never the last one unless `force`."""
    manifest = manifest_ops.open_manifest(manifest_path)
    if not manifest.declares("keys", name):
        known = ", ".join(sorted(declared(manifest_path).keys)) or "none"
        raise NotFound(f"key '{name}' is not declared in {manifest_path} (keys: {known})")
    if len(declared(manifest_path).keys) == 1 and not force:
        raise Conflict(LAST_KEY.format(name=name))
    manifest.remove_resource("keys", name)
    try:
        manifest.save()
    except ManifestError as exc:
        raise InvalidManifest(
            f"key {name} not removed: the manifest would not be valid:\n{exc}"
        ) from None
    with apply_lock(paths.state / "apply.lock"), Store(paths.db) as store:
        store.delete_key(name)  # under the lock: an apply's transactions fail beside a writer
