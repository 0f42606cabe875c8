"""Resumable, verified downloads over HTTP(S).

Used by the `release` install method of the llamacpp lane (release archives)
and, later, by model downloads. A download goes to `<dest>.part`; re-running
after an interruption resumes it with an HTTP Range request. The bytes are
hashed while they stream, and the file only gets its final name (an atomic
rename) once its size and sha256 match, so a file at `dest` is always whole.
A checksum mismatch deletes the `.part`: nothing unverified is ever kept.
`unpack` opens downloaded .zip and .tar.gz archives through `blazar.archives`:
bounded before they are read, no member escaping the target directory.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from blazar import urls
from blazar.archives import SOFTWARE, ArchiveError, UnsafeArchive, extract  # noqa: F401 (re-export)
from blazar.errors import BlazarError, VerificationFailed
from blazar.models.hashing import sha256_file

CHUNK = 1024 * 1024
USER_AGENT = "blazar"

Progress = Callable[[int, int | None], None]


class DownloadError(BlazarError):
    """A download could not be completed: network trouble or an HTTP error."""


def part_path(dest: Path) -> Path:
    """Where the partial download of `dest` lives until it is verified."""
    return dest.with_name(dest.name + ".part")


def download(
    url: str,
    dest: Path,
    *,
    sha256: str | None,
    size: int | None = None,
    progress: Progress | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> Path:
    """Download `url` to `dest`, resuming `dest.part`, and verify it; return `dest`.

    `progress(done, total)` is called as bytes arrive (total is None when the
    server does not say). Raises DownloadError on network and HTTP errors (the
    `.part` is kept, so re-running resumes) and VerificationFailed when the
    size or sha256 is wrong (the `.part` is deleted).
    """
    url = urls.target(url, credentials=True).url  # its host as urllib dials it (blazar.urls)
    expected = sha256.lower() if sha256 else None
    if dest.exists() and expected is not None:
        if sha256_file(dest)[0] == expected:
            return dest
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(dest)
    for _attempt in range(2):
        result = _fetch(url, part, size, progress, headers or {}, timeout)
        if result is not None:
            break
        part.unlink(missing_ok=True)  # the server disagreed with our partial file: start over
    else:
        raise DownloadError(f"could not download {url}: the server's ranges do not add up")
    digest, done = result
    if size is not None and done != size:
        part.unlink(missing_ok=True)
        raise VerificationFailed(
            f"{url} is {done} bytes, expected {size}; nothing was kept. "
            "The file on the server may have changed; check the source."
        )
    if expected is not None and digest != expected:
        part.unlink(missing_ok=True)
        raise VerificationFailed(
            f"sha256 mismatch for {url}: expected {expected}, got {digest}; nothing was kept."
        )
    os.replace(part, dest)
    return dest


def _fetch(
    url: str,
    part: Path,
    size: int | None,
    progress: Progress | None,
    headers: Mapping[str, str],
    timeout: float,
) -> tuple[str, int] | None:
    """Fill `part` from `url`; return (sha256, size), or None to restart from zero."""
    have = part.stat().st_size if part.exists() else 0
    if size is not None and have > size:
        return None
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **headers})
    if have:
        req.add_header("Range", f"bytes={have}-")
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:
            # Range not satisfiable: the .part already holds the whole file, or
            # is longer than it (then it is not this file's prefix).
            total = _total_from_content_range(exc.headers.get("Content-Range", ""))
            if total == have or (total is None and size == have):
                return sha256_file(part)
            return None
        again = (
            " Re-running resumes where it stopped." if exc.code >= 500 or exc.code == 429 else ""
        )
        raise DownloadError(
            f"downloading {url} failed: HTTP {exc.code} {exc.reason}.{again}"
        ) from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise DownloadError(
            f"downloading {url} failed: {_reason(exc)}. Re-running resumes where it stopped."
        ) from exc
    with resp:
        digest = hashlib.sha256()
        if have and resp.status == 206:
            start = _start_from_content_range(resp.headers.get("Content-Range", ""))
            if start != have:
                return None
            with part.open("rb") as fh:
                while chunk := fh.read(CHUNK):
                    digest.update(chunk)
            mode = "ab"
        else:  # 200: a fresh download, or a server that ignored our Range
            have = 0
            mode = "wb"
        length = resp.headers.get("Content-Length")
        remaining = int(length) if length and length.isdigit() else None
        total = have + remaining if remaining is not None else size
        done = have
        with part.open(mode) as out:
            try:
                while chunk := resp.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress(done, total)
            except (OSError, http.client.HTTPException) as exc:
                raise _interrupted(url, part, done, _reason(exc)) from exc
        if remaining is not None and done < have + remaining:
            raise _interrupted(url, part, done, "the connection closed early")
        if size is not None and done < size:
            raise _interrupted(url, part, done, f"the server sent only {done} of {size} bytes")
    return digest.hexdigest(), done


def _interrupted(url: str, part: Path, done: int, why: str) -> DownloadError:
    return DownloadError(
        f"download of {url} stopped after {done} bytes ({why}); "
        f"the partial file {part} was kept and re-running resumes from there."
    )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc.reason, str):
        return str(exc.reason) or type(exc.reason).__name__
    return str(exc) or type(exc).__name__


_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
_UNSATISFIED = re.compile(r"bytes\s+\*/(\d+)")


def _start_from_content_range(value: str) -> int | None:
    match = _RANGE.match(value.strip())
    return int(match.group(1)) if match else None


def _total_from_content_range(value: str) -> int | None:
    match = _UNSATISFIED.match(value.strip()) or _RANGE.match(value.strip())
    if match is None:
        return None
    last = match.groups()[-1]
    return int(last) if last.isdigit() else None


def unpack(archive: Path, into: Path) -> None:
    """Unpack a .zip or .tar.gz into `into` (empty), bounded and refusing members that
    would escape it (`blazar.archives`, with the limits for downloaded software).

    Executable bits survive (zip entries made on Unix carry them). Raises
    UnsafeArchive, naming the member and why, for absolute, `..` or link-out members and
    for members over the caps or a compression bomb; nothing is left in `into` then.
    """
    if not archive.name.endswith((".zip", ".tar.gz", ".tgz")):
        raise ArchiveError(f"{archive.name} is neither a .zip nor a .tar.gz archive")
    extract(
        archive,
        into,
        limits=SOFTWARE,
        then="nothing was installed: check where the archive came from",
    )
