"""diff / apply / status end to end with the real ports: store, registry, sources, engines."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from blazar.paths import Paths
from blazar.testing.tiny import write_tiny_model
from tests.conftest import Blazar
from tests.fixtures import ENGINE_WHEEL
from tests.hf_endpoint import FakeHub

ROOT = Path(__file__).resolve().parent.parent


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def manifest_text(files: dict[str, Path], *, engine: bool = False, extra: str = "") -> str:
    return (
        (ENGINE_WHEEL if engine else "")
        + f"""[models.tiny]
source = "{files["tiny"].as_uri()}"
sha256 = "{sha256(files["tiny"])}"
ctx = 2048

[models.other]
source = "{files["other"].as_uri()}"

[loras.fox]
model = "tiny"
source = "{files["fox"].as_uri()}"
"""
        + extra
    )


def test_diff_apply_diff_converges(
    blazar: Blazar, paths: Paths, files: dict[str, Path], tmp_path: Path
) -> None:
    manifest = write(tmp_path / "blazar.toml", manifest_text(files, engine=True))
    first = blazar("diff", str(manifest), "--detailed-exitcode", ok=False)
    assert first.exit_code == 2
    assert "+ engines.llamacpp" in first.output and "+ models.tiny" in first.output
    assert "Plan: 4 to add, 0 to change, 0 to destroy." in first.output
    plan = json.loads(blazar("diff", str(manifest), "--json").output)
    assert [c["address"] for c in plan["changes"]] == [
        "engines.llamacpp",
        "models.other",
        "models.tiny",
        "loras.fox",
    ]
    out = blazar("apply", str(manifest)).output
    assert "Apply complete! Resources: 4 added, 0 changed, 0 destroyed." in out
    again = blazar("diff", str(manifest), "--detailed-exitcode")
    assert again.exit_code == 0 and "No changes." in again.output
    assert "No changes." in blazar("apply", str(manifest)).output  # idempotent

    engines = [json.loads(x) for x in blazar("engine", "list", "--json").output.splitlines()]
    assert [(e["tag"], e["active"]) for e in engines] == [("b11549-cpu", True)]
    models = {
        json.loads(x)["model"]: json.loads(x) for x in blazar("list", "--json").output.splitlines()
    }
    assert models["tiny"]["managed"] and models["tiny"]["settings"]["ctx"] == 2048
    status = [json.loads(x) for x in blazar("status", "--json").output.splitlines()]
    assert {(c["kind"], c["name"], c["status"]) for c in status} == {
        ("engine", "llamacpp", "True"),
        ("model", "tiny", "True"),
        ("model", "other", "True"),
        ("lora", "fox", "True"),
    }
    assert "RESOURCE" in blazar("status").output

    # A runtime setting changes in place: an update, no download.
    write(manifest, manifest.read_text().replace("ctx = 2048", "ctx = 4096"))
    changed = blazar("diff", str(manifest)).output
    assert "~ models.tiny" in changed and "ctx: 2048 -> 4096" in changed
    assert "Plan: 0 to add, 1 to change, 0 to destroy." in changed
    blazar("apply", str(manifest))
    assert "No changes." in blazar("diff", str(manifest)).output


def test_wrong_checksum_fails_that_resource_keeps_nothing_and_completes_the_rest(
    blazar: Blazar, paths: Paths, files: dict[str, Path], tmp_path: Path
) -> None:
    text = manifest_text(files).replace(sha256(files["tiny"]), "0" * 64)
    manifest = write(tmp_path / "blazar.toml", text)
    result = blazar("apply", str(manifest), ok=False)
    assert result.exit_code == 1
    assert "models.tiny: FAILED" in result.output and "sha256" in result.output
    assert "loras.fox: FAILED: skipped: its model 'tiny' failed" in result.output
    held = [json.loads(x)["model"] for x in blazar("list", "--json").output.splitlines()]
    assert held == ["other"]  # the independent model completed
    blobs = sorted(p.name for p in paths.blobs.iterdir())
    assert blobs == [f"sha256-{sha256(files['other'])}"]  # nothing of tiny was kept
    status = {
        (c["kind"], c["name"]): c
        for c in map(json.loads, blazar("status", "--json").output.splitlines())
    }
    assert status[("model", "tiny")]["status"] == "False"
    assert status[("model", "tiny")]["reason"] == "ApplyFailed"
    assert status[("lora", "fox")]["status"] == "False"


def test_prune_deletes_only_managed_resources_and_asks_first(
    blazar: Blazar, paths: Paths, files: dict[str, Path], tmp_path: Path
) -> None:
    manifest = write(tmp_path / "blazar.toml", manifest_text(files))
    blazar("apply", str(manifest))
    hand = write_tiny_model(tmp_path / "hand.gguf", seed=3)
    blazar("import", str(hand), "--name", "by-hand")
    write(manifest, f'[models.tiny]\nsource = "{files["tiny"].as_uri()}"\nctx = 2048\n')
    kept = blazar("diff", str(manifest)).output
    assert "No changes." in kept and "--prune deletes them" in kept
    assert "models.other" in kept and "loras.fox" in kept
    plan = blazar("diff", str(manifest), "--prune").output
    assert "- models.other" in plan and "- loras.fox" in plan
    assert "by-hand" not in plan
    refused = blazar("apply", str(manifest), "--prune", ok=False)  # no terminal to ask on
    assert refused.exit_code == 1 and "pass --yes" in refused.output
    assert len(blazar("list", "--json").output.splitlines()) == 3
    out = blazar("apply", str(manifest), "--prune", "--yes").output
    assert "2 destroyed" in out
    held = sorted(json.loads(x)["model"] for x in blazar("list", "--json").output.splitlines())
    assert held == ["by-hand", "tiny"]
    assert files["other"].exists() and files["fox"].exists()  # originals untouched


def test_prune_removes_only_what_this_manifest_applied(
    blazar: Blazar, paths: Paths, files: dict[str, Path], tmp_path: Path
) -> None:
    """Two manifests sharing one store: `apply --prune` of one deleted the quickstart's
    model, which the other declared (issue 33, day one 10). Each resource's owner is the
    manifest that applied it last; prune, and the kept list, see only their own."""
    quick = write(tmp_path / "quick" / "blazar.toml", manifest_text(files).split("[loras")[0])
    team = write(
        tmp_path / "team" / "blazar.toml",
        f'[models.mine]\nsource = "{write_tiny_model(tmp_path / "mine.gguf", seed=5).as_uri()}"\n',
    )
    blazar("apply", str(quick))
    blazar("apply", str(team))
    write(team, "[serving]\n")  # the team manifest drops its model
    plan = blazar("diff", str(team), "--prune").output
    assert "- models.mine" in plan
    assert "tiny" not in plan and "other" not in plan  # the other manifest's, not listed
    out = blazar("apply", str(team), "--prune", "--yes").output
    assert "1 destroyed" in out
    held = sorted(json.loads(x)["model"] for x in blazar("list", "--json").output.splitlines())
    assert held == ["other", "tiny"]
    # What the first manifest no longer declares is still its own to prune.
    write(quick, f'[models.tiny]\nsource = "{files["tiny"].as_uri()}"\nctx = 2048\n')
    assert "- models.other" in blazar("diff", str(quick), "--prune").output


def test_target_and_dry_run(blazar: Blazar, files: dict[str, Path], tmp_path: Path) -> None:
    manifest = write(tmp_path / "blazar.toml", manifest_text(files))
    dry = blazar("apply", str(manifest), "--dry-run").output
    assert "Plan: 3 to add" in dry and "Apply" not in dry.splitlines()[-1]
    assert blazar("list", "--json").output == ""
    out = blazar("apply", str(manifest), "--target", "other").output
    assert "Plan: 1 to add, 0 to change, 0 to destroy." in out
    assert [json.loads(x)["model"] for x in blazar("list", "--json").output.splitlines()] == [
        "other"
    ]
    bad = blazar("apply", str(manifest), "--target", "nope", ok=False)
    assert "--target nope is not declared" in bad.output


def test_invalid_manifest_is_rejected_whole_before_any_action(
    blazar: Blazar, paths: Paths, files: dict[str, Path], tmp_path: Path
) -> None:
    text = manifest_text(files) + '\n[loras.owl]\nmodel = "tinny"\nsource = "file:///x.gguf"\n'
    manifest = write(tmp_path / "blazar.toml", text.replace("ctx = 2048", "ctxx = 2048"))
    for command in ("diff", "apply"):
        result = blazar(command, str(manifest), ok=False)
        assert result.exit_code == 1
        assert "has 2 problems; nothing was changed" in result.output
        assert (
            "blazar.toml:4: unknown field 'ctxx' in models.tiny; did you mean 'ctx'?"
            in result.output
        )
        assert (
            "lora 'owl' names model 'tinny', which is not declared; did you mean 'tiny'?"
            in result.output
        )
    assert blazar("list", "--json").output == ""
    assert not paths.blobs.exists() or not any(paths.blobs.iterdir())


def test_a_missing_manifest_says_how_to_start_one(blazar: Blazar, paths: Paths) -> None:
    result = blazar("diff", ok=False)
    assert str(paths.manifest) in result.output and "blazar pull" in result.output


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as served:
        yield served


def big_model(tmp_path: Path) -> tuple[bytes, str]:
    """A tiny GGUF padded to 3 MiB, so a download can be caught midway."""
    tiny = write_tiny_model(tmp_path / "pad.gguf").read_bytes()
    big = tiny + bytes(3 * 2**20 - len(tiny))
    return big, hashlib.sha256(big).hexdigest()


def run_apply(manifest: Path) -> subprocess.Popen[str]:
    exe = Path(sys.executable).with_name("blazar")
    return subprocess.Popen(
        [str(exe), "apply", str(manifest)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ),
    )


def test_an_apply_killed_mid_download_resumes_on_the_next_apply(
    blazar: Blazar, paths: Paths, hub: FakeHub, tmp_path: Path
) -> None:
    big, digest = big_model(tmp_path)
    hub.files["big.gguf"] = big
    hub.stall_after["big.gguf"] = 3 * 2**19
    manifest = write(
        tmp_path / "blazar.toml",
        f'[models.big]\nsource = "{hub.file_url("big.gguf")}"\nsha256 = "{digest}"\n',
    )
    child = run_apply(manifest)
    part = paths.downloads / f"{digest}.gguf.part"
    try:
        deadline = time.monotonic() + 20
        while not (part.exists() and part.stat().st_size >= 2**20):
            assert child.poll() is None, child.communicate()[0]
            assert time.monotonic() < deadline, "the download never got going"
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=10)
    have = part.stat().st_size
    assert 0 < have < len(big)
    assert blazar("list", "--json").output == ""  # nothing registered from a partial file
    out = blazar("apply", str(manifest)).output
    assert "Apply complete! Resources: 1 added" in out
    ranges = [s.header("Range") for s in hub.requests if s.path.endswith("big.gguf")]
    assert ranges == [None, f"bytes={have}-"]
    assert not part.exists()
    [record] = [json.loads(x) for x in blazar("list", "--json").output.splitlines()]
    assert record["sha256"] == digest


def test_two_applies_at_once_do_not_interleave(
    blazar: Blazar, paths: Paths, hub: FakeHub, tmp_path: Path
) -> None:
    big, digest = big_model(tmp_path)
    hub.files["big.gguf"] = big
    hub.stall_after["big.gguf"] = 3 * 2**19  # the first apply holds the lock, stalled
    manifest = write(
        tmp_path / "blazar.toml",
        f'[models.big]\nsource = "{hub.file_url("big.gguf")}"\nsha256 = "{digest}"\n',
    )
    first = run_apply(manifest)
    try:
        deadline = time.monotonic() + 20
        while not hub.stalled.is_set():
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.01)
        second = run_apply(manifest)
        lines: list[str] = []
        told = threading.Event()

        def read() -> None:
            assert second.stdout is not None
            for line in second.stdout:
                lines.append(line)
                if "waiting for another apply (pid" in line:
                    told.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert told.wait(60), "".join(lines)  # it says it waits for the lock ...
        assert second.poll() is None  # ... and does: not downloading alongside
        assert len([s for s in hub.requests if s.path.endswith("big.gguf")]) == 1
        first.send_signal(signal.SIGKILL)  # the kernel releases a dead holder's lock
        second.wait(timeout=60)
        reader.join(timeout=10)
    finally:
        first.kill()
        first.wait(timeout=10)
    out = "".join(lines)
    assert second.returncode == 0, out
    assert "Apply complete! Resources: 1 added" in out


def test_a_field_blazar_does_not_act_on_is_refused_not_ignored(
    blazar: Blazar,
    files: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """specs.support's table is empty today; its mechanism stays for the next such field
    (here remotes stand in for one)."""
    monkeypatch.setattr("specs.support.NOT_YET", {("remotes",): "a stand-in"})
    extra = '[remotes.box]\nurl = "http://127.0.0.1:1"\n'
    manifest = write(tmp_path / "blazar.toml", manifest_text(files) + "\n" + extra)
    for command in ("diff", "apply"):
        refused = blazar(command, str(manifest), ok=False)
        assert refused.exit_code == 1
        lines = manifest.read_text().splitlines()
        line = next(n for n, text in enumerate(lines, 1) if text.startswith("[remotes.box]"))
        assert f"blazar.toml:{line}: remotes: not supported yet (a stand-in)" in refused.output
    assert blazar("list", "--json").output == ""  # nothing was applied
