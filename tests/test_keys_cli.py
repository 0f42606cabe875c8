"""`blazar keys add|list|rm` and `--manifest` on the commands that edit a manifest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from blazar.paths import Paths
from blazar.store.db import Store
from specs.loader import load_manifest
from tests.conftest import Blazar

MANIFEST = """# the team's manifest: comments stay
[models.tiny]   # the one model
source = "{source}"
"""


def test_keys_add_list_rm(blazar: Blazar, paths: Paths, tmp_path: Path, tiny_model: Path) -> None:
    manifest = tmp_path / "team.toml"
    manifest.write_text(MANIFEST.format(source=tiny_model.as_uri()))
    added = blazar(
        "keys",
        "add",
        "ci",
        "--scope",
        "admin",
        "--models",
        "tiny",
        "--rpm",
        "60",
        "--description",
        "the CI runner",
        "--manifest",
        str(manifest),
    )
    key = added.stdout.strip()
    assert added.stdout == key + "\n"  # alone on stdout: KEY=$(blazar keys add ci) works
    assert key.startswith("plm_") and len(key) == 4 + 43
    assert "shown only now" in added.stderr
    text = manifest.read_text()
    assert "# the team's manifest: comments stay" in text and "# the one model" in text
    assert key not in text and hashlib.sha256(key.encode()).hexdigest() in text
    declared = load_manifest(manifest).keys["ci"]
    assert (declared.scope, declared.models, declared.rpm) == ("admin", ["tiny"], 60)
    assert declared.description == "the CI runner" and declared.created
    with Store(paths.db) as store:  # reconciled: the store holds its hash, not the key
        assert [(k.name, k.sha256) for k in store.list_keys()] == [("ci", declared.sha256)]
    # What the manifest would refuse, or a name taken, changes nothing.
    before = manifest.read_text()
    taken = blazar("keys", "add", "ci", "--manifest", str(manifest), ok=False)
    assert taken.exit_code == 1 and "already exists" in taken.output
    unknown = blazar(
        "keys", "add", "web", "--models", "nope", "--manifest", str(manifest), ok=False
    )
    assert unknown.exit_code == 1 and "'nope', which is not declared" in unknown.output
    assert manifest.read_text() == before
    second = blazar("keys", "add", "web", "--manifest", str(manifest)).stdout.strip()
    assert second != key
    listed = blazar("keys", "list", "--manifest", str(manifest)).stdout
    assert "ci" in listed and "admin" in listed and "never" in listed
    rows = [
        json.loads(line)
        for line in blazar(
            "keys", "list", "--json", "--manifest", str(manifest)
        ).stdout.splitlines()
    ]
    assert [(r["name"], r["scope"], r["models"]) for r in rows] == [
        ("ci", "admin", ["tiny"]),
        ("web", "inference", ["*"]),
    ]
    assert key not in json.dumps(rows) and declared.sha256 not in json.dumps(rows)
    # The last key goes only with --force.
    blazar("keys", "rm", "web", "--manifest", str(manifest))
    last = blazar("keys", "rm", "ci", "--manifest", str(manifest), ok=False)
    assert last.exit_code == 1 and "refuses to go authless" in last.output
    assert "ci" in load_manifest(manifest).keys
    blazar("keys", "rm", "ci", "--force", "--manifest", str(manifest))
    assert load_manifest(manifest).keys == {}
    with Store(paths.db) as store:
        assert store.list_keys() == []
    missing = blazar("keys", "rm", "ci", "--manifest", str(manifest), ok=False)
    assert missing.exit_code == 1 and "not declared" in missing.output
    assert "No key is declared" in blazar("keys", "list", "--manifest", str(manifest)).stdout


def test_manifest_option_edits_another_manifest(
    blazar: Blazar, paths: Paths, tmp_path: Path, tiny_model: Path
) -> None:
    other = tmp_path / "other.toml"
    blazar("config", "set", "serving.port", "12345", "--manifest", str(other))
    assert blazar("config", "get", "serving.port", "--manifest", str(other)).stdout == "12345\n"
    assert not paths.manifest.exists()  # the user's manifest was not touched
    blazar("pull", tiny_model.as_uri(), "--name", "tiny", "--manifest", str(other))
    assert "tiny" in load_manifest(other).models and not paths.manifest.exists()
    blazar("rm", "tiny", "--manifest", str(other))
    assert load_manifest(other).models == {}


def test_keys_add_without_a_name_names_the_key_itself(
    blazar: Blazar, paths: Paths, tmp_path: Path, tiny_model: Path
) -> None:
    """The user guide's `blazar keys add` with no name: the key is named key-1, then key-2,
    and the name is said (issue 33, day one 11)."""
    manifest = tmp_path / "team.toml"
    manifest.write_text(MANIFEST.format(source=tiny_model.as_uri()))
    first = blazar("keys", "add", "--manifest", str(manifest))
    second = blazar("keys", "add", "--manifest", str(manifest))
    assert "named key-1" in first.stderr and "blazar keys rm key-1" in first.stderr
    assert "named key-2" in second.stderr
    declared = load_manifest(manifest).keys
    assert set(declared) == {"key-1", "key-2"}
    for out, name in ((first, "key-1"), (second, "key-2")):
        secret = out.stdout.strip()
        assert declared[name].sha256 == hashlib.sha256(secret.encode()).hexdigest()
