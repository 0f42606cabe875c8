"""packaging/: the systemd unit (checked by systemd-analyze), the container file, and
install.sh run the way `curl ... | sh` runs it (from stdin, $0 pointing nowhere)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from blazar.render import kubernetes

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"


def unit_settings() -> dict[str, str]:
    found = {}
    for line in (PACKAGING / "blazar.service").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip()
    return found


def test_the_unit_restarts_on_failure_but_not_on_a_busy_port() -> None:
    unit = unit_settings()
    assert unit["Restart"] == "on-failure"
    assert unit["RestartPreventExitStatus"] == "3"  # `blazar serve`'s exit on a busy port
    assert unit["User"] == "blazar" and unit["Group"] == "blazar"
    assert unit["ExecStart"].split()[1:] == ["serve", "/etc/blazar"]
    assert "u blazar" in (PACKAGING / "blazar.sysusers").read_text()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not here")
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: point it at this checkout's blazar
    blazar = Path(sys.executable).with_name("blazar")
    text = (PACKAGING / "blazar.service").read_text()
    unit = tmp_path / "blazar.service"
    unit.write_text(text.replace("/usr/local/bin/blazar", str(blazar)))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    # ... and it can fail: an unknown key is reported
    unit.write_text(unit.read_text().replace("RestartSec=5", "RestartSec=5\nRestartz=no"))
    bad = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert "Unknown key 'Restartz'" in bad.stderr


def test_the_container_file_runs_serve_as_a_non_root_user_with_the_store_as_a_volume() -> None:
    text = (PACKAGING / "Containerfile").read_text()
    assert re.search(r"^FROM python:3\.1[1-9]-slim$", text, re.M)
    assert f"USER {kubernetes.UID}:{kubernetes.UID}" in text  # what the rendered pod runs as
    assert f"VOLUME {kubernetes.HOME}" in text and f"BLAZAR_HOME={kubernetes.HOME}" in text
    assert 'ENTRYPOINT ["blazar"]' in text and 'CMD ["serve", "/etc/blazar"' in text
    for copied in re.findall(r"^COPY (\S+) /src", text, re.M):
        assert (ROOT / copied).exists(), copied  # installed from this checkout
    assert "pip install --no-cache-dir /src" in text


FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$FAKE_LOG"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    mkdir -p "$3/bin"
    cp "$0" "$3/bin/python"
    printf '#!/bin/sh\\necho "blazar, version 0.0-fake"\\n' > "$3/bin/blazar"
    chmod +x "$3/bin/blazar"
fi
"""


def piped(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`curl ... | sh`: the script on stdin, run from elsewhere, $0 is `sh`."""
    with (PACKAGING / "install.sh").open() as script:
        return subprocess.run(
            ["sh"],
            stdin=script,
            capture_output=True,
            text=True,
            timeout=900,
            cwd=tmp_path,
            env={**os.environ, **env},
        )


def test_install_sh_from_a_pipe_installs_what_blazar_repo_names(tmp_path: Path) -> None:
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    log = tmp_path / "log"
    env = {
        "PYTHON": str(fake),
        "FAKE_LOG": str(log),
        "BLAZAR_REPO": str(ROOT),
        "PREFIX": str(tmp_path / "venv"),
        "BINDIR": str(tmp_path / "bin"),
    }
    done = piped(tmp_path, env)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert calls[1] == f"-m venv {tmp_path / 'venv'}"
    assert calls[-1] == f"-m pip install --quiet {ROOT}"
    assert (tmp_path / "bin" / "blazar").resolve() == tmp_path / "venv" / "bin" / "blazar"
    assert "installed:" in done.stdout and "blazar, version 0.0-fake" in done.stdout
    missing = piped(tmp_path, {**env, "PYTHON": str(tmp_path / "no-python")})
    assert missing.returncode == 1 and "install Python 3.11 or newer" in missing.stderr


@pytest.mark.network  # pip fetches Blazar's dependencies from the package index
def test_install_sh_from_a_pipe_installs_a_working_blazar(tmp_path: Path) -> None:
    env = {
        "PREFIX": str(tmp_path / "venv"),
        "BINDIR": str(tmp_path / "bin"),
        "PYTHON": sys.executable,
        "BLAZAR_REPO": str(ROOT),
    }
    done = piped(tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert "installed:" in done.stdout and "blazar, version" in done.stdout
