"""The snapshot archive: its listing, writing one under the apply lock, and reading one back
with every member checked (`blazar.snapshots` describes the format)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import socket
import sqlite3
import tarfile
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import IO, Any

from blazar import __version__, archives
from blazar.errors import AlreadyExists, BlazarError, InvalidInput, VerificationFailed
from blazar.host.locking import apply_lock
from blazar.models.hashing import CHUNK, sha256_file
from blazar.paths import DB_NAME, Paths

FORMAT = 1
LISTING = "snapshot.json"
DB_MEMBER = f"data/{DB_NAME}"
BLOBS_MEMBER = "data/models/blobs"
# `snapshot.json` lists each member in about 150 bytes: 8 MiB holds some 50,000 of them.
LISTING_LIMIT = 8 * 1024 * 1024
# Tables counted in the listing (what `snapshot list` shows) and checked for content
# before a restore replaces a store.
COUNTED = ("models", "loras", "keys", "sessions", "traces", "engines", "events")
_BLOB = re.compile(r"sha256-([0-9a-f]{64})")
_STAMP = "%Y%m%dT%H%M%SZ"


class DamagedSnapshot(VerificationFailed):
    """An archive is not a snapshot, or its members do not match its listing."""


@dataclass(frozen=True)
class Member:
    name: str  # the member's path in the archive
    size: int
    sha256: str


@dataclass(frozen=True)
class Listing:
    """`snapshot.json`: what an archive holds."""

    created: str
    blazar: str
    host: str
    with_models: bool
    counts: dict[str, int]
    files: tuple[Member, ...]
    data_root: str = ""  # the data directory it was taken from: record paths start with it
    format: int = FORMAT

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["files"] = [asdict(m) for m in self.files]
        return data

    @classmethod
    def from_json(cls, data: Any, where: str) -> Listing:
        try:
            if data["format"] != FORMAT:
                raise DamagedSnapshot(
                    f"{where} is a snapshot of format {data['format']}; this Blazar reads "
                    f"format {FORMAT}: restore it with the Blazar that made it "
                    f"({data.get('blazar', 'unknown')})"
                )
            files = tuple(
                Member(str(f["name"]), int(f["size"]), str(f["sha256"])) for f in data["files"]
            )
            if any(m.size < 0 for m in files):
                raise ValueError("a member's size is negative")
            return cls(
                created=str(data["created"]),
                blazar=str(data["blazar"]),
                host=str(data["host"]),
                with_models=bool(data["with_models"]),
                counts={str(k): int(v) for k, v in dict(data["counts"]).items()},
                files=files,
                data_root=str(data.get("data_root", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DamagedSnapshot(f"{where}: {LISTING} is not a snapshot listing ({exc})") from None


@dataclass(frozen=True)
class Created:
    path: Path
    listing: Listing
    size: int  # bytes of the archive


def snapshots_dir(paths: Paths) -> Path:
    return paths.data / "snapshots"


def default_name(now: datetime, with_models: bool) -> str:
    return f"blazar-{now.strftime(_STAMP)}.tar" + ("" if with_models else ".gz")


# -- create -------------------------------------------------------------------------------


def backup_store(db: Path, dest: Path) -> None:
    """Copy the store with SQLite's online backup API (consistent while others write), as
    one self-contained file (rollback journal, not WAL), checked by integrity_check."""
    source = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    target = sqlite3.connect(str(dest))
    try:
        source.backup(target)
        target.execute("PRAGMA journal_mode=DELETE")
        (status,) = target.execute("PRAGMA integrity_check").fetchone()
        if status != "ok":
            raise VerificationFailed(f"the copy of {db} fails SQLite's integrity check: {status}")
    finally:
        target.close()
        source.close()


def table_counts(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        return {
            t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0])
            for t in COUNTED
            if t in names
        }
    finally:
        conn.close()


def config_files(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and not p.name.startswith(".blazar-restore")
    )


def blob_files(blobs: Path) -> list[Path]:
    if not blobs.is_dir():
        return []
    return sorted(
        p
        for p in blobs.rglob("*")
        if p.is_file() and not any(part.startswith(".tmp-") for part in p.relative_to(blobs).parts)
    )


class _Hashing(io.RawIOBase):
    """A file read through a sha256, for a blob verified while it streams into the tar."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.fh.read(len(buffer))
        self.digest.update(data)
        buffer[: len(data)] = data
        return len(data)


def create(
    paths: Paths,
    dest: Path | None = None,
    *,
    with_models: bool = False,
    force: bool = False,
    now: datetime | None = None,
    notify: Callable[[str], None] | None = None,
) -> Created:
    """Write a snapshot to `dest` (a file, or a directory for the default name; default: the
    snapshots directory) under the apply lock; the archive appears only when complete."""
    now = now or datetime.now(UTC)
    name = default_name(now, with_models)
    if dest is None:
        dest = snapshots_dir(paths) / name
    elif dest.is_dir():
        dest = dest / name
    dest = dest.expanduser().absolute()
    if dest.exists() and not force:
        raise AlreadyExists(f"{dest} exists: pass --force to replace it, or give another PATH")
    with apply_lock(paths.state / "apply.lock", notify=notify):
        return write(paths, dest, with_models=with_models, now=now)


def _member(name: str, path: Path) -> Member:
    digest, size = sha256_file(path)
    return Member(name, size, digest)


def write(paths: Paths, dest: Path, *, with_models: bool, now: datetime) -> Created:
    """Write the archive (the caller holds the apply lock): files are staged first, so the
    archive holds what the lock held, then tarred to a temporary name and renamed."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = dest.parent / f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    try:
        staged: list[tuple[str, Path]] = []
        for path in config_files(paths.config):
            rel = path.relative_to(paths.config)
            copy = work / "config" / rel
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, copy)
            staged.append((f"config/{rel.as_posix()}", copy))
        counts: dict[str, int] = {}
        if paths.db.exists():
            backup_store(paths.db, work / DB_NAME)
            counts = table_counts(work / DB_NAME)
            staged.append((DB_MEMBER, work / DB_NAME))
        blobs = blob_files(paths.blobs) if with_models else []
        members = [_member(name, path) for name, path in staged]
        blob_members = [_blob_member(paths.blobs, path) for path in blobs]
        listing = Listing(
            created=now.isoformat(timespec="seconds"),
            blazar=__version__,
            host=socket.gethostname(),
            with_models=with_models,
            counts=counts,
            files=(*members, *blob_members),
            data_root=str(paths.data),
        )
        archive = work / "archive"
        with tarfile.open(archive, "w" if with_models else "w:gz") as tar:
            _add_bytes(tar, LISTING, json.dumps(listing.to_json(), indent=1).encode(), now)
            for name, path in staged:
                tar.add(str(path), arcname=name, recursive=False)
            for path, entry in zip(blobs, blob_members, strict=True):
                _add_verified(tar, path, entry)
        os.replace(archive, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Created(dest, listing, dest.stat().st_size)


def _blob_member(blobs: Path, path: Path) -> Member:
    name = f"{BLOBS_MEMBER}/{path.relative_to(blobs).as_posix()}"
    size = path.stat().st_size
    match = _BLOB.fullmatch(path.name)
    if match is not None:  # content-addressed: its hash is its name, checked as it streams
        return Member(name, size, match.group(1))
    digest, size = sha256_file(path)
    return Member(name, size, digest)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, now: datetime) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(now.timestamp())
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def _add_verified(tar: tarfile.TarFile, path: Path, entry: Member) -> None:
    info = tar.gettarinfo(str(path), arcname=entry.name)
    with path.open("rb") as fh:
        reader = _Hashing(fh)
        tar.addfile(info, io.BufferedReader(reader, CHUNK))
    if reader.digest.hexdigest() != entry.sha256 or info.size != entry.size:
        raise VerificationFailed(
            f"{path} does not hash to the sha256 its name says: the blob is damaged; "
            "`blazar doctor --deep` finds such files, `blazar rm` and `blazar pull` replace them"
        )


# -- read ---------------------------------------------------------------------------------


# What restore tells the user when it refuses an archive.
_REFUSED = (
    "nothing was restored: restore another snapshot (`blazar snapshot list` shows them) "
    "or take a new one with `blazar snapshot create`"
)


def _listing_bytes(path: Path) -> bytes:
    """`snapshot.json`, the first member, read with a size limit before it is parsed."""
    if not path.is_file():
        raise InvalidInput(f"no snapshot at {path}: `blazar snapshot list` shows the snapshots")
    try:
        data = archives.read_first(path, LISTING, limit=LISTING_LIMIT, then=_REFUSED)
    except (archives.UnsafeArchive, archives.ArchiveError) as exc:
        raise DamagedSnapshot(str(exc)) from None
    if data is None:
        raise DamagedSnapshot(f"{path} is not a Blazar snapshot: no {LISTING} first")
    return data


def _parse_listing(data: bytes, path: Path) -> Listing:
    try:
        parsed = json.loads(data)
    except ValueError as exc:
        raise DamagedSnapshot(f"{path}: cannot read {LISTING} ({exc})") from None
    return Listing.from_json(parsed, str(path))


def read_listing(path: Path) -> Listing:
    """The listing of an archive (its first member), without reading the rest."""
    return _parse_listing(_listing_bytes(path), path)


def list_snapshots(paths: Paths) -> list[tuple[Path, Listing | None, str]]:
    """The snapshots directory's archives, newest first: (path, listing or None, problem)."""
    root = snapshots_dir(paths)
    found: list[tuple[Path, Listing | None, str]] = []
    for path in sorted(root.glob("*.tar*"), key=lambda p: p.name, reverse=True):
        if not path.is_file() or ".tmp-" in path.name:
            continue
        try:
            found.append((path, read_listing(path), ""))
        except BlazarError as exc:
            found.append((path, None, str(exc)))
    return found


def _safe_name(name: str) -> bool:
    pure = PurePosixPath(name)
    top = pure.parts[0] if pure.parts else ""
    return (
        not pure.is_absolute()
        and ".." not in pure.parts
        and (top == "config" or name == DB_MEMBER or name.startswith(BLOBS_MEMBER + "/"))
    )


def unpack_verified(path: Path, into: Path) -> Listing:
    """Extract every member into `into` (empty), each checked against the listing before
    its data is read and hashed as it streams (`blazar.archives`); raise DamagedSnapshot,
    naming the member and why, on any difference, leaving `into` empty."""
    data = _listing_bytes(path)
    listing = _parse_listing(data, path)
    expected = {LISTING: archives.Expected(len(data), hashlib.sha256(data).hexdigest())}
    for member in listing.files:
        if member.name in expected or not _safe_name(member.name):
            raise DamagedSnapshot(
                f"{path}: its listing names {member.name!r}, which a snapshot cannot hold "
                f"(twice, or outside config/ and data/); {_REFUSED}"
            )
        expected[member.name] = archives.Expected(member.size, member.sha256)
    try:
        archives.extract(
            path, into, limits=archives.for_listing(expected), expected=expected, then=_REFUSED
        )
    except (archives.UnsafeArchive, archives.ArchiveError) as exc:
        raise DamagedSnapshot(str(exc)) from None
    return listing
