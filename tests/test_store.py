"""The SQLite store: migrations from blank, WAL, atomic writes."""

from __future__ import annotations

import datetime as dt
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from blazar.errors import NotFound
from blazar.store.db import ModelRecord, Store
from blazar.store.schema import MIGRATIONS
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
            "key_usage",
            "audio_jobs",
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
        assert db["key_usage"].columns_dict == {"name": str, "last_used": str}
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
    written = ModelRecord(
        name="tiny",
        tag="q4",
        path="/x",
        held="link",
        size=123_456,
        sha256="ab" * 32,
        source="file:///src/tiny.gguf",
        architecture="llama",
        parameters=1_234_567,
        quantization="Q4_K_M",
        context_length=2048,
        facts={"n_layer": 2, "head_count": [4, 4]},
        added_at="2026-12-01T10:00:00Z",
        managed=True,
        settings={"ctx": 1024, "pin": False},
    )
    with Store(tmp_path / "blazar.db") as store:
        store.put_model(written, event="imported")
        # What SQLite holds, column by column, stated here rather than derived from the record.
        [row] = store.db.execute("SELECT * FROM models").fetchall()
        assert row == (
            "tiny",
            "q4",
            "/x",
            "link",
            123_456,
            "ab" * 32,
            "file:///src/tiny.gguf",
            "llama",
            1_234_567,
            "Q4_K_M",
            2048,
            '{"head_count": [4, 4], "n_layer": 2}',
            "2026-12-01T10:00:00Z",
            1,
            '{"ctx": 1024, "pin": false}',
        )
        got = store.get_model(parse_name("tiny:q4"))
        assert (got.name, got.tag, got.path, got.held, got.size, got.sha256, got.source) == (
            "tiny",
            "q4",
            "/x",
            "link",
            123_456,
            "ab" * 32,
            "file:///src/tiny.gguf",
        )
        assert (got.architecture, got.parameters, got.quantization, got.context_length) == (
            "llama",
            1_234_567,
            "Q4_K_M",
            2048,
        )
        assert got.facts == {"n_layer": 2, "head_count": [4, 4]}
        assert got.settings == {"ctx": 1024, "pin": False}
        assert got.added_at == "2026-12-01T10:00:00Z" and got.managed is True
        assert [(r.name, r.tag) for r in store.list_models()] == [("tiny", "q4")]
        assert store.paths_in_use("/x") == 1
        store.delete_model(parse_name("tiny:q4"))
        with pytest.raises(NotFound, match="blazar list"):
            store.get_model(parse_name("tiny:q4"))
        actions = [e["action"] for e in store.events("model")]
        assert actions == ["imported", "removed"]


def test_a_record_without_optional_fields_reads_back_with_defaults(tmp_path: Path) -> None:
    with Store(tmp_path / "blazar.db") as store:
        store.put_model(_record(), event="imported")
        got = store.get_model(parse_name("tiny"))
    assert (got.name, got.tag, got.held, got.size) == ("tiny", "latest", "copy", 1)
    assert (got.architecture, got.parameters, got.quantization, got.context_length) == (
        None,
        None,
        None,
        None,
    )
    assert got.facts == {} and got.settings == {} and got.managed is False
    added = dt.datetime.fromisoformat(got.added_at)  # stamped when written, in UTC
    assert added.utcoffset() == dt.timedelta(0)
    assert abs(dt.datetime.now(dt.UTC) - added) < dt.timedelta(minutes=5)


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


def test_key_use_is_kept_by_name(tmp_path: Path) -> None:
    with Store(tmp_path / "blazar.db") as store:
        store.record_key_use({"ci": "2026-12-01T10:00:00+00:00"})
        store.record_key_use({"ci": "2026-12-01T11:00:00+00:00", "ops": "2026-12-01T09:00Z"})
        store.record_key_use({})
        assert store.key_usage() == {
            "ci": "2026-12-01T11:00:00+00:00",
            "ops": "2026-12-01T09:00Z",
        }


HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], timeout=30)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO key_usage (name, last_used) VALUES ('other', 'now')")
print("holding", flush=True)
time.sleep(0.5)
conn.commit()
"""


def test_a_write_waits_for_another_process_writing_instead_of_failing(tmp_path: Path) -> None:
    """serve and a CLI command write the same store: a transaction that reads and then
    writes (a condition keeps its last transition) waits for the other's write lock and
    goes on; begun deferred, its read snapshot went stale and SQLite refused it at once,
    "database is locked" (seen while `blazar lora add` applied beside a running serve)."""
    store = Store(tmp_path / "blazar.db")
    store.set_condition("model", "tiny", "Ready", "False", "Pulling", "")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "blazar.db")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        store.set_condition("model", "tiny", "Ready", "True", "Served", "")
    finally:
        assert holder.wait(timeout=30) == 0
    assert [(c.status, c.reason) for c in store.conditions()] == [("True", "Served")]
    assert store.key_usage() == {"other": "now"}  # the other's write is kept too
