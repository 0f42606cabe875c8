"""Restoring a snapshot onto this host: staged and verified whole, then the config files, the
blobs and the store (through SQLite's backup API) under the apply lock; records whose files
are not here are dropped (`blazar.snapshots` describes the guarantees)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from blazar.errors import AlreadyExists, Conflict
from blazar.host.locking import apply_lock
from blazar.paths import Paths
from blazar.snapshots.archive import (
    BLOBS_MEMBER,
    DB_MEMBER,
    DamagedSnapshot,
    Listing,
    blob_files,
    config_files,
    default_name,
    snapshots_dir,
    table_counts,
    unpack_verified,
    write,
)


@dataclass(frozen=True)
class Restored:
    """What `restore` did."""

    listing: Listing
    config_files: list[str]
    blobs: int
    dropped: dict[str, list[str]] = field(default_factory=dict)  # table -> names
    kept: list[str] = field(default_factory=list)  # config files not in the snapshot, left
    before: Path | None = None  # the snapshot of what --force replaced


def daemon_pid(paths: Paths) -> int | None:
    """The pid of a `blazar serve` that runs with these paths, if one does."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        pid = int(json.loads((paths.state / "serve.json").read_text())["pid"])
        os.kill(pid, 0)
        return pid
    return None


def _holds_something(db: Path) -> bool:
    if not db.exists():
        return False
    return any(table_counts(db).values())  # any record, trace or event is something to lose


def conflicts(paths: Paths, staged: Path) -> list[str]:
    """What a restore from `staged` would overwrite: differing config files, a store with
    records. Pure of the archive: it reads only the host and the staged files."""
    found = []
    for path in config_files(staged / "config"):
        rel = path.relative_to(staged / "config")
        current = paths.config / rel
        if current.is_file() and current.read_bytes() != path.read_bytes():
            found.append(str(current))
    if (staged / DB_MEMBER).exists() and _holds_something(paths.db):
        found.append(f"{paths.db} (the store holds records)")
    return found


def restore(
    paths: Paths,
    archive: Path,
    *,
    force: bool = False,
    notify: Callable[[str], None] | None = None,
) -> Restored:
    """Restore a snapshot onto this host (see the module's docstring for the guarantees)."""
    say = notify or (lambda _m: None)
    archive = archive.expanduser().absolute()
    pid = daemon_pid(paths)
    if pid is not None:
        raise Conflict(
            f"`blazar serve` is running (pid {pid}) on this store: stop it first, then restore "
            "and start it again"
        )
    paths.data.mkdir(parents=True, exist_ok=True)
    staged = paths.data / f".blazar-restore-{uuid.uuid4().hex[:8]}"
    staged.mkdir()
    try:
        listing = unpack_verified(archive, staged)
        if (staged / DB_MEMBER).exists():
            backup_check(staged / DB_MEMBER)
        with apply_lock(paths.state / "apply.lock", timeout=0):
            replaced = conflicts(paths, staged)
            before = None
            if replaced and not force:
                raise AlreadyExists(
                    "restoring would overwrite " + "; ".join(replaced) + ": pass --force to "
                    "replace them (a snapshot of what is replaced is taken first)"
                )
            if replaced:
                before = _snapshot_before(paths, say)
            written = _restore_config(paths, staged)
            kept = [
                str(p.relative_to(paths.config))
                for p in config_files(paths.config)
                if not (staged / "config" / p.relative_to(paths.config)).exists()
            ]
            blobs = _restore_blobs(paths, staged)
            dropped: dict[str, list[str]] = {}
            if (staged / DB_MEMBER).exists():
                restore_store(staged / DB_MEMBER, paths.db)
                if listing.data_root:
                    rebase(paths.db, Path(listing.data_root) / "models" / "blobs", paths.blobs)
                dropped = drop_orphans(paths)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return Restored(listing, written, blobs, dropped, kept, before)


def _snapshot_before(paths: Paths, say: Callable[[str], None]) -> Path:
    """Keep what a forced restore replaces (the lock is held already)."""
    now = datetime.now(UTC)
    name = default_name(now, False).replace(".tar", "-before-restore.tar")
    created = write(paths, snapshots_dir(paths) / name, with_models=False, now=now)
    say(f"took a snapshot of what the restore replaces: {created.path}")
    return created.path


def backup_check(db: Path) -> None:
    conn = sqlite3.connect(str(db))
    try:
        (status,) = conn.execute("PRAGMA integrity_check").fetchone()
    except sqlite3.DatabaseError as exc:
        raise DamagedSnapshot(f"the snapshot's store is not a SQLite database ({exc})") from None
    finally:
        conn.close()
    if status != "ok":
        raise DamagedSnapshot(f"the snapshot's store fails SQLite's integrity check: {status}")


def _restore_config(paths: Paths, staged: Path) -> list[str]:
    written = []
    for path in config_files(staged / "config"):
        rel = path.relative_to(staged / "config")
        target = paths.config / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".blazar-restore-{target.name}.tmp-{os.getpid()}")
        shutil.copy2(path, tmp)
        os.replace(tmp, target)
        written.append(str(rel))
    return written


def _restore_blobs(paths: Paths, staged: Path) -> int:
    root = staged / BLOBS_MEMBER
    count = 0
    for path in blob_files(root):
        target = paths.blobs / path.relative_to(root)
        if target.is_file() and target.stat().st_size == path.stat().st_size:
            continue  # content-addressed: the same bytes are here already
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)  # verified on unpacking; same filesystem (under data/)
        count += 1
    return count


def restore_store(snapshot_db: Path, db: Path) -> None:
    """Replace the store's content with the snapshot's, through the backup API: one write
    under SQLite's own locks, so any other reader sees the old store or the new one."""
    db.parent.mkdir(parents=True, exist_ok=True)
    source = sqlite3.connect(str(snapshot_db))
    target = sqlite3.connect(str(db), timeout=30)
    try:
        source.backup(target)
        target.execute("PRAGMA journal_mode=WAL")  # as `blazar.store.db.Store` opens it
    finally:
        target.close()
        source.close()


def rebase(db: Path, old: Path, new: Path) -> None:
    """Point model, adapter and projector records at this home's blob store when the
    snapshot came from another one (its blobs, when it has them, were restored here)."""
    if old == new:
        return
    conn = sqlite3.connect(str(db), timeout=30)
    try:
        with conn:
            for table in ("models", "loras", "projectors"):
                conn.execute(
                    f"UPDATE {table} SET path = ? || substr(path, ?) WHERE substr(path, 1, ?) = ?",
                    [str(new), len(str(old)) + 1, len(str(old)) + 1, f"{old}/"],
                )
    finally:
        conn.close()


def _exists(path: str) -> bool:
    return bool(path) and Path(path).exists()


def drop_orphans(paths: Paths) -> dict[str, list[str]]:
    """Drop, in one transaction, records whose files are not on this host (model and
    adapter files, session files, engine directories); `apply` recreates what is declared."""
    conn = sqlite3.connect(str(paths.db), timeout=30)
    dropped: dict[str, list[str]] = {}
    try:
        with conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            checks: list[tuple[str, str, str, Callable[[Any], bool]]] = [
                ("models", "name || ':' || tag", "path", _exists),
                ("loras", "name", "path", _exists),
                ("projectors", "model", "path", _exists),
                ("sessions", "name", "file", lambda f: (paths.sessions / str(f)).is_file()),
                ("engines", "kind || ' ' || tag", "path", _exists),
            ]
            for table, label, column, present in checks:
                if table not in tables:
                    continue
                rows = conn.execute(f"SELECT rowid, {label}, {column} FROM {table}").fetchall()
                gone = [(rowid, name) for rowid, name, value in rows if not present(value)]
                for rowid, _ in gone:
                    conn.execute(f"DELETE FROM {table} WHERE rowid = ?", [rowid])
                if gone:
                    dropped[table] = [str(name) for _, name in gone]
            for name in dropped.get("models", []):
                model, _, tag = name.rpartition(":")
                short = model if tag == "latest" else name
                conn.execute("DELETE FROM conditions WHERE kind = 'model' AND name = ?", [short])
    finally:
        conn.close()
    return dropped
