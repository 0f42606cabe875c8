"""`blazar upgrade [--rollback]`: upgrade Blazar itself the way it was installed, and go back.

Blazar lives in a virtual environment of its own: the one `packaging/install.sh`
makes (it leaves `blazar-install` in it, naming what it installed), or any venv
a user `pip install`ed it into. `detect` (pure) reads how: an editable checkout
(`pip install -e`, pip's `direct_url.json` says so) is refused, since upgrading
would put a copy over the user's own code; so is a Python that is not a venv.
The source to upgrade from is `--source`, else what install.sh installed, else
the git URL or directory pip recorded, else the package index.

`upgrade` copies the venv to `<venv>.previous` first (a staged copy, swapped in
only once the new version runs), runs the venv's own pip, and checks that
`<venv>/bin/blazar --version` starts and names a version; if it does not, the
copy is put back, so a failed upgrade leaves the old Blazar working.
`rollback` swaps `<venv>` and `<venv>.previous` by renames (so a second
rollback goes forward again) and checks the result the same way. Venvs hold
absolute paths, which is why the copy goes back to the same path. Only the
standard library here: an upgrade must run even when the environment's other
packages are what is broken.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from blazar import __version__
from blazar.errors import BlazarError, Conflict, InvalidInput, NotFound

MARKER = "blazar-install"  # written by packaging/install.sh into the venv it makes
PACKAGE = "blazar"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(==|>=|<=|~=|!=|<|>).*$")
_VERSION = re.compile(r"blazar, version (\S+)")

Runner = Callable[..., subprocess.CompletedProcess[Any]]


class UpgradeFailed(BlazarError):
    """pip failed, or the new Blazar does not start; the previous one was put back."""


@dataclass(frozen=True)
class Install:
    """How this Blazar was installed."""

    how: str  # install-script | venv
    prefix: Path  # the virtual environment
    source: str  # what pip installs to upgrade it
    version: str

    @property
    def previous(self) -> Path:
        return self.prefix.with_name(self.prefix.name + ".previous")

    @property
    def blazar(self) -> Path:
        return self.prefix / "bin" / "blazar"

    @property
    def python(self) -> Path:
        return self.prefix / "bin" / "python"


@dataclass(frozen=True)
class Upgraded:
    install: Install
    before: str
    after: str
    previous: Path | None  # the copy kept to roll back to (None: nothing changed)


def _unpinned(spec: str) -> str:
    """`blazar==0.1.0` -> `blazar`: the newest, not the version once installed."""
    match = _PIN.match(spec.strip())
    return match.group(1) if match else spec.strip()


def detect(
    prefix: Path,
    base_prefix: Path,
    direct_url: dict[str, Any] | None,
    marker: str | None,
    version: str,
    source: str | None = None,
    package_dir: Path | None = None,
) -> Install:
    """How Blazar was installed and what to upgrade it from (pure). `package_dir` is where
    the running `blazar` package is: outside `prefix`, it runs from a checkout."""
    editable = bool(direct_url and (direct_url.get("dir_info") or {}).get("editable"))
    outside = package_dir is not None and not package_dir.is_relative_to(prefix)
    if editable or outside:
        url = str((direct_url or {}).get("url", ""))
        where = _path_of(url) if editable else None
        where = where or (str(package_dir.parent) if package_dir is not None else url or "?")
        raise Conflict(
            f"Blazar runs from an editable checkout at {where} (`pip install -e`): upgrading "
            "would put a copy over your checkout's code. Update the checkout instead (`git "
            f"pull` in {where}); `blazar upgrade` upgrades an installed Blazar"
        )
    if prefix.resolve() == base_prefix.resolve():
        raise Conflict(
            f"Blazar is installed in Python's own environment ({prefix}), not a virtual "
            "environment of its own, so there is nowhere to keep the old one to roll back to: "
            "upgrade it with the tool that installed it, or install Blazar with "
            "packaging/install.sh (its own venv) and upgrade that"
        )
    how = "venv"
    found = None
    if marker is not None:
        how = "install-script"
        found = next(
            (ln.partition("=")[2] for ln in marker.splitlines() if ln.startswith("repo=")), None
        )
    if found is None and direct_url:
        vcs = direct_url.get("vcs_info")
        url = str(direct_url.get("url", ""))
        if vcs:
            found = f"{vcs.get('vcs', 'git')}+{url}"
        elif direct_url.get("dir_info") is not None:
            found = _path_of(url) or url
        elif direct_url.get("archive_info") is not None and not source:
            raise InvalidInput(
                f"Blazar was installed from the file {url}, which has no newer version: give "
                "the new one with --source PATH|URL"
            )
    return Install(how, prefix, _unpinned(source or found or PACKAGE), version)


def _path_of(url: str) -> str | None:
    parsed = urlparse(url)
    return unquote(parsed.path) if parsed.scheme == "file" else None


def this_install(source: str | None = None) -> Install:
    """`detect` on the running Python and Blazar."""
    from importlib import metadata

    import blazar

    package_dir = Path(blazar.__file__).resolve().parent
    direct_url = None
    # the distribution beside the running package (a checkout's own blazar.egg-info, first
    # on sys.path when Python runs in it, is not what is installed)
    for dist in metadata.distributions(path=[str(package_dir.parent)]):
        if (dist.metadata["Name"] or "").lower() == PACKAGE:
            text = dist.read_text("direct_url.json")
            try:
                direct_url = json.loads(text) if text else None
            except ValueError:
                direct_url = None
            break
    prefix = Path(sys.prefix).resolve()
    marker_path = prefix / MARKER
    marker = marker_path.read_text() if marker_path.is_file() else None
    return detect(
        prefix, Path(sys.base_prefix), direct_url, marker, __version__, source, package_dir
    )


def version_of(blazar: Path, runner: Runner = subprocess.run) -> str | None:
    """What `blazar --version` says, or None when it does not start."""
    try:
        done = runner([str(blazar), "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _VERSION.search(done.stdout or "")
    return match.group(1) if done.returncode == 0 and match else None


def _copy(prefix: Path) -> Path:
    staged = prefix.with_name(f".{prefix.name}.previous-{uuid.uuid4().hex[:8]}")
    shutil.copytree(prefix, staged, symlinks=True)
    return staged


def _swap(a: Path, b: Path) -> None:
    """Exchange two directories by renames (both on one filesystem: siblings)."""
    middle = a.with_name(f".{a.name}.swap-{uuid.uuid4().hex[:8]}")
    os.rename(a, middle)
    os.rename(b, a)
    os.rename(middle, b)


def upgrade(
    install: Install,
    *,
    pip_args: Sequence[str] = (),
    notify: Callable[[str], None] | None = None,
    runner: Runner = subprocess.run,
) -> Upgraded:
    """Upgrade `install` in place, keeping a copy to roll back to (module docstring)."""
    say = notify or (lambda _m: None)
    say(f"keeping a copy of {install.prefix} to roll back to")
    staged = _copy(install.prefix)
    try:
        cmd = [str(install.python), "-m", "pip", "install", "--upgrade", *pip_args, install.source]
        say(f"running {' '.join(cmd)}")
        done = runner(cmd, capture_output=True, text=True)
        after = version_of(install.blazar, runner) if done.returncode == 0 else None
        if after is None:
            _swap(install.prefix, staged)  # the old one back; the broken one is removed below
            said = (done.stdout or "") + (done.stderr or "")
            tail = "\n".join(said.strip().splitlines()[-12:])
            what = "pip failed" if done.returncode else "the new Blazar does not start"
            raise UpgradeFailed(
                f"upgrade from {install.source} failed ({what}); Blazar {install.version} was "
                f"put back and runs as before.\n{tail}"
            )
        if after == install.version:
            return Upgraded(install, install.version, after, None)
        if install.previous.exists():
            shutil.rmtree(install.previous)
        os.rename(staged, install.previous)
        return Upgraded(install, install.version, after, install.previous)
    finally:
        if staged.exists():
            shutil.rmtree(staged, ignore_errors=True)


def rollback(install: Install, runner: Runner = subprocess.run) -> Upgraded:
    """Swap the venv and the copy an upgrade kept; check that the result starts."""
    if not install.previous.is_dir():
        raise NotFound(
            f"no previous Blazar at {install.previous}: `blazar upgrade` keeps one when it "
            "installs a new version"
        )
    _swap(install.prefix, install.previous)
    after = version_of(install.blazar, runner)
    if after is None:
        _swap(install.prefix, install.previous)
        raise UpgradeFailed(
            f"the previous Blazar in {install.previous} does not start; kept {install.version}"
        )
    return Upgraded(install, install.version, after, install.previous)
