"""The SQLite store: migrations from blank, WAL, atomic writes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from blazar.errors import NotFound
from blazar.migrations import MIGRATIONS
from blazar.store import ModelRecord, Store
from specs.names import parse_name


def test_blank_database_migrates_to_the_full_schema(tmp_path: Path) -> None:
    with Store(tmp_path / "blazar.db") as store:
        db = store.db
        assert set(db.table_names()) >= {
            "_migrations",
            "models",
            "events",
            "engines",
            "engine_switches",
            "bench",
            "loras",
            "keys",
            "conditions",
        }
        assert [r["name"] for r in db["_migrations"].rows] == [m.__name__ for m in MIGRATIONS]
        assert db["models"].columns_dict == {
            "name": str,
            "tag": str,
            "path": str,
            "held": str,
            "size": int,
            "sha256": str,
            "source": str,
            "architecture": str,
            "parameters": int,
            "quantization": str,
            "context_length": int,
            "facts": str,
            "added_at": str,
            "managed": int,
            "settings": str,
        }
        assert db["models"].pks == ["name", "tag"]
        assert set(db["events"].columns_dict) == {
            "id",
            "time",
            "kind",
            "subject",
            "action",
            "message",
        }
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_migrations_run_once(tmp_path: Path) -> None:
    Store(tmp_path / "blazar.db").close()
    with Store(tmp_path / "blazar.db") as store:
        names = [r["name"] for r in store.db["_migrations"].rows]
    assert len(names) == len(set(names)) == len(MIGRATIONS)


def test_migration_names_are_numbered_and_in_order() -> None:
    names = [m.__name__ for m in MIGRATIONS]
    assert names == sorted(names)
    assert all(n[0] == "m" and n[1:4].isdigit() for n in names)


def _record(name: str = "tiny", path: str = "/x") -> ModelRecord:
    return ModelRecord(
        name=name, tag="latest", path=path, held="copy", size=1, sha256="0" * 64, source="s"
    )


def test_put_get_list_delete_round_trip(tmp_path: Path) -> None:
    with Store(tmp_path / "blazar.db") as store:
        store.put_model(_record(), event="imported")
        got = store.get_model(parse_name("tiny"))
        assert got == _record().__class__(**{**got.__dict__})
        assert [r.name for r in store.list_models()] == ["tiny"]
        assert store.paths_in_use("/x") == 1
        store.delete_model(parse_name("tiny"))
        with pytest.raises(NotFound, match="blazar list"):
            store.get_model(parse_name("tiny"))
        actions = [e["action"] for e in store.events("model")]
        assert actions == ["imported", "removed"]


def test_a_failed_write_leaves_no_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model row and its event are one transaction: a failing event write undoes the row."""
    with Store(tmp_path / "blazar.db") as store:

        def boom(*args: object) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(store, "_event", boom)
        with pytest.raises(sqlite3.OperationalError):
            store.put_model(_record())
        assert store.list_models() == []


def test_data_written_is_visible_to_another_connection(tmp_path: Path) -> None:
    with Store(tmp_path / "blazar.db") as one, Store(tmp_path / "blazar.db") as two:
        one.put_model(_record("a"))
        assert [r.name for r in two.list_models()] == ["a"]
