"""XDG locations, BLAZAR_HOME, and the loud fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

from blazar.paths import resolve_paths


def test_blazar_home_holds_all_four_roots(blazar_home: Path) -> None:
    paths = resolve_paths()
    assert paths.config == blazar_home / "config"
    assert paths.data == blazar_home / "data"
    assert paths.state == blazar_home / "state"
    assert paths.cache == blazar_home / "cache"
    assert all(p.is_dir() for p in paths.all())
    assert paths.manifest == blazar_home / "config" / "blazar.toml"
    assert paths.db.parent == paths.data


def test_xdg_variables_are_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BLAZAR_HOME")
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    paths = resolve_paths()
    assert paths.config == tmp_path / "xdg_config_home" / "blazar"
    assert paths.data == tmp_path / "xdg_data_home" / "blazar"
    assert paths.state == tmp_path / "xdg_state_home" / "blazar"
    assert paths.cache == tmp_path / "xdg_cache_home" / "blazar"


def test_defaults_follow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BLAZAR_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    paths = resolve_paths()
    assert paths.config == tmp_path / ".config" / "blazar"
    assert paths.data == tmp_path / ".local" / "share" / "blazar"


def test_unusable_xdg_falls_back_to_cwd_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("BLAZAR_HOME")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(blocker / "sub"))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    paths = resolve_paths()
    assert paths.data == work / ".blazar-home" / "data"
    assert paths.data.is_dir()
    err = capsys.readouterr().err
    assert "WARNING" in err and str(work / ".blazar-home") in err and "BLAZAR_HOME" in err


def test_config_path_prints_the_manifest(blazar, blazar_home: Path) -> None:  # type: ignore[no-untyped-def]
    assert blazar("config", "path").output.strip() == str(blazar_home / "config" / "blazar.toml")
