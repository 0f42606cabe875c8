"""Models of several files: a faster-whisper (CTranslate2) model, a piper voice.

A chat model is one GGUF (or its shards); a transcription or speech model is a
directory of files. The store records such a model as a *verified set*: every
file's sha256, and the set's own digest, which is what `sha256` means for it in
the manifest: the sha256 of its `sha256sum` listing (one `<sha256>  <name>` line
per file, sorted by name), so one file changed changes the digest. The
registry (`blazar.registry.Registry.import_set`) places the files in
`blobs/sha256-<digest>.set/`, each verified, and renames the directory into
place only when all are: a half-made set is never visible. The model sources
(`blazar.sources`) and the serve runtime use `kind_of` to tell what a set is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

SET_SUFFIX = ".set"
TRANSCRIPTION, SPEECH, CHAT = "transcription", "speech", "chat"
# What each kind is, in words, for the errors that say a source holds something else.
DESCRIBED = {
    CHAT: "a GGUF model",
    TRANSCRIPTION: "a faster-whisper model (config.json, model.bin, tokenizer.json)",
    SPEECH: "a piper voice (NAME.onnx and NAME.onnx.json)",
}


def set_digest(hashes: Mapping[str, str]) -> str:
    """The digest of a set: sha256 of its `sha256sum` listing, files sorted by name."""
    listing = "".join(f"{hashes[name]}  {name}\n" for name in sorted(hashes))
    return hashlib.sha256(listing.encode()).hexdigest()


def kind_of(names: Iterable[str]) -> str | None:
    """transcription, speech, chat (one GGUF), or None for files that make none of them."""
    base = {name.rsplit("/", 1)[-1] for name in names}
    if len(base) == 1 and next(iter(base)).endswith(".gguf"):
        return CHAT
    vocabulary = any(n.startswith("vocabulary.") for n in base) or "tokenizer.json" in base
    if {"model.bin", "config.json"} <= base and vocabulary:
        return TRANSCRIPTION
    if any(n.endswith(".onnx") and f"{n}.json" in base for n in base):
        return SPEECH
    return None


def voice_file(directory: Path) -> Path | None:
    """The piper voice's .onnx file in a set's directory (the one with a .onnx.json)."""
    found = sorted(p for p in directory.rglob("*.onnx") if p.with_name(p.name + ".json").is_file())
    return found[0] if found else None


def is_set(path: Path) -> bool:
    """A set's directory in the blob store (or any directory a record points at)."""
    return path.is_dir()


def size_of(path: Path) -> int:
    """Bytes of a model: its file, or every file of its set."""
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size
