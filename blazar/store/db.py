"""Blazar's store: the single record of observed state, in SQLite, and its records.

What the store holds are plain frozen dataclasses (`ModelRecord`, `LoraRecord`, ...);
those with JSON or flag columns share one row codec (`StoredRecord`).

Opened through sqlite-utils in WAL mode (readers never block the writer);
migrations from `blazar.store.schema` run on every open. Callers get and put
plain dataclasses; every multi-row write runs in one transaction so the store
is never left half-written. The writers that batch what serve saw (traces, audio jobs,
message batches, key use) go through `insert_isolated`, so one record the store refuses
never costs the others. sqlite-utils itself is imported when the first
store is opened (`open_database`): commands that open none do not pay for it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sqlite3
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

from blazar.errors import NotFound
from blazar.store.schema import migrate
from specs.names import ModelName, closest_name

if TYPE_CHECKING:
    import sqlite_utils

__all__ = [
    "HELD_KINDS",
    "RECORD_FAULTS",
    "Condition",
    "KeyRecord",
    "LoraRecord",
    "ModelRecord",
    "ProjectorRecord",
    "SessionRecord",
    "Store",
    "StoredRecord",
    "Written",
    "insert_isolated",
    "open_database",
    "storable",
    "utcnow",
    "utcnow_us",
]

# -- the records -----------------------------------------------------------------
HELD_KINDS = ("hardlink", "copy", "reference")


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def utcnow_us() -> str:
    """To the microsecond: what least-recently-used orders by."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class StoredRecord:
    """A record kept as one row of its table: the fields named in `JSON` as JSON text (sorted
    keys; read back through the type it maps them to), the flags in `FLAGS` as 0 or 1, every
    other field as it is. One codec for every record with such fields, not a pair each."""

    JSON: ClassVar[Mapping[str, type]] = {}
    FLAGS: ClassVar[tuple[str, ...]] = ("managed",)

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        for name in self.JSON:
            row[name] = json.dumps(row[name], sort_keys=True)
        for name in self.FLAGS:
            row[name] = int(row[name])
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        data = dict(row)
        for name, kind in cls.JSON.items():
            text = data.get(name)
            data[name] = kind(json.loads(text)) if text else kind()
        for name in cls.FLAGS:
            data[name] = bool(data.get(name))
        return cls(**data)


@dataclass(frozen=True)
class ModelRecord(StoredRecord):
    """One model Blazar holds, as the store records it."""

    JSON: ClassVar[Mapping[str, type]] = {"facts": dict, "settings": dict}

    name: str
    tag: str
    path: str
    held: str
    size: int
    sha256: str
    source: str
    architecture: str | None = None
    parameters: int | None = None
    quantization: str | None = None
    context_length: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    added_at: str = field(default_factory=utcnow)
    managed: bool = False  # a manifest owns it (created by apply), not `blazar import`
    settings: dict[str, Any] = field(default_factory=dict)  # runtime fields last applied

    @property
    def ref(self) -> ModelName:
        return ModelName(self.name, self.tag)

    @property
    def kind(self) -> str:
        """chat (a GGUF, or a safetensors set), transcription or speech (a set of files:
        `blazar.models.filesets`)."""
        kind = self.facts.get("kind")
        return kind if isinstance(kind, str) else "chat"

    @property
    def is_set(self) -> bool:
        """A directory of files (`blazar.models.filesets`), not one GGUF (or its shards)."""
        return self.kind != "chat" or self.facts.get("format") == "safetensors"


@dataclass(frozen=True)
class LoraRecord(StoredRecord):
    """A LoRA adapter Blazar holds, bound to its base model."""

    JSON: ClassVar[Mapping[str, type]] = {"settings": dict}

    name: str
    model: str
    path: str
    size: int
    sha256: str
    source: str
    architecture: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    managed: bool = True
    added_at: str = field(default_factory=utcnow)


@dataclass(frozen=True)
class ProjectorRecord(StoredRecord):
    """A vision projector (mmproj GGUF) Blazar holds for a model (`models.NAME.mmproj`)."""

    JSON: ClassVar[Mapping[str, type]] = {"facts": dict, "settings": dict}

    model: str  # the model's short name
    path: str
    size: int
    sha256: str
    source: str  # as declared (a source, or "auto")
    facts: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    managed: bool = True
    added_at: str = field(default_factory=utcnow)

    @property
    def vision(self) -> bool:
        """It reads images (an audio-only projector does not)."""
        return bool(self.facts.get("vision", True))


@dataclass(frozen=True)
class KeyRecord(StoredRecord):
    """An API key: its name, the hash of its secret and the models it may use."""

    JSON: ClassVar[Mapping[str, type]] = {"models": tuple}

    name: str
    sha256: str
    models: tuple[str, ...]
    managed: bool = True
    added_at: str = field(default_factory=utcnow)


@dataclass(frozen=True)
class SessionRecord:
    """A saved KV session: which model, engine and cache it belongs to, and its file."""

    name: str
    model: str
    kind: str  # saved (by `blazar session save`) | bank (by the session bank)
    file: str  # the file's name under `Paths.sessions`
    n_tokens: int
    size: int
    model_sha256: str
    engine_tag: str
    cache_type: str
    created_at: str = field(default_factory=utcnow)
    last_used: str = field(default_factory=utcnow_us)


@dataclass(frozen=True)
class Condition:
    kind: str
    name: str
    type: str
    status: str
    reason: str
    message: str
    last_transition: str
    updated_at: str


# -- the store -------------------------------------------------------------------

# sqlite-utils imports these, when installed, only to map their scalar types to column
# types; Blazar never stores them, and numpy alone adds about 30 ms to every command
# that opens the store.
_OPTIONAL_IMPORTS = ("numpy", "pandas")


def open_database(conn: sqlite3.Connection) -> sqlite_utils.Database:
    """A sqlite-utils `Database` on `conn`, without third-party sqlite-utils plugins.

    The first call imports sqlite-utils with numpy and pandas hidden when they are not
    loaded yet (sqlite-utils then runs without its optional numpy/pandas column types;
    a later `import numpy` works as usual). Plugins are not run: they would touch
    Blazar's store, and finding them scans every installed package's entry points.
    """
    if "sqlite_utils" not in sys.modules:
        hidden = [name for name in _OPTIONAL_IMPORTS if name not in sys.modules]
        for name in hidden:
            sys.modules[name] = None  # type: ignore[assignment]  # `import name` fails
        try:
            import sqlite_utils  # noqa: F401  # imported here, with numpy and pandas hidden
        finally:
            for name in hidden:
                if sys.modules.get(name, "") is None:
                    del sys.modules[name]
    return _database_class()(conn, execute_plugins=False)


@functools.cache
def _database_class() -> type[sqlite_utils.Database]:
    """sqlite-utils' `Database`, with `atomic()` opening its transaction IMMEDIATE.

    sqlite-utils begins a deferred transaction: one that reads and then writes (a
    condition's transition, a record and its journal) upgrades its read snapshot to a
    write, and in WAL mode SQLite refuses that upgrade at once, without waiting out the
    busy timeout, when another process (serve, while a CLI command applies) wrote in
    between: "database is locked". IMMEDIATE takes the write lock first, waiting for it.
    """
    import sqlite_utils

    class Database(sqlite_utils.Database):
        @contextlib.contextmanager
        def atomic(self) -> Iterator[sqlite_utils.Database]:
            if self.conn.in_transaction:  # nested: sqlite-utils' savepoint
                with super().atomic():
                    yield self
                return
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self
                self.conn.execute("COMMIT")
            except BaseException:
                self.rollback()
                raise

    return Database


# What one record's values can make a write fail with while the store itself is fine: text
# SQLite cannot take as UTF-8 (a lone surrogate: a byte that was not UTF-8, decoded with
# surrogateescape), an integer past 64 bits, a type it cannot bind, a constraint. A fault
# of the store (locked, full, unreadable: sqlite3.OperationalError and its kin) is not one.
RECORD_FAULTS: tuple[type[Exception], ...] = (
    ValueError,  # UnicodeEncodeError among them
    OverflowError,
    TypeError,
    sqlite3.InterfaceError,
    sqlite3.ProgrammingError,
    sqlite3.IntegrityError,
    sqlite3.DataError,
)
_INT64 = (-(2**63), 2**63 - 1)


def storable(value: Any) -> Any:
    """`value` as SQLite can always bind it: text with every lone surrogate escaped (one
    that carried a byte, as surrogateescape makes them, as `\\xNN`; any other as
    `\\uNNNN`), an integer past 64 bits as its digits, another type as its `str`."""
    if value is None or isinstance(value, float | bytes):
        return value
    if isinstance(value, int):
        return int(value) if _INT64[0] <= value <= _INT64[1] else str(value)
    text = value if isinstance(value, str) else str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join(_escaped(ch) for ch in text)
    return text


def _escaped(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's: the byte it stood for
        return f"\\x{code - 0xDC00:02x}"
    if 0xD800 <= code <= 0xDFFF:
        return f"\\u{code:04x}"
    return ch


@dataclass(frozen=True)
class Written:
    """What `insert_isolated` did with a batch's rows."""

    rows: int = 0  # written as they were
    escaped: int = 0  # refused, then written with their values made `storable`
    dropped: int = 0  # refused even so: left out, so that the rest was written

    @property
    def total(self) -> int:
        return self.rows + self.escaped


def insert_isolated(conn: sqlite3.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> Written:
    """Run `sql` once per row within the caller's transaction (begun here if none is open;
    the caller commits), so that one bad row never costs the rest of its batch.

    All rows at once first (one `executemany`, the usual case). If a row is refused for
    what it holds (`RECORD_FAULTS`), that attempt is rolled back to a savepoint and the
    rows go one by one: a refused row once more with its values made `storable`, and one
    refused even then is left out and counted. A fault of the store itself is raised as
    before, for the caller's retry.
    """
    if not rows:
        return Written()
    if not conn.in_transaction:
        conn.execute("BEGIN")
    conn.execute("SAVEPOINT isolated")
    try:
        conn.executemany(sql, rows)
    except RECORD_FAULTS:
        conn.execute("ROLLBACK TO isolated")
        conn.execute("RELEASE isolated")
    else:
        conn.execute("RELEASE isolated")
        return Written(rows=len(rows))
    written = escaped = dropped = 0
    for row in rows:
        try:
            conn.execute(sql, row)
            written += 1
            continue
        except RECORD_FAULTS:
            pass
        try:
            conn.execute(sql, [storable(v) for v in row])
            escaped += 1
        except RECORD_FAULTS:
            dropped += 1
    return Written(written, escaped, dropped)


class Store:
    """The SQLite store. One instance per process; cheap to open."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        conn = sqlite3.connect(str(path), timeout=30)
        self.db = open_database(conn)
        self.db.enable_wal()
        self.db.execute("PRAGMA foreign_keys = ON")
        migrate(self.db)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- models ---------------------------------------------------------------

    def get_model(self, ref: ModelName) -> ModelRecord:
        rows = list(self.db["models"].rows_where("name = ? AND tag = ?", [ref.name, ref.tag]))
        if not rows:
            close = closest_name(ref.short, (r.ref.short for r in self.list_models()))
            meant = f" (did you mean '{close}'?)" if close else ""
            raise NotFound(
                f"model '{ref.short}' is not in the store{meant}: run `blazar list` to see models"
            )
        return ModelRecord.from_row(rows[0])

    def find_model(self, ref: ModelName) -> ModelRecord | None:
        try:
            return self.get_model(ref)
        except NotFound:
            return None

    def list_models(self) -> list[ModelRecord]:
        rows = self.db["models"].rows_where(order_by="name, tag")
        return [ModelRecord.from_row(r) for r in rows]

    def put_model(self, record: ModelRecord, *, event: str = "imported") -> None:
        """Insert or replace a model's record, journaling the change, atomically."""
        with self.db.atomic():
            self.db["models"].upsert(record.to_row(), pk=("name", "tag"))  # type: ignore[union-attr]
            self._event("model", record.ref.short, event, f"{record.path} ({record.held})")

    def delete_model(self, ref: ModelName) -> None:
        with self.db.atomic():
            self.db.execute("DELETE FROM models WHERE name = ? AND tag = ?", [ref.name, ref.tag])
            self._event("model", ref.short, "removed", "")

    def paths_in_use(self, path: str) -> int:
        """How many model, adapter or projector records point at this file (blobs are
        shared)."""
        row = self.db.execute(
            "SELECT (SELECT count(*) FROM models WHERE path = ?)"
            " + (SELECT count(*) FROM loras WHERE path = ?)"
            " + (SELECT count(*) FROM projectors WHERE path = ?)",
            [path, path, path],
        ).fetchone()
        return int(row[0])

    # -- LoRA adapters --------------------------------------------------------

    def find_lora(self, name: str) -> LoraRecord | None:
        rows = list(self.db["loras"].rows_where("name = ?", [name]))
        return LoraRecord.from_row(rows[0]) if rows else None

    def list_loras(self) -> list[LoraRecord]:
        return [LoraRecord.from_row(r) for r in self.db["loras"].rows_where(order_by="name")]

    def put_lora(self, record: LoraRecord) -> None:
        with self.db.atomic():
            self.db["loras"].upsert(record.to_row(), pk="name")  # type: ignore[union-attr]
            self._event("lora", record.name, "imported", f"{record.path} for {record.model}")

    def delete_lora(self, name: str) -> None:
        with self.db.atomic():
            self.db.execute("DELETE FROM loras WHERE name = ?", [name])
            self._event("lora", name, "removed", "")

    # -- vision projectors ----------------------------------------------------

    def find_projector(self, model: str) -> ProjectorRecord | None:
        rows = list(self.db["projectors"].rows_where("model = ?", [model]))
        return ProjectorRecord.from_row(rows[0]) if rows else None

    def list_projectors(self) -> list[ProjectorRecord]:
        rows = self.db["projectors"].rows_where(order_by="model")
        return [ProjectorRecord.from_row(r) for r in rows]

    def put_projector(self, record: ProjectorRecord) -> None:
        with self.db.atomic():
            self.db["projectors"].upsert(record.to_row(), pk="model")  # type: ignore[union-attr]
            self._event("projector", record.model, "imported", f"{record.path} ({record.source})")

    def delete_projector(self, model: str) -> None:
        with self.db.atomic():
            self.db.execute("DELETE FROM projectors WHERE model = ?", [model])
            self._event("projector", model, "removed", "")

    # -- API keys -------------------------------------------------------------

    def list_keys(self) -> list[KeyRecord]:
        return [KeyRecord.from_row(r) for r in self.db["keys"].rows_where(order_by="name")]

    def put_key(self, record: KeyRecord) -> None:
        with self.db.atomic():
            self.db["keys"].upsert(record.to_row(), pk="name")  # type: ignore[union-attr]
            self._event("key", record.name, "put", "")

    def delete_key(self, name: str) -> None:
        with self.db.atomic():
            self.db.execute("DELETE FROM keys WHERE name = ?", [name])
            self._event("key", name, "removed", "")

    # -- sessions -------------------------------------------------------------

    def find_session(self, name: str) -> SessionRecord | None:
        rows = list(self.db["sessions"].rows_where("name = ?", [name]))
        return SessionRecord(**rows[0]) if rows else None

    def list_sessions(
        self, model: str | None = None, kind: str | None = None
    ) -> list[SessionRecord]:
        """Sessions, most recently used first; of one model or kind when given."""
        where, args = [], []
        for column, value in (("model", model), ("kind", kind)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        rows = self.db["sessions"].rows_where(
            " AND ".join(where) or None, args, order_by="last_used DESC, name"
        )
        return [SessionRecord(**r) for r in rows]

    def put_session(self, record: SessionRecord) -> None:
        with self.db.atomic():
            self.db["sessions"].upsert(asdict(record), pk="name")  # type: ignore[union-attr]
            self._event(
                "session", record.name, "saved", f"{record.model}: {record.n_tokens} tokens"
            )

    def touch_session(self, name: str) -> None:
        with self.db.atomic():
            self.db.execute("UPDATE sessions SET last_used = ? WHERE name = ?", [utcnow_us(), name])

    def delete_session(self, name: str, reason: str = "removed") -> None:
        with self.db.atomic():
            self.db.execute("DELETE FROM sessions WHERE name = ?", [name])
            self._event("session", name, reason, "")

    def record_key_use(self, last_used: dict[str, str]) -> None:
        """Remember when keys were last used (name -> ISO 8601 time), in one transaction."""
        if not last_used:
            return
        # One plain upsert: its first statement writes, so SQLite waits for the write lock
        # (busy timeout) instead of failing on a read snapshot another writer made stale.
        with self.db.conn:
            insert_isolated(
                self.db.conn,
                "INSERT INTO key_usage (name, last_used) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET last_used = excluded.last_used",
                list(last_used.items()),
            )

    def key_usage(self) -> dict[str, str]:
        """When each key name was last used (ISO 8601, UTC)."""
        return {r["name"]: r["last_used"] for r in self.db["key_usage"].rows}

    # -- conditions -----------------------------------------------------------

    def set_condition(
        self, kind: str, name: str, type_: str, status: str, reason: str, message: str
    ) -> None:
        """Write a condition; its last_transition moves only when its status changes."""
        now = utcnow()
        with self.db.atomic():
            row = self.db.execute(
                "SELECT status, last_transition FROM conditions"
                " WHERE kind = ? AND name = ? AND type = ?",
                [kind, name, type_],
            ).fetchone()
            transition = row[1] if row and row[0] == status else now
            self.db["conditions"].upsert(  # type: ignore[union-attr]
                {
                    "kind": kind,
                    "name": name,
                    "type": type_,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "last_transition": transition,
                    "updated_at": now,
                },
                pk=("kind", "name", "type"),
            )

    def conditions(self) -> list[Condition]:
        rows = self.db["conditions"].rows_where(order_by="kind, name, type")
        return [Condition(**r) for r in rows]

    def delete_condition(self, kind: str, name: str, type_: str) -> None:
        with self.db.atomic():
            self.db.execute(
                "DELETE FROM conditions WHERE kind = ? AND name = ? AND type = ?",
                [kind, name, type_],
            )

    def delete_conditions(self, kind: str, name: str) -> None:
        with self.db.atomic():
            self.db.execute("DELETE FROM conditions WHERE kind = ? AND name = ?", [kind, name])

    # -- owners: which manifest applied each resource last -------------------------------

    def owners(self, kind: str) -> dict[str, str]:
        """name -> the manifest (its resolved path) that applied it last, for one kind."""
        rows = self.db.execute("SELECT name, manifest FROM owners WHERE kind = ?", [kind])
        return {str(name): str(manifest) for name, manifest in rows.fetchall()}

    def set_owners(self, manifest: str, resources: Sequence[tuple[str, str]]) -> None:
        """Record `manifest` as having applied each (kind, name), in one transaction."""
        with self.db.atomic():
            self.db.conn.executemany(
                "INSERT INTO owners (kind, name, manifest) VALUES (?, ?, ?) "
                "ON CONFLICT (kind, name) DO UPDATE SET manifest = excluded.manifest",
                [(kind, name, manifest) for kind, name in resources],
            )

    # -- footprints: what a model's child used once loaded -------------------------------

    def footprints(self) -> dict[tuple[str, str, str], int]:
        """(model, sha256, device kind) -> the bytes one instance of it was measured at."""
        rows = self.db.execute("SELECT model, sha256, device, bytes FROM footprints")
        return {(str(m), str(s), str(d)): int(b) for m, s, d, b in rows.fetchall()}

    def put_footprint(self, model: str, sha256: str, device: str, size: int) -> None:
        """Record what one instance of a model used (the latest measure wins)."""
        with self.db.atomic():
            self.db.conn.execute(
                "INSERT INTO footprints (model, sha256, device, bytes, measured_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (model, sha256, device) DO UPDATE SET "
                "bytes = excluded.bytes, measured_at = excluded.measured_at",
                [model, sha256, device, size, utcnow()],
            )

    # -- events ---------------------------------------------------------------

    def _event(self, kind: str, subject: str, action: str, message: str) -> None:
        row = {"time": utcnow(), "kind": kind, "subject": subject, "action": action}
        self.db["events"].insert({**row, "message": message})  # type: ignore[union-attr]

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        where = "kind = ?" if kind else None
        return list(self.db["events"].rows_where(where, [kind] if kind else [], order_by="id"))
