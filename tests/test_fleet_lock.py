"""blazar.lock and host overlays end to end: apply writes the lock, `apply --locked` installs
exactly it or refuses (changing nothing), `diff` reports drift (exit 2), and an overlay
changes one host's plan."""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

import pytest

from blazar.engines.wheel import tag_for_version
from blazar.paths import Paths
from blazar.reconcile.lockfile import Lock, Locked, drift, merged, parse_lock, refusals
from blazar.testing.tiny import write_tiny_model
from reconcilers.desired import Desired, DesiredEngine, DesiredModel
from tests.conftest import Blazar
from tests.fixtures import ENGINE_VERSION, ENGINE_WHEEL, OLD_ENGINE_VERSION, WHEELS
from tests.hf_endpoint import FakeHub

ROOT = Path(__file__).resolve().parent.parent


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def base_text(files: dict[str, Path]) -> str:
    return f"""[models.tiny]
source = "{files["tiny"].as_uri()}"

[loras.fox]
model = "tiny"
source = "{files["fox"].as_uri()}"
"""


def held(blazar: Blazar) -> dict[str, str]:
    return {
        r["name"]: r["sha256"]
        for r in map(json.loads, blazar("list", "--json").output.splitlines())
    }


# -- the lock ---------------------------------------------------------------------------


def test_apply_writes_a_lock_and_apply_locked_refuses_a_manifest_that_resolves_differently(
    blazar: Blazar, files: dict[str, Path], tmp_path: Path
) -> None:
    manifest = write(tmp_path / "m" / "blazar.toml", base_text(files))
    out = blazar("apply", str(manifest)).output
    lock_file = manifest.parent / "blazar.lock"
    assert f"wrote {lock_file}" in out
    lock = tomllib.loads(lock_file.read_text())
    [model] = lock["model"]
    files_named = model.pop("files")
    assert model == {
        "name": "tiny",
        "source": files["tiny"].as_uri(),
        "sha256": sha256(files["tiny"]),
        "size": files["tiny"].stat().st_size,
    }
    assert len(files_named) == 1
    [lora] = lock["lora"]
    assert (lora["name"], lora["sha256"]) == ("fox", sha256(files["fox"]))
    text = lock_file.read_text()
    assert "fox" in text and blazar("apply", str(manifest)).output.count("wrote") == 0  # stable

    # The lock covers the manifest: --locked applies (nothing to do) and leaves it alone.
    assert "No changes." in blazar("apply", "--locked", str(manifest)).output
    assert lock_file.read_text() == text

    # Another source for tiny: --locked refuses before changing anything.
    before = held(blazar)
    write(manifest, base_text({**files, "tiny": files["other"]}))
    refused = blazar("apply", "--locked", str(manifest), ok=False)
    assert refused.exit_code == 1
    assert "resolves differently from blazar.lock; nothing was changed" in refused.output
    assert f"models.tiny: the manifest asks source {files['other'].as_uri()}" in refused.output
    assert held(blazar) == before
    assert lock_file.read_text() == text

    # A model the lock has no entry for, and a sha256 the lock's bytes do not have.
    extra = f'\n[models.more]\nsource = "{files["other"].as_uri()}"\n'
    write(manifest, base_text(files) + extra)
    refused = blazar("apply", "--locked", str(manifest), ok=False)
    assert "models.more: the manifest asks source" in refused.output
    assert "but the lock has nothing for it" in refused.output
    wrong = f'sha256 = "{"0" * 64}"\n\n[loras.fox]'
    write(manifest, base_text(files).replace("[loras.fox]", wrong))
    refused = blazar("apply", "--locked", str(manifest), ok=False)
    assert f"models.tiny: the manifest asks sha256 {'0' * 64}, the lock has" in refused.output
    assert held(blazar) == before

    # Without --locked the change is applied and the lock rewritten.
    write(manifest, base_text(files) + extra)
    assert f"wrote {lock_file}" in blazar("apply", str(manifest)).output
    assert [m["name"] for m in tomllib.loads(lock_file.read_text())["model"]] == ["more", "tiny"]


def test_the_lock_pins_the_engine_by_version_tag_and_wheel_digest(
    blazar: Blazar, files: dict[str, Path], tmp_path: Path
) -> None:
    engine = ENGINE_WHEEL
    manifest = write(tmp_path / "m" / "blazar.toml", engine + base_text(files))
    blazar("apply", str(manifest))
    [entry] = tomllib.loads((manifest.parent / "blazar.lock").read_text())["engine"]
    wheel = next(WHEELS.glob(f"xllamacpp-{ENGINE_VERSION}-*.whl"))
    assert entry == {
        "name": "llamacpp",
        "install": "wheel",
        "backend": "cpu",
        "declared": ENGINE_VERSION,
        "version": ENGINE_VERSION,
        "tag": tag_for_version(ENGINE_VERSION),
        "digest": f"sha256:{sha256(wheel)}",
        "wheel": wheel.name,
    }
    write(manifest, engine.replace(ENGINE_VERSION, OLD_ENGINE_VERSION) + base_text(files))
    refused = blazar("apply", "--locked", str(manifest), ok=False)
    assert (
        "engines.llamacpp: the manifest asks install wheel, backend cpu, declared "
        f"{OLD_ENGINE_VERSION}" in refused.output
    )
    assert OLD_ENGINE_VERSION not in blazar("engine", "list").output  # nothing was installed


def test_diff_shows_drift_between_manifest_lock_and_host_and_exits_2(
    blazar: Blazar, files: dict[str, Path], tmp_path: Path
) -> None:
    manifest = write(tmp_path / "m" / "blazar.toml", base_text(files))
    blazar("apply", str(manifest))
    assert blazar("diff", "--detailed-exitcode", str(manifest)).exit_code == 0
    lock_file = manifest.parent / "blazar.lock"
    lock_file.write_text(lock_file.read_text().replace(sha256(files["tiny"]), "ab" * 32))
    found = blazar("diff", "--detailed-exitcode", str(manifest), ok=False)
    assert found.exit_code == 2
    assert "No changes." in found.output  # the host matches the manifest; the lock does not
    assert (
        f"lock vs host: models.tiny: the lock has sha256 {'ab' * 32}, the host holds "
        f"{sha256(files['tiny'])}" in found.output
    )
    data = json.loads(blazar("diff", "--json", str(manifest)).output)
    assert any("lock vs host: models.tiny" in line for line in data["drift"])


def test_apply_locked_fetches_the_revision_the_lock_resolved(
    blazar: Blazar, paths: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = write_tiny_model(tmp_path / "a.gguf").read_bytes()
    second = write_tiny_model(tmp_path / "b.gguf", seed=9).read_bytes()
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        old = hub.add_repo("acme/tiny-GGUF", {"tiny-Q8_0.gguf": first})
        manifest = write(
            tmp_path / "m" / "blazar.toml", '[models.t]\nsource = "hf://acme/tiny-GGUF:Q8_0"\n'
        )
        blazar("apply", str(manifest))
        [entry] = tomllib.loads((manifest.parent / "blazar.lock").read_text())["model"]
        assert entry["repo"] == "acme/tiny-GGUF" and entry["revision"] == old
        assert entry["files"] == ["tiny-Q8_0.gguf"]
        assert entry["url"] == f"{hub.url}/acme/tiny-GGUF/resolve/{old}/tiny-Q8_0.gguf"
        assert entry["sha256"] == hashlib.sha256(first).hexdigest()
        # main moves on; a fresh host applying --locked gets the locked bytes, not main's
        hub.add_repo("acme/tiny-GGUF", {"tiny-Q8_0.gguf": second})
        blazar("rm", "t", "--manifest", str(tmp_path / "unused.toml"), ok=False)
        (paths.db).unlink()
        for leftover in paths.blobs.glob("*"):
            leftover.unlink()
        blazar("apply", "--locked", str(manifest))
        assert held(blazar) == {"t": hashlib.sha256(first).hexdigest()}
        assert hub.seen("GET", f"/resolve/{old}/")


def test_lock_rules_are_pure_functions_of_values() -> None:
    engine = DesiredEngine("llamacpp", "llamacpp", "wheel", "latest")
    model = DesiredModel("m", "file:///m.gguf", None)
    desired = Desired(engines=(engine,), models=(model,))
    lock = Lock(
        (
            Locked(
                "engine",
                "llamacpp",
                (("install", "wheel"), ("backend", "cpu"), ("declared", "latest")),
                {"version": ENGINE_VERSION, "tag": "wheel-x"},
            ),
            Locked("model", "m", (("source", "file:///m.gguf"),), {"sha256": "aa" * 32}),
            Locked("model", "gone", (("source", "file:///g.gguf"),), {"sha256": "bb" * 32}),
        )
    )
    assert refusals(lock, desired) == []
    pinned = DesiredEngine("llamacpp", "llamacpp", "wheel", OLD_ENGINE_VERSION)
    assert refusals(lock, Desired(engines=(pinned,), models=(model,))) == [
        "engines.llamacpp: the manifest asks install wheel, backend cpu, declared "
        f"{OLD_ENGINE_VERSION}, but the lock has install wheel, backend cpu, declared latest for it"
    ]
    # `gone` is asked for by no view: dropped on the next write, reported as drift now
    assert [e.name for e in merged(Lock(), lock, [desired]).entries] == ["llamacpp", "m"]
    host = Lock((Locked("model", "m", (("source", "file:///m.gguf"),), {"sha256": "cc" * 32}),))
    assert drift(desired, lock, host, [desired]) == [
        f"lock vs host: models.m: the lock has sha256 {'aa' * 32}, the host holds {'cc' * 32}",
        "lock: models.gone (source file:///g.gguf) is asked for by no view of the manifest; "
        "the next apply drops it",
    ]
    assert parse_lock(
        '# c\nversion = 1\n[[model]]\nname = "m"\nsource = "file:///m.gguf"\nsha256 = "x"\n'
    ).entries == (Locked("model", "m", (("source", "file:///m.gguf"),)),)


# -- overlays ---------------------------------------------------------------------------


def test_an_overlay_changes_one_hosts_plan(
    blazar: Blazar, files: dict[str, Path], tmp_path: Path
) -> None:
    root = tmp_path / "fleet"
    write(root / "models.toml", base_text(files) + "\n[models.tiny.params]\ntemperature = 0.5\n")
    write(
        root / "hosts" / "gpu-1.toml",
        f"[models.tiny]\nctx = 8192\n\n[loras.fox]\nenabled = false\n\n"
        f'[models.big]\nsource = "{files["other"].as_uri()}"\n',
    )
    base = json.loads(blazar("diff", "--json", str(root)).output)
    gpu = json.loads(blazar("diff", "--json", "--host", "gpu-1", str(root)).output)
    assert [c["address"] for c in base["changes"]] == ["models.tiny", "loras.fox"]
    assert [c["address"] for c in gpu["changes"]] == ["models.big", "models.tiny"]
    blazar("apply", "--host", "gpu-1", str(root))
    assert set(held(blazar)) == {"tiny", "big"}
    # The host's view of tiny: the overlay's ctx over the base's table (params kept).
    assert "No changes." in blazar("diff", "--host", "gpu-1", str(root)).output
    base_again = blazar("diff", str(root)).output
    assert "~ models.tiny" in base_again and "+ loras.fox" in base_again
    # One lock for the directory: the base's entries and gpu-1's side by side.
    lock = tomllib.loads((root / "blazar.lock").read_text())
    assert sorted(m["name"] for m in lock["model"]) == ["big", "tiny"]
    missing = blazar("diff", "--host", "nope", str(root), ok=False)
    assert "no overlay for host 'nope'" in missing.output
    assert "(hosts there: gpu-1)" in missing.output


def test_the_fleet_example_loads_for_each_host() -> None:
    from specs.loader import hosts, load_manifest

    example = ROOT / "examples" / "fleet"
    assert hosts(example) == ["gpu-box", "laptop"]
    base = load_manifest(example)
    gpu, laptop = (load_manifest(example, h) for h in ("gpu-box", "laptop"))
    assert set(gpu.models) != set(base.models) or gpu.models != base.models
    assert laptop.models != base.models
