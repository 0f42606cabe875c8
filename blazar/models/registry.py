"""The model registry: import, list, show and remove local GGUF models.

Called by the CLI (and later by the models reconciler's real port). A model's
bytes live in a content-addressed blob (`blobs/sha256-<hex>`) when Blazar
holds them (hardlink or copy), or stay in the user's file (reference) when a
hardlink is impossible. Bytes become visible under their final name only
after their size and sha256 are verified (a model of several files, a
transcription model or a voice, as one verified set: `import_set`); the store row is written after
that, so a crash can leave at most an unreferenced blob, never a row that
points at bad bytes.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blazar.errors import AlreadyExists, InvalidInput, VerificationFailed
from blazar.models.filesets import (
    DESCRIBED,
    IMAGE,
    SET_SUFFIX,
    is_image_set,
    kind_of,
    safetensors_facts,
    set_digest,
)
from blazar.models.hashing import sha256_file
from blazar.paths import Paths
from blazar.store.db import LoraRecord, ModelRecord, Store
from specs.names import ModelName

if TYPE_CHECKING:
    from blazar.models.gguf import GGUFFacts

# os.link fails with these when a hardlink is impossible (another filesystem,
# a filesystem without links, a protected file): reference the file instead.
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES}


def inspect_gguf(path: Path) -> GGUFFacts:
    """The file's GGUF facts; gguf (and numpy) load here, the first time a file is read,
    so opening the registry (every `blazar diff`) costs neither."""
    from blazar.models.gguf import inspect_gguf as inspect

    return inspect(path)


@dataclass(frozen=True)
class Placed:
    path: Path
    held: str


class Registry:
    """Model records in the store plus the blobs they own."""

    def __init__(self, store: Store, paths: Paths) -> None:
        self.store = store
        self.paths = paths

    def import_file(
        self,
        src: Path,
        ref: ModelName,
        *,
        copy: bool = False,
        force: bool = False,
        source: str | None = None,
        managed: bool = False,
        settings: dict[str, Any] | None = None,
        sha256: str | None = None,
        resolved: dict[str, str] | None = None,
    ) -> ModelRecord:
        """Register a local GGUF under `ref`. Never modifies, moves or deletes `src`.

        `source` records where the bytes came from (default: the file's URI);
        `managed` marks a model a manifest owns; `sha256`, when given, is what the
        file must hash to (another runtime's digest for it), or nothing is kept;
        `resolved` is what the source resolved to (repository, revision, file: the
        lock file reads it from the record's facts).
        """
        expected = sha256
        src = Path(os.path.abspath(src.expanduser()))
        if not src.exists():
            raise InvalidInput(f"no such file: {src}")
        if not src.is_file():
            raise InvalidInput(f"{src} is not a file; give the path of a .gguf file")
        existing = self.store.find_model(ref)
        if existing and not force:
            raise AlreadyExists(
                f"model '{ref.short}' already exists (from {existing.source}); "
                "pass --force to replace it, or choose another --name"
            )
        facts = inspect_gguf(src)
        if facts.file_kind == "adapter":
            raise InvalidInput(
                f"{src} is a LoRA adapter, not a model; declare it under [loras] in the manifest"
            )
        sha256, size = sha256_file(src)
        _expect(src, sha256, expected)
        placed = self._place(src, sha256, size, copy=copy)
        record = _record(ref, placed, size, sha256, source or src.as_uri(), facts)
        record = replace(record, managed=managed, settings=dict(settings or {}))
        if resolved:
            record = replace(record, facts={**record.facts, "resolved": dict(resolved)})
        self.store.put_model(record, event="replaced" if existing else "imported")
        if existing and existing.path != record.path:
            self._release(existing)
        return record

    def import_files(
        self,
        files: list[Path],
        ref: ModelName,
        *,
        force: bool = False,
        source: str | None = None,
        managed: bool = False,
        settings: dict[str, Any] | None = None,
        names: list[str] | None = None,
        sha256: str | None = None,
        resolved: dict[str, str] | None = None,
    ) -> ModelRecord:
        """Register one GGUF, or a sharded model (first shard first) as one model.

        `names` are the shards' file names when the files themselves are named
        otherwise (a Hugging Face cache names blobs by hash).

        Shards keep their names (llama.cpp finds shard N beside shard 1 by name)
        in a directory `blobs/sha256-<first shard>.shards/`, each hardlinked or
        copied and verified like a single file.
        """
        if len(files) == 1:
            return self.import_file(
                files[0],
                ref,
                force=force,
                source=source,
                managed=managed,
                settings=settings,
                sha256=sha256,
                resolved=resolved,
            )
        existing = self.store.find_model(ref)
        if existing and not force:
            raise AlreadyExists(f"model '{ref.short}' already exists; pass --force to replace it")
        facts = inspect_gguf(files[0])
        names = names or [f.name for f in files]
        hashes = [sha256_file(f) for f in files]
        _expect(files[0], hashes[0][0], sha256)
        shard_dir = self.paths.blobs / f"sha256-{hashes[0][0]}.shards"
        if not shard_dir.is_dir():
            tmp = self.paths.blobs / f".tmp-{uuid.uuid4().hex}"
            tmp.mkdir(parents=True)
            try:
                for src, name, (sha256, size) in zip(files, names, hashes, strict=True):
                    target = tmp / name
                    try:
                        os.link(src.resolve(), target)  # link() would link a symlink itself
                    except OSError as exc:
                        if exc.errno not in _NO_LINK:
                            raise
                        shutil.copyfile(src, target)
                    _verify(target, sha256, size)
                os.rename(tmp, shard_dir)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        first = Placed(shard_dir / names[0], "hardlink")
        total = sum(size for _, size in hashes)
        record = _record(ref, first, total, hashes[0][0], source or files[0].as_uri(), facts)
        record = replace(
            record,
            managed=managed,
            settings=dict(settings or {}),
            facts={**record.facts, "shards": names, **({"resolved": resolved} if resolved else {})},
        )
        self.store.put_model(record, event="replaced" if existing else "imported")
        if existing and existing.path != record.path:
            self._release(existing)
        return record

    def import_set(
        self,
        files: list[Path],
        names: list[str],
        ref: ModelName,
        *,
        kind: str,
        force: bool = False,
        source: str,
        managed: bool = False,
        settings: dict[str, Any] | None = None,
        sha256: str | None = None,
        hashes: dict[str, str] | None = None,
    ) -> ModelRecord:
        """Register a model of several files (`blazar.models.filesets`) under `ref`: `names` are
        the files' paths inside the model's directory, `kind` what the manifest declares
        (transcription or speech), `sha256` the set's expected digest and `hashes` each
        file's, when the source knows them (each is checked, or nothing is kept).

        The files are linked (or copied) into `blobs/sha256-<digest>.set/`, each verified,
        and the directory is renamed into place only when all are."""
        found = IMAGE if kind == IMAGE and is_image_set(names) else kind_of(names)
        if found != kind:
            what = DESCRIBED.get(found or "", "none of the model kinds Blazar serves")
            raise InvalidInput(
                f"{source} holds {what} ({', '.join(sorted(names)[:6])}), but the model is "
                f"declared kind = {kind!r}, which needs {DESCRIBED.get(kind, kind)}: fix the "
                "model's kind or its source"
            )
        existing = self.store.find_model(ref)
        if existing and not force:
            raise AlreadyExists(f"model '{ref.short}' already exists; pass --force to replace it")
        measured = {name: sha256_file(f) for f, name in zip(files, names, strict=True)}
        for name, (digest, _) in measured.items():
            if hashes is not None and name in hashes and hashes[name] != digest:
                raise VerificationFailed(
                    f"{source}: {name} has sha256 {digest}, not the {hashes[name]} its source "
                    "lists; nothing was kept"
                )
        digest = set_digest({name: d for name, (d, _) in measured.items()})
        if sha256 is not None and digest != sha256.lower():
            raise VerificationFailed(
                f"{source}: its files' digest (the sha256 of their sha256sum listing) is "
                f"{digest}, not the {sha256.lower()} expected; nothing was kept"
            )
        target = self.paths.blobs / f"sha256-{digest}{SET_SUFFIX}"
        held = "hardlink"
        if not target.is_dir():
            tmp = self.paths.blobs / f".tmp-{uuid.uuid4().hex}"
            tmp.mkdir(parents=True)
            try:
                for src, name in zip(files, names, strict=True):
                    placed = tmp / name
                    placed.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        os.link(src.resolve(), placed)
                    except OSError as exc:
                        if exc.errno not in _NO_LINK:
                            raise
                        shutil.copyfile(src, placed)
                        held = "copy"
                    _verify(placed, *measured[name])
                os.rename(tmp, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        total = sum(size for _, size in measured.values())
        record = ModelRecord(
            name=ref.name,
            tag=ref.tag,
            path=str(target),
            held=held,
            size=total,
            sha256=digest,
            source=source,
            facts={
                "kind": kind,
                "files": {n: d for n, (d, _) in sorted(measured.items())},
                **(safetensors_facts(target) if kind == "chat" else {}),
            },
            managed=managed,
            settings=dict(settings or {}),
        )
        self.store.put_model(record, event="replaced" if existing else "imported")
        if existing and existing.path != record.path:
            self._release(existing)
        return record

    def adopt(self, ref: ModelName, source: str, settings: dict[str, Any]) -> ModelRecord:
        """Mark a held model as the manifest's, with its source and runtime settings."""
        record = replace(
            self.store.get_model(ref), managed=True, source=source, settings=dict(settings)
        )
        self.store.put_model(record, event="adopted")
        return record

    def import_lora(
        self, src: Path, name: str, model: ModelName, *, source: str, settings: dict[str, Any]
    ) -> LoraRecord:
        """Register a LoRA adapter GGUF for `model`: an adapter of the model's architecture."""
        base = self.store.get_model(model)
        facts = inspect_gguf(src)
        if facts.file_kind != "adapter":
            raise InvalidInput(
                f"{src} is a {facts.file_kind} file, not a LoRA adapter "
                "(its general.type must be 'adapter')"
            )
        if base.architecture and facts.architecture != base.architecture:
            raise InvalidInput(
                f"adapter {name!r} is for {facts.architecture} models, but "
                f"{base.ref.short} is {base.architecture}"
            )
        sha256, size = sha256_file(src)
        placed = self._place(src, sha256, size, copy=False)
        previous = self.store.find_lora(name)
        record = LoraRecord(
            name=name,
            model=base.ref.short,
            path=str(placed.path),
            size=size,
            sha256=sha256,
            source=source,
            architecture=facts.architecture,
            settings=dict(settings),
        )
        self.store.put_lora(record)
        if previous and previous.path != record.path:
            self._release_path(previous.path)
        return record

    def remove_lora(self, name: str) -> None:
        record = self.store.find_lora(name)
        if record is None:
            return
        self.store.delete_lora(name)
        self._release_path(record.path)

    def remove(self, ref: ModelName) -> ModelRecord:
        """Forget a model and delete Blazar's own link or copy (never a referenced file)."""
        record = self.store.get_model(ref)
        projector = self.store.find_projector(ref.short)
        self.store.delete_model(ref)
        self._release(record)
        if projector is not None:  # a model's projector goes with it
            self.store.delete_projector(ref.short)
            self._release_path(projector.path)
        return record

    def place(self, src: Path, sha256: str, size: int) -> Path:
        """Hold a verified file's bytes in the blob store (hardlinked, else referenced)."""
        return self._place(src, sha256, size, copy=False).path

    def release(self, path: str) -> None:
        """Delete a blob once no record points at it (a projector's, an adapter's)."""
        self._release_path(path)

    def _release(self, record: ModelRecord) -> None:
        """Delete a blob Blazar owns once no record points at it."""
        if record.held != "reference":
            self._release_path(record.path)

    def _release_path(self, path_text: str) -> None:
        if self.store.paths_in_use(path_text):
            return
        path = Path(path_text)
        if path.parent == self.paths.blobs and path.name.endswith(SET_SUFFIX):
            shutil.rmtree(path, ignore_errors=True)  # a set: its directory
        elif path.parent == self.paths.blobs:  # only ever delete inside the blob store
            path.unlink(missing_ok=True)
        elif path.parent.parent == self.paths.blobs and path.parent.name.endswith(".shards"):
            shutil.rmtree(path.parent, ignore_errors=True)

    def _place(self, src: Path, sha256: str, size: int, *, copy: bool) -> Placed:
        blob = self.paths.blobs / f"sha256-{sha256}"
        self.paths.blobs.mkdir(parents=True, exist_ok=True)
        if blob.exists():
            # Same bytes already held (under another name, or left by a crash
            # between rename and store write): reuse after verifying them.
            _verify(blob, sha256, size)
            return Placed(blob, "copy" if copy or not _same_inode(blob, src) else "hardlink")
        tmp = self.paths.blobs / f".tmp-{uuid.uuid4().hex}"
        try:
            held = "copy"
            if not copy:
                try:
                    # the file itself: Linux's link() links a symlink (a Hugging Face cache's
                    # snapshot entry), not what it points at
                    os.link(src.resolve(), tmp)
                    held = "hardlink"
                except OSError as exc:
                    if exc.errno not in _NO_LINK:
                        raise
                    return Placed(src, "reference")
            else:
                shutil.copyfile(src, tmp)
            _verify(tmp, sha256, size)
            os.replace(tmp, blob)
        finally:
            tmp.unlink(missing_ok=True)
        return Placed(blob, held)


def _same_inode(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _expect(path: Path, actual: str, expected: str | None) -> None:
    if expected is not None and actual != expected.lower():
        raise VerificationFailed(
            f"{path} has sha256 {actual}, not the {expected.lower()} expected; nothing was kept"
        )


def _verify(path: Path, sha256: str, size: int) -> None:
    actual_size = path.stat().st_size
    if actual_size != size:
        raise VerificationFailed(
            f"{path}: expected {size} bytes, found {actual_size}; nothing was kept"
        )
    actual, _ = sha256_file(path)
    if actual != sha256:
        raise VerificationFailed(f"{path}: sha256 is {actual}, expected {sha256}; nothing was kept")


def _record(
    ref: ModelName, placed: Placed, size: int, sha256: str, source: str, facts: GGUFFacts
) -> ModelRecord:
    return ModelRecord(
        name=ref.name,
        tag=ref.tag,
        path=str(placed.path),
        held=placed.held,
        size=size,
        sha256=sha256,
        source=source,
        architecture=facts.architecture,
        parameters=facts.parameters,
        quantization=facts.quantization,
        context_length=facts.context_length,
        facts=facts.to_dict(),
    )
