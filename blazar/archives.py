"""Every archive Blazar opens, unpacked with its size bounded before a byte is written.

Snapshots (`blazar.snapshots`), llama.cpp release archives and fork source archives
(`blazar.engines.download.unpack`) and llama.cpp source tarballs such as the
llama-cpp-python sdist (`blazar.engines.source`, which `blazar.engines.tools` uses to
build llama-quantize) all come through `extract`; `read_first` reads a snapshot's
listing. Why one module: a hostile-input run found that a 2.1 MB gzip whose tar header
declares a 2 GiB member (its listing said 6 bytes) wrote about 2 GB into staging before
restore refused it, and that a 262 KB archive whose `snapshot.json` is 256 MiB was read
whole (341 MB of memory); each archive reader had its own, partial, checks.

The rules, applied to each member in archive order, before its data is read:

- its name is relative, without `..`, and (tar) passes tarfile's `data` filter: no
  absolute or escaping links, no device files or fifos; links at all only where the
  caller allows them, and then only pointing inside the target;
- a caller that knows what the archive holds (a snapshot's listing) names every member
  and its size: an unnamed member, a declared size that differs, a second copy of a
  name, and (at the end) a missing member are each refused, saying which and why;
- its declared size is within the per-member cap, the declared sizes so far within the
  total cap, and (for downloaded software) within `ratio` times the archive's own size,
  so a compression bomb is refused from its header;
- its data is streamed with a running count that stops at the cap, whatever the header
  said, and a listed sha256 is checked as it streams.

The decompressed stream tarfile reads is itself metered (`_Meter`): the bytes outside
members' data (headers, pax and GNU long-name records) may not pass a small allowance,
so a header that claims gigabytes is refused after reading about a mebibyte, where
tarfile would read it into memory whole. On any refusal everything written under the
target is removed; the target must be empty (or absent) when extraction starts.
Refusals are `UnsafeArchive` (a member Blazar will not unpack) or `ArchiveError` (the
archive cannot be read), each saying which member, what is wrong and, through the
caller's `then`, what to do next.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import io
import lzma
import os
import re
import shutil
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any, Protocol

from blazar.errors import BlazarError, VerificationFailed

CHUNK = 1024 * 1024
MiB = 1024 * 1024
GiB = 1024 * MiB
# Bytes of the decompressed tar stream outside members' data that tarfile may read: a
# fixed allowance (its 10 KiB read-ahead, end-of-archive blocks and record padding) and
# one per member (a 512-byte header, padding up to 511 bytes, a pax record with a long
# path). A pax or GNU long-name header claiming more is refused when it passes this.
HEADER_ALLOWANCE = 1 * MiB
HEADER_PER_MEMBER = 16 * 1024
# Archives under this many bytes may unpack to up to this much whatever their ratio.
RATIO_FLOOR = 64 * MiB
_DRIVE = re.compile(r"^[A-Za-z]:")


class ArchiveError(BlazarError):
    """An archive cannot be read: not an archive, damaged or truncated."""


class UnsafeArchive(VerificationFailed):
    """An archive holds a member Blazar will not unpack, or more than it may unpack."""


@dataclass(frozen=True)
class Limits:
    """How much one archive may unpack to."""

    member: int  # bytes one member may hold
    total: int  # bytes all members together may hold
    members: int  # entries (files, directories, links)
    ratio: int | None = None  # unpacked bytes per archive byte; None: not checked
    floor: int = RATIO_FLOOR  # what any archive may unpack to, whatever its ratio
    links: bool = False  # symbolic and hard links pointing inside the target
    modes: bool = False  # keep the archive's mode bits (filtered: no setuid, no group write)


@dataclass(frozen=True)
class Expected:
    """What a caller knows a member holds (a snapshot's listing)."""

    size: int
    sha256: str | None = None


# Downloaded software: llama.cpp release archives (a CUDA build's libraries run to about
# a gigabyte), fork source archives and llama.cpp source tarballs (the llama-cpp-python
# sdist unpacks to a few hundred megabytes in a few thousand files). Binaries and source
# compress 3 to 10 times; a bomb, a thousand.
SOFTWARE = Limits(
    member=4 * GiB, total=16 * GiB, members=200_000, ratio=100, links=True, modes=True
)


def for_listing(expected: Mapping[str, Expected], *, directories: int = 64) -> Limits:
    """The limits a listing implies: no member over its listed size, no more in all."""
    sizes = [e.size for e in expected.values()]
    return Limits(
        member=max(sizes, default=0),
        total=sum(sizes),
        members=len(sizes) + directories,
    )


@dataclass
class _Refusal(Exception):
    """A refusal found inside the archive, made a domain error with the archive's name."""

    member: str | None
    why: str
    unsafe: bool = True


@dataclass
class Unpacked:
    """What `extract` wrote: regular files by name, and their bytes."""

    files: dict[str, int] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(self.files.values())


def kind(archive: Path) -> str | None:
    """'zip', 'tar' (plain or gzip/bzip2/xz-compressed) or None, from the first bytes."""
    try:
        with archive.open("rb") as fh:
            head = fh.read(8)
            if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
                return "zip"
            fh.seek(0)
            with _decompressed(fh, head) as stream:
                block = stream.read(tarfile.BLOCKSIZE)
        if block != bytes(tarfile.BLOCKSIZE):  # an empty tar is its end-of-archive blocks
            tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
    except (OSError, EOFError, zlib.error, lzma.LZMAError, tarfile.HeaderError):
        return None
    return "tar"


def read_first(archive: Path, name: str, *, limit: int, then: str) -> bytes | None:
    """The first member's bytes if it is a regular file called `name`, else None; a
    `name` declaring more than `limit` bytes is refused before any of it is read."""
    try:
        with _open_tar(archive, HEADER_ALLOWANCE) as (tar, meter):
            first = tar.next()
            if first is None or first.name != name or not first.isreg():
                return None
            if first.size > limit:
                raise _Refusal(
                    name, f"declares {first.size} bytes, over the limit of {limit} for it"
                )
            meter.limit += first.size + tarfile.BLOCKSIZE
            source = tar.extractfile(first)
            assert source is not None  # a regular file
            return source.read(first.size)
    except _Refusal as refusal:
        raise _error(archive, refusal, then) from None
    except _DAMAGED as exc:
        damaged = _Refusal(None, f"is damaged or truncated ({exc})", unsafe=False)
        raise _error(archive, damaged, then) from None


def extract(
    archive: Path,
    into: Path,
    *,
    limits: Limits,
    expected: Mapping[str, Expected] | None = None,
    then: str,
) -> Unpacked:
    """Unpack a tar (plain or compressed) or zip `archive` into `into` under `limits`
    (see the module's docstring); with `expected`, exactly the members it names, at their
    sizes and hashes. On a refusal nothing is left under `into`; `then` ends the message
    with what to do."""
    created = not into.exists()
    into.mkdir(parents=True, exist_ok=True)
    if any(into.iterdir()):
        raise ValueError(f"{into} must be empty to unpack {archive.name} into it")
    try:
        found = kind(archive)
        if found is None:
            raise _Refusal(None, "is not a tar or zip archive", unsafe=False)
        job = _Job(archive, into.resolve(), limits, expected)
        job.check_room()
        if found == "zip":
            job.unzip()
        else:
            job.untar()
        job.check_complete()
        return job.unpacked
    except BaseException as exc:
        _empty(into, remove=created)
        refusal = _as_refusal(exc, into)
        if refusal is None:
            raise
        raise _error(archive, refusal, then) from None


# What a damaged, truncated or unsupported archive raises while it is read.
_DAMAGED = (
    tarfile.ReadError,
    tarfile.HeaderError,
    tarfile.CompressionError,
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    gzip.BadGzipFile,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    UnicodeDecodeError,
    NotImplementedError,  # a zip member compressed with a method this Python lacks
)


def _as_refusal(exc: BaseException, into: Path) -> _Refusal | None:
    if isinstance(exc, _Refusal):
        return exc
    if isinstance(exc, tarfile.FilterError):  # before _DAMAGED: both are TarErrors
        return _Refusal(exc.tarinfo.name, _filter_why(exc))
    if isinstance(exc, _DAMAGED):
        return _Refusal(None, f"is damaged or truncated ({exc})", unsafe=False)
    if isinstance(exc, OSError):
        return _Refusal(None, f"could not be unpacked into {into} ({exc})", unsafe=False)
    return None


def _error(archive: Path, refusal: _Refusal, then: str) -> BlazarError:
    where = f"{archive}: member {refusal.member!r}" if refusal.member else str(archive)
    message = f"{where} {refusal.why}; {then}"
    return UnsafeArchive(message) if refusal.unsafe else ArchiveError(message)


def _filter_why(exc: tarfile.FilterError) -> str:
    if isinstance(exc, tarfile.SpecialFileError):
        return "is a device file or fifo, which an archive Blazar unpacks may not hold"
    if isinstance(exc, (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError)):
        return f"is a link to {exc.tarinfo.linkname!r}, which points outside the target"
    return "points outside the directory it unpacks into"


def _empty(into: Path, *, remove: bool) -> None:
    if remove:
        shutil.rmtree(into, ignore_errors=True)
        return
    for child in list(into.iterdir()) if into.is_dir() else []:
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


# -- reading ------------------------------------------------------------------------------


class _Reads(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _Meter(io.RawIOBase):
    """The decompressed stream tarfile reads, counted: reading past `limit` is refused.
    The extractor raises the limit by each accepted member's declared size, so only the
    bytes between members (headers) are bounded by the allowance."""

    def __init__(self, raw: _Reads, limit: int) -> None:
        self.raw = raw
        self.limit = limit
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        room = self.limit - self.count
        if room <= 0:
            if self.raw.read(1):
                raise _Refusal(
                    None, "has a header larger than any header may be: a pax or long-name bomb"
                )
            return 0
        data = self.raw.read(min(len(buffer), room))
        buffer[: len(data)] = data
        self.count += len(data)
        return len(data)


@contextlib.contextmanager
def _decompressed(raw: IO[bytes], head: bytes) -> Iterator[_Reads]:
    if head.startswith(b"\x1f\x8b"):
        with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
            yield stream
    elif head.startswith(b"BZh"):
        with bz2.BZ2File(raw, "rb") as stream:
            yield stream
    elif head.startswith(b"\xfd7zXZ\x00"):
        with lzma.LZMAFile(raw, "rb") as stream:
            yield stream
    else:
        yield raw


@contextlib.contextmanager
def _open_tar(archive: Path, limit: int) -> Iterator[tuple[tarfile.TarFile, _Meter]]:
    """The archive as a tar stream read through a `_Meter` (tarfile's stream mode: it never
    seeks, so every byte it reads is counted)."""
    with archive.open("rb") as raw:
        head = raw.read(8)
        raw.seek(0)
        with _decompressed(raw, head) as stream:
            meter = _Meter(stream, limit)
            try:
                tar = tarfile.open(fileobj=meter, mode="r|")  # noqa: SIM115 (closed below)
            except _DAMAGED as exc:
                why = f"is not a readable tar archive ({exc})"
                raise _Refusal(None, why, unsafe=False) from None
            with tar:
                yield tar, meter


@dataclass
class _Job:
    """One extraction's running counts and the checks made on each member."""

    archive: Path
    root: Path  # the target, resolved
    limits: Limits
    expected: Mapping[str, Expected] | None
    unpacked: Unpacked = field(default_factory=Unpacked)
    seen: set[str] = field(default_factory=set)
    dirs: dict[Path, Path] = field(default_factory=dict)  # directories checked: as named, real
    declared: int = 0
    entries: int = 0
    bound: int | None = None  # what `ratio` allows this archive to unpack to

    def __post_init__(self) -> None:
        if self.limits.ratio is not None:
            size = self.archive.stat().st_size
            self.bound = max(self.limits.ratio * size, self.limits.floor)

    def check_room(self) -> None:
        """A listing's total must fit where it unpacks before anything is read."""
        if self.expected is None:
            return
        need = sum(e.size for e in self.expected.values())
        free = shutil.disk_usage(self.root).free
        if need > free:
            raise _Refusal(None, f"lists {need} bytes, more than the {free} free in {self.root}")

    def check_complete(self) -> None:
        if self.expected is None:
            return
        missing = sorted(set(self.expected) - self.seen)
        if missing:
            raise _Refusal(
                missing[0],
                "is named by the listing but is not in the archive"
                + (f" (nor are {', '.join(missing[1:])})" if missing[1:] else "")
                + ": it is truncated",
                unsafe=False,
            )

    def admit(self, name: str, *, size: int, is_file: bool) -> PurePosixPath:
        """Check one member's name and declared size, before any of its data is read."""
        path = _relative(name)
        self.entries += 1
        if self.entries > self.limits.members:
            raise _Refusal(name, f"is past the limit of {self.limits.members} members")
        if not is_file:
            return path
        key = path.as_posix()
        if not path.parts:
            raise _Refusal(name, "is a file without a name")
        if key in self.seen:
            raise _Refusal(name, "appears twice")
        self.seen.add(key)
        if self.expected is not None:
            entry = self.expected.get(key)
            if entry is None:
                raise _Refusal(name, "is not in the archive's listing: it was added or altered")
            if size != entry.size:
                raise _Refusal(
                    name,
                    f"declares {size} bytes where the listing says {entry.size}: "
                    "it was altered or damaged",
                )
        if size > self.limits.member:
            raise _Refusal(
                name, f"declares {size} bytes, over the cap of {self.limits.member} per member"
            )
        self.declared += size
        if self.declared > self.limits.total:
            raise _Refusal(
                name,
                f"brings the declared total to {self.declared} bytes, over the cap of "
                f"{self.limits.total}",
            )
        if self.bound is not None and self.declared > self.bound:
            raise _Refusal(
                name,
                f"brings what the archive unpacks to {self.declared} bytes, over "
                f"{self.limits.ratio} times its own size: a compression bomb",
            )
        return path

    def write(
        self, name: str, path: PurePosixPath, source: IO[bytes], size: int, mode: int | None
    ) -> None:
        """Stream one regular file with a running count that stops at its declared size
        (and so the cap), hashing it when the listing gives a sha256."""
        target = self.parents(name, path) / path.name
        key = path.as_posix()
        entry = self.expected.get(key) if self.expected is not None else None
        digest = hashlib.sha256() if entry is not None and entry.sha256 else None
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        try:
            fd = os.open(target, flags, 0o666)
        except FileExistsError:
            raise _Refusal(name, "appears twice") from None
        with os.fdopen(fd, "wb") as out:
            count = 0
            while chunk := source.read(CHUNK):
                count += len(chunk)
                if count > size:
                    raise _Refusal(name, f"holds more than the {size} bytes its header declares")
                out.write(chunk)
                if digest is not None:
                    digest.update(chunk)
            if count != size:
                raise _Refusal(
                    name, f"ends after {count} of its {size} bytes: it is truncated", unsafe=False
                )
            if mode is not None:
                os.fchmod(out.fileno(), mode)
        self.unpacked.files[key] = count
        if digest is not None and entry is not None and digest.hexdigest() != entry.sha256:
            raise _Refusal(
                name, "does not match the sha256 the listing gives: it was altered or damaged"
            )

    def parents(self, name: str, path: PurePosixPath) -> Path:
        """Make a member's directories one at a time, each checked to be inside the target
        (a link unpacked earlier may stand for one of them); return the last, resolved."""
        current = self.root
        for part in path.parts[:-1]:
            current = self.step(name, current / part)
        return current

    def step(self, name: str, step: Path) -> Path:
        # A directory checked once stays one: nothing unpacked later can replace it.
        if (known := self.dirs.get(step)) is not None:
            return known
        if step.is_symlink() or step.exists():
            real = step.resolve()
            if not real.is_relative_to(self.root) or not real.is_dir():
                raise _Refusal(name, "points outside the directory it unpacks into")
        else:
            step.mkdir()
            real = step
        self.dirs[step] = real
        return real

    def make_dir(self, name: str, path: PurePosixPath) -> None:
        if path.parts:
            self.step(name, self.parents(name, path) / path.name)

    # -- tar ------------------------------------------------------------------------------

    def untar(self) -> None:
        with _open_tar(self.archive, HEADER_ALLOWANCE + HEADER_PER_MEMBER) as (tar, meter):
            for info in tar:
                meter.limit += HEADER_PER_MEMBER  # for the header after this one
                self.tar_member(tar, info, meter)

    def tar_member(self, tar: tarfile.TarFile, info: tarfile.TarInfo, meter: _Meter) -> None:
        name = info.name
        if info.isreg():
            path = self.admit(name, size=info.size, is_file=True)
            filtered = tarfile.data_filter(info, str(self.root))
            meter.limit += info.size + tarfile.BLOCKSIZE  # its data and padding
            source = tar.extractfile(info)
            assert source is not None  # a regular file
            self.write(name, path, source, info.size, filtered.mode if self.limits.modes else None)
            return
        path = self.admit(name, size=0, is_file=False)
        if info.isdir():
            self.make_dir(name, path)
        elif not (info.issym() or info.islnk()):
            tarfile.data_filter(info, str(self.root))  # raises SpecialFileError
            raise _Refusal(name, "is not a regular file, a directory or a link")
        elif not self.limits.links:
            raise _Refusal(
                name,
                f"is a link (to {info.linkname!r}), and this archive may hold only regular "
                "files and directories",
            )
        else:
            tarfile.data_filter(info, str(self.root))  # a link pointing outside is refused
            self.link(name, path, info)

    def link(self, name: str, path: PurePosixPath, info: tarfile.TarInfo) -> None:
        target = self.parents(name, path) / path.name
        if target.is_symlink() or target.exists():
            raise _Refusal(name, "appears twice")
        if info.issym():
            target.symlink_to(info.linkname)
            if not target.resolve().is_relative_to(self.root):
                raise _Refusal(name, f"is a link to {info.linkname!r}, outside the target")
            return
        source = (self.root / _relative(info.linkname)).resolve()
        if not source.is_relative_to(self.root) or not source.is_file():
            raise _Refusal(name, f"is a hard link to {info.linkname!r}, not a file unpacked here")
        os.link(source, target)

    # -- zip ------------------------------------------------------------------------------

    def unzip(self) -> None:
        """A zip's directory gives every member's size: all are checked before any is read."""
        with zipfile.ZipFile(self.archive) as zf:
            infos = zf.infolist()
            if len(infos) > self.limits.members:
                raise _Refusal(
                    None, f"holds {len(infos)} members, over the limit of {self.limits.members}"
                )
            plan = [(info, self.zip_admit(info)) for info in infos]
            for info, (path, fmt) in plan:
                self.zip_member(zf, info, path, fmt)

    def zip_admit(self, info: zipfile.ZipInfo) -> tuple[PurePosixPath, int]:
        name = info.filename
        fmt = stat.S_IFMT(info.external_attr >> 16)
        if info.flag_bits & 0x1:
            raise _Refusal(name, "is encrypted")
        if fmt == stat.S_IFLNK and not self.limits.links:
            raise _Refusal(
                name,
                "is a link, and this archive may hold only regular files and directories",
            )
        if fmt not in (0, stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK):
            raise _Refusal(name, "is a device file, fifo or socket")
        if info.is_dir() or fmt == stat.S_IFDIR:
            return self.admit(name, size=0, is_file=False), stat.S_IFDIR
        if fmt == stat.S_IFLNK:
            if info.file_size > 4096:
                raise _Refusal(name, f"is a link of {info.file_size} bytes; a path is shorter")
            return self.admit(name, size=0, is_file=False), fmt
        return self.admit(name, size=info.file_size, is_file=True), stat.S_IFREG

    def zip_member(
        self, zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: PurePosixPath, fmt: int
    ) -> None:
        name = info.filename
        if fmt == stat.S_IFDIR:
            self.make_dir(name, path)
        elif fmt == stat.S_IFLNK:
            with zf.open(info) as fh:
                link = fh.read(4096).decode()
            parent = self.parents(name, path)
            inside = (parent / link).resolve().is_relative_to(self.root)
            if _DRIVE.match(link) or link.startswith("/") or not inside:
                raise _Refusal(name, f"is a link to {link!r}, which points outside the target")
            (parent / path.name).symlink_to(link)
        else:
            executable = self.limits.modes and (info.external_attr >> 16) & 0o111
            with zf.open(info) as source:
                self.write(name, path, source, info.file_size, 0o755 if executable else None)


def _relative(name: str) -> PurePosixPath:
    """A member's name as a relative path that stays inside the target, or a refusal."""
    if "\x00" in name:
        raise _Refusal(name, "has a NUL byte in its name")
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or _DRIVE.match(name):
        raise _Refusal(name, "has an absolute path, which points outside the target")
    if ".." in path.parts:
        raise _Refusal(name, "climbs out with '..', which points outside the target")
    return path
