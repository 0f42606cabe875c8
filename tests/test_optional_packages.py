"""A setting that needs an optional package is refused when it is set, where the package
is missing: `config set serving.otlp_endpoint` was accepted (and a running serve logged it
at INFO) while the next `blazar serve` exited 1 with "opentelemetry-sdk is not installed"
(issue 33, day one 2)."""

from __future__ import annotations

import os
from pathlib import Path

from blazar.paths import Paths
from specs.loader import load_manifest_text
from specs.support import NEEDS, missing_packages
from tests.conftest import run_blazar

SET = ("config", "set", "serving.otlp_endpoint", "http://127.0.0.1:4318")


def without_opentelemetry(tmp_path: Path) -> dict[str, str]:
    """An environment in which `opentelemetry` cannot be imported, as where it was never
    installed: a package of that name first on the path that refuses to import."""
    shadow = tmp_path / "shadow" / "opentelemetry"
    shadow.mkdir(parents=True, exist_ok=True)
    (shadow / "__init__.py").write_text("raise ImportError('not installed here')\n")
    path = os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def test_otlp_is_refused_when_set_without_its_package(paths: Paths, tmp_path: Path) -> None:
    paths.manifest.parent.mkdir(parents=True, exist_ok=True)
    paths.manifest.write_text("[serving]\nport = 11436\n")
    refused = run_blazar(*SET, env=without_opentelemetry(tmp_path))
    assert refused.returncode != 0
    said = refused.stdout + refused.stderr
    assert "serving.otlp_endpoint needs opentelemetry-sdk" in said
    assert "pip install 'blazar[otlp]'" in said and "Traceback" not in said
    assert paths.manifest.read_text() == "[serving]\nport = 11436\n"  # nothing written
    # Where the package is installed (this test environment), the same setting is taken.
    accepted = run_blazar(*SET)
    assert accepted.returncode == 0, accepted.stderr
    assert "otlp_endpoint" in paths.manifest.read_text()
    # serve and apply refuse such a manifest before any action, with the same words.
    diff = run_blazar("diff", env=without_opentelemetry(tmp_path))
    assert diff.returncode != 0
    assert "needs opentelemetry-sdk" in diff.stdout + diff.stderr


def test_every_optional_field_names_its_package() -> None:
    manifest = load_manifest_text('[serving]\notlp_endpoint = "http://127.0.0.1:4318"\n', "m.toml")
    problems = missing_packages(manifest, lambda module: False)
    assert [p.message.split(" needs ")[0] for p in problems] == ["serving.otlp_endpoint"]
    assert problems[0].line == 2
    assert missing_packages(manifest, lambda module: True) == []
    assert all(how.startswith("pip install") for _, _, how in NEEDS.values())
