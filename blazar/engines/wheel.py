"""The `wheel` install method: xllamacpp from PyPI, one virtual environment per version.

`xllamacpp` wraps llama.cpp's native HTTP server;
`blazar/engines/launchers/llama_launcher.py` (copied into each engine as `launcher.py`)
maps llama-server's flags onto it. Wheels are downloaded once into a wheel cache
(`BLAZAR_WHEEL_CACHE`, default `<cache>/wheels`) and installed from there with no
index, so a second install of the same version, on the same machine, fetches nothing.
Blazar's own pip drives the install (`pip --python`), so engine environments need no
pip of their own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from blazar.engines import launchers
from blazar.engines.base import KIND, InstalledEngine, publish, staging
from blazar.errors import BlazarError, InvalidInput
from blazar.models.hashing import sha256_file

PACKAGE = "xllamacpp"
_VERSION = re.compile(r"^(\d{4})\.(\d{1,2})\.(\d+)(?:\.(\d+))?$")


class WheelInstallError(BlazarError):
    """pip could not fetch or install the engine's wheel."""


def tag_for_version(version: str) -> str:
    """2026.10.11549 -> b11549-cpu (the last component is llama.cpp's build number)."""
    match = _VERSION.match(version)
    if not match:
        raise InvalidInput(
            f"xllamacpp version {version!r} does not name a llama.cpp build "
            "(expected YEAR.MONTH.BUILD, e.g. 2026.10.11549)"
        )
    build, post = match.group(3), match.group(4)
    return f"b{build}-cpu" + (f"-post{post}" if post else "")


def wheel_cache(default: Path) -> Path:
    return Path(os.environ.get("BLAZAR_WHEEL_CACHE") or default)


def _pip(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:  # pragma: no cover - sys.executable always exists
        raise WheelInstallError(f"cannot run pip: {exc}") from exc


def place_launcher(launcher: Path, tmp: Path, name: str, what: str, *, timeout: float) -> str:
    """Copy an engine's standalone launcher (`blazar.engines.launchers`) into its staging
    directory as `name`, with `launcher_common.py` beside it (every launcher imports it as
    a sibling), and run it once with the environment's Python (`--version`); what it
    printed, or a WheelInstallError saying why the engine installed but does not start."""
    shutil.copy2(launcher, tmp / name)
    shutil.copy2(launchers.COMMON, tmp / launchers.COMMON.name)
    check = subprocess.run(
        [str(tmp / "venv" / "bin" / "python"), str(tmp / name), "--version"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check.returncode != 0:
        raise WheelInstallError(
            f"{what} installed but its launcher does not start:\n"
            f"{_tail(check.stderr or check.stdout)}"
        )
    return _tail(check.stdout, 2)


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def make_venv(tmp: Path) -> Path:
    """An engine's own virtual environment, `tmp/venv`, made by this Python without pip
    (pip installs into it from outside, `--python`)."""
    venv = tmp / "venv"
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        raise WheelInstallError(f"could not create a virtual environment:\n{made.stderr}")
    return venv


def latest_version(package: str = PACKAGE) -> str:
    """The newest release of `package` (xllamacpp) on the package index pip is configured
    for."""
    result = _pip("index", "versions", package, timeout=120)
    match = re.search(rf"^{re.escape(package)} \(([^)]+)\)", result.stdout, re.MULTILINE)
    if result.returncode != 0 or not match:
        raise WheelInstallError(
            f"could not find the newest {package} on the package index:\n"
            f"{_tail(result.stderr or result.stdout)}\n"
            "pass --version to choose one, or check pip's index settings"
        )
    return match.group(1)


def cached_wheel(cache: Path, version: str) -> Path | None:
    found = sorted(cache.glob(f"{PACKAGE}-{version}-*.whl"))
    return found[-1] if found else None


def fetch_wheel(cache: Path, version: str) -> Path:
    """The wheel for `version`, from the cache or downloaded into it."""
    if wheel := cached_wheel(cache, version):
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    result = _pip(
        "download", "--no-deps", "--only-binary", ":all:", "-d", str(cache), f"{PACKAGE}=={version}"
    )
    wheel = cached_wheel(cache, version)
    if result.returncode != 0 or wheel is None:
        raise WheelInstallError(
            f"could not download {PACKAGE}=={version}:\n{_tail(result.stderr or result.stdout)}"
        )
    return wheel


def install_wheel(engines_root: Path, cache: Path, version: str | None = None) -> InstalledEngine:
    """Install xllamacpp `version` (default: the newest) as a new engine, beside the others."""
    version = version or latest_version()
    tag = tag_for_version(version)
    wheel = fetch_wheel(cache, version)
    with staging(engines_root, tag) as (tmp, final):
        venv = make_venv(tmp)
        result = _pip(
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-index",
            "--no-deps",
            "--quiet",
            str(wheel),
        )
        if result.returncode != 0:
            raise WheelInstallError(
                f"could not install {wheel.name}:\n{_tail(result.stderr or result.stdout)}"
            )
        launcher_version = place_launcher(
            launchers.LLAMA, tmp, "launcher.py", f"{PACKAGE} {version}", timeout=60
        )
        publish(tmp, final)
    return InstalledEngine(
        kind=KIND,
        tag=tag,
        method="wheel",
        version=version,
        path=final,
        command=[str(final / "venv" / "bin" / "python"), str(final / "launcher.py")],
        details={
            "wheel": wheel.name,
            "sha256": sha256_file(wheel)[0],  # the artifact's digest, for blazar.lock
            "launcher_version": launcher_version,
        },
    )
