"""Model sources: file://, https:// (resumable, verified), short names, and plans."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from blazar.engines.download import part_path
from blazar.errors import InvalidInput, NotGGUF, VerificationFailed
from blazar.sources import (
    REGISTRY,
    FetchError,
    TemporaryFetchError,
    UnknownModelName,
    fetch,
    plan_fetch,
    resolve_registry,
)
from blazar.testing.tiny import tiny_model_bytes
from specs.sources import FileSource, HFSource, HttpsSource, RegistrySource, parse_source
from tests.hf_endpoint import FakeHub

ROOT = Path(__file__).resolve().parent.parent
TINY = tiny_model_bytes()
TINY_SHA = hashlib.sha256(TINY).hexdigest()


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as hub:
        hub.files["tiny.gguf"] = TINY
        yield hub


# --- file:// ---------------------------------------------------------------------------


def test_a_file_is_used_where_it_is_and_never_changed(tiny_model: Path, tmp_path: Path) -> None:
    before = tiny_model.stat()
    got = fetch(FileSource(str(tiny_model)), sha256=None, downloads=tmp_path / "dl")
    assert got.files == [tiny_model] and not got.temporary
    assert got.sha256 == TINY_SHA and got.size == len(TINY)
    again = fetch(tiny_model.as_uri(), sha256=TINY_SHA.upper(), downloads=tmp_path / "dl")
    assert again.sha256 == TINY_SHA
    after = tiny_model.stat()
    assert (after.st_mtime_ns, after.st_size, after.st_ino) == (
        before.st_mtime_ns,
        before.st_size,
        before.st_ino,
    )
    assert not (tmp_path / "dl").exists()


def test_a_missing_file_or_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match=r"no such file: .*nope\.gguf"):
        fetch(FileSource(str(tmp_path / "nope.gguf")), sha256=None, downloads=tmp_path)
    with pytest.raises(FetchError, match="not a file"):
        fetch(FileSource(str(tmp_path)), sha256=None, downloads=tmp_path)
    (tmp_path / "notes.gguf").write_text("hello")
    with pytest.raises(NotGGUF):
        fetch(FileSource(str(tmp_path / "notes.gguf")), sha256=None, downloads=tmp_path)


def test_a_file_with_the_wrong_sha256_is_refused_and_left_alone(
    tiny_model: Path, tmp_path: Path
) -> None:
    with pytest.raises(VerificationFailed, match="nothing was kept"):
        fetch(FileSource(str(tiny_model)), sha256="ab" * 32, downloads=tmp_path / "dl")
    assert tiny_model.read_bytes() == TINY
    assert not (tmp_path / "dl").exists()
    with pytest.raises(InvalidInput, match="64 hexadecimal"):
        fetch(FileSource(str(tiny_model)), sha256="abc", downloads=tmp_path)


def test_a_first_shard_brings_its_siblings(tmp_path: Path) -> None:
    first, second = tmp_path / "m-00001-of-00002.gguf", tmp_path / "m-00002-of-00002.gguf"
    first.write_bytes(TINY[:1000])
    with pytest.raises(FetchError, match="missing"):
        fetch(FileSource(str(first)), sha256=None, downloads=tmp_path)
    second.write_bytes(TINY[1000:])
    got = fetch(FileSource(str(first)), sha256=None, downloads=tmp_path)
    assert got.files == [first, second] and got.size == len(TINY)


# --- https:// ---------------------------------------------------------------------------


def test_a_url_downloads_verified_into_the_download_area(hub: FakeHub, tmp_path: Path) -> None:
    seen: list[int] = []
    got = fetch(
        HttpsSource(hub.file_url("tiny.gguf")),
        sha256=TINY_SHA,
        downloads=tmp_path,
        progress=lambda done, total: seen.append(done),
    )
    assert got.files == [tmp_path / f"{TINY_SHA}.gguf"] and got.temporary
    assert got.files[0].read_bytes() == TINY and got.size == len(TINY)
    assert got.detail == {"url": hub.file_url("tiny.gguf")} and seen[-1] == len(TINY)


def test_a_url_without_sha256_is_refused_before_any_request(hub: FakeHub, tmp_path: Path) -> None:
    source = HttpsSource(hub.file_url("tiny.gguf"))
    with pytest.raises(FetchError, match="sha256 is required"):
        plan_fetch(source, sha256=None)
    with pytest.raises(FetchError, match="sha256 is required"):
        fetch(source, sha256=None, downloads=tmp_path)
    assert hub.requests == []


def test_a_url_with_the_wrong_sha256_keeps_nothing(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(VerificationFailed, match="nothing was kept"):
        fetch(HttpsSource(hub.file_url("tiny.gguf")), sha256="0" * 64, downloads=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_http_errors_are_permanent_or_temporary(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="HTTP 404") as err:
        fetch(HttpsSource(hub.file_url("gone.gguf")), sha256=TINY_SHA, downloads=tmp_path)
    assert not isinstance(err.value, TemporaryFetchError)
    hub.file_status["tiny.gguf"] = 503
    with pytest.raises(TemporaryFetchError, match="HTTP 503"):
        fetch(HttpsSource(hub.file_url("tiny.gguf")), sha256=TINY_SHA, downloads=tmp_path)


def test_a_cut_download_resumes_with_a_range_request(hub: FakeHub, tmp_path: Path) -> None:
    source = HttpsSource(hub.file_url("tiny.gguf"))
    hub.cut_after["tiny.gguf"] = 100_000
    with pytest.raises(TemporaryFetchError, match="resumes"):
        fetch(source, sha256=TINY_SHA, downloads=tmp_path)
    part = part_path(tmp_path / f"{TINY_SHA}.gguf")
    assert part.stat().st_size == 100_000
    got = fetch(source, sha256=TINY_SHA, downloads=tmp_path)
    assert got.files[0].read_bytes() == TINY and not part.exists()
    assert [s.header("Range") for s in hub.requests] == [None, "bytes=100000-"]


def test_a_fetch_killed_mid_download_resumes_in_the_next_process(
    hub: FakeHub, tmp_path: Path
) -> None:
    # The downloader writes 1 MiB chunks: stall after 1.5 MiB so one chunk lands on disk.
    big = TINY + bytes(3 * 2**20 - len(TINY))
    digest = hashlib.sha256(big).hexdigest()
    hub.files["big.gguf"] = big
    hub.stall_after["big.gguf"] = 3 * 2**19
    code = (
        "from pathlib import Path\n"
        "from blazar.sources import fetch\n"
        f"fetch({hub.file_url('big.gguf')!r}, sha256={digest!r},"
        f" downloads=Path({str(tmp_path)!r}))\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ))
    part = part_path(tmp_path / f"{digest}.gguf")
    try:
        deadline = time.monotonic() + 4
        while not (part.exists() and part.stat().st_size >= 2**20):
            assert child.poll() is None, "the child ended before it was killed"
            assert time.monotonic() < deadline, "the download never got going"
            time.sleep(0.01)
        assert hub.stalled.is_set()
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=5)
    assert child.returncode == -signal.SIGKILL
    have = part.stat().st_size
    assert 0 < have < len(big)
    got = fetch(HttpsSource(hub.file_url("big.gguf")), sha256=digest, downloads=tmp_path)
    assert got.sha256 == digest and got.files[0].read_bytes() == big and not part.exists()
    assert [s.header("Range") for s in hub.requests] == [None, f"bytes={have}-"]


def test_verified_bytes_that_are_no_gguf_are_not_kept(hub: FakeHub, tmp_path: Path) -> None:
    hub.files["page.gguf"] = b"<html>not a model</html>"
    digest = hashlib.sha256(hub.files["page.gguf"]).hexdigest()
    with pytest.raises(NotGGUF):
        fetch(hub.file_url("page.gguf"), sha256=digest, downloads=tmp_path)
    assert list(tmp_path.iterdir()) == []


# --- short names --------------------------------------------------------------------------


def test_every_short_name_is_an_hf_quantization() -> None:
    assert {"qwen3-0.6b", "gemma3-270m", "llama3.2-1b", "smollm2-135m"} <= set(REGISTRY)
    for name, target in REGISTRY.items():
        source = resolve_registry(name)
        assert isinstance(source, HFSource) and source.quant and str(source) == target
        assert isinstance(parse_source(name), RegistrySource)
    assert resolve_registry("qwen3-0.6b") == HFSource("Qwen/Qwen3-0.6B-GGUF", "Q8_0")


def test_a_tag_picks_another_quantization_of_the_same_repo() -> None:
    assert resolve_registry("qwen3-4b:q8_0") == HFSource("Qwen/Qwen3-4B-GGUF", "Q8_0")


def test_an_unknown_short_name_suggests_a_close_one(tmp_path: Path) -> None:
    with pytest.raises(UnknownModelName, match=r"did you mean 'qwen3-0\.6b'.*smollm2-135m"):
        resolve_registry("qwen3-0.5b")
    with pytest.raises(UnknownModelName, match="known names are"):
        fetch("zzzz", sha256=None, downloads=tmp_path)


# --- plans ---------------------------------------------------------------------------------


def test_plans_say_what_a_fetch_would_do_without_the_network(
    tiny_model: Path, tmp_path: Path
) -> None:
    plan = plan_fetch(tiny_model.as_uri(), sha256=TINY_SHA)
    assert (plan.kind, plan.location, plan.size, plan.network) == (
        "file",
        str(tiny_model),
        len(TINY),
        False,
    )
    assert plan.describe() == f"use file://{tiny_model}"
    plan = plan_fetch("https://example.invalid/m.gguf", sha256=TINY_SHA)
    assert (plan.kind, plan.network, plan.sha256) == ("https", True, TINY_SHA)
    plan = plan_fetch("hf://o/r:Q8_0", sha256=None, env={})
    assert plan.location == "https://huggingface.co/o/r" and plan.network
    assert plan.describe() == "download hf://o/r:Q8_0 from https://huggingface.co/o/r"
    plan = plan_fetch("ollama://qwen3", sha256=None, env={"OLLAMA_MODELS": str(tmp_path)})
    expected = tmp_path / "manifests/registry.ollama.ai/library/qwen3/latest"
    assert plan.kind == "ollama" and plan.location == str(expected) and not plan.network
    with pytest.raises(InvalidInput, match="unknown source scheme"):
        plan_fetch("ftp://x/y.gguf", sha256=None)
