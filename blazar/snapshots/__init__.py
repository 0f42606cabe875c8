"""A host's Blazar state as one archive: `blazar snapshot create|restore|list` (the CLI).

A snapshot is one tar archive. Its first member, `snapshot.json`, lists every
other member with its size and sha256 (and says when, by which Blazar, and what
the store held); the others are

- `config/...`: every file of the config directory (the manifest, `blazar.lock`,
  host overlays): key hashes live in the manifest and the store, never keys;
- `data/blazar.db`: the store (model, adapter, key-hash, session, engine and
  condition records, the event journal, request traces), copied with SQLite's
  online backup API, so a live WAL database held open by `blazar serve` gives a
  consistent copy;
- with `with_models` only, `data/models/blobs/...`: the model and adapter files
  Blazar holds (the archive is then a plain tar: GGUF bytes do not compress).

Saved KV session files and engines are not in it (an engine build's state, and
engines are reinstalled by `apply`); their records are. Restore reads the whole
archive into a staging directory and checks every member against the listing
before anything is replaced (its name and declared size from its header, before
its data is read; its sha256 as it streams; `blazar.archives`): a damaged,
truncated or altered archive is refused whole, naming the member and why. It
never overwrites a manifest or a store that holds something unless `force` is
given, and then it first snapshots what it replaces. The store is
restored with the backup API into the live database under the apply lock, so
no reader sees half of it; records whose files are not on this host are then
dropped in one transaction (`apply` fetches them again), so no record points at
nothing.
"""

from __future__ import annotations

from blazar.snapshots.archive import (
    Created,
    DamagedSnapshot,
    Listing,
    Member,
    create,
    list_snapshots,
    read_listing,
    snapshots_dir,
)
from blazar.snapshots.restore import Restored, restore

__all__ = [
    "Created",
    "DamagedSnapshot",
    "Listing",
    "Member",
    "Restored",
    "create",
    "list_snapshots",
    "read_listing",
    "restore",
    "snapshots_dir",
]
