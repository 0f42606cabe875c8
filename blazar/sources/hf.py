"""Fetch GGUF files from a Hugging Face hub repo (`hf://owner/repo:QUANT[@rev]`), or the
files of a transcription model or voice (`hf://owner/repo[/dir]`: `_fetch_set`), or of a
safetensors chat model (`hf://owner/repo` holding no GGUF: its config, weights and
tokenizer files only, `blazar.models.filesets.safetensors_files`).

Called by `blazar.sources.fetch`. One `model_info(files_metadata=True)` call
lists the repo at the revision (its commit sha, every file's size and LFS
sha256); `select_files` picks the GGUF file(s) of the asked quantization (or
the named file; with neither, the repo's only model or its Q4_K_M);
`huggingface_hub.hf_hub_download` downloads each one, pinned to that commit,
into Blazar's own HF cache (`<downloads>/hf`). Every file is then hashed and
compared with the hub's sha256 (its git blob id for non-LFS files); a mismatch
evicts it from the cache so that nothing unverified stays.

The environment passed in is honoured, not only `os.environ`: huggingface_hub
reads `HF_ENDPOINT` once at import, so the endpoint is passed explicitly to
every call, and so is the token (`HF_TOKEN`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar, cast

import httpx2
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import (
    FileMetadataError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    XetDownloadError,
)
from huggingface_hub.hf_api import RepoSibling

from blazar import urls
from blazar.errors import VerificationFailed
from blazar.models.filesets import is_safetensors_model, safetensors_files, set_digest
from blazar.models.hashing import sha256_file
from blazar.sources.base import (
    SHARD,
    Fetched,
    FetchError,
    Progress,
    TemporaryFetchError,
    check_gguf,
)
from blazar.sources.projector_files import PROJECTOR, select_projector
from specs.sources import HFSource

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_QUANT = "Q4_K_M"  # when a repo holds several and none is named, as ollama picks
TIMEOUT = 30.0
_SHA256 = re.compile(r"[0-9a-f]{64}")
T = TypeVar("T")


def hub_endpoint(env: Mapping[str, str]) -> str:
    """The hub's base URL (`HF_ENDPOINT`, else huggingface.co) with its host as the HTTP
    client dials it (`blazar.urls.target`); an ambiguous host is refused."""
    endpoint = env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    return urls.target(endpoint, credentials=True).url.rstrip("/")


def hub_token(env: Mapping[str, str]) -> str | bool | None:
    """The token to send: HF_TOKEN from `env`; with os.environ, also a saved `hf auth login`."""
    token = env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN")
    if token and token.strip():
        return token.strip()
    return None if env is os.environ else False  # False: send none, read no saved token


def quant_pattern(quant: str) -> re.Pattern[str]:
    """Match a quantization as a whole token: Q4_K_M matches x-q4_k_m.gguf, not x-Q4_K_M_L."""
    return re.compile(rf"(?:^|[-_./]){re.escape(quant)}(?=$|[-./])", re.IGNORECASE)


def select_files(source: HFSource, names: list[str]) -> list[str]:
    """Pick the repo file(s) a source means; several only for one sharded model, in order."""
    ggufs = sorted(n for n in names if n.lower().endswith(".gguf"))
    listing = _listing(ggufs)
    if source.filename is not None:
        if source.filename not in names:
            raise FetchError(f"{source.repo} has no file {source.filename!r}; {listing}")
        return _shard_set(source, source.filename, ggufs)
    models = [n for n in ggufs if not PurePosixPath(n).name.lower().startswith("mmproj")]
    if source.quant is None:
        return _shard_set(source, _default_file(source, models, listing), ggufs)
    pattern = quant_pattern(source.quant)
    matches = [n for n in models if pattern.search(n)]
    if not matches:
        raise FetchError(f"{source.repo} has no {source.quant} GGUF file; {listing}")
    groups = {_group(n) for n in matches}
    if len(groups) > 1:
        raise FetchError(
            f"{source.quant} matches several files in {source.repo}: {', '.join(matches)}; "
            f"name one with hf://{source.repo}/<file>.gguf"
        )
    return _shard_set(source, matches[0], ggufs)


def _default_file(source: HFSource, models: list[str], listing: str) -> str:
    """No quantization named: the repo's only model, else its Q4_K_M (ollama's default)."""
    groups = sorted({_group(n) for n in models})
    if len(groups) == 1:
        return models[0]
    default = [n for n in models if quant_pattern(DEFAULT_QUANT).search(n)]
    if default and len({_group(n) for n in default}) == 1:
        return default[0]
    if not models:
        raise FetchError(f"{source.repo} has no GGUF model file; {listing}")
    raise FetchError(
        f"{source.repo} holds several models and none is {DEFAULT_QUANT}: name one, as "
        f"{source.repo}:QUANT or hf://{source.repo}/<file>.gguf; {listing}"
    )


def _group(name: str) -> str:
    shard = SHARD.match(name)
    return f"{shard['prefix']}-of-{shard['total']}" if shard else name


def _shard_set(source: HFSource, name: str, ggufs: list[str]) -> list[str]:
    """`name` alone, or every shard of the split model it belongs to, first shard first."""
    shard = SHARD.match(name)
    if shard is None:
        return [name]
    prefix, total = shard["prefix"], int(shard["total"])
    wanted = [f"{prefix}-{i:05d}-of-{total:05d}.gguf" for i in range(1, total + 1)]
    missing = [w for w in wanted if w not in ggufs]
    if missing:
        raise FetchError(
            f"{source.repo} holds an incomplete split model: {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} missing"
        )
    return wanted


def _listing(ggufs: list[str]) -> str:
    if not ggufs:
        return "it holds no .gguf files at all"
    shown = ", ".join(ggufs[:40]) + (f" and {len(ggufs) - 40} more" if len(ggufs) > 40 else "")
    return f"its .gguf files are: {shown}"


def fetch_hf(
    source: HFSource,
    *,
    sha256: str | None,
    downloads: Path,
    progress: Progress | None,
    env: Mapping[str, str],
    kind: str = "chat",
) -> Fetched:
    """Download and verify the file(s) an hf:// source means; see the module docstring.
    A model of another `kind` than chat (or a source naming a directory) is a set of
    files: every file of the repo, or under the directory (`set_files`)."""
    endpoint, token = hub_endpoint(env), hub_token(env)
    api = HfApi(endpoint=endpoint, token=token, library_name="blazar")
    info = _hub(
        lambda: api.model_info(
            source.repo, revision=source.revision, files_metadata=True, timeout=TIMEOUT
        ),
        source,
        endpoint,
    )
    siblings = {s.rfilename: s for s in info.siblings or []}
    if source.directory is not None or kind not in ("chat", PROJECTOR):
        return _fetch_set(source, info, siblings, downloads, progress, endpoint, token)
    names = list(siblings)
    plain = source.quant is None and source.filename is None and kind == "chat"
    if (
        plain
        and not any(n.lower().endswith(".gguf") for n in names)
        and is_safetensors_model(names)
    ):  # a safetensors model (a mistralrs lane serves it): the files a server reads
        model = {n: siblings[n] for n in safetensors_files(names)}
        return _fetch_set(source, info, model, downloads, progress, endpoint, token)
    if kind == PROJECTOR:
        chosen = select_projector(source, list(siblings))
    else:
        chosen = select_files(source, list(siblings))
    first = siblings[chosen[0]]
    if sha256 and first.lfs is not None and first.lfs.sha256 != sha256.lower():
        raise VerificationFailed(
            f"{source} is {chosen[0]} with sha256 {first.lfs.sha256} on {endpoint}, but the "
            f"manifest says {sha256.lower()}; nothing was downloaded. Update the manifest's "
            "sha256, or pin the revision that has those bytes."
        )
    sizes = [siblings[n].size for n in chosen]
    total = sum(s for s in sizes if s is not None) if None not in sizes else None
    bar = _bar_class(progress, total) if progress is not None else None
    revision = info.sha or source.revision
    pointers: list[Path] = []
    files: list[Path] = []
    digests: list[str] = []
    size = 0
    for name in chosen:  # verify each file as it lands: a bad one stops the rest
        pointer = _download(source, name, revision, downloads, endpoint, token, bar)
        blob = pointer.resolve()
        digest, n = _verify(pointer, blob, siblings[name], f"{name} from {source}")
        pointers.append(pointer)
        files.append(blob)
        digests.append(digest)
        size += n
    if sha256 and digests[0] != sha256.lower():
        _evict(pointers[0], files[0])
        raise VerificationFailed(
            f"sha256 mismatch for {chosen[0]} from {source}: expected {sha256.lower()}, "
            f"got {digests[0]}; nothing was kept."
        )
    check_gguf(files[0], f"{chosen[0]} from {source}")
    detail = {
        "repo": source.repo,
        "revision": info.sha or "",
        "requested": source.revision or "main",
        "filename": chosen[0],
        "endpoint": endpoint,
    }
    if len(chosen) > 1:
        detail["shards"] = ",".join(chosen)
    return Fetched(files, digests[0], size, False, detail)


SKIPPED = (".gitattributes",)  # repo files that are no part of a model


def set_files(source: HFSource, names: list[str]) -> dict[str, str]:
    """The files of a set: repo path -> its path inside the model (relative to the
    directory the source names, or to the repo root); READMEs are left out."""
    prefix = f"{source.directory.strip('/')}/" if source.directory else ""
    found = {
        name: name[len(prefix) :]
        for name in names
        if name.startswith(prefix)
        and PurePosixPath(name).name not in SKIPPED
        and not name.lower().endswith(".md")
    }
    if not found:
        where = f"under {source.directory!r}" if source.directory else "at all"
        raise FetchError(f"{source.repo} holds no files {where}; check the source's path")
    return dict(sorted(found.items()))


def _fetch_set(
    source: HFSource,
    info: Any,
    siblings: dict[str, RepoSibling],
    downloads: Path,
    progress: Progress | None,
    endpoint: str,
    token: str | bool | None,
) -> Fetched:
    """Download every file of a set (a transcription model, a voice), each verified against
    the hub's sha256 (its git blob id for a small file), pinned to one commit."""
    chosen = set_files(source, list(siblings))
    sizes = [siblings[n].size for n in chosen]
    total = sum(s for s in sizes if s is not None) if None not in sizes else None
    bar = _bar_class(progress, total) if progress is not None else None
    revision = info.sha or source.revision
    files, names, hashes, size = [], [], {}, 0
    for name, inside in chosen.items():
        pointer = _download(source, name, revision, downloads, endpoint, token, bar)
        blob = pointer.resolve()
        digest, n = _verify(pointer, blob, siblings[name], f"{name} from {source}")
        files.append(blob)
        names.append(inside)
        hashes[inside] = digest
        size += n
    detail = {
        "repo": source.repo,
        "revision": info.sha or "",
        "requested": source.revision or "main",
        "directory": source.directory or "",
        "endpoint": endpoint,
    }
    return Fetched(files, set_digest(hashes), size, False, detail, tuple(names), hashes)


def _download(
    source: HFSource,
    name: str,
    revision: str | None,
    downloads: Path,
    endpoint: str,
    token: str | bool | None,
    bar: type | None,
) -> Path:
    pointer = _hub(
        lambda: hf_hub_download(
            source.repo,
            name,
            revision=revision,
            cache_dir=downloads / "hf",
            endpoint=endpoint,
            token=token,
            library_name="blazar",
            tqdm_class=cast(Any, bar),
        ),
        source,
        endpoint,
        name,
    )
    return Path(pointer)


def _verify(pointer: Path, blob: Path, sibling: RepoSibling, what: str) -> tuple[str, int]:
    """Hash a downloaded file and compare it with what the hub announced."""
    digest, size = sha256_file(blob)
    expected = sibling.lfs.sha256 if sibling.lfs is not None else None
    if expected is None and _SHA256.fullmatch(blob.name):
        expected = blob.name  # an LFS blob is named by its sha256 (the ETag)
    problem = None
    if sibling.size is not None and size != sibling.size:
        problem = f"is {size} bytes, the hub says {sibling.size}"
    elif expected is not None and digest != expected:
        problem = f"has sha256 {digest}, the hub says {expected}"
    elif expected is None and sibling.blob_id and _git_oid(blob) != sibling.blob_id:
        problem = f"does not match the hub's git blob {sibling.blob_id}"
    if problem is not None:
        _evict(pointer, blob)
        raise VerificationFailed(
            f"{what} {problem}; nothing was kept. Fetching again downloads it anew."
        )
    return digest, size


def _git_oid(path: Path) -> str:
    data = path.read_bytes()  # non-LFS files are small
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _evict(pointer: Path, blob: Path) -> None:
    """Drop a bad file from the HF cache: the snapshot link and the blob it points at."""
    for path in (pointer, blob):
        if path.is_absolute() and (path.is_symlink() or path.exists()):
            path.unlink(missing_ok=True)


def _hub(call: Callable[[], T], source: HFSource, endpoint: str, name: str | None = None) -> T:
    """Run a huggingface_hub call, turning its errors into Blazar's."""
    where = f"{source.repo} on {endpoint}"
    rev = source.revision or "main"
    try:
        return call()
    except GatedRepoError as exc:
        raise FetchError(
            f"{where} is gated: accept its terms on the repo's page, then set HF_TOKEN "
            "to a token of that account"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise FetchError(
            f"no repo {where} (or it is private: set HF_TOKEN to a token that can read it)"
        ) from exc
    except RevisionNotFoundError as exc:
        raise FetchError(f"{where} has no revision {rev!r}") from exc
    except RemoteEntryNotFoundError as exc:
        raise FetchError(f"{where} has no file {name!r} at revision {rev!r}") from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status is None or status >= 500 or status in (408, 429):
            raise TemporaryFetchError(
                f"{where} answered HTTP {status} for {source}; fetching again retries"
            ) from exc
        hint = ": set HF_TOKEN to a token that can read it" if status in (401, 403) else ""
        raise FetchError(f"{where} refused {source} with HTTP {status}{hint}") from exc
    except OfflineModeIsEnabled as exc:
        raise FetchError(f"HF_HUB_OFFLINE is set, so {source} cannot be downloaded") from exc
    except LocalEntryNotFoundError as exc:
        if isinstance(exc.__cause__, OfflineModeIsEnabled):
            raise FetchError(f"HF_HUB_OFFLINE is set, so {source} cannot be downloaded") from exc
        if isinstance(exc.__cause__, FileMetadataError):
            raise FetchError(
                f"{endpoint} does not answer like a Hugging Face hub ({exc.__cause__}); "
                "check HF_ENDPOINT"
            ) from exc
        raise TemporaryFetchError(
            f"cannot reach {endpoint} to download {name or source}; fetching again retries"
        ) from exc
    except (httpx2.TransportError, XetDownloadError) as exc:
        raise TemporaryFetchError(
            f"cannot reach {endpoint} for {source} ({exc or type(exc).__name__}); "
            "fetching again retries"
        ) from exc
    except HFValidationError as exc:
        raise FetchError(f"bad Hugging Face repo or file name in {source}: {exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:  # JSON that is not a hub's answer
        raise FetchError(
            f"{endpoint} does not answer like a Hugging Face hub ({type(exc).__name__}: {exc}); "
            "check HF_ENDPOINT"
        ) from exc
    except OSError as exc:
        if "Consistency check failed" in str(exc):
            raise TemporaryFetchError(
                f"the download of {name} from {where} was cut short; fetching again retries"
            ) from exc
        raise FetchError(f"cannot store {name or source} from {where}: {exc}") from exc


def _bar_class(progress: Progress, total: int | None) -> type:
    """A tqdm stand-in for huggingface_hub that reports bytes to `progress(done, total)`."""
    done = [0]

    class Bar:
        def __init__(self, *args: object, initial: int = 0, **kwargs: object) -> None:
            self.total, self.n, self.disable = total, 0, False
            self.update(initial)

        def update(self, n: float | None = 1) -> None:
            if n:
                self.n += int(n)
                done[0] += int(n)
                progress(done[0], total)

        def close(self) -> None:
            pass

        def refresh(self) -> None:
            pass

        def set_description(self, *args: object, **kwargs: object) -> None:
            pass

        def __enter__(self) -> Bar:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    return Bar
