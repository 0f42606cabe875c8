"""`blazar import / list / show / rm`: holding models, and refusing bad input whole."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from blazar.models.hashing import sha256_file
from blazar.paths import Paths
from blazar.testing.tiny import write_tiny_model
from specs.loader import load_manifest
from tests.conftest import Blazar, run_blazar


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def blobs(paths: Paths) -> list[Path]:
    return sorted(paths.blobs.iterdir()) if paths.blobs.exists() else []


def test_import_hardlinks_by_default(blazar: Blazar, paths: Paths, tiny_model: Path) -> None:
    before = (sha256(tiny_model), tiny_model.stat().st_mtime_ns)
    out = blazar("import", str(tiny_model), "--name", "tiny").output
    assert "imported tiny: llama" in out and "(hardlink)" in out
    [blob] = blobs(paths)
    assert blob.name == f"sha256-{before[0]}"
    assert os.path.samefile(blob, tiny_model)
    assert (sha256(tiny_model), tiny_model.stat().st_mtime_ns) == before


def test_import_copy_makes_an_independent_copy(
    blazar: Blazar, paths: Paths, tiny_model: Path
) -> None:
    out = blazar("import", str(tiny_model), "--name", "tiny", "--copy").output
    assert "(copy)" in out
    [blob] = blobs(paths)
    assert not os.path.samefile(blob, tiny_model)
    assert blob.read_bytes() == tiny_model.read_bytes()
    assert tiny_model.stat().st_nlink == 1


@pytest.fixture
def other_filesystem() -> Iterator[Path]:
    """A directory on another filesystem (tmpfs), where a hardlink is impossible."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == Path(tempfile.gettempdir()).stat().st_dev:
        pytest.skip("needs /dev/shm on a filesystem other than the temp dir")
    path = Path(tempfile.mkdtemp(dir=shm))
    yield path
    shutil.rmtree(path)


def test_import_across_filesystems_references_in_place(
    blazar: Blazar, paths: Paths, other_filesystem: Path
) -> None:
    src = write_tiny_model(other_filesystem / "tiny.gguf")
    out = blazar("import", str(src), "--name", "tiny").output
    assert "(reference)" in out
    assert blobs(paths) == []
    data = json.loads(blazar("show", "tiny", "--json").output)
    assert data["path"] == str(src) and data["held"] == "reference"
    assert "left in place" in blazar("rm", "tiny").output
    assert src.exists()


def test_list_and_show(blazar: Blazar, tiny_model: Path) -> None:
    assert "No models yet" in blazar("list").output
    blazar("import", str(tiny_model), "--name", "tiny")
    blazar("import", str(tiny_model), "--name", "tiny:v2", "--copy")
    listing = blazar("list").output.splitlines()
    assert listing[0].split()[:4] == ["NAME", "ARCH", "PARAMS", "QUANT"]
    assert [line.split()[0] for line in listing[1:]] == ["tiny", "tiny:v2"]
    lines = blazar("list", "--json").output.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["model"] for r in records] == ["tiny", "tiny:v2"]
    assert records[0]["sha256"] == sha256(tiny_model)
    assert records[0]["size"] == tiny_model.stat().st_size
    assert records[0]["source"] == tiny_model.as_uri()
    assert records[0]["facts"]["block_count"] == 2
    shown = blazar("show", "tiny:v2").output
    assert "architecture       llama" in shown and "chat template      the GGUF's own" in shown
    assert json.loads(blazar("show", "tiny:v2", "--json").output)["held"] == "copy"


def test_rm_deletes_only_blazars_link(blazar: Blazar, paths: Paths, tiny_model: Path) -> None:
    blazar("import", str(tiny_model), "--name", "a")
    blazar("import", str(tiny_model), "--name", "b")
    [blob] = blobs(paths)  # same bytes, one blob
    blazar("rm", "a")
    assert blob.exists()  # b still uses it
    blazar("rm", "b")
    assert blobs(paths) == []
    assert tiny_model.exists() and tiny_model.stat().st_nlink == 1
    assert "neither declared nor in the store" in blazar("rm", "b", ok=False).output


def test_force_replaces_and_releases_the_old_blob(
    blazar: Blazar, paths: Paths, tmp_path: Path
) -> None:
    one = write_tiny_model(tmp_path / "one.gguf", seed=1)
    two = write_tiny_model(tmp_path / "two.gguf", seed=2)
    blazar("import", str(one), "--name", "m")
    r = blazar("import", str(two), "--name", "m", ok=False)
    assert r.exit_code == 1 and "already exists" in r.output and "--force" in r.output
    blazar("import", str(two), "--name", "m", "--force")
    assert [b.name for b in blobs(paths)] == [f"sha256-{sha256(two)}"]
    assert one.exists()


BAD_INPUTS = [
    ("missing path", lambda d: d / "nope.gguf", "tiny", "no such file"),
    ("directory", lambda d: d, "tiny", "is not a file"),
    ("not gguf", lambda d: _write(d / "x.bin", b"PK\x03\x04" + b"\0" * 100), "tiny", "not a GGUF"),
    ("empty file", lambda d: _write(d / "e.gguf", b""), "tiny", "not a GGUF"),
    ("truncated", lambda d: _truncated(d), "tiny", "truncated GGUF"),
    ("reserved #", lambda d: write_tiny_model(d / "t.gguf"), "tiny#fox", "'#' are reserved"),
    ("upper case", lambda d: write_tiny_model(d / "t.gguf"), "Tiny", "try 'tiny'"),
    ("bad tag", lambda d: write_tiny_model(d / "t.gguf"), "tiny:", "tag is empty"),
]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _truncated(d: Path) -> Path:
    data = write_tiny_model(d / "full.gguf").read_bytes()
    return _write(d / "cut.gguf", data[: len(data) // 2])


@pytest.mark.parametrize(
    ("case", "make", "name", "message"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_is_one_line_and_changes_nothing(
    blazar: Blazar,
    paths: Paths,
    tmp_path: Path,
    case: str,
    make: Callable[[Path], Path],
    name: str,
    message: str,
) -> None:
    src_dir = tmp_path / "in"
    src_dir.mkdir()
    src = make(src_dir)
    before = sorted(p.name for p in src_dir.iterdir())
    result = blazar("import", str(src), "--name", name, ok=False)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0]
    assert blazar("list", "--json").output == ""
    assert blobs(paths) == []
    assert sorted(p.name for p in src_dir.iterdir()) == before


def test_adapter_is_not_a_model(blazar: Blazar, tmp_path: Path, tiny_model: Path) -> None:
    from blazar.testing.tiny import write_tiny_lora

    lora = write_tiny_lora(tmp_path / "fox.gguf", tiny_model)
    r = blazar("import", str(lora), "--name", "fox", ok=False)
    assert "LoRA adapter" in r.output and "[loras]" in r.output


def test_console_script_end_to_end(tiny_model: Path) -> None:
    """The installed `blazar` executable, in a child process, with its exit codes."""
    ok = run_blazar("import", str(tiny_model), "--name", "tiny")
    assert ok.returncode == 0, ok.stderr
    assert run_blazar("show", "tiny").returncode == 0
    bad = run_blazar("import", str(tiny_model), "--name", "tiny")
    assert bad.returncode == 1
    assert bad.stderr.strip() == (
        f"Error: model 'tiny' already exists (from {tiny_model.as_uri()}); "
        "pass --force to replace it, or choose another --name"
    )


def test_an_imported_model_is_declared_so_the_hint_for_a_template_works(
    blazar: Blazar, paths: Paths, tmp_path: Path
) -> None:
    """`blazar import x.gguf --name mymodel` declares the model, so the hint a model
    without a chat template gets (`blazar config set models.mymodel.chat_template chatml`)
    works: it failed with "missing required field 'source'" (issue 33, day one 4). A model
    declared already keeps its declaration."""
    model = write_tiny_model(tmp_path / "x.gguf")
    out = blazar("import", str(model), "--name", "mymodel").output
    assert "declared models.mymodel" in out
    blazar("config", "set", "models.mymodel.chat_template", "chatml")
    declared = load_manifest(paths.manifest).models["mymodel"]
    assert declared.chat_template == "chatml" and declared.sha256 == sha256_file(model)[0]
    again = blazar("import", str(model), "--name", "mymodel", "--force").output
    assert "declared" not in again
    assert load_manifest(paths.manifest).models["mymodel"].chat_template == "chatml"
