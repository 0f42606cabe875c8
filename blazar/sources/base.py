"""What every model source returns and raises, and the checks they share.

`Fetched` is the result of `blazar.sources.fetch` (verified local GGUF files),
`FetchPlan` the result of `blazar.sources.plan_fetch` (what a fetch would do).
Errors: `FetchError` is permanent (a bad name, a missing file or repo, an
HTTP 404); `TemporaryFetchError` is a network failure, an HTTP 5xx or a
timeout, which the models reconciler retries later. A checksum mismatch is
`blazar.errors.VerificationFailed`, and a file that is no GGUF is
`blazar.errors.NotGGUF`; both are permanent.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from blazar.errors import BlazarError, NotGGUF, VerificationFailed
from blazar.models.hashing import sha256_file
from specs.sources import Source

Progress = Callable[[int, int | None], None]

GGUF_MAGIC = b"GGUF"
# A split model's shard file name, as llama.cpp's gguf-split names them.
SHARD = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<total>\d{5})\.gguf$")
# A quantization as model files name it: Q4_K_M, IQ3_XXS, Q8_0, F16, BF16, MXFP4, TQ1_0, ...
_QUANT = re.compile(
    r"(?:^|[-_.])((?:I?Q|TQ)\d(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?)(?=$|[-_.])",
    re.IGNORECASE,
)


def quant_of(filename: str) -> str | None:
    """The quantization a GGUF file name names, upper case; None when it names none."""
    stem = filename.rsplit("/", 1)[-1]
    shard = SHARD.match(stem)
    stem = shard["prefix"] if shard else stem.removesuffix(".gguf")
    found = _QUANT.findall(stem)
    return found[-1].upper() if found else None


class FetchError(BlazarError):
    """A model's bytes cannot be fetched from its source; retrying will not help."""


class TemporaryFetchError(FetchError):
    """A fetch failed for a reason that may pass (network, HTTP 5xx, timeout): retry later."""


@dataclass(frozen=True)
class Fetched:
    """Verified local file(s) of one model: a GGUF, its shards, or a set of files."""

    files: list[Path]  # several for a sharded model (first shard first) or a set
    sha256: str  # of files[0], the file Blazar registers; of a set, its digest
    size: int  # total bytes of all files
    temporary: bool  # True when the files sit in Blazar's download area (delete after import)
    detail: dict[str, str] = field(default_factory=dict)  # repo, revision, filename, url, ...
    # A model of several files (`blazar.models.filesets`): each file's path inside the model's
    # directory, in the order of `files`, and the sha256 the source lists for each.
    names: tuple[str, ...] = ()
    hashes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FetchPlan:
    """What `fetch` would do for a source, found without touching the network."""

    source: Source  # short names resolved to their hf:// source
    kind: str  # file | hf | https | ollama
    location: str  # a local path, a URL, or the hub repo's URL
    sha256: str | None  # the sha256 the manifest asks for
    size: int | None  # bytes, when known without the network
    network: bool  # whether fetching needs the network

    def describe(self) -> str:
        """One line for a plan: `download hf://... from https://huggingface.co/...`."""
        verb = "download" if self.network else "use"
        same = self.kind == "file" or self.location == str(self.source)
        where = "" if same else f" from {self.location}"
        return f"{verb} {self.source}{where}"


def check_gguf(path: Path, what: str) -> None:
    """Raise NotGGUF unless `path` starts with the GGUF magic."""
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise NotGGUF(
            f"{what} is not a GGUF model file (it starts with {magic!r}); "
            "Blazar serves GGUF models only: choose a .gguf file or quantization"
        )


def verify_sha256(path: Path, expected: str | None, what: str) -> tuple[str, int]:
    """Hash `path`; raise VerificationFailed if `expected` is given and differs.

    Never deletes anything: callers decide what "nothing was kept" means for
    their source (a user's file or ollama's blob is never touched).
    """
    digest, size = sha256_file(path)
    if expected is not None and digest != expected.lower():
        raise VerificationFailed(
            f"sha256 mismatch for {what}: expected {expected.lower()}, got {digest}; "
            "nothing was kept. Check the sha256 in the manifest or the source."
        )
    return digest, size
