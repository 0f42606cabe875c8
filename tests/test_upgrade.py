"""`blazar upgrade [--rollback]`: how Blazar was installed (pure, table-tested), and the real
thing offline: packaging/install.sh and a plain `pip install` into a venv, each from wheels of
Blazar built here, upgraded to a newer one, rolled back, and a broken release put back.

The wheels are this checkout's packages with another version and only click as a dependency
(what `blazar --version` and `blazar upgrade` import; the other dependencies have no wheels in
the offline cache); pip reads them from a local directory with --no-index (PIP_NO_INDEX,
PIP_FIND_LINKS).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from blazar.errors import Conflict, InvalidInput
from blazar.host.upgrade import Install, detect
from tests.conftest import Blazar
from tests.fixtures import WHEEL_CACHE

ROOT = Path(__file__).resolve().parent.parent
VENV = Path("/opt/blazar/venv")
BASE = Path("/usr")


@pytest.mark.parametrize(
    ("direct_url", "marker", "source", "how", "expected"),
    [
        (None, None, None, "venv", "blazar"),  # from the package index
        (
            None,
            "repo=git+https://example.org/b.git\n",
            None,
            "install-script",
            "git+https://example.org/b.git",
        ),
        (None, "repo=blazar==0.1.0\n", None, "install-script", "blazar"),  # not the old pin
        (
            {"url": "https://example.org/b.git", "vcs_info": {"vcs": "git", "commit_id": "ab"}},
            None,
            None,
            "venv",
            "git+https://example.org/b.git",
        ),
        ({"url": "file:///src/blazar", "dir_info": {}}, None, None, "venv", "/src/blazar"),
        (None, None, "blazar>=0.2", "venv", "blazar"),
        (None, None, "/src/new-checkout", "venv", "/src/new-checkout"),
    ],
)
def test_detect_how_blazar_was_installed(
    direct_url: dict[str, object] | None,
    marker: str | None,
    source: str | None,
    how: str,
    expected: str,
) -> None:
    install = detect(VENV, BASE, direct_url, marker, "0.1.0", source)
    assert (install.how, install.source) == (how, expected)
    assert install.previous == Path("/opt/blazar/venv.previous")


def test_detect_refuses_what_it_cannot_upgrade() -> None:
    editable = {"url": "file:///home/me/blazar", "dir_info": {"editable": True}}
    with pytest.raises(Conflict, match=r"editable checkout at /home/me/blazar .*git pull"):
        detect(VENV, BASE, editable, None, "0.1.0")
    with pytest.raises(Conflict, match="checkout at /home/me/blazar"):  # on PYTHONPATH
        detect(VENV, BASE, None, None, "0.1.0", package_dir=Path("/home/me/blazar/blazar"))
    inside = VENV / "lib" / "python3.11" / "site-packages" / "blazar"
    assert detect(VENV, BASE, None, None, "0.1.0", package_dir=inside).how == "venv"
    with pytest.raises(Conflict, match="not a virtual environment"):
        detect(BASE, BASE, None, None, "0.1.0")
    wheel = {"url": "file:///tmp/blazar-0.1.0-py3-none-any.whl", "archive_info": {}}
    with pytest.raises(InvalidInput, match="--source"):
        detect(VENV, BASE, wheel, None, "0.1.0")
    assert detect(VENV, BASE, wheel, None, "0.1.0", "/tmp/new.whl").source == "/tmp/new.whl"


def test_upgrade_refuses_in_an_editable_checkout(blazar: Blazar) -> None:
    refused = blazar("upgrade", ok=False)  # this test suite runs from `pip install -e .`
    assert refused.exit_code == 1 and "editable checkout" in refused.output
    assert "Traceback" not in refused.output


def _wheel(out: Path, version: str, broken: bool = False) -> Path:
    """A wheel of this checkout as `version`, needing only click; `broken` cannot start.

    Written as the wheel format says (a zip with the packages and a .dist-info), since
    setuptools here cannot make wheels without the `wheel` package and the index."""
    dist = f"blazar-{version}.dist-info"
    files: dict[str, bytes] = {}
    for part in ("blazar", "reconcilers", "specs"):
        for path in sorted((ROOT / part).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files[path.relative_to(ROOT).as_posix()] = path.read_bytes()
    init = files["blazar/__init__.py"].decode()
    files["blazar/__init__.py"] = re.sub(
        r'__version__ = ".*"', f'__version__ = "{version}"', init
    ).encode()
    if broken:  # a release whose entry point fails on import
        main = files["blazar/cli/main.py"]
        files["blazar/cli/main.py"] = b"raise ImportError('a broken release')\n" + main
    files[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: blazar\nVersion: {version}\n"
        "Requires-Python: >=3.11\nRequires-Dist: click>=8.1\n"
    ).encode()
    files[f"{dist}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: blazar-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{dist}/entry_points.txt"] = b"[console_scripts]\nblazar = blazar.cli.main:main\n"
    files[f"{dist}/top_level.txt"] = b"blazar\nreconcilers\nspecs\n"
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    wheel = out / f"blazar-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("wheels")
    releases = [("0.1.0", False), ("0.1.1", False), ("0.1.2", True), ("0.1.3", False)]
    return {version: _wheel(work, version, broken) for version, broken in releases}


def offer(index: Path, *wheels: Path) -> None:
    """Make `wheels` (only those) what the local index directory holds."""
    for old in index.glob("*.whl"):
        old.unlink()
    for wheel in wheels:
        shutil.copy(wheel, index)


def run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture
def offline_env(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    index = tmp_path / "index"
    index.mkdir()
    env = {
        **os.environ,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": f"{index} {WHEEL_CACHE / 'wheels'}",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_COMPILE": "1",
    }
    env.pop("BLAZAR_HOME", None)
    env["BLAZAR_HOME"] = str(tmp_path / "home")
    return index, env


def version(blazar: Path, env: dict[str, str]) -> str:
    done = run([str(blazar), "--version"], env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().rsplit(" ", 1)[-1]


def held(prefix: Path) -> list[str]:
    """The Blazar versions a venv holds (its scripts name the venv's path: run it there)."""
    return sorted(p.name for p in prefix.glob("lib/python*/site-packages/blazar-*.dist-info"))


def test_upgrade_the_install_script_venv_and_a_pip_venv_then_roll_back(
    tmp_path: Path, wheels: dict[str, Path], offline_env: tuple[Path, dict[str, str]]
) -> None:
    index, env = offline_env
    offer(index, wheels["0.1.0"])
    prefix, bindir = tmp_path / "venv", tmp_path / "bin"
    with (ROOT / "packaging" / "install.sh").open() as script:  # as `curl ... | sh` runs it
        done = subprocess.run(
            ["sh"],
            stdin=script,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env={
                **env,
                "PYTHON": sys.executable,
                "BLAZAR_REPO": "blazar",
                "PREFIX": str(prefix),
                "BINDIR": str(bindir),
            },
        )
    assert done.returncode == 0, done.stderr
    assert (prefix / "blazar-install").read_text() == "repo=blazar\n"
    blazar = bindir / "blazar"
    assert version(blazar, env) == "0.1.0"
    nothing = json.loads(run([str(blazar), "upgrade", "--json"], env).stdout)
    assert (nothing["before"], nothing["after"], nothing["previous"]) == ("0.1.0", "0.1.0", None)
    offer(index, wheels["0.1.1"])  # a new release appears
    up = run([str(blazar), "upgrade", "--json"], env)
    assert up.returncode == 0, up.stderr
    result = json.loads(up.stdout)
    assert (result["how"], result["source"]) == ("install-script", "blazar")
    assert (result["before"], result["after"]) == ("0.1.0", "0.1.1")
    assert result["previous"] == str(tmp_path / "venv.previous")
    assert version(blazar, env) == "0.1.1"  # through the link install.sh made
    assert held(tmp_path / "venv.previous") == ["blazar-0.1.0.dist-info"]  # kept, runs in place
    back = run([str(blazar), "upgrade", "--rollback"], env)
    assert back.returncode == 0, back.stderr
    assert "rolled back to Blazar 0.1.0 (was 0.1.1" in back.stdout
    assert version(blazar, env) == "0.1.0"
    assert held(tmp_path / "venv.previous") == ["blazar-0.1.1.dist-info"]
    forward = run([str(blazar), "upgrade", "--rollback"], env)  # and forward again
    assert forward.returncode == 0 and version(blazar, env) == "0.1.1"
    # Without install.sh's note this is a venv Blazar was pip-installed into by hand: the
    # upgrade comes from the package index. A release that cannot start is put back.
    (prefix / "blazar-install").unlink()
    offer(index, wheels["0.1.2"])
    failed = run([str(blazar), "upgrade"], env)
    assert failed.returncode == 1 and "the new Blazar does not start" in failed.stderr
    assert "Blazar 0.1.1 was put back" in failed.stderr and "Traceback" not in failed.stderr
    assert version(blazar, env) == "0.1.1"
    assert held(tmp_path / "venv.previous") == ["blazar-0.1.0.dist-info"]  # still the one kept
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".venv")] == []
    offer(index, wheels["0.1.3"])
    fixed = json.loads(run([str(blazar), "upgrade", "--json"], env).stdout)
    assert (fixed["how"], fixed["source"], fixed["after"]) == ("venv", "blazar", "0.1.3")
    assert version(blazar, env) == "0.1.3"


def test_install_for_the_running_python() -> None:
    """The suite's own Python is this checkout, editable: detect says so."""
    from blazar.host.upgrade import this_install

    with pytest.raises(Conflict, match="editable"):
        this_install()
    assert Install("venv", VENV, "blazar", "0").blazar == VENV / "bin" / "blazar"
