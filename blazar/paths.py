"""Where Blazar keeps its files.

Four XDG locations: config (the user's manifest), data (model blobs, engines,
the store), state (logs, locks) and cache (downloads). `BLAZAR_HOME` moves all
four under one root, which is how tests isolate themselves. If the XDG
directories cannot be created, Blazar falls back to `./.blazar-home` and says
so on stderr: running with state in an odd place must never be silent.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

MANIFEST_NAME = "blazar.toml"
FLAT_CONFIG_NAME = "config.toml"  # the user guide's flat file, which Blazar does not read
DB_NAME = "blazar.db"


@dataclass(frozen=True)
class Paths:
    """The four roots and the well-known files below them."""

    config: Path
    data: Path
    state: Path
    cache: Path

    @property
    def manifest(self) -> Path:
        """The user's manifest: the file imperative commands edit."""
        return self.config / MANIFEST_NAME

    @property
    def flat_config(self) -> Path:
        """The flat `config.toml` the user guide describes (`port = 11434`, `[[keys]]`),
        beside the manifest. Blazar does not read it: `unread_config_warning` says so and
        `blazar migrate config` turns it into manifest content."""
        return self.config / FLAT_CONFIG_NAME

    @property
    def db(self) -> Path:
        return self.data / DB_NAME

    @property
    def blobs(self) -> Path:
        """Content-addressed model files: `sha256-<hex>`."""
        return self.data / "models" / "blobs"

    @property
    def engines(self) -> Path:
        return self.data / "engines"

    @property
    def sessions(self) -> Path:
        """Saved KV sessions (llama-server's --slot-save-path), named by Blazar."""
        return self.data / "sessions"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def downloads(self) -> Path:
        return self.cache / "downloads"

    def all(self) -> tuple[Path, Path, Path, Path]:
        return (self.config, self.data, self.state, self.cache)

    def ensure(self) -> Paths:
        """Create the roots; return self for chaining."""
        for root in self.all():
            root.mkdir(parents=True, exist_ok=True)
        return self


def unread_config_warning(paths: Paths) -> str | None:
    """What `blazar serve` (at start), `blazar doctor` and `blazar config path` say while a
    flat config.toml sits beside the manifest: settings in it would otherwise be ignored
    in silence. None when there is no such file."""
    flat = paths.flat_config
    if not flat.is_file():
        return None
    return (
        f"{flat} exists and is not read: Blazar reads its settings from the manifest, "
        f"{paths.manifest}; `blazar migrate config --merge` carries that file's settings "
        "over (then remove it)"
    )


def _xdg(env: str, default: str) -> Path:
    value = os.environ.get(env)
    # The XDG spec says relative values are invalid and must be ignored.
    if value and os.path.isabs(value):
        return Path(value) / "blazar"
    return Path.home() / default / "blazar"


def _under(root: Path) -> Paths:
    return Paths(root / "config", root / "data", root / "state", root / "cache")


def _usable(paths: Paths) -> bool:
    try:
        paths.ensure()
    except OSError:
        return False
    return all(os.access(p, os.W_OK) for p in paths.all())


def resolve_paths() -> Paths:
    """Resolve Blazar's directories from the environment and create them."""
    home = os.environ.get("BLAZAR_HOME")
    if home:
        return _under(Path(home).expanduser().resolve()).ensure()
    paths = Paths(
        config=_xdg("XDG_CONFIG_HOME", ".config"),
        data=_xdg("XDG_DATA_HOME", ".local/share"),
        state=_xdg("XDG_STATE_HOME", ".local/state"),
        cache=_xdg("XDG_CACHE_HOME", ".cache"),
    )
    if _usable(paths):
        return paths
    fallback = _under(Path.cwd() / ".blazar-home")
    print(
        f"blazar: WARNING: XDG directories are not usable ({paths.data} and friends); "
        f"keeping all state under {fallback.config.parent} instead. "
        "Set BLAZAR_HOME to choose a location.",
        file=sys.stderr,
    )
    return fallback.ensure()
