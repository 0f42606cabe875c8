"""A split GGUF is one model: its shards keep their names side by side, as llama.cpp needs."""

from __future__ import annotations

import os
from pathlib import Path

from blazar.models.registry import Registry
from blazar.paths import Paths
from blazar.store.db import Store
from blazar.testing.tiny import write_tiny_model
from specs.names import parse_name


def test_shards_are_one_model_with_their_names_kept(paths: Paths, tmp_path: Path) -> None:
    # Stand-ins for a split model: whole GGUFs named as gguf-split names shards
    # (only the first is inspected), held in a cache that names files by hash.
    cache = tmp_path / "cache"
    cache.mkdir()
    blobs = [write_tiny_model(cache / f"{seed:064x}", seed=seed) for seed in (1, 2)]
    names = ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]
    with Store(paths.db) as store:
        registry = Registry(store, paths)
        record = registry.import_files(blobs, parse_name("split"), names=names, managed=True)
        shard_dir = Path(record.path).parent
        assert shard_dir.parent == paths.blobs and shard_dir.name.endswith(".shards")
        assert sorted(p.name for p in shard_dir.iterdir()) == names
        assert Path(record.path).name == names[0]
        assert record.size == sum(b.stat().st_size for b in blobs)
        assert record.facts["shards"] == names
        for blob, name in zip(blobs, names, strict=True):
            assert os.path.samefile(blob, shard_dir / name)  # hardlinked, not copied
        registry.remove(parse_name("split"))
        assert not shard_dir.exists()
        assert all(b.exists() for b in blobs)
