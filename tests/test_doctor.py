"""`blazar doctor`'s judgments, as tables: facts in, findings (severity and fix) out.

The whole command against a real host (a model file deleted, then fetched again) is in
tests/test_observe_host.py; a daemon's cache-busting clients in tests/test_observe_served.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from blazar.doctor import DaemonView, Finding, exit_code
from blazar.doctor.host import system_findings, version_finding
from blazar.doctor.serving import channel_findings, runtime_findings
from blazar.engines.ledger import EngineRecord
from specs.manifest import Manifest
from specs.serving import Serving
from tests.fixtures import ENGINE_VERSION


def severities(findings: list[Finding]) -> list[str]:
    return [f.severity for f in findings]


@pytest.mark.parametrize(
    ("python", "free", "fallback", "expected"),
    [
        ((3, 11, 7), 50 * 10**9, False, ["ok", "ok"]),
        ((3, 10, 2), 50 * 10**9, False, ["error", "ok"]),
        ((3, 12, 0), 2 * 10**9, False, ["ok", "warning"]),
        ((3, 12, 0), 100 * 10**6, False, ["ok", "error"]),
        ((3, 12, 0), 50 * 10**9, True, ["ok", "ok", "warning"]),
    ],
)
def test_system(python: tuple[int, ...], free: int, fallback: bool, expected: list[str]) -> None:
    found = system_findings(python=python, free_bytes=free, data=Path("/d"), fallback=fallback)
    assert severities(found) == expected
    assert all(f.fix for f in found if f.severity != "ok")


def engine(tag: str) -> EngineRecord:
    return EngineRecord("llamacpp", tag, "wheel", ENGINE_VERSION, "/e", ["x"], True, "now")


@pytest.mark.parametrize(
    ("tag", "output", "severity"),
    [
        ("b11549-cpu", "version: 11549 (abc)\nbuilt with cc", "ok"),
        ("b11549-cpu", "version: 11063 (abc)", "error"),
        ("abcdef1-cpu", "version: 11549 (abc)", "ok"),  # a source build by commit: no number
    ],
)
def test_engine_version(tag: str, output: str, severity: str) -> None:
    found = version_finding(engine(tag), output)
    assert found.severity == severity
    if severity == "error":
        assert found.fix is not None and f"blazar engine rm {tag}" in found.fix


def serving(**fields: Any) -> Manifest:
    return Manifest(serving=Serving(**fields))


def test_channels_port_held_by_this_daemon_or_free() -> None:
    ours = channel_findings(serving(port=18999), DaemonView("http://127.0.0.1:18999", True, 42))
    assert severities(ours) == ["ok"] and "held by this daemon (pid 42)" in ours[0].what
    free = channel_findings(serving(port=1), DaemonView("http://127.0.0.1:2", False))
    assert severities(free) == ["ok"] and "free" in free[0].what


def test_channels_beyond_loopback_without_keys_is_an_error() -> None:
    found = channel_findings(serving(host="0.0.0.0", port=1), DaemonView("http://x:2", False))
    assert severities(found) == ["ok", "error"]
    assert "blazar keys add" in (found[1].fix or "")


STATS: dict[str, Any] = {
    "instances": [
        {"model": "a", "replica": 0, "state": "ready", "restarts": 0},
        {"model": "b", "replica": 0, "state": "failed", "last_error": "exited with code 1"},
        {"model": "c", "replica": 1, "state": "ready", "restarts": 2, "last_error": "killed"},
    ],
    "models": {
        "a": {"prompt_tokens": 10_000, "cached_tokens": 9_000},
        "c": {
            "prompt_tokens": 10_000,
            "cached_tokens": 500,
            "cold_loads": {"count": 3, "max_ms": 4_200.0},
        },
        "d": {"prompt_tokens": 100, "cached_tokens": 0},  # too little traffic to judge
    },
    "cache_busters": [{"client": "ci", "model": "a", "count": 3, "last": 1.0}],
    "rejected": {"busy": 4.0, "auth": 0.0},
}


def test_runtime_findings() -> None:
    found = runtime_findings(DaemonView("http://h:1", True, stats=STATS))
    text = [(f.severity, f.what) for f in found]
    assert text[0] == ("ok", "daemon up at http://h:1")
    assert ("error", "instance b/0 is failed: exited with code 1") in text
    assert ("warning", "instance c/1 restarted 2 times (last: killed)") in text
    assert ("warning", "model 'c' reuses only 5% of its prompt tokens from cache") in text
    assert not any("model 'a' reuses" in w or "model 'd'" in w for _, w in text)
    [cold] = [f for f in found if "slow to first token after idle" in f.what]
    assert cold.what == (
        "model 'c' was slow to first token after idle: 3 requests waited for it to start "
        "(up to 4.2 s)"
    )
    assert "models.c.warm_peg = true" in (cold.fix or "")
    [buster] = [f for f in found if "busts the prompt cache" in f.what]
    assert "client ci" in buster.what and "byte-stable" in (buster.fix or "")
    assert ("warning", "4 requests refused (busy)") in text
    assert exit_code(found) == 1
    down = runtime_findings(DaemonView("http://h:1", False))
    assert severities(down) == ["warning"] and exit_code(down) == 0


def test_the_summary_counts_the_cold_loads_the_traces_kept() -> None:
    from collections import deque

    from blazar.serve.state import live

    ring = deque(
        [
            {"model": "c", "decision": "spawned", "load_ms": 4_200.0},
            {"model": "c", "decision": "spawned", "load_ms": 300.0},  # quick: not idle-slow
            {"model": "c", "decision": "ready", "load_ms": None},
            {"model": "c", "decision": "spawned", "load_ms": 1_500.0},
            {"model": "a", "decision": "spawned", "load_ms": 9_000.0},
        ]
    )
    assert live._cold_loads(ring, "c") == {"cold_loads": {"count": 2, "max_ms": 4_200.0}}
    assert live._cold_loads(ring, "b") == {}
