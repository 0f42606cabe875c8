"""GGUF models other runtimes keep on this machine, found for `blazar import --scan`.

Three stores are read, never written:

- ollama: `$OLLAMA_MODELS`, else `~/.ollama/models` (or the service's store):
  `manifests/<host>/<namespace>/<name>/<tag>` JSON whose model layer names a
  `blobs/sha256-<hex>` file;
- the Hugging Face hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
  `~/.cache/huggingface/hub`: `models--<owner>--<repo>/snapshots/<rev>/<file>`
  symlinks to `blobs/<sha256>`;
- LM Studio: `~/.lmstudio/models` and `~/.cache/lm-studio/models`:
  `<publisher>/<repo>/<file>.gguf`.

Each model found comes with its facts (from its GGUF header), whether Blazar
already holds those bytes (same sha256 where the store names it, else the same
file), and the command that adopts it: `blazar pull ollama://name:tag` for
ollama's library models, `blazar import PATH --name NAME [--sha256 HEX]`
otherwise. Adopting hardlinks (or references) the other runtime's file after
checking its size and sha256 (`blazar.models.registry`); nothing here modifies, moves
or deletes it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from blazar.errors import NotGGUF
from blazar.models.gguf import inspect_gguf
from blazar.sources.base import SHARD, quant_of
from blazar.sources.ollama import HOST, MODEL_MEDIA_TYPE, ollama_store
from blazar.store.db import ModelRecord

_SHA256 = re.compile(r"[0-9a-f]{64}")
_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")


@dataclass(frozen=True)
class Found:
    """One model another runtime holds, and how Blazar would adopt it."""

    runtime: str  # ollama | huggingface | lmstudio
    name: str  # the name Blazar would serve it as
    path: str  # the file to adopt (the first shard of a split model)
    size: int  # bytes, all shards
    origin: str  # how that runtime names it
    quantization: str | None = None
    architecture: str | None = None
    parameters: int | None = None
    sha256: str | None = None  # when the store names the bytes by it
    shards: tuple[str, ...] = ()
    held: str | None = None  # the Blazar model with these bytes already
    command: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["shards"] = list(self.shards)
        return data


@dataclass
class _Candidate:
    runtime: str
    origin: str
    name: str
    path: Path
    sha256: str | None = None
    pull: str | None = None  # a `blazar pull` source that adopts it, when there is one
    shards: list[Path] = field(default_factory=list)


def _home(env: Mapping[str, str]) -> Path:
    return Path(env["HOME"]) if env.get("HOME") else Path.home()


def hf_cache(env: Mapping[str, str]) -> Path:
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return _home(env) / ".cache" / "huggingface" / "hub"


def lmstudio_dirs(env: Mapping[str, str]) -> list[Path]:
    home = _home(env)
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def _ollama(env: Mapping[str, str]) -> Iterator[_Candidate]:
    store = ollama_store(env)
    manifests = store / "manifests"
    if not manifests.is_dir():
        return
    for path in sorted(p for p in manifests.rglob("*") if p.is_file()):
        parts = path.relative_to(manifests).parts
        if len(parts) != 4:
            continue
        host, namespace, model, tag = parts
        try:
            layers = json.loads(path.read_text()).get("layers") or []
        except (OSError, ValueError, AttributeError):
            continue
        digests = [
            m.group(1)
            for layer in layers
            if isinstance(layer, dict) and layer.get("mediaType") == MODEL_MEDIA_TYPE
            if (m := _DIGEST.fullmatch(str(layer.get("digest", ""))))
        ]
        if not digests:
            continue
        full = model if namespace == "library" else f"{namespace}/{model}"
        origin = f"{full}:{tag}" if host == HOST else f"{host}/{full}:{tag}"
        pull = f"ollama://{full}:{tag}" if host == HOST else None
        name = f"{_clean(model)}:{_clean(tag)}" if tag != "latest" else _clean(model)
        blob = store / "blobs" / f"sha256-{digests[0]}"
        yield _Candidate("ollama", origin, name, blob, digests[0], pull)


def _hf(env: Mapping[str, str]) -> Iterator[_Candidate]:
    cache = hf_cache(env)
    if not cache.is_dir():
        return
    for repo_dir in sorted(cache.glob("models--*--*")):
        owner, _, repo = repo_dir.name.removeprefix("models--").partition("--")
        seen: set[Path] = set()
        snapshots = sorted((repo_dir / "snapshots").glob("*"), key=_mtime, reverse=True)
        for snapshot in snapshots:  # the newest first; the same blob is listed once
            for path in sorted(snapshot.rglob("*.gguf")):
                blob = path.resolve()
                if blob in seen or not blob.is_file():
                    continue
                seen.add(blob)
                rel = path.relative_to(snapshot).as_posix()
                sha256 = blob.name if _SHA256.fullmatch(blob.name) else None
                origin = f"{owner}/{repo}/{rel}@{snapshot.name[:12]}"
                yield _Candidate("huggingface", origin, _name(repo, rel), path, sha256)


def _lmstudio(env: Mapping[str, str]) -> Iterator[_Candidate]:
    for root in lmstudio_dirs(env):
        if not root.is_dir():
            continue
        for path in sorted(root.glob("*/*/**/*.gguf")):
            publisher, repo = path.relative_to(root).parts[:2]
            rel = path.relative_to(root / publisher / repo).as_posix()
            yield _Candidate("lmstudio", f"{publisher}/{repo}/{rel}", _name(repo, rel), path)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _name(repo: str, filename: str) -> str:
    """`repo:quant` (Qwen3-0.6B-GGUF, x-Q8_0.gguf -> qwen3-0.6b:q8_0), as `blazar pull` names
    hub models; the file's name as the tag when it names no quantization."""
    base = _clean(re.sub(r"[-_.]gguf$", "", repo, flags=re.IGNORECASE))
    stem = filename.rsplit("/", 1)[-1]
    shard = SHARD.match(stem)
    tag = quant_of(stem) or (shard["prefix"] if shard else stem.removesuffix(".gguf"))
    return f"{base}:{_clean(tag)}"


def _clean(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._") or "model"


def _split(candidates: list[_Candidate]) -> list[_Candidate]:
    """A split model's shards as one candidate (its first shard); the others dropped."""
    out = []
    for c in candidates:
        shard = SHARD.match(c.path.name)
        if shard is None:
            out.append(c)
        elif int(shard["index"]) == 1:
            total = int(shard["total"])
            c.shards = [
                c.path.with_name(f"{shard['prefix']}-{i:05d}-of-{total:05d}.gguf")
                for i in range(1, total + 1)
            ]
            if all(s.exists() for s in c.shards):
                out.append(c)
    return out


def _held(c: _Candidate, records: list[ModelRecord]) -> str | None:
    for record in records:
        if c.sha256 is not None and record.sha256 == c.sha256:
            return record.ref.short
        try:
            if os.path.samefile(record.path, c.path):
                return record.ref.short
        except OSError:
            continue
    return None


def _command(c: _Candidate) -> str:
    if c.pull is not None:
        return f"blazar pull {c.pull}"
    words = ["blazar", "import", str(c.path), "--name", c.name]
    if c.sha256 is not None:
        words += ["--sha256", c.sha256]
    return shlex.join(words)


def scan(env: Mapping[str, str], records: list[ModelRecord]) -> list[Found]:
    """Every GGUF model in the other runtimes' stores, with its facts and adopt command.

    Files that are not GGUF models (adapters, vision projectors, broken files) are left
    out; `records` (the store's models) mark what Blazar already holds."""
    found = []
    for group in (_ollama(env), _hf(env), _lmstudio(env)):
        for c in _split(list(group)):
            try:
                facts = inspect_gguf(c.path)
            except (NotGGUF, OSError):
                continue
            if facts.file_kind != "model" or facts.architecture == "clip":
                continue
            files = c.shards or [c.path]
            found.append(
                Found(
                    runtime=c.runtime,
                    name=c.name,
                    path=str(c.path),
                    size=sum(f.stat().st_size for f in files),
                    origin=c.origin,
                    quantization=facts.quantization,
                    architecture=facts.architecture,
                    parameters=facts.parameters,
                    sha256=c.sha256,
                    shards=tuple(str(f) for f in c.shards),
                    held=_held(c, records),
                    command=_command(c),
                )
            )
    return found
