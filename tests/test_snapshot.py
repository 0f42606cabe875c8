"""`blazar snapshot create|restore|list` on a real store: a manifest applied with a tiny model,
a key, traces and a saved session; archives checked member by member; restore onto another
home, refusals (damaged, truncated, altered, would overwrite, daemon running)."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import sqlite3
import tarfile
import time
from pathlib import Path

import pytest

from blazar.observe import trace_store as trace_store
from blazar.paths import Paths
from blazar.snapshots import read_listing
from blazar.store.db import SessionRecord, Store
from specs.names import parse_name
from tests.conftest import Blazar

TRACES = 500


@pytest.fixture
def host(blazar: Blazar, paths: Paths, tiny_model: Path) -> Paths:
    """A host with a model, a key, a session and TRACES traces in its store."""
    paths.manifest.write_text(
        f'# my models\n[models.tiny]\nsource = "{tiny_model.as_uri()}"\nctx = 512\n'
    )
    blazar("apply")
    blazar("keys", "add", "ci")
    paths.sessions.mkdir(parents=True, exist_ok=True)
    (paths.sessions / "chat.bin").write_bytes(b"kv" * 100)
    with Store(paths.db) as store:
        store.put_session(
            SessionRecord("chat", "tiny", "saved", "chat.bin", 7, 200, "0" * 64, "t", "f16")
        )
        now = time.time()
        batch = [
            {"id": f"trace-{i}", "time": now + i, "model": "tiny", "status": 200, "n": i}
            for i in range(TRACES)
        ]
        trace_store.write(store, batch)
    return paths


def other_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Paths:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path / "other-home"))
    from blazar.paths import resolve_paths

    return resolve_paths()


def test_a_snapshot_lists_a_sha256_of_every_member_and_holds_no_key(
    blazar: Blazar, host: Paths, tmp_path: Path
) -> None:
    out = json.loads(blazar("snapshot", "create", str(tmp_path), "--json").stdout)
    archive = Path(out["path"])
    assert archive.parent == tmp_path and archive.name.endswith(".tar.gz")
    assert out["counts"]["traces"] == TRACES and out["counts"]["models"] == 1
    assert out["counts"]["keys"] == 1 and out["counts"]["sessions"] == 1
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert names[0] == "snapshot.json"
        listed = {f["name"]: f for f in out["files"]}
        assert (
            set(names[1:])
            == set(listed)
            == {
                "config/blazar.toml",
                "config/blazar.lock",
                "data/blazar.db",
            }
        )
        manifest = tar.extractfile("config/blazar.toml").read().decode()  # type: ignore[union-attr]
    assert "# my models" in manifest and "[keys.ci]" in manifest
    assert "plm_" not in manifest  # only the key's hash was ever written
    assert not any(n.startswith("data/models") for n in names)  # no blobs without --with-models
    assert read_listing(archive).counts == out["counts"]  # read back from the first member
    listed_rows = [json.loads(line) for line in blazar("snapshot", "list", "--json").stdout.split()]
    assert listed_rows == []  # list shows the snapshots directory; this one went elsewhere
    blazar("snapshot", "create")
    rows = blazar("snapshot", "list").stdout
    assert "blazar-" in rows and f"{TRACES} traces" in rows


def test_the_store_is_copied_with_the_backup_api_wal_pages_included(
    blazar: Blazar, host: Paths, tmp_path: Path
) -> None:
    """Rows committed but still in the WAL file are in the snapshot; a copy of the main
    database file alone would not have them (the reason for SQLite's backup API)."""
    writer = sqlite3.connect(str(host.db))
    writer.execute("PRAGMA wal_autocheckpoint=0")  # keep what follows in the WAL
    with writer:
        writer.execute(
            "INSERT INTO traces (trace_id, time, model, status, record) VALUES (?, ?, ?, ?, ?)",
            ["in-the-wal", time.time(), "tiny", 200, "{}"],
        )
    reader = sqlite3.connect(str(host.db))  # held open: the WAL cannot be folded back in
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM traces").fetchone()
    assert Path(f"{host.db}-wal").stat().st_size > 0
    naive = tmp_path / "naive.db"
    shutil.copyfile(host.db, naive)
    count = sqlite3.connect(str(naive)).execute(
        "SELECT count(*) FROM traces WHERE trace_id = 'in-the-wal'"
    )
    assert count.fetchone()[0] == 0  # what copying the file would have lost
    out = json.loads(blazar("snapshot", "create", str(tmp_path / "s.tar.gz"), "--json").stdout)
    assert out["counts"]["traces"] == TRACES + 1
    reader.rollback()
    reader.close()
    writer.close()


def test_restore_onto_another_home_keeps_records_whose_files_are_here(
    blazar: Blazar, host: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = Path(json.loads(blazar("snapshot", "create", str(tmp_path), "--json").stdout)["path"])
    shutil.rmtree(host.blobs)  # as on another machine: the first home's model file is gone
    other = other_home(tmp_path, monkeypatch)
    done = blazar("snapshot", "restore", str(archive), "--json")
    out = json.loads(done.stdout)
    assert out["config_files"] == ["blazar.lock", "blazar.toml"]
    # The model's blob is gone and the session's file is not under this home's sessions.
    assert out["dropped"] == {"models": ["tiny:latest"], "sessions": ["chat"]}
    assert other.manifest.read_text() == host.manifest.read_text()
    with Store(other.db) as store:
        assert store.find_model(parse_name("tiny")) is None
        assert [k.name for k in store.list_keys()] == ["ci"]
        assert trace_store.find(store, "trace-42")["n"] == 42  # type: ignore[index]
    # apply fetches what was dropped again, from the manifest restored
    blazar("apply")
    with Store(other.db) as store:
        assert store.get_model(parse_name("tiny")).path.startswith(str(other.data))


def test_with_models_the_blobs_come_back_verified(
    blazar: Blazar, host: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = json.loads(blazar("snapshot", "create", str(tmp_path), "--with-models", "--json").stdout)
    archive = Path(out["path"])
    assert archive.name.endswith(".tar") and out["with_models"] is True
    with Store(host.db) as store:
        record = store.get_model(parse_name("tiny"))
    blob = f"data/models/blobs/sha256-{record.sha256}"
    assert {f["name"]: f["sha256"] for f in out["files"]}[blob] == record.sha256
    shutil.rmtree(host.blobs)  # as on another machine
    other = other_home(tmp_path, monkeypatch)
    result = json.loads(blazar("snapshot", "restore", str(archive), "--json").stdout)
    assert result["blobs"] == 1 and result["dropped"] == {"sessions": ["chat"]}
    with Store(other.db) as store:  # the record is this home's, pointing at its own blob
        restored = store.get_model(parse_name("tiny"))
    assert restored.path == str(other.blobs / f"sha256-{record.sha256}")
    assert Path(restored.path).read_bytes() == (tmp_path / "src" / "tiny.gguf").read_bytes()
    assert "tiny" in blazar("list").stdout
    assert "No changes." in blazar("diff").stdout  # the store matches the restored manifest


def test_restore_never_overwrites_without_force_and_keeps_what_force_replaced(
    blazar: Blazar, host: Paths, tmp_path: Path
) -> None:
    archive = Path(json.loads(blazar("snapshot", "create", str(tmp_path), "--json").stdout)["path"])
    host.manifest.write_text(host.manifest.read_text() + "\n# edited after the snapshot\n")
    refused = blazar("snapshot", "restore", str(archive), ok=False)
    assert refused.exit_code == 1
    assert "would overwrite" in refused.output and "--force" in refused.output
    assert str(host.manifest) in refused.output and "store holds records" in refused.output
    assert "edited after" in host.manifest.read_text()  # nothing changed
    done = blazar("snapshot", "restore", str(archive), "--force", "--json")
    before = Path(json.loads(done.stdout)["before"])
    assert "edited after" not in host.manifest.read_text()
    with tarfile.open(before) as tar:  # what --force replaced was kept first
        kept = tar.extractfile("config/blazar.toml").read().decode()  # type: ignore[union-attr]
    assert "edited after" in kept
    with Store(host.db) as store:  # the restored store is whole and usable
        assert store.find_model(parse_name("tiny")) is not None
        assert len(store.list_sessions()) == 1


def _rewrite(archive: Path, dest: Path, change: dict[str, bytes]) -> None:
    """Copy an archive, replacing some members' bytes (the listing left as it was)."""
    with tarfile.open(archive) as src, tarfile.open(dest, "w:gz") as out:
        for info in src:
            data = src.extractfile(info).read()  # type: ignore[union-attr]
            data = change.get(info.name, data)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("damage", ["altered", "truncated", "flipped", "extra", "not-a-tar"])
def test_restore_refuses_a_damaged_archive_and_changes_nothing(
    blazar: Blazar, host: Paths, tmp_path: Path, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = Path(json.loads(blazar("snapshot", "create", str(tmp_path), "--json").stdout)["path"])
    bad = tmp_path / "bad.tar.gz"
    if damage == "altered":  # a member edited, its listed sha256 left
        _rewrite(archive, bad, {"config/blazar.toml": b'[models.evil]\nsource = "x"\n'})
    elif damage == "truncated":
        bad.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    elif damage == "flipped":  # one byte of the compressed stream
        data = bytearray(archive.read_bytes())
        data[len(data) // 2] ^= 0xFF
        bad.write_bytes(bytes(data))
    elif damage == "extra":  # a member the listing does not name
        raw = gzip.decompress(archive.read_bytes())
        with tarfile.open(fileobj=io.BytesIO(raw)) as src, tarfile.open(bad, "w:gz") as out:
            for info in src:
                out.addfile(info, src.extractfile(info))
            extra = tarfile.TarInfo("config/extra.toml")
            extra.size = 3
            out.addfile(extra, io.BytesIO(b"x=1"))
    else:
        bad.write_bytes(b"not an archive at all")
    other = other_home(tmp_path, monkeypatch)
    refused = blazar("snapshot", "restore", str(bad), ok=False)
    assert refused.exit_code == 1, refused.output
    assert "nothing was restored" in refused.output or "not" in refused.output
    assert "Traceback" not in refused.output
    assert not other.manifest.exists()
    assert not other.db.exists() or Store(other.db).list_models() == []
    assert not [p for p in other.data.iterdir() if p.name.startswith(".blazar-restore")]


def test_restore_refuses_while_serve_runs(blazar: Blazar, host: Paths, tmp_path: Path) -> None:
    archive = Path(json.loads(blazar("snapshot", "create", str(tmp_path), "--json").stdout)["path"])
    (host.state / "serve.json").write_text(json.dumps({"pid": os.getpid(), "url": "x"}))
    refused = blazar("snapshot", "restore", str(archive), "--force", ok=False)
    assert f"`blazar serve` is running (pid {os.getpid()})" in refused.output
    assert blazar("snapshot", "create", str(tmp_path / "live.tar.gz")).exit_code == 0
