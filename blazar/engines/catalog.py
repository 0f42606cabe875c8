"""The catalog of curated fork lanes: what `blazar engine offers` lists and `install --lane` builds.

A catalog is a TOML file of `[offers.ID]` tables. Blazar ships one
(`catalog.toml`, package data); `engines.catalog` in the manifest, the
`BLAZAR_ENGINE_CATALOG` variable or a command's `--catalog` names another, by path
or URL. Each offer pins a fork of llama.cpp to one immutable commit:

    [offers.nova]
    kind = "llamacpp"                   # the contract its server honours
    repo = "https://github.com/o/llama.cpp-nova"
    commit = "<40 hex digits>"          # a full commit SHA, never a branch or tag
    tree = "<40 hex digits>"            # that commit's git tree hash, or instead:
    # archive = "https://.../nova.tar.gz" and sha256 = "<64 hex digits>"
    architectures = ["nova"]            # GGUF general.architecture values it adds
    build_options = ["-DGGML_NOVA=ON"]  # cmake -D options its build needs
    backends = ["cpu", "cuda"]          # what it builds for (default: both)
    build_minutes = 25                  # how long a CPU build took on two cores, as measured
    upstream = "b12000"                 # once known: the mainstream build that added them

Parsing is pure and refuses each bad offer with its reason (the good ones stay
usable); the digest itself is checked once the source is fetched
(`blazar.engines.forks`). URL catalogs are cached under the cache directory and
fetched again at most once per `MAX_AGE`; the gateway's passes read only the cache.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import tomllib
import urllib.request
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from blazar import urls
from blazar.errors import BlazarError, InvalidInput, NotFound

SHIPPED = "shipped with Blazar"
MAX_AGE = 3600.0
MAINSTREAM_KINDS = ("llamacpp",)  # lane names a fork may not take
_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_SHA1 = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_BUILD = re.compile(r"b([0-9]+)")
_URL = re.compile(r"^(https?|file)://")
_GIT_URL = re.compile(r"^(https?|git|ssh|file)://|^[\w.-]+@[\w.-]+:")
_KEYS = {
    "kind",
    "description",
    "repo",
    "commit",
    "tree",
    "archive",
    "sha256",
    "architectures",
    "build_options",
    "upstream",
    "backends",
    "build_minutes",
}
BACKENDS = ("cpu", "cuda")  # what `blazar.engines.source` builds


class CatalogError(BlazarError):
    """The catalog cannot be read at all (a missing file, an unreachable URL, bad TOML)."""


@dataclass(frozen=True)
class Offer:
    """One curated fork lane, pinned by commit."""

    id: str
    kind: str
    repo: str
    commit: str  # full 40-hex SHA
    architectures: tuple[str, ...]
    tree: str | None = None  # git tree hash of `commit`
    archive: str | None = None  # or an archive of the tree, with its sha256
    sha256: str | None = None
    build_options: tuple[str, ...] = ()
    upstream: int | None = None  # mainstream build number that added the architectures
    description: str = ""
    backends: tuple[str, ...] = BACKENDS  # the backends it builds for
    build_minutes: int | None = None  # a CPU build's duration on two cores, as measured

    @property
    def build_estimate(self) -> str | None:
        """The build time in words, for `engine offers`."""
        if self.build_minutes is None:
            return None
        return f"about {self.build_minutes} min (CPU, 2 cores)"

    @property
    def short(self) -> str:
        return self.commit[:7]

    def tag(self, backend: str) -> str:
        """The engine tag its build installs as: fork-nova-0123abc-cpu."""
        return f"fork-{self.id}-{self.short}-{backend}"

    @property
    def digest(self) -> str:
        return f"tree {self.tree}" if self.tree else f"sha256 {self.sha256}"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "repo": self.repo,
            "commit": self.commit,
            "tree": self.tree,
            "archive": self.archive,
            "sha256": self.sha256,
            "architectures": list(self.architectures),
            "build_options": list(self.build_options),
            "upstream": f"b{self.upstream}" if self.upstream is not None else None,
            "description": self.description,
            "backends": list(self.backends),
            "build_minutes": self.build_minutes,
            "build_estimate": self.build_estimate,
        }


@dataclass(frozen=True)
class Catalog:
    source: str  # where it was read from
    offers: dict[str, Offer] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # offer id -> why it is refused
    note: str | None = None  # e.g. a stale cached copy was used

    def get(self, offer_id: str) -> Offer:
        """The offer `offer_id`; NotFound or InvalidInput that say what to run."""
        if offer_id in self.offers:
            return self.offers[offer_id]
        if offer_id in self.refused:
            raise InvalidInput(
                f"offer {offer_id!r} of the catalog ({self.source}) is refused: "
                f"{self.refused[offer_id]}; fix the catalog entry or choose another offer"
            )
        known = ", ".join(sorted(self.offers)) or "none"
        raise NotFound(
            f"the catalog ({self.source}) has no offer {offer_id!r} (offers: {known}); "
            "`blazar engine offers` lists them"
        )

    def adding(self, architecture: str) -> list[Offer]:
        """The offers that add `architecture`."""
        return [o for o in self.offers.values() if architecture in o.architectures]


def _strings(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{what} must be a list of non-empty strings")
    return tuple(value)


def parse_offer(offer_id: str, body: object) -> Offer:
    """Pure: one `[offers.ID]` table as an Offer; ValueError saying what is wrong."""
    if not _ID.fullmatch(offer_id):
        raise ValueError("the id must be lowercase letters, digits, '.', '-' or '_'")
    if offer_id in MAINSTREAM_KINDS:
        raise ValueError(f"{offer_id!r} is the mainstream lane's name")
    if not isinstance(body, dict):
        raise ValueError("an offer is a table")
    unknown = sorted(set(body) - _KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}")
    kind = body.get("kind", "llamacpp")
    if kind not in MAINSTREAM_KINDS:
        kinds = ", ".join(MAINSTREAM_KINDS)
        raise ValueError(f"kind {kind!r} is not a kind Blazar serves ({kinds})")
    repo = body.get("repo")
    if not isinstance(repo, str) or not _GIT_URL.match(repo):
        raise ValueError("repo must be a git URL (https://, git://, ssh://, file://, user@host:)")
    commit = body.get("commit")
    if not isinstance(commit, str) or not _SHA1.fullmatch(commit):
        raise ValueError(
            f"commit {commit!r} is not a full commit SHA (40 lowercase hex digits); "
            "an offer is pinned to one commit, never a branch or tag"
        )
    tree, archive, sha256 = body.get("tree"), body.get("archive"), body.get("sha256")
    if tree is not None:
        if not isinstance(tree, str) or not _SHA1.fullmatch(tree):
            raise ValueError(f"tree {tree!r} is not a git tree hash (40 lowercase hex digits)")
        if archive is not None or sha256 is not None:
            raise ValueError("give either tree, or archive with sha256, not both")
    elif archive is not None:
        if not isinstance(archive, str) or not _URL.match(archive):
            raise ValueError("archive must be an https:// or file:// URL")
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise ValueError(f"sha256 {sha256!r} is not 64 lowercase hex digits")
    else:
        raise ValueError("an offer needs a digest: tree, or archive with sha256")
    architectures = _strings(body.get("architectures"), "architectures")
    if not architectures:
        raise ValueError("the offer adds no architecture: list them in architectures")
    options = _strings(body.get("build_options", []), "build_options")
    if any(not o.startswith("-D") for o in options):
        raise ValueError("build_options are cmake -D options")
    upstream = body.get("upstream")
    build = None
    if upstream is not None:
        match = _BUILD.fullmatch(upstream) if isinstance(upstream, str) else None
        if match is None:
            raise ValueError(f"upstream {upstream!r} is not a mainstream build such as 'b12000'")
        build = int(match.group(1))
    backends = _strings(body.get("backends", list(BACKENDS)), "backends")
    if not backends or any(b not in BACKENDS for b in backends):
        raise ValueError(f"backends must list some of {', '.join(BACKENDS)}")
    minutes = body.get("build_minutes")
    if minutes is not None and (
        isinstance(minutes, bool) or not isinstance(minutes, int) or minutes < 1
    ):
        raise ValueError("build_minutes must be a whole number of minutes, at least 1")
    description = body.get("description", "")
    return Offer(
        id=offer_id,
        kind=kind,
        repo=repo,
        commit=commit,
        architectures=architectures,
        tree=tree,
        archive=archive,
        sha256=sha256,
        build_options=options,
        upstream=build,
        description=description if isinstance(description, str) else "",
        backends=backends,
        build_minutes=minutes,
    )


def parse_catalog(text: str, source: str) -> Catalog:
    """Pure: a catalog's TOML text; every bad offer refused with its reason."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"the catalog {source} is not valid TOML: {exc}") from None
    offers, refused = {}, {}
    tables = doc.get("offers", {})
    if not isinstance(tables, dict):
        raise CatalogError(f"the catalog {source}: `offers` must be a table of [offers.ID]")
    for offer_id, body in tables.items():
        try:
            offers[offer_id] = parse_offer(offer_id, body)
        except ValueError as exc:
            refused[offer_id] = str(exc)
    return Catalog(source, offers, refused)


def _cached(location: str, cache_dir: Path) -> Path:
    return cache_dir / "catalogs" / (hashlib.sha256(location.encode()).hexdigest()[:16] + ".toml")


def load_catalog(
    location: str | None,
    cache_dir: Path,
    *,
    fetch: bool = True,
    max_age: float = MAX_AGE,
    now: float | None = None,
) -> Catalog:
    """The catalog at `location` (a path or URL; None: the one shipped with Blazar).

    A URL's copy in `cache_dir` younger than `max_age` is used as is; with
    `fetch=False` (the gateway's passes) only the cached copy is read, whatever its age.
    """
    location = location or os.environ.get("BLAZAR_ENGINE_CATALOG") or None
    if location is None:
        text = resources.files("blazar.engines").joinpath("catalog.toml").read_text("utf-8")
        return parse_catalog(text, SHIPPED)
    if not _URL.match(location) or location.startswith("file://"):
        path = Path(location.removeprefix("file://")).expanduser()
        try:
            return parse_catalog(path.read_text("utf-8"), str(path))
        except OSError as exc:
            raise CatalogError(f"cannot read the catalog {path}: {exc.strerror}") from None
    cached = _cached(location, cache_dir)
    age = (now or time.time()) - cached.stat().st_mtime if cached.exists() else None
    if cached.exists() and (not fetch or (age is not None and age < max_age)):
        return parse_catalog(cached.read_text("utf-8"), location)
    if not fetch:
        return Catalog(location, note=f"not fetched yet: `blazar engine offers` fetches {location}")
    try:
        url = urls.target(location, credentials=True).url  # as urllib dials it
        with urllib.request.urlopen(url, timeout=30) as resp:
            text = resp.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        if cached.exists():
            catalog = parse_catalog(cached.read_text("utf-8"), location)
            note = f"{location} is unreachable ({exc}); using the copy fetched earlier"
            return Catalog(catalog.source, catalog.offers, catalog.refused, note)
        raise CatalogError(
            f"cannot fetch the catalog {location}: {exc}; check engines.catalog"
        ) from None
    catalog = parse_catalog(text, location)  # refuse bad TOML before it replaces the cache
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".part")
    tmp.write_text(text, "utf-8")
    os.replace(tmp, cached)
    return catalog
