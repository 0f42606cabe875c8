"""Runtime failures where `blazar status` and `blazar doctor` show them, and serve's log.

A real `blazar serve` runs a model whose child cannot start (the real launcher, given a
flag it refuses), a model whose settings its GGUF cannot take, and a remote nothing
answers; each shows as a False condition with its reason in `blazar status --json`
and a finding in `blazar doctor --json`, each clears once the manifest is fixed, and
serve removes its conditions when it stops. The rules themselves are pure and tested
with tables; the writer against the real store and the real apply lock.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from blazar.doctor.findings import DaemonView
from blazar.doctor.serving import condition_findings, runtime_findings
from blazar.host.locking import apply_lock, held
from blazar.paths import Paths
from blazar.serve import logs as serve_logs
from blazar.serve.state.conditions import (
    InstanceView,
    Status,
    StatusWriter,
    applied,
    model_condition,
    remote_condition,
)
from blazar.serve.triggers import when_released
from blazar.store.db import Condition, Store
from blazar.testing.ports import free_port
from blazar.testing.tiny import write_tiny_model
from tests.conftest import Blazar
from tests.serving import Served
from tests.test_serve import ENGINE, model_block

# --- the rules (pure) -------------------------------------------------------------------


def inst(state: str, restarts: int = 0, error: str | None = "exited with code 2") -> InstanceView:
    return InstanceView("m/0", state, error, restarts, "/logs/m-0.log")


FAILED = Status("model", "m", "Serving", "False", "StartFailed", "instance m/0 could not start")
REFUSED = Status("model", "m", "Serving", "False", "SettingsRefused", "not started: ...")


@pytest.mark.parametrize(
    ("instances", "fields", "status", "reason"),
    [
        ([inst("stopped")], {}, "True", "Idle"),
        ([inst("starting")], {}, "True", "Starting"),
        ([inst("ready"), inst("starting")], {}, "True", "Ready"),
        ([inst("failed")], {}, "False", "StartFailed"),
        ([inst("failed", restarts=5)], {}, "False", "GaveUp"),
        ([inst("backoff", restarts=1)], {}, "False", "Restarting"),
        ([inst("ready"), inst("failed")], {}, "True", "Ready"),  # one replica serves
        ([inst("stopped")], {"settings_problem": "cache_type..."}, "False", "SettingsRefused"),
        ([inst("stopped")], {"refusal": "no engine..."}, "False", "NoEngine"),
        # starting again after a failure: the failure stands until it is ready
        ([inst("starting")], {"previous": FAILED}, "False", "StartFailed"),
        ([inst("ready")], {"previous": FAILED}, "True", "Ready"),
        # ... but not a refusal of the settings: they are judged afresh
        ([inst("stopped")], {"previous": REFUSED}, "True", "Idle"),
    ],
)
def test_model_condition(
    instances: list[InstanceView], fields: dict[str, Any], status: str, reason: str
) -> None:
    got = model_condition("m", instances, **fields)
    assert (got.kind, got.name, got.type, got.status, got.reason) == (
        "model",
        "m",
        "Serving",
        status,
        reason,
    )
    if reason in ("StartFailed", "GaveUp") and "previous" not in fields:
        assert "exited with code 2" in got.message and "/logs/m-0.log" in got.message


def test_remote_and_apply_conditions() -> None:
    class Remote:
        def __init__(self, health: str, drained: bool = False) -> None:
            self.name, self.health, self.drained = "big", health, drained
            self.last_error: str | None = "connection refused"

    down = remote_condition(Remote("down"))
    assert (down.status, down.reason) == ("False", "Down") and "connection refused" in down.message
    assert remote_condition(Remote("up")).status == "True"
    assert remote_condition(Remote("unknown")).status == "Unknown"
    assert "drained" in remote_condition(Remote("up", drained=True)).message
    path = Path("/m/blazar.toml")
    assert applied(path).key == ("manifest", "blazar.toml", "Applied")
    assert applied(path).status == "True"
    bad = applied(path, "Invalid", "line 3: no")
    assert (bad.status, bad.reason, bad.message) == ("False", "Invalid", "line 3: no")
    some = applied(path, failed=["models.a", "loras.b"])
    assert some.reason == "ActionsFailed" and "models.a, loras.b failed" in some.message


def cond(kind: str, name: str, type_: str, status: str, reason: str) -> Condition:
    return Condition(kind, name, type_, status, reason, "why", "2026-12-02T00:00:00", "")


UP, DOWN = DaemonView("http://h:1", True), DaemonView("http://h:1", False)


@pytest.mark.parametrize(
    ("condition", "daemon", "expected"),
    [
        (cond("model", "m", "Serving", "False", "StartFailed"), UP, ("RUNTIME", "error")),
        (cond("model", "m", "Serving", "True", "Ready"), UP, None),
        (cond("model", "m", "Serving", "False", "StartFailed"), DOWN, None),  # a dead serve's
        (cond("remote", "r", "Reachable", "False", "Down"), UP, ("RUNTIME", "warning")),
        (cond("manifest", "b.toml", "Applied", "False", "Invalid"), UP, ("RUNTIME", "error")),
        (cond("model", "m", "Ready", "False", "FetchFailed"), DOWN, ("MODELS", "error")),
        (cond("engine", "e", "Ready", "False", "InstallFailed"), UP, ("ENGINES", "error")),
        (cond("remote", "r", "Reachable", "Unknown", "NotProbed"), UP, None),
    ],
)
def test_condition_findings(
    condition: Condition, daemon: DaemonView, expected: tuple[str, str] | None
) -> None:
    found = condition_findings([condition], daemon)
    if expected is None:
        assert found == []
        return
    [finding] = found
    assert (finding.group, finding.severity) == expected
    assert condition.reason in finding.what and "why" in finding.what and finding.fix


def test_a_failing_model_is_reported_once() -> None:
    stats = {"instances": [{"model": "m", "replica": 0, "state": "failed", "restarts": 2}]}
    view = DaemonView("http://h:1", True, stats=stats)
    assert [f.severity for f in runtime_findings(view)] == ["ok", "error"]
    assert [f.severity for f in runtime_findings(view, covered={"m"})] == ["ok"]


# --- the writer, the lock probe, the log ---------------------------------------------------


def test_the_writer_keeps_the_store_to_what_serve_means(paths: Paths) -> None:
    lock = paths.state / "apply.lock"
    wanted: dict[tuple[str, str, str], Status] = {}
    writer = StatusWriter(paths.db, lock, lambda: dict(wanted))
    with Store(paths.db) as store:  # apply's condition, and one an earlier serve left
        store.set_condition("model", "m", "Ready", "True", "UpToDate", "ok")
        store.set_condition("model", "gone", "Serving", "True", "Ready", "stale")

    def stored() -> set[tuple[str, str, str, str]]:
        with Store(paths.db) as store:
            return {(c.name, c.type, c.status, c.reason) for c in store.conditions()}

    async def scenario() -> None:
        failing = model_condition("m", [inst("failed")])
        wanted[failing.key] = failing
        assert await writer.flush()
        assert stored() == {
            ("m", "Ready", "True", "UpToDate"),
            ("m", "Serving", "False", "StartFailed"),
        }
        wanted[failing.key] = model_condition("m", [inst("ready")])
        with apply_lock(lock, timeout=0):  # an apply runs: nothing is written beside it
            assert not await writer.flush()
            assert ("m", "Serving", "False", "StartFailed") in stored()
        assert await writer.flush()
        assert ("m", "Serving", "True", "Ready") in stored()
        await writer.close()  # serve stops: its conditions go, apply's stay
        assert stored() == {("m", "Ready", "True", "UpToDate")}

    asyncio.run(scenario())


def test_held_and_when_released(tmp_path: Path) -> None:
    lock = tmp_path / "apply.lock"
    assert not held(lock)  # no file: nobody holds it

    async def scenario() -> None:
        wake = asyncio.Event()
        with apply_lock(lock, timeout=0):
            assert held(lock)
            pid = lock.read_text()
            waiter = asyncio.create_task(when_released(lock, wake, poll=0.01))
            for _ in range(5):  # it looks several times, and never while the lock is held
                await asyncio.sleep(0.01)
                assert not wake.is_set()
            assert lock.read_text() == pid  # the probe left the holder's pid alone
        await asyncio.wait_for(wake.wait(), 5)
        await waiter
        assert not held(lock)

    asyncio.run(scenario())


def test_serve_logs_time_and_level_to_stderr_and_its_file(tmp_path: Path) -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    before = list(root.handlers), root.level
    try:
        path = serve_logs.configure(tmp_path / "logs", stream=stream)
        logging.getLogger("blazar.serve").info("remote big is down")
        logging.getLogger("aiohttp.server").info("not shown: another library's info")
        logging.getLogger("aiohttp.server").warning("shown: another library's warning")
        for handler in root.handlers:
            handler.flush()
        for text in (stream.getvalue(), path.read_text()):
            lines = text.splitlines()
            assert len(lines) == 2, text
            assert " INFO blazar.serve: remote big is down" in lines[0]
            assert lines[0][:4].isdigit() and " WARNING aiohttp.server: shown" in lines[1]
        with path.open("a") as same:  # stderr is serve.log already (`blazar launch`)
            serve_logs.configure(tmp_path / "logs", stream=same)
            kinds = [type(h).__name__ for h in root.handlers if getattr(h, "_blazar_serve", 0)]
            assert kinds == ["StreamHandler"]
    finally:
        for handler in [h for h in root.handlers if getattr(h, "_blazar_serve", False)]:
            root.removeHandler(handler)
            handler.close()
        root.handlers[:] = before[0]
        root.setLevel(before[1])


# --- a real serve -------------------------------------------------------------------------


def wait_for(check: Callable[[], Any], what: str, served: Served, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{served.log[-4000:]}"
        time.sleep(0.1)


def status(blazar: Blazar) -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in blazar("status", "--json").output.splitlines()]
    return {f"{r['kind']}s.{r['name']} {r['type']}": r for r in rows}


def doctor(blazar: Blazar) -> list[dict[str, Any]]:
    out = blazar("doctor", "--json", ok=False).output
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_runtime_failures_are_conditions_status_and_doctor_show(
    blazar: Blazar, paths: Paths, blazar_home: Path, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    tiny, other = write_tiny_model(src / "tiny.gguf"), write_tiny_model(src / "o.gguf", seed=3)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    text = ENGINE + model_block("tiny", tiny, replicas=1)
    text += model_block("broken", other, replicas=1, args=["--no-such-flag"])
    text += model_block("squeezed", tiny, cache_type="q4_0")  # heads of 16: q4_0 needs 32
    text += f'[remotes.gone]\nurl = "{dead}"\nhealth_interval = "0.2s"\ntimeout = "0.2s"\n'
    paths.manifest.parent.mkdir(parents=True, exist_ok=True)
    paths.manifest.write_text(text)
    served = Served(paths.manifest, blazar_home)
    with served:
        wanted = {
            "models.broken Serving": ("False", "StartFailed"),
            "models.squeezed Serving": ("False", "SettingsRefused"),
            "remotes.gone Reachable": ("False", "Down"),
            "models.tiny Serving": ("True", "Ready"),
            "manifests.blazar.toml Applied": ("True", "Applied"),
        }

        def shown(want: dict[str, tuple[str, str]]) -> dict[str, dict[str, Any]] | None:
            now = status(blazar)
            got = {k: (now[k]["status"], now[k]["reason"]) for k in want if k in now}
            return now if got == want else None

        rows = wait_for(lambda: shown(wanted), "the failures as conditions", served)
        assert "unknown flag '--no-such-flag'" in rows["models.broken Serving"]["message"]
        assert "cache_type = 'q4_0'" in rows["models.squeezed Serving"]["message"]
        findings = [f for f in doctor(blazar) if f["severity"] in ("error", "warning")]
        about = {
            n: [f for f in findings if f"'{n}'" in f["what"]]
            for n in ("broken", "squeezed", "gone")
        }
        assert [f["severity"] for f in about["broken"]] == ["error"], findings  # once
        assert "StartFailed" in about["broken"][0]["what"] and about["broken"][0]["fix"]
        assert [f["severity"] for f in about["squeezed"]] == ["error"]
        assert [f["severity"] for f in about["gone"]] == ["warning"]

        # a manifest serve cannot load: recorded, and what runs keeps running
        paths.manifest.write_text(text + "[models.bad\n")
        wait_for(
            lambda: shown({"manifests.blazar.toml Applied": ("False", "Invalid")}),
            "an invalid manifest",
            served,
        )
        # a manifest whose apply fails in part: a model whose file is not there
        paths.manifest.write_text(text + model_block("missing", tmp_path / "nowhere.gguf"))
        rows = wait_for(
            lambda: shown({"manifests.blazar.toml Applied": ("False", "ActionsFailed")}),
            "an apply that fails",
            served,
        )
        assert "models.missing failed" in rows["manifests.blazar.toml Applied"]["message"]
        assert rows["models.missing Ready"]["status"] == "False"  # apply's, with the error
        assert [f for f in doctor(blazar) if "'missing' is not ready" in f["what"]]
        blazar("rm", "missing")
        assert "models.missing Ready" not in status(blazar)  # its failure went with it
        blazar(
            "config",
            "set",
            "models.broken.args",
            "[]",
            "models.squeezed.cache_type",
            "f16",
            "remotes.gone.url",
            served.url,
        )
        fixed = {
            "models.broken Serving": ("True", "Ready"),
            "models.squeezed Serving": ("True", "Idle"),
            "remotes.gone Reachable": ("True", "Up"),
            "manifests.blazar.toml Applied": ("True", "Applied"),
        }
        wait_for(lambda: shown(fixed), "the conditions to clear", served)
        left = [f for f in doctor(blazar) if f["severity"] == "error"]
        assert not [f for f in left if "broken" in f["what"] or "squeezed" in f["what"]], left
    after = status(blazar)
    assert [k for k in after if not k.endswith(" Ready")] == []  # serve's went with it
    log = (paths.logs / "serve.log").read_text()
    # configured logging: serve's own lines and the library's info lines, with level and time
    assert " INFO blazar.serve: remote gone is down" in log
    assert " ERROR blazar.serve: broken/0: exited with code 2" in log
    assert log[:4].isdigit()
