"""The `release` install method against a release feed served on loopback (tests/feeds.py)."""

from __future__ import annotations

import os
import platform
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from blazar.engines import release
from blazar.engines.base import InstalledEngine
from blazar.engines.download import DownloadError, UnsafeArchive, download, part_path
from blazar.engines.release import (
    EngineCheckFailed,
    NoAsset,
    Release,
    install_release,
    latest_version,
    pick_asset,
)
from blazar.errors import AlreadyExists, NotFound, VerificationFailed
from blazar.paths import Paths
from tests.feeds import BROKEN_SERVER, ReleaseFeed, make_archive, server_archive, sha256

_HOST = {"x86_64": "ubuntu-x64", "aarch64": "ubuntu-arm64"}.get(platform.machine())
pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or _HOST is None, reason="release archives here are Linux builds"
)


def asset_name(tag: str, ext: str = "tar.gz") -> str:
    return f"llama-{tag}-bin-{_HOST}.{ext}"


@pytest.fixture
def feed() -> Iterator[ReleaseFeed]:
    with ReleaseFeed() as served:
        yield served


def install(paths: Paths, feed: ReleaseFeed, version: str | None = None) -> InstalledEngine:
    return install_release(paths.engines, paths.downloads, feed=feed.url, version=version)


def lane(paths: Paths) -> list[str]:
    root = paths.engines / "llamacpp"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def downloads(paths: Paths) -> list[str]:
    return sorted(p.name for p in paths.downloads.iterdir()) if paths.downloads.exists() else []


def test_a_good_archive_installs_and_its_server_answers(
    paths: Paths, feed: ReleaseFeed, tiny_model: Path
) -> None:
    name = asset_name("b11549")
    data = server_archive(name)
    feed.add_release("b11549", {name: data, f"cudart-{name}": b"runtime"})

    engine = install(paths, feed)

    assert (engine.kind, engine.tag, engine.method, engine.version) == (
        "llamacpp",
        "b11549-cpu",
        "release",
        "b11549",
    )
    assert engine.path == paths.engines / "llamacpp" / "b11549-cpu"
    assert engine.details["asset"] == name
    assert engine.details["sha256"] == sha256(data)
    assert engine.details["feed"] == feed.url
    assert engine.details["server_version"].startswith("version:")  # --version ran
    server = Path(engine.command[0])
    assert server == engine.path / "build" / "bin" / "llama-server"
    assert os.access(server, os.X_OK)
    assert lane(paths) == ["b11549-cpu"]  # no staging leftovers
    assert downloads(paths) == []
    assert "Range" not in feed.downloads_of(name)[0].headers

    proc = subprocess.Popen(
        [*engine.command, "--model", str(tiny_model), "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        port = wait_for_listening(proc)
        assert wait_for_health(port) == 200
    finally:
        os.kill(proc.pid, signal.SIGTERM)  # the script exec'd: this PID is the server
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def wait_for_listening(proc: subprocess.Popen[str], deadline_s: float = 20.0) -> int:
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        match = re.search(r"blazar-launcher: listening on http://127\.0\.0\.1:(\d+)", line)
        if match:
            return int(match.group(1))
    raise AssertionError("the server never said it was listening:\n" + "".join(seen[-20:]))


def wait_for_health(port: int, deadline_s: float = 10.0) -> int:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                return int(resp.status)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_latest_or_an_explicit_tag(paths: Paths, feed: ReleaseFeed) -> None:
    old, new = asset_name("b100", "zip"), asset_name("b200")
    feed.add_release("b100", {old: server_archive(old)}, latest=False)
    feed.add_release("b200", {new: server_archive(new)})

    assert latest_version(feed=feed.url) == "b200"
    assert install(paths, feed).tag == "b200-cpu"
    older = install(paths, feed, version="100")  # a bare number means b100
    assert (older.tag, older.version, older.details["asset"]) == ("b100-cpu", "b100", old)
    assert os.access(older.command[0], os.X_OK)  # a zip keeps the executable bit
    assert lane(paths) == ["b100-cpu", "b200-cpu"]
    with pytest.raises(AlreadyExists):
        install(paths, feed, version="b100")
    with pytest.raises(NotFound, match="b999"):
        install(paths, feed, version="b999")


def test_the_feed_comes_from_the_environment(
    paths: Paths, feed: ReleaseFeed, monkeypatch: pytest.MonkeyPatch
) -> None:
    feed.add_release("b7", {})
    monkeypatch.setenv("BLAZAR_RELEASE_FEED", feed.url + "/")
    assert latest_version() == "b7"
    monkeypatch.setenv("BLAZAR_RELEASE_REPO", "someone/else")
    with pytest.raises(NotFound, match="someone/else"):
        latest_version()


def test_a_wrong_checksum_keeps_nothing(paths: Paths, feed: ReleaseFeed) -> None:
    name = asset_name("b11549")
    data = server_archive(name)
    feed.add_release("b11549", {name: data})
    wrong = sha256(b"something else")
    feed.digests[name] = f"sha256:{wrong}"

    with pytest.raises(VerificationFailed) as failed:
        install(paths, feed)

    assert wrong in str(failed.value) and sha256(data) in str(failed.value)
    assert "nothing was kept" in str(failed.value)
    assert lane(paths) == []
    assert downloads(paths) == []  # no .part either


def test_an_interrupted_download_resumes_with_a_range_request(
    paths: Paths, feed: ReleaseFeed
) -> None:
    name = asset_name("b11549")
    data = server_archive(name, extra={"build/bin/libggml.so": (os.urandom(200_000), 0o644)})
    feed.add_release("b11549", {name: data})
    cut = len(data) // 2
    feed.cut_after[name] = cut

    with pytest.raises(DownloadError, match="resumes"):
        install(paths, feed)
    part = part_path(paths.downloads / name)
    assert part.stat().st_size == cut
    assert lane(paths) == []

    seen: list[tuple[int, int | None]] = []
    engine = install_release(
        paths.engines, paths.downloads, feed=feed.url, progress=lambda d, t: seen.append((d, t))
    )
    assert engine.tag == "b11549-cpu"
    assert feed.downloads_of(name)[-1].headers["Range"] == f"bytes={cut}-"
    assert seen[-1] == (len(data), len(data))
    assert not part.exists()


def test_a_server_that_ignores_range_restarts_from_zero(tmp_path: Path, feed: ReleaseFeed) -> None:
    data = os.urandom(300_000)
    feed.add_release("b1", {"blob.bin": data})
    feed.ignore_range = True
    dest = tmp_path / "blob.bin"
    part_path(dest).write_bytes(data[:1000])
    url = f"{feed.url}/download/b1/blob.bin"

    assert download(url, dest, sha256=sha256(data), size=len(data)).read_bytes() == data
    assert feed.downloads_of("blob.bin")[-1].headers["Range"] == "bytes=1000-"


def test_a_complete_part_is_finished_after_a_416(tmp_path: Path, feed: ReleaseFeed) -> None:
    data = os.urandom(10_000)
    feed.add_release("b1", {"blob.bin": data})
    dest = tmp_path / "blob.bin"
    part_path(dest).write_bytes(data)

    download(f"{feed.url}/download/b1/blob.bin", dest, sha256=sha256(data))
    assert dest.read_bytes() == data and not part_path(dest).exists()


def test_an_unreachable_server_is_a_download_error(tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match=r"127\.0\.0\.1:9/x"):
        download("http://127.0.0.1:9/x", tmp_path / "x", sha256=None, timeout=2)


def test_an_asset_without_a_digest_is_refused(paths: Paths, feed: ReleaseFeed) -> None:
    name = asset_name("b11549")
    feed.add_release("b11549", {name: server_archive(name)})
    feed.digests[name] = None

    with pytest.raises(VerificationFailed, match="no sha256 digest"):
        install(paths, feed)
    assert feed.downloads_of(name) == []
    assert lane(paths) == []


def test_no_asset_for_this_platform_lists_the_assets(paths: Paths, feed: ReleaseFeed) -> None:
    names = ["llama-b5-bin-macos-arm64.tar.gz", "llama-b5-bin-win-cpu-x64.zip"]
    feed.add_release("b5", dict.fromkeys(names, b"x"))

    with pytest.raises(NoAsset) as missing:
        install(paths, feed)
    assert all(n in str(missing.value) for n in names)
    assert lane(paths) == []


def test_an_archive_whose_server_does_not_run_is_not_installed(
    paths: Paths, feed: ReleaseFeed
) -> None:
    name = asset_name("b11549")
    feed.add_release("b11549", {name: server_archive(name, server=BROKEN_SERVER)})

    with pytest.raises(EngineCheckFailed, match=r"exited 127[\s\S]*libllama\.so"):
        install(paths, feed)
    assert lane(paths) == []
    assert downloads(paths) == []


@pytest.mark.parametrize("evil", ["../../escaped.sh", "/tmp/blazar-escaped.sh"])
def test_an_archive_escaping_its_directory_is_refused(
    paths: Paths, feed: ReleaseFeed, evil: str
) -> None:
    name = asset_name("b11549", "zip")
    payload = server_archive(name, extra={evil: (b"#!/bin/sh\necho pwned\n", 0o755)})
    feed.add_release("b11549", {name: payload})

    with pytest.raises(UnsafeArchive, match="outside"):
        install(paths, feed)
    assert lane(paths) == []
    assert downloads(paths) == []
    assert not (paths.engines / "escaped.sh").exists()
    assert not Path("/tmp/blazar-escaped.sh").exists()


def test_a_tar_with_a_link_out_is_refused(paths: Paths, feed: ReleaseFeed) -> None:
    import io
    import tarfile

    name = asset_name("b11549")
    buf = io.BytesIO(make_archive(name, {"build/bin/llama-server": (BROKEN_SERVER, 0o755)}))
    out = io.BytesIO()
    with tarfile.open(fileobj=buf) as src, tarfile.open(fileobj=out, mode="w:gz") as tar:
        for member in src.getmembers():
            tar.addfile(member, src.extractfile(member))
        link = tarfile.TarInfo("build/bin/libevil.so")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    feed.add_release("b11549", {name: out.getvalue()})

    with pytest.raises(UnsafeArchive):
        install(paths, feed)
    assert lane(paths) == []


REAL = [
    "cudart-llama-bin-win-cuda-12.4-x64.zip",
    "cudart-llama-b6000-bin-ubuntu-cuda-13.4-x64.tar.gz",
    "llama-b6000-xcframework.zip",
    "llama-b6000-bin-macos-arm64.tar.gz",
    "llama-b6000-bin-macos-arm64-kleidiai.tar.gz",
    "llama-b6000-bin-macos-x64.tar.gz",
    "llama-b6000-bin-ubuntu-x64.tar.gz",
    "llama-b6000-bin-ubuntu-x64.zip",
    "llama-b6000-bin-ubuntu-vulkan-x64.tar.gz",
    "llama-b6000-bin-ubuntu-cuda-12.8-x64.tar.gz",
    "llama-b6000-bin-ubuntu-cuda-13.4-x64.tar.gz",
    "llama-b6000-bin-ubuntu-rocm-7.2-x64.tar.gz",
    "llama-b6000-bin-ubuntu-s390x.tar.gz",
    "llama-b6000-bin-ubuntu-vulkan-arm64.tar.gz",
    "llama-b6000-bin-win-cpu-x64.zip",
    "llama-b6000-bin-win-cpu-arm64.zip",
    "llama-b6000-bin-win-cuda-12.4-x64.zip",
    "llama-b6000-bin-win-vulkan-x64.zip",
    "llama-b6000-bin-win-hip-radeon-x64.zip",
    "llama-b6000-bin-win-opencl-adreno-arm64.zip",
]


def real_release(names: list[str]) -> Release:
    return Release.from_json(
        {
            "tag_name": "b6000",
            "assets": [{"name": n, "browser_download_url": f"https://x/{n}"} for n in names],
        }
    )


@pytest.mark.parametrize(
    ("system", "machine", "backend", "expected", "backend_tag"),
    [
        ("Linux", "x86_64", "cpu", "llama-b6000-bin-ubuntu-x64.tar.gz", "cpu"),
        ("Linux", "x86_64", "vulkan", "llama-b6000-bin-ubuntu-vulkan-x64.tar.gz", "vulkan"),
        ("Linux", "x86_64", "cuda", "llama-b6000-bin-ubuntu-cuda-13.4-x64.tar.gz", "cuda"),
        ("Linux", "x86_64", "cuda-12.8", "llama-b6000-bin-ubuntu-cuda-12.8-x64.tar.gz", "cuda"),
        ("Linux", "x86_64", "rocm", "llama-b6000-bin-ubuntu-rocm-7.2-x64.tar.gz", "rocm"),
        ("Linux", "s390x", "cpu", "llama-b6000-bin-ubuntu-s390x.tar.gz", "cpu"),
        ("Linux", "aarch64", "vulkan", "llama-b6000-bin-ubuntu-vulkan-arm64.tar.gz", "vulkan"),
        ("Darwin", "arm64", "cpu", "llama-b6000-bin-macos-arm64.tar.gz", "metal"),
        ("Darwin", "arm64", "metal", "llama-b6000-bin-macos-arm64.tar.gz", "metal"),
        ("Darwin", "x86_64", "cpu", "llama-b6000-bin-macos-x64.tar.gz", "cpu"),
        ("Windows", "AMD64", "cpu", "llama-b6000-bin-win-cpu-x64.zip", "cpu"),
        ("Windows", "ARM64", "cpu", "llama-b6000-bin-win-cpu-arm64.zip", "cpu"),
        ("Windows", "AMD64", "cuda", "llama-b6000-bin-win-cuda-12.4-x64.zip", "cuda"),
        ("Windows", "AMD64", "hip", "llama-b6000-bin-win-hip-radeon-x64.zip", "hip"),
    ],
)
def test_pick_asset(
    system: str, machine: str, backend: str, expected: str, backend_tag: str
) -> None:
    asset, build = pick_asset(real_release(REAL), system, machine, backend)
    assert (asset.name, build.backend) == (expected, backend_tag)


def test_pick_asset_takes_an_old_zip_and_arm64_when_present() -> None:
    old = real_release(["llama-b4000-bin-ubuntu-x64.zip", "llama-b4000-bin-win-avx2-x64.zip"])
    assert pick_asset(old, "Linux", "x86_64")[0].name == "llama-b4000-bin-ubuntu-x64.zip"
    arm = real_release([*REAL, "llama-b6000-bin-ubuntu-arm64.tar.gz"])
    assert pick_asset(arm, "Linux", "aarch64")[0].name == "llama-b6000-bin-ubuntu-arm64.tar.gz"


@pytest.mark.parametrize(
    ("system", "machine", "backend"),
    [("Linux", "aarch64", "cpu"), ("Linux", "x86_64", "sycl"), ("FreeBSD", "amd64", "cpu")],
)
def test_pick_asset_without_a_match_lists_the_names(
    system: str, machine: str, backend: str
) -> None:
    with pytest.raises(NoAsset) as missing:
        pick_asset(real_release(REAL), system, machine, backend)
    assert "llama-b6000-bin-ubuntu-x64.tar.gz" in str(missing.value)
    assert backend in str(missing.value)


def test_tags_and_digests() -> None:
    assert release.normalize_tag("11549") == "b11549" == release.normalize_tag("b11549")
    asset = release.Asset("a", "u", 1, "sha256:ABC")
    assert asset.sha256 == "abc"
    assert release.Asset("a", "u", 1, "md5:abc").sha256 is None
