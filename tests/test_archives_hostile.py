"""Issue 28, class 4: every archive Blazar opens is bounded before it is read (`blazar.archives`).

The reproductions come first, each named for what it found; each failed on the code before
`blazar.archives` (snapshot restore streamed a member whatever its header declared and
checked it against the listing only once it was written; the listing, and tarfile's pax
headers, were read whole; release and source archives were unpacked with no cap at all).
How much a refused archive wrote is read from the kernel's count of this process's write()
bytes (/proc/self/io `wchar`): deterministic, and not something the code can hide.

Then Hypothesis over the family, built by the tests, for both kinds of caller:
snapshots through the real `blazar snapshot restore` (the listing gives every member's size
and sha256) and downloaded software through `blazar.archives.extract` with small caps (what
`download.unpack` and `source.resolve_source` use, with larger ones). For each hostile
archive, whatever the format (tar, tar.gz, tar.xz, tar.bz2, zip) and wherever the hostile
member sits: a refusal that names the member and says why, nothing left in the target or
beside it, and no more written than the cap. Well-formed archives round-trip.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import hashlib
import io
import json
import lzma
import os
import random
import stat
import tarfile
import time
import tracemalloc
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blazar import archives
from blazar.archives import ArchiveError, Limits, UnsafeArchive
from blazar.engines.download import unpack
from blazar.engines.release import install_release
from blazar.engines.source import resolve_source
from blazar.paths import Paths
from tests.conftest import Blazar
from tests.feeds import ReleaseFeed, launcher_script

MiB = 1024 * 1024
BOMB = 200 * MiB  # what the bomb members declare (and hold: zeros)
END = bytes(2 * tarfile.BLOCKSIZE)  # a tar's end-of-archive blocks
REFUSED = "nothing was restored"
pytestmark = pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs /proc/self/io")


# -- measuring ------------------------------------------------------------------------------


def _wchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


@dataclass
class Written:
    bytes: int = 0


@contextmanager
def writes() -> Iterator[Written]:
    """Bytes this process passed to write() meanwhile (files, pipes, sockets alike)."""
    seen = Written()
    before = _wchar()
    try:
        yield seen
    finally:
        seen.bytes = _wchar() - before


@contextmanager
def peak_memory() -> Iterator[Written]:
    """The peak of Python allocations meanwhile (tracemalloc)."""
    seen = Written()
    tracemalloc.start()
    try:
        yield seen
    finally:
        seen.bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


# -- building archives --------------------------------------------------------------------------


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def header(name: str, size: int, **attrs: Any) -> bytes:
    """A tar header block declaring `size` bytes (the data is the caller's to append)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 1_700_000_000
    for key, value in attrs.items():
        setattr(info, key, value)
    return info.tobuf(tarfile.PAX_FORMAT)


def pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % tarfile.BLOCKSIZE)


def block(name: str, data: bytes) -> bytes:
    return header(name, len(data)) + pad(data)


@functools.cache
def compressed_fill(size: int, byte: bytes = b"\0") -> bytes:
    """A gzip member of `size` copies of `byte`, made once: about a thousandth its size."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip header and trailer
    chunk, out = byte * MiB, []
    for _ in range(size // MiB):
        out.append(squeeze.compress(chunk))
    out.append(squeeze.compress(byte * (size % MiB)))
    out.append(squeeze.flush())
    return b"".join(out)


def gz_tar(before: bytes, fill: int, after: bytes = END, byte: bytes = b"\0") -> bytes:
    """A tar.gz as concatenated gzip members (gzip allows it): `before`, `fill` copies of
    `byte` (the data of the member whose header ends `before`), then `after`."""
    return gzip.compress(before, 1) + compressed_fill(fill, byte) + gzip.compress(after, 1)


def listing(files: dict[str, bytes], *, extra: dict[str, tuple[int, str]] | None = None) -> bytes:
    """A snapshot's `snapshot.json` naming `files` (and `extra`: name -> size, sha256)."""
    named = [{"name": n, "size": len(d), "sha256": sha(d)} for n, d in files.items()]
    named += [{"name": n, "size": s, "sha256": h} for n, (s, h) in (extra or {}).items()]
    return json.dumps(
        {
            "format": 1,
            "created": "2026-12-04T00:00:00+00:00",
            "blazar": "test",
            "host": "test",
            "with_models": False,
            "counts": {},
            "files": named,
            "data_root": "",
        }
    ).encode()


def nothing_restored(paths: Paths) -> None:
    assert not paths.config.exists() or not any(paths.config.rglob("*"))
    assert not paths.db.exists()
    leftovers = [p for p in paths.data.iterdir() if p.name.startswith(".blazar-restore")]
    assert leftovers == []


# -- the reproductions ----------------------------------------------------------------------


def test_a_header_declaring_200_mib_where_the_listing_says_6_bytes_is_refused_unwritten(
    blazar: Blazar, paths: Paths, tmp_path: Path
) -> None:
    """Found: a 2.1 MB gzip whose header declared 2 GiB (listing: 6 bytes) wrote ~2 GB into
    staging before restore refused it. Here 200 MiB, in a 200 KB archive."""
    files = {"config/blazar.toml": b"x = 1\n"}
    archive = tmp_path / "bomb.tar.gz"
    archive.write_bytes(
        gz_tar(block("snapshot.json", listing(files)) + header("config/blazar.toml", BOMB), BOMB)
    )
    assert archive.stat().st_size < 400_000
    started = time.monotonic()
    with writes() as written:
        refused = blazar("snapshot", "restore", str(archive), ok=False)
    assert written.bytes < MiB  # before: all 200 MiB, then the sha256 refused it
    assert time.monotonic() - started < 5
    assert refused.exit_code == 1, refused.output
    assert f"'config/blazar.toml' declares {BOMB} bytes where the listing says 6" in refused.output
    assert REFUSED in refused.output and "Traceback" not in refused.output
    nothing_restored(paths)


def test_a_64_mib_listing_is_refused_without_being_read(
    blazar: Blazar, paths: Paths, tmp_path: Path
) -> None:
    """Found: a 262 KB archive whose snapshot.json is 256 MiB was read whole (341 MB RSS)."""
    size = 64 * MiB
    archive = paths.data / "snapshots" / "blazar-20261204T000000Z.tar.gz"
    archive.parent.mkdir(parents=True)
    archive.write_bytes(gz_tar(header("snapshot.json", size), size, END, b" "))
    assert archive.stat().st_size < 200_000
    with peak_memory() as peak:
        refused = blazar("snapshot", "restore", str(archive), ok=False)
        listed = blazar("snapshot", "list", ok=False)
    assert peak.bytes < 8 * MiB  # before: the 64 MiB read, then parsed
    assert refused.exit_code == 1, refused.output
    assert f"'snapshot.json' declares {size} bytes, over the limit" in refused.output
    assert listed.exit_code == 0, listed.output  # one refused listing: a row, not a failure
    assert "over the limit" in listed.output
    nothing_restored(paths)


@pytest.mark.parametrize("where", ["snapshot", "release"])
def test_a_32_mib_pax_header_is_refused_having_read_about_a_mebibyte(
    blazar: Blazar, paths: Paths, tmp_path: Path, where: str
) -> None:
    """tarfile reads a pax or GNU long-name header into memory whole, whatever it claims:
    the decompressed stream is metered, so a header is refused past a small allowance."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("snapshot.json" if where == "snapshot" else "build/bin/x")
        info.pax_headers = {"comment": "a" * (32 * MiB)}
        tar.addfile(info, io.BytesIO(b""))
    archive = tmp_path / "pax.tar.gz"
    archive.write_bytes(buf.getvalue())
    with peak_memory() as peak:
        if where == "snapshot":
            message = blazar("snapshot", "restore", str(archive), ok=False).output
        else:
            try:  # the refusal is asserted below, after the memory
                unpack(archive, tmp_path / "into")
                message = "unpacked"
            except UnsafeArchive as exc:
                message = str(exc)
    assert peak.bytes < 8 * MiB  # before: the 32 MiB header read into memory whole
    assert "header larger than any header may be" in message
    assert not (tmp_path / "into").exists()


@pytest.mark.parametrize("kind", ["listed link", "fifo"])
def test_a_listed_member_that_is_not_a_file_is_refused_for_what_it_is(
    blazar: Blazar, paths: Paths, tmp_path: Path, kind: str
) -> None:
    """Found: every such refusal said "which its listing does not name", listed or not."""
    files = {"config/blazar.toml": b"x = 1\n"}
    attrs: dict[str, Any] = (
        {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}
        if kind == "listed link"
        else {"type": tarfile.FIFOTYPE}
    )
    archive = tmp_path / "odd.tar.gz"
    body = block("snapshot.json", listing(files)) + header("config/blazar.toml", 0, **attrs)
    archive.write_bytes(gzip.compress(body + END))
    refused = blazar("snapshot", "restore", str(archive), ok=False)
    assert refused.exit_code == 1
    assert "does not name" not in refused.output
    said = "is a link (to '/etc/passwd')" if kind == "listed link" else "is a device file or fifo"
    assert f"'config/blazar.toml' {said}" in refused.output
    nothing_restored(paths)


@functools.cache
def zip_bomb() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        zf.writestr("build/bin/llama-server", launcher_script())
        with zf.open("build/bin/libggml-bomb.so", "w", force_zip64=True) as out:
            for _ in range(BOMB // MiB):
                out.write(bytes(MiB))
    return buf.getvalue()


@pytest.mark.parametrize("ext", ["tar.gz", "zip"])
def test_an_engine_release_with_a_bomb_member_is_refused_naming_it(
    paths: Paths, tmp_path: Path, ext: str
) -> None:
    """A release archive served on loopback: 200 MiB of zeros in about 200 KB. Before, it was
    unpacked whole (and installed: nothing checked its size)."""
    name = f"llama-b11549-bin-ubuntu-x64.{ext}"
    if ext == "zip":
        payload = zip_bomb()
    else:
        server = header("build/bin/llama-server", len(launcher_script()), mode=0o755)
        payload = gz_tar(
            server + pad(launcher_script()) + header("build/bin/libggml-bomb.so", BOMB), BOMB
        )
    assert len(payload) < 1_000_000
    with ReleaseFeed() as feed, writes() as written:
        feed.add_release("b11549", {name: payload})
        with pytest.raises(UnsafeArchive) as refused:
            install_release(paths.engines, paths.downloads, feed=feed.url)
    assert "member 'build/bin/libggml-bomb.so'" in str(refused.value)
    assert "compression bomb" in str(refused.value)
    assert written.bytes < 16 * MiB
    lane = paths.engines / "llamacpp"
    assert not lane.exists() or list(lane.iterdir()) == []
    assert not paths.downloads.exists() or list(paths.downloads.iterdir()) == []


@pytest.mark.parametrize("evil", ["bomb", "../../escaped.txt", "link"])
def test_a_source_archive_is_bounded_and_confined(tmp_path: Path, evil: str) -> None:
    """`blazar engine build --source X.tar.gz` and build_quantize's sdist come through here."""
    tree = b"".join(
        block(f"llama.cpp/{name}", b"x\n")
        for name in ("CMakeLists.txt", "include/llama.h", "tools/server/server.cpp")
    )
    sdist = tmp_path / "llama_cpp_python-0.0.1.tar.gz"
    if evil == "bomb":
        sdist.write_bytes(gz_tar(tree + header("llama.cpp/models/bomb.gguf", BOMB), BOMB))
        named = "llama.cpp/models/bomb.gguf"
    elif evil == "link":
        link = header("llama.cpp/ggml", 0, type=tarfile.SYMTYPE, linkname="../../..")
        sdist.write_bytes(gzip.compress(tree + link + END))
        named = "llama.cpp/ggml"
    else:
        sdist.write_bytes(gzip.compress(tree + block(evil, b"pwned\n") + END))
        named = evil
    work = tmp_path / "work"
    with writes() as written, pytest.raises(UnsafeArchive) as refused:
        resolve_source(str(sdist), work)
    assert f"member {named!r}" in str(refused.value)
    assert "nothing was built" in str(refused.value)
    assert written.bytes < MiB
    assert [p for p in work.rglob("*") if not p.is_dir()] == []
    assert not (tmp_path / "escaped.txt").exists()


# -- the family: snapshots through `blazar snapshot restore` --------------------------------

NAMES = st.from_regex(r"config/[a-z]{1,8}(/[a-z]{1,8})?\.toml", fullmatch=True)
CONFIG = st.dictionaries(NAMES, st.binary(max_size=2000), min_size=1, max_size=4)
SNAPSHOT_HOSTILE = [
    "size-lie",
    "bomb",
    "sha",
    "unlisted",
    "duplicate",
    "traversal",
    "absolute",
    "listed-traversal",
    "symlink",
    "hardlink",
    "device",
    "missing",
    "pax-bomb",
    "big-listing",
]


@dataclass
class Member:
    """One member of a test archive: a file (data, or `fill` zeros), link, or device."""

    name: str
    data: bytes = b""
    fill: int = 0  # bytes of zeros instead of data (declared and present)
    type: bytes = tarfile.REGTYPE
    linkname: str = ""
    mode: int = 0o644
    pax: int = 0  # bytes of a pax comment before this member
    declared: int | None = None  # a header that lies: declares this, holds `data`

    @property
    def size(self) -> int:
        return self.fill or len(self.data)

    @property
    def body(self) -> bytes:
        return bytes(self.fill) if self.fill else self.data


def build(path: Path, fmt: str, members: list[Member]) -> Path:
    """Write `members` as a tar (plain, gz, xz, bz2), block by block (tarfile will not write
    a header that lies), or as a zip archive, at `path`."""
    if fmt == "zip":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Duplicate name": that is the point
            with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
                for m in members:
                    info = zipfile.ZipInfo(m.name, date_time=(2025, 1, 1, 0, 0, 0))
                    info.create_system = 3  # Unix: the mode bits mean something
                    kind = stat.S_IFLNK if m.type == tarfile.SYMTYPE else stat.S_IFREG
                    info.external_attr = (kind | m.mode) << 16
                    info.compress_type = zipfile.ZIP_DEFLATED
                    with zf.open(info, "w") as out:
                        out.write(m.linkname.encode() if m.type == tarfile.SYMTYPE else m.body)
        return path
    blocks = []
    for m in members:
        attrs: dict[str, Any] = {"type": m.type, "linkname": m.linkname, "mode": m.mode}
        if m.pax:
            attrs["pax_headers"] = {"comment": "a" * m.pax}
        if m.declared is not None:  # the stream ends inside the member's data
            blocks.append(header(m.name, m.declared, **attrs) + m.data)
            break
        size = m.size if m.type == tarfile.REGTYPE else 0
        blocks.append(header(m.name, size, **attrs) + (pad(m.body) if size else b""))
    else:
        blocks.append(END)
    data = b"".join(blocks)
    squeeze: dict[str, Callable[[bytes], bytes]] = {
        "tar": lambda d: d,
        "tar.gz": lambda d: gzip.compress(d, 1),
        "tar.xz": lambda d: lzma.compress(d, preset=0),
        "tar.bz2": lambda d: bz2.compress(d, 1),
    }
    path.write_bytes(squeeze[fmt](data))
    return path


def snapshot_members(
    files: dict[str, bytes], hostile: str, at: int, size: int
) -> tuple[list[Member], str | None, str]:
    """A snapshot's members with one hostile change: (members, the member named, why)."""
    names = list(files)
    victim = names[at % len(names)]
    listed = dict(files)
    extra: dict[str, tuple[int, str]] = {}
    body = [Member(n, d) for n, d in files.items()]
    index = names.index(victim)
    named: str | None = victim
    if hostile == "size-lie":  # holds more (or fewer) bytes than listed
        body[index] = Member(victim, files[victim] + b"#" * (size % 4096 + 1))
        why = "where the listing says"
    elif hostile == "bomb":
        body[index] = Member(victim, fill=size)
        why = f"declares {size} bytes where the listing says {len(files[victim])}"
    elif hostile == "sha":
        body[index] = Member(victim, bytes(b ^ 1 for b in files[victim]) or b"")
        if not files[victim]:
            body[index] = Member(victim, b"!")
            why = "where the listing says 0"
        else:
            why = "does not match the sha256 the listing gives"
    elif hostile == "unlisted":
        named = "config/zz-extra.toml"
        body.insert(index, Member(named, b"evil = 1\n"))
        why = "is not in the archive's listing"
    elif hostile == "duplicate":
        body.insert(index + 1, Member(victim, files[victim]))
        why = "appears twice"
    elif hostile == "traversal":
        named = "config/../../escaped.toml"
        body.insert(index, Member(named, b"x"))
        why = "climbs out with '..'"
    elif hostile == "absolute":
        named = "/tmp/blazar-escaped.toml"
        body.insert(index, Member(named, b"x"))
        why = "has an absolute path"
    elif hostile == "listed-traversal":
        named = "config/../../escaped.toml"
        extra[named] = (1, sha(b"x"))
        body.insert(index, Member(named, b"x"))
        why = "which a snapshot cannot hold"
    elif hostile == "symlink":
        body[index] = Member(victim, type=tarfile.SYMTYPE, linkname="/etc/passwd")
        why = "is a link"
    elif hostile == "hardlink":
        body[index] = Member(victim, type=tarfile.LNKTYPE, linkname="../../../etc/passwd")
        why = "is a link"
    elif hostile == "device":
        body[index] = Member(victim, type=tarfile.CHRTYPE)
        why = "is a device file or fifo"
    elif hostile == "missing":
        named = "config/zz-missing.toml"
        extra[named] = (3, sha(b"abc"))
        why = "is named by the listing but is not in the archive"
    elif hostile == "pax-bomb":
        body[index] = Member(victim, files[victim], pax=max(size, 2 * MiB))
        named, why = None, "header larger than any header may be"
    else:  # big-listing
        named, why = "snapshot.json", "over the limit"
    data = listing(listed, extra=extra)
    if hostile == "big-listing":
        data += b" " * (8 * MiB + size % MiB)
    return [Member("snapshot.json", data), *body], named, why


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    files=CONFIG,
    hostile=st.sampled_from(SNAPSHOT_HOSTILE),
    at=st.integers(0, 3),
    size=st.integers(2 * MiB, 6 * MiB),
    fmt=st.sampled_from(["tar", "tar.gz", "tar.xz"]),
)
def test_restore_refuses_every_hostile_snapshot_naming_the_member_and_writing_nothing(
    blazar: Blazar,
    paths: Paths,
    tmp_path: Path,
    files: dict[str, bytes],
    hostile: str,
    at: int,
    size: int,
    fmt: str,
) -> None:
    members, named, why = snapshot_members(files, hostile, at, size)
    archive = build(tmp_path / f"hostile.{fmt}", fmt, members)
    with writes() as written:
        refused = blazar("snapshot", "restore", str(archive), ok=False)
    assert refused.exit_code == 1, refused.output
    assert REFUSED in refused.output and "Traceback" not in refused.output
    assert why in refused.output, refused.output
    if named is not None:
        assert repr(named) in refused.output, refused.output
    assert written.bytes < sum(map(len, files.values())) + MiB  # nothing past the listing
    nothing_restored(paths)
    assert not (tmp_path.parent / "escaped.toml").exists()
    assert not Path("/tmp/blazar-escaped.toml").exists()


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(files=CONFIG, fmt=st.sampled_from(["tar", "tar.gz", "tar.xz", "tar.bz2"]))
def test_a_well_formed_snapshot_round_trips(
    blazar: Blazar,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, bytes],
    fmt: str,
) -> None:
    home = Path(os.urandom(4).hex())
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path / home))
    members = [Member("snapshot.json", listing(files)), *(Member(n, d) for n, d in files.items())]
    archive = build(tmp_path / f"{home}.{fmt}", fmt, members)
    blazar("snapshot", "restore", str(archive))
    for name, data in files.items():
        assert (tmp_path / home / "config" / name.removeprefix("config/")).read_bytes() == data


# -- the family: downloaded software through blazar.archives.extract --------------------------

# Good trees hold at most 15 KB, so the floor lets them through whatever they compress to.
SMALL = Limits(
    member=256 * 1024, total=MiB, members=32, ratio=20, floor=64 * 1024, links=True, modes=True
)
NOISE = random.Random(28).randbytes(SMALL.member)  # incompressible: no ratio to exceed
FORMATS = ["tar", "tar.gz", "tar.xz", "tar.bz2", "zip"]
TAR_ONLY = {"hardlink-out", "device", "pax-bomb", "lying-header"}
SOFTWARE_HOSTILE = [
    "over-member-cap",
    "over-total",
    "over-ratio",
    "too-many",
    "traversal",
    "absolute",
    "symlink-out",
    "symlink-chain-out",
    "duplicate",
    *sorted(TAR_ONLY),
]
TREE = st.dictionaries(
    st.from_regex(r"[a-z]{1,6}(/[a-z]{1,6}){0,2}", fullmatch=True),
    st.tuples(st.binary(max_size=3000), st.booleans()),
    max_size=5,
).filter(lambda t: not any(a != b and b.startswith(a + "/") for a in t for b in t))


def software_members(
    tree: dict[str, tuple[bytes, bool]], hostile: str, at: int, size: int
) -> tuple[list[Member], str | None, str]:
    body = [Member(f"pkg/{n}", d, mode=0o755 if x else 0o644) for n, (d, x) in tree.items()]
    at = at % (len(body) + 1)
    named: str | None
    if hostile == "over-member-cap":
        named, why = "pkg/big.bin", "per member"
        body.insert(at, Member(named, fill=SMALL.member + size % MiB + 1))
    elif hostile == "over-total":
        parts = [Member(f"pkg/part{i}.bin", NOISE) for i in range(5)]
        body[at:at] = parts
        named, why = None, "over the cap of"
    elif hostile == "over-ratio":  # under every cap, but a thousand times its archive
        named, why = "pkg/zeros.bin", "compression bomb"
        body.insert(at, Member(named, fill=SMALL.member))
    elif hostile == "too-many":
        body[at:at] = [Member(f"pkg/many-files/{i}", b"") for i in range(SMALL.members + 1)]
        named, why = None, "members"
    elif hostile == "traversal":
        named, why = "pkg/../../escaped.txt", "climbs out"
        body.insert(at, Member(named, b"x"))
    elif hostile == "absolute":
        named, why = "/tmp/blazar-escaped.txt", "absolute path"
        body.insert(at, Member(named, b"x"))
    elif hostile == "symlink-out":
        named, why = "pkg/out-link", "outside"
        body.insert(at, Member(named, type=tarfile.SYMTYPE, linkname="../.."))
    elif hostile == "symlink-chain-out":  # each link is inside when made; the next is not
        body[at:at] = [
            Member("pkg/l-1", type=tarfile.SYMTYPE, linkname=".."),  # the target's root
            Member("pkg/l-1/l-2", type=tarfile.SYMTYPE, linkname=".."),  # its parent
        ]
        named, why = "pkg/l-1/l-2", "outside"
    elif hostile == "duplicate":
        named, why = "pkg/twice.txt", "appears twice"
        body[at:at] = [Member(named, b"one"), Member(named, b"two")]
    elif hostile == "hardlink-out":
        named, why = "pkg/passwd-link", "outside"
        body.insert(at, Member(named, type=tarfile.LNKTYPE, linkname="../../../etc/passwd"))
    elif hostile == "device":
        named, why = "pkg/dev-fifo", "device file or fifo"
        body.insert(at, Member(named, type=tarfile.FIFOTYPE))
    elif hostile == "pax-bomb":
        named, why = None, "header larger than any header may be"
        body.insert(at, Member("pkg/pax.txt", b"x", pax=max(size, 2 * MiB)))
    else:  # lying-header: declares more than the archive holds
        named, why = None, "damaged or truncated"
        body.append(Member("pkg/lies.bin", b"short", declared=40_000))
    return body, named, why


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    tree=TREE,
    hostile=st.sampled_from(SOFTWARE_HOSTILE),
    at=st.integers(0, 5),
    size=st.integers(0, 4 * MiB),
    fmt=st.sampled_from(FORMATS),
)
def test_extract_refuses_every_hostile_archive_within_its_caps(
    tmp_path: Path,
    tree: dict[str, tuple[bytes, bool]],
    hostile: str,
    at: int,
    size: int,
    fmt: str,
) -> None:
    if fmt == "zip" and hostile in TAR_ONLY:
        fmt = "tar.gz"
    if fmt == "tar" and hostile == "over-ratio":
        fmt = "tar.xz"  # a plain tar holds what it unpacks to: no ratio to exceed
    members, named, why = software_members(tree, hostile, at, size)
    case = tmp_path / os.urandom(4).hex()
    case.mkdir()
    archive = build(case / f"hostile.{fmt}", fmt, members)
    into = case / "out" / "engine"
    with writes() as written, pytest.raises((UnsafeArchive, ArchiveError)) as refused:
        archives.extract(archive, into, limits=SMALL, then="test: refused")
    message = str(refused.value)
    assert why in message, message
    if named is not None:
        assert f"member {named!r}" in message, message
    assert message.endswith("; test: refused")
    assert not into.exists()
    assert sorted(p.name for p in case.rglob("*")) == ["hostile." + fmt, "out"]
    assert written.bytes < SMALL.total + 256 * 1024
    assert not Path("/tmp/blazar-escaped.txt").exists()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tree=TREE, fmt=st.sampled_from(FORMATS), link=st.booleans())
def test_a_well_formed_software_archive_round_trips(
    tmp_path: Path, tree: dict[str, tuple[bytes, bool]], fmt: str, link: bool
) -> None:
    members = [Member(f"pkg/{n}", d, mode=0o755 if x else 0o644) for n, (d, x) in tree.items()]
    if link and tree:  # a link inside the tree, as release archives hold (libfoo.so -> .so.0)
        first = next(iter(tree))
        members.append(Member("pkg/zz-link", type=tarfile.SYMTYPE, linkname=first))
    case = tmp_path / os.urandom(4).hex()
    case.mkdir()
    archive = build(case / f"good.{fmt}", fmt, members)
    unpacked = archives.extract(archive, case / "out", limits=SMALL, then="test")
    assert unpacked.files == {f"pkg/{n}": len(d) for n, (d, _) in tree.items()}
    for name, (data, executable) in tree.items():
        path = case / "out" / "pkg" / name
        assert path.read_bytes() == data
        assert bool(path.stat().st_mode & 0o100) == executable
    if link and tree:
        assert (case / "out" / "pkg" / "zz-link").read_bytes() == tree[first][0]
