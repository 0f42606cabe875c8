"""The `release` install method of the llamacpp lane: llama.cpp's official archives.

Releases are found through a feed with the GitHub releases API's shape
(`GET {feed}/repos/{repo}/releases/latest` and `.../releases/tags/{tag}`); the
feed defaults to api.github.com and `BLAZAR_RELEASE_FEED` (or an explicit
argument) points it elsewhere, `BLAZAR_RELEASE_REPO` changes the repository.
`install_release` picks the archive for this platform and backend, downloads it
(resumable, sha256-verified against the feed's `digest`), unpacks it in a
staging directory, checks that its `llama-server --version` runs, and only then
publishes it under `<engines>/llamacpp/<tag>`. The engine commands call it.
"""

from __future__ import annotations

import json
import os
import platform
import re
import stat
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blazar import urls
from blazar.engines.base import KIND, InstalledEngine, publish, staging
from blazar.engines.download import Progress, download, unpack
from blazar.errors import BlazarError, NotFound, VerificationFailed

DEFAULT_FEED = "https://api.github.com"
DEFAULT_REPO = "ggml-org/llama.cpp"
FEED_ENV = "BLAZAR_RELEASE_FEED"
REPO_ENV = "BLAZAR_RELEASE_REPO"
SERVER_NAMES = ("llama-server", "llama-server.exe")
VERSION_TIMEOUT = 30.0

_OS = {"linux": "ubuntu", "darwin": "macos", "windows": "win"}
_ARCH = {"x86_64": "x64", "amd64": "x64", "x64": "x64", "aarch64": "arm64", "arm64": "arm64"}
_ARCHES = ("x64", "arm64", "s390x")
_EXTS = (".tar.gz", ".zip")


class FeedError(BlazarError):
    """The release feed could not be read or answered something unusable."""


class NoAsset(NotFound):
    """A release has no archive for this platform and backend."""


class EngineCheckFailed(BlazarError):
    """An unpacked engine does not run (`llama-server --version` failed)."""


@dataclass(frozen=True)
class Asset:
    name: str
    url: str
    size: int | None
    digest: str | None  # "sha256:<hex>" as the feed gives it, or None

    @property
    def sha256(self) -> str | None:
        if self.digest and self.digest.lower().startswith("sha256:"):
            return self.digest.split(":", 1)[1].lower()
        return None


@dataclass(frozen=True)
class Release:
    tag: str
    assets: tuple[Asset, ...]

    @classmethod
    def from_json(cls, data: Any) -> Release:
        """Read the releases API's document; FeedError if it is not one."""
        try:
            return cls(str(data["tag_name"]), tuple(_asset(a) for a in data["assets"]))
        except (KeyError, TypeError, AttributeError) as exc:
            raise FeedError(f"the release feed answered an unexpected document ({exc!r})") from exc


def _asset(item: Any) -> Asset:
    size, digest = item.get("size"), item.get("digest")
    return Asset(
        name=str(item["name"]),
        url=str(item["browser_download_url"]),
        size=size if isinstance(size, int) and not isinstance(size, bool) else None,
        digest=digest if isinstance(digest, str) else None,
    )


@dataclass(frozen=True)
class Build:
    """What an asset name says: `llama-b6000-bin-ubuntu-vulkan-x64.tar.gz`."""

    system: str  # ubuntu | macos | win
    backend: str  # cpu | cuda | vulkan | ... (metal for the plain macOS arm64 build)
    variant: str  # the backend's version or flavour: "12.4", "radeon", ""
    arch: str  # x64 | arm64 | s390x
    extra: str  # what follows the arch: "kleidiai", ""


def parse_asset_name(name: str) -> Build | None:
    """Read a llama.cpp binary archive's name; None for anything else (cudart, sources)."""
    ext = next((e for e in _EXTS if name.endswith(e)), None)
    if ext is None or not name.startswith("llama-") or "-bin-" not in name:
        return None
    parts = name[: -len(ext)].split("-bin-", 1)[1].split("-")
    arch_at = max((i for i, p in enumerate(parts) if p in _ARCHES), default=-1)
    if len(parts) < 2 or arch_at < 1:
        return None
    os_name, flavour, extra = parts[0], parts[1:arch_at], "-".join(parts[arch_at + 1 :])
    plain = "metal" if os_name == "macos" and parts[arch_at] == "arm64" else "cpu"
    backend, variant = (flavour[0], "-".join(flavour[1:])) if flavour else (plain, "")
    return Build(os_name, backend, variant, parts[arch_at], extra)


def pick_asset(
    release: Release, system: str, machine: str, backend: str = "cpu"
) -> tuple[Asset, Build]:
    """Choose the archive for `system`/`machine` (platform.system()/machine()) and backend.

    `backend` is a family (`cpu`, `cuda`, `vulkan`, `rocm`, `metal`, ...) or a
    family with its version (`cuda-12.4`). On macOS arm64 the plain build
    (Metal) serves `cpu` too. Raises NoAsset listing the release's assets.
    """
    want_os = _OS.get(system.lower())
    want_arch = _ARCH.get(machine.lower(), machine.lower())
    family, _, version = backend.lower().partition("-")
    families = {family, "metal"} if family == "cpu" and want_os == "macos" else {family}
    found: list[tuple[tuple[int, ...], bool, Asset, Build]] = []
    for asset in release.assets:
        build = parse_asset_name(asset.name)
        if build is None or build.system != want_os or build.arch != want_arch or build.extra:
            continue
        if build.backend not in families or (version and build.variant != version):
            continue
        rank = tuple(int(n) for n in re.findall(r"\d+", build.variant))
        found.append((rank, asset.name.endswith(".tar.gz"), asset, build))
    if not found:
        names = ", ".join(a.name for a in release.assets) or "(none)"
        raise NoAsset(
            f"llama.cpp release {release.tag} has no {backend} build for {system} {machine}. "
            f"Its assets: {names}. Choose another backend, or install with the wheel or "
            "source method."
        )
    found.sort(key=lambda item: (item[3].backend == family, item[0], item[1]))
    return found[-1][2], found[-1][3]


def feed_url(feed: str | None = None) -> str:
    return (feed or os.environ.get(FEED_ENV) or DEFAULT_FEED).rstrip("/")


def normalize_tag(version: str) -> str:
    """`11549` and `b11549` both name release `b11549`."""
    version = version.strip()
    return f"b{version}" if version.isdigit() else version


def fetch_release(
    version: str | None = None, feed: str | None = None, repo: str | None = None
) -> Release:
    """The latest release, or the one tagged `version`, from the feed."""
    base = feed_url(feed)
    repo = repo or os.environ.get(REPO_ENV) or DEFAULT_REPO
    which = "latest" if version is None else "tags/" + urllib.parse.quote(normalize_tag(version))
    url = urls.target(f"{base}/repos/{repo}/releases/{which}", credentials=True).url
    req = urllib.request.Request(
        url, headers={"Accept": "application/vnd.github+json", "User-Agent": "blazar"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            data = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            what = (
                "no latest release" if version is None else f"no release {normalize_tag(version)}"
            )
            raise NotFound(f"the release feed has {what} for {repo} ({url})") from exc
        raise FeedError(f"the release feed answered HTTP {exc.code} for {url}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise FeedError(
            f"could not read the release feed at {url}: {exc}. "
            f"Check the network, or set {FEED_ENV} to a reachable feed."
        ) from exc
    return Release.from_json(data)


def latest_version(feed: str | None = None) -> str:
    """The tag of the newest release, such as `b11549`."""
    return fetch_release(None, feed).tag


def install_release(
    engines_root: Path,
    downloads_dir: Path,
    *,
    version: str | None = None,
    feed: str | None = None,
    backend: str = "cpu",
    progress: Progress | None = None,
) -> InstalledEngine:
    """Download, verify, unpack, check and publish a llama.cpp release archive.

    `version` is a tag (`b11549` or `11549`; None for the latest release).
    Nothing is left under `engines_root` when this fails; an interrupted
    download leaves its `.part` in `downloads_dir` so that re-running resumes.
    """
    base = feed_url(feed)
    release = fetch_release(version, base)
    asset, build = pick_asset(release, platform.system(), platform.machine(), backend)
    sha = asset.sha256
    if sha is None:
        raise VerificationFailed(
            f"{asset.name} in release {release.tag} has no sha256 digest in the feed "
            f"(digest: {asset.digest!r}), so it cannot be verified; refusing to install it."
        )
    tag = f"{release.tag}-{build.backend}"
    with staging(engines_root, tag) as (tmp, final):
        archive = download(
            asset.url, downloads_dir / asset.name, sha256=sha, size=asset.size, progress=progress
        )
        try:
            unpack(archive, tmp)
            server = find_server(tmp)
            version_line = check_server(server)
            publish(tmp, final)
        finally:  # installed or refused, the archive has served its purpose
            archive.unlink(missing_ok=True)
    final_server = final / server.relative_to(tmp)
    return InstalledEngine(
        kind=KIND,
        tag=tag,
        method="release",
        version=release.tag,
        path=final,
        command=[str(final_server)],
        details={"asset": asset.name, "sha256": sha, "feed": base, "server_version": version_line},
    )


def find_server(root: Path) -> Path:
    """The `llama-server` executable anywhere under `root` (the shallowest one)."""
    found = sorted(
        (p for p in root.rglob("*") if p.name in SERVER_NAMES and p.is_file()),
        key=lambda p: (len(p.parts), str(p)),
    )
    if not found:
        raise EngineCheckFailed(
            "the release archive has no llama-server executable; nothing was installed"
        )
    server = found[0]
    server.chmod(server.stat().st_mode | stat.S_IXUSR)
    return server


def check_server(server: Path) -> str:
    """Run `llama-server --version`; return its version line or raise EngineCheckFailed."""
    try:
        proc = subprocess.run(
            [str(server), "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=VERSION_TIMEOUT,
        )
    except (subprocess.TimeoutExpired, OSError) as exc:
        raise EngineCheckFailed(
            f"`llama-server --version` from the archive failed ({exc}); nothing was installed"
        ) from exc
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        tail = "\n".join(output.splitlines()[-10:])
        raise EngineCheckFailed(
            f"`llama-server --version` exited {proc.returncode}; nothing was installed. "
            f"Its output ends with:\n{tail}"
        )
    lines = output.splitlines()
    return next((line for line in lines if "version" in line), lines[0] if lines else "")
