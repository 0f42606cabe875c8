"""hf:// sources with the real huggingface_hub client against a hub on loopback."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from blazar.errors import VerificationFailed
from blazar.sources import (
    REGISTRY,
    Fetched,
    FetchError,
    TemporaryFetchError,
    fetch,
    plan_fetch,
)
from blazar.sources.base import Progress
from blazar.sources.hf import select_files
from blazar.testing.tiny import tiny_model_bytes
from specs.sources import HFSource, parse_source
from tests.hf_endpoint import FakeHub

REPO = "test/tiny-GGUF"


@cache
def tiny(seed: int) -> bytes:
    return tiny_model_bytes(seed=seed)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


SHARDED = tiny(3)
HALF = len(SHARDED) // 2
FILES = {
    "README.md": b"# tiny\n",
    "tiny-Q8_0.gguf": tiny(1),
    "tiny-f16.gguf": tiny(2),
    "tiny-Q4_K_M-00001-of-00002.gguf": SHARDED[:HALF],
    "tiny-Q4_K_M-00002-of-00002.gguf": SHARDED[HALF:],
    "Q5_K_M/tiny-Q5_K_M.gguf": tiny(4),
    "mmproj-tiny-Q8_0.gguf": b"GGUF not a model",
}


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as hub:
        hub.add_repo(REPO, FILES)
        yield hub


def get(
    hub: FakeHub,
    source: str,
    tmp_path: Path,
    *,
    sha256: str | None,
    env: dict[str, str] | None = None,
    progress: Progress | None = None,
) -> Fetched:
    env = {"HF_ENDPOINT": hub.url, **(env or {})}
    return fetch(source, sha256=sha256, downloads=tmp_path / "dl", env=env, progress=progress)


def test_a_quantization_picks_its_file_and_verifies_it(hub: FakeHub, tmp_path: Path) -> None:
    calls: list[tuple[int, int | None]] = []
    got = get(
        hub, f"hf://{REPO}:Q8_0", tmp_path, sha256=None, progress=lambda d, t: calls.append((d, t))
    )
    assert got.files[0].read_bytes() == tiny(1)
    assert got.sha256 == sha(tiny(1)) and got.size == len(tiny(1))
    assert got.files[0].is_relative_to(tmp_path / "dl" / "hf") and not got.files[0].is_symlink()
    assert not got.temporary
    assert got.detail["revision"] == hub.repos[REPO].refs["main"]
    assert got.detail["filename"] == "tiny-Q8_0.gguf" and got.detail["repo"] == REPO
    assert calls[-1] == (len(tiny(1)), len(tiny(1)))
    assert hub.seen("GET", "/api/models/test/tiny-GGUF")  # model_info(files_metadata=True)
    assert hub.seen("HEAD", "/resolve/") and hub.seen("GET", "/resolve/")


def test_quantizations_match_case_insensitively(hub: FakeHub, tmp_path: Path) -> None:
    assert get(hub, f"hf://{REPO}:q8_0", tmp_path, sha256=None).sha256 == sha(tiny(1))
    assert get(hub, f"hf://{REPO}:F16", tmp_path, sha256=None).sha256 == sha(tiny(2))


def test_shards_are_one_model_first_shard_first(hub: FakeHub, tmp_path: Path) -> None:
    got = get(hub, f"hf://{REPO}:Q4_K_M", tmp_path, sha256=None)
    assert len(got.files) == 2
    assert b"".join(f.read_bytes() for f in got.files) == SHARDED
    assert got.sha256 == sha(SHARDED[:HALF]) and got.size == len(SHARDED)
    assert got.detail["shards"].split(",") == [
        "tiny-Q4_K_M-00001-of-00002.gguf",
        "tiny-Q4_K_M-00002-of-00002.gguf",
    ]


def test_files_in_subfolders_by_quant_and_by_name(hub: FakeHub, tmp_path: Path) -> None:
    assert get(hub, f"hf://{REPO}:Q5_K_M", tmp_path, sha256=None).sha256 == sha(tiny(4))
    by_name = get(hub, f"hf://{REPO}/Q5_K_M/tiny-Q5_K_M.gguf", tmp_path, sha256=None)
    assert by_name.sha256 == sha(tiny(4))
    assert by_name.detail["filename"] == "Q5_K_M/tiny-Q5_K_M.gguf"


def test_quantization_matching_respects_token_boundaries() -> None:
    names = ["m-Q4_K.gguf", "m-Q4_K_M.gguf", "m-IQ4_XS.gguf", "m-Q4_K_M_L.gguf", "m.Q6_K.gguf"]
    names += ["sub/m-UD-Q4_K_XL.gguf", "mmproj-m-f16.gguf", "m-BF16.gguf", "m-F16.gguf"]

    def pick(quant: str) -> list[str]:
        return select_files(HFSource("o/r", quant), names)

    assert pick("Q4_K") == ["m-Q4_K.gguf"]
    assert pick("q4_k_m") == ["m-Q4_K_M.gguf"]
    with pytest.raises(FetchError):
        pick("Q4_XS")  # IQ4_XS is another quantization
    assert pick("IQ4_XS") == ["m-IQ4_XS.gguf"]
    assert pick("Q6_K") == ["m.Q6_K.gguf"]
    assert pick("Q4_K_XL") == ["sub/m-UD-Q4_K_XL.gguf"]
    assert pick("F16") == ["m-F16.gguf"]  # neither BF16 nor the vision projector


def test_naming_any_shard_means_the_whole_split_model() -> None:
    names = ["x-00001-of-00002.gguf", "x-00002-of-00002.gguf", "y-00001-of-00002.gguf"]
    second = HFSource("o/r", filename="x-00002-of-00002.gguf")
    assert select_files(second, names) == names[:2]
    with pytest.raises(FetchError, match=r"incomplete split model: y-00002-of-00002\.gguf"):
        select_files(HFSource("o/r", filename="y-00001-of-00002.gguf"), names)


def test_an_ambiguous_or_missing_quantization_lists_the_files(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo("test/two", {"a-Q8_0.gguf": tiny(1), "b-Q8_0.gguf": tiny(2)})
    with pytest.raises(FetchError, match=r"several files.*a-Q8_0\.gguf, b-Q8_0\.gguf"):
        get(hub, "hf://test/two:Q8_0", tmp_path, sha256=None)
    with pytest.raises(FetchError, match=r"no Q2_K GGUF file.*tiny-Q8_0\.gguf") as err:
        get(hub, f"hf://{REPO}:Q2_K", tmp_path, sha256=None)
    assert "tiny-f16.gguf" in str(err.value) and not isinstance(err.value, TemporaryFetchError)
    with pytest.raises(FetchError, match=r"no file 'nope\.gguf'"):
        get(hub, f"hf://{REPO}/nope.gguf", tmp_path, sha256=None)
    assert not hub.seen("GET", "/resolve/")


def test_a_revision_pins_older_bytes(hub: FakeHub, tmp_path: Path) -> None:
    old = hub.repos[REPO].refs["main"]
    hub.add_repo(REPO, {**FILES, "tiny-Q8_0.gguf": tiny(9)})
    hub.repos[REPO].refs["v1"] = old
    assert get(hub, f"hf://{REPO}:Q8_0", tmp_path, sha256=None).sha256 == sha(tiny(9))
    tagged = get(hub, f"hf://{REPO}:Q8_0@v1", tmp_path, sha256=None)
    assert tagged.sha256 == sha(tiny(1))
    assert tagged.detail["revision"] == old and tagged.detail["requested"] == "v1"
    by_sha = get(hub, f"hf://{REPO}/tiny-Q8_0.gguf@{old}", tmp_path, sha256=None)
    assert by_sha.sha256 == sha(tiny(1))
    with pytest.raises(FetchError, match="no revision 'v9'"):
        get(hub, f"hf://{REPO}:Q8_0@v9", tmp_path, sha256=None)


def test_hf_token_is_sent_as_a_bearer_token(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo("test/private", {"p-Q8_0.gguf": tiny(5)}, token="hf_secret")
    with pytest.raises(FetchError, match="HF_TOKEN"):
        get(hub, "hf://test/private:Q8_0", tmp_path, sha256=None)
    got = get(hub, "hf://test/private:Q8_0", tmp_path, sha256=None, env={"HF_TOKEN": "hf_secret"})
    assert got.sha256 == sha(tiny(5))
    for method, part in (
        ("GET", "/api/models/test/private"),
        ("HEAD", "/resolve/"),
        ("GET", "/resolve/"),
    ):
        assert hub.seen(method, part)[-1].header("Authorization") == "Bearer hf_secret"


def test_wrong_bytes_from_the_hub_are_not_kept(hub: FakeHub, tmp_path: Path) -> None:
    hub.wrong_bytes.add("tiny-Q8_0.gguf")
    with pytest.raises(VerificationFailed, match="nothing was kept"):
        get(hub, f"hf://{REPO}:Q8_0", tmp_path, sha256=None)
    cache = tmp_path / "dl" / "hf" / "models--test--tiny-GGUF"
    assert not [p for p in cache.rglob("*") if p.is_file() and p.parent.name != "refs"]
    hub.wrong_bytes.clear()
    assert get(hub, f"hf://{REPO}:Q8_0", tmp_path, sha256=None).sha256 == sha(tiny(1))


def test_a_manifest_sha256_the_hub_does_not_have_downloads_nothing(
    hub: FakeHub, tmp_path: Path
) -> None:
    with pytest.raises(VerificationFailed, match="nothing was downloaded"):
        get(hub, f"hf://{REPO}:Q8_0", tmp_path, sha256="0" * 64)
    assert not hub.seen("GET", "/resolve/")
    got = get(hub, f"hf://{REPO}:Q8_0", tmp_path, sha256=sha(tiny(1)).upper())
    assert got.sha256 == sha(tiny(1))


def test_a_download_cut_midway_resumes_with_a_range_request(hub: FakeHub, tmp_path: Path) -> None:
    # huggingface_hub writes in 10 MiB chunks and resumes after the last one it wrote.
    big = tiny(1) + bytes(11 * 2**20 - len(tiny(1)))
    hub.add_repo("test/big", {"big-Q8_0.gguf": big})
    hub.cut_after["big-Q8_0.gguf"] = 10 * 2**20 + 5
    got = get(hub, "hf://test/big:Q8_0", tmp_path, sha256=None)  # one fetch: the client retries
    assert got.sha256 == sha(big)
    ranges = [s.header("Range") for s in hub.seen("GET", "/resolve/")]
    assert ranges == [None, f"bytes={10 * 2**20}-"]


def test_hub_trouble_is_temporary_and_a_missing_repo_is_not(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="no repo test/missing") as err:
        get(hub, "hf://test/missing:Q8_0", tmp_path, sha256=None)
    assert not isinstance(err.value, TemporaryFetchError)
    hub.api_body = b"<html>a captive portal</html>"
    with pytest.raises(FetchError, match="does not answer like a Hugging Face hub"):
        get(hub, f"hf://{REPO}:Q8_0", tmp_path, sha256=None)
    hub.api_status = 503
    with pytest.raises(TemporaryFetchError, match="HTTP 503"):
        get(hub, f"hf://{REPO}:Q8_0", tmp_path, sha256=None)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(TemporaryFetchError, match="cannot reach"):
        fetch(f"hf://{REPO}:Q8_0", sha256=None, downloads=tmp_path, env={"HF_ENDPOINT": closed})


def test_a_short_name_fetches_its_hf_source(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(REGISTRY, "tiny-1m", f"hf://{REPO}:Q8_0")
    got = get(hub, "tiny-1m", tmp_path, sha256=None)
    assert got.sha256 == sha(tiny(1)) and got.detail["name"] == "tiny-1m"
    plan = plan_fetch(parse_source("tiny-1m"), sha256=None, env={"HF_ENDPOINT": hub.url})
    assert plan.kind == "hf" and plan.location == f"{hub.url}/{REPO}" and plan.network
