"""The dashboard's admin routes against a real `blazar serve` with tiny models: load, pin
and unload change what `blazar ps` shows and what the manifest says; health and the log
listing read the real host; `blazar ui --print` names the page.

In a real browser: tests/test_ui_browser.py (`make test-ui`).
"""

from __future__ import annotations

import json
import os
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from blazar.testing.tiny import write_tiny_model
from tests.conftest import run_blazar
from tests.fixtures import ENGINE
from tests.serving import Served


def manifest(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    tiny, spare = write_tiny_model(src / "tiny.gguf"), write_tiny_model(src / "spare.gguf", seed=3)
    path = tmp_path / "manifest" / "blazar.toml"
    path.parent.mkdir()
    path.write_text(
        ENGINE
        + f'[models.tiny]\nsource = "{tiny.as_uri()}"\nctx = 512\n\n'
        + "# the spare one: kept for the dashboard\n"
        + f'[models.spare]\nsource = "{spare.as_uri()}"\nctx = 512\nkeep_alive = "10m"\n'
    )
    return path


def ps(served: Served) -> dict[str, dict[str, Any]]:
    """`blazar ps --json`, by model."""
    done = run_blazar("ps", "--json", "--url", served.url)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return {row["model"]: row for row in rows}


def refused(served: Served, path: str, body: dict[str, Any]) -> tuple[int, str]:
    with pytest.raises(urllib.error.HTTPError) as error:
        served.post(path, body)
    return error.value.code, json.load(error.value)["error"]


def test_load_pin_and_unload_change_what_runs_and_the_manifest(
    tmp_path: Path, blazar_home: Path
) -> None:
    path = manifest(tmp_path)
    with Served(path, blazar_home) as served:
        assert ps(served) == {}
        loaded = served.post("/api/blazar/load", {"model": "spare"})
        assert loaded["model"] == "spare" and loaded["instances"][0]["state"] == "ready"
        running = ps(served)
        assert list(running) == ["spare"] and not running["spare"]["pinned"]
        os.kill(running["spare"]["pid"], 0)  # a real child
        assert 0 < running["spare"]["keep_alive_remaining"] <= 600

        pinned = served.post("/api/blazar/pin", {"model": "spare", "pinned": True})
        assert pinned == {"model": "spare", "pinned": True, "changed": True}
        text = path.read_text()
        spare = text[text.index("[models.spare]") :]
        assert "pin = true" in spare and "# the spare one: kept for the dashboard" in text
        assert "pin = " not in text[: text.index("[models.spare]")]
        assert ps(served)["spare"]["pinned"] is True
        again = served.post("/api/blazar/pin", {"model": "spare", "pinned": True})
        assert again["changed"] is False
        unpinned = served.post("/api/blazar/pin", {"model": "spare", "pinned": False})
        assert unpinned["pinned"] is False and "pin = " not in path.read_text()

        logs = {row["name"]: row for row in served.get("/api/ui/logs")["logs"]}
        assert logs["spare-0.log"]["instance"] == "spare/0"
        assert logs["serve.log"]["instance"] is None  # serve's own, beside the children's

        assert served.post("/api/blazar/stop", {"model": "spare"})["stopped"] is True
        assert ps(served) == {}

        status, message = refused(served, "/api/blazar/load", {"model": "nope"})
        assert status == 404 and "model 'nope' not found" in message and "spare" in message
        assert refused(served, "/api/blazar/load", {})[0] == 400
        status, message = refused(served, "/api/blazar/pin", {"model": "tiny"})
        assert status == 400 and '"pinned": true or false' in message

        health = served.get("/api/ui/health")
        findings = {(f["group"], f["severity"], f["what"]) for f in health["findings"]}
        assert ("MODELS", "ok", "model 'spare': present with its recorded size") in findings
        assert any(g == "ENGINES" and s == "ok" and "llamacpp" in w for g, s, w in findings)
        assert ("RUNTIME", "ok", f"daemon up at {served.url}") in findings
        [engine] = health["engines"]
        assert engine["active"] and engine["models"] == ["spare", "tiny"]
        assert health["remotes"] == {"remotes": [], "chains": {}}

        printed = run_blazar("ui", "--print", "--url", served.url)
        assert printed.returncode == 0 and printed.stdout.strip() == f"{served.url}/ui"
    gone = run_blazar("ui", "--print", "--url", served.url)
    assert gone.returncode == 1 and "`blazar serve`" in gone.stderr
