"""What `blazar serve` records as conditions, for `blazar status` and `blazar doctor`.

Apply records each declared resource's `Ready` condition; serve records what only it
sees, the runtime, with conditions of three types it owns:

- `models.NAME Serving`: True while the model is served (an instance ready, starting,
  or loaded on the next request); False, with the reason, when it cannot be: its
  settings are refused for its GGUF (SettingsRefused), no engine serves it
  (NoEngine), an instance failed to start (StartFailed), exited and waits to be
  restarted (Restarting), or gave up after its restarts (GaveUp).
- `remotes.NAME Reachable`: True while the remote answers its probes, False once it
  is down (Down), Unknown before the first probe.
- `manifests.FILE Applied`: the last pass's apply: False when the manifest could not
  be loaded (Invalid: serve keeps what runs), the apply failed as a whole
  (ApplyFailed) or some of its actions did (ActionsFailed: each resource's Ready
  condition has the error).

Level-triggered, as a pass is: `observe` reads what runs now (the scheduler's pools,
the fleet's remotes, the last apply) and the pure `model_condition` and
`remote_condition` judge it; `StatusWriter.run` writes what changed when it is poked
(an instance event, a pass: the daemon's `_on_instance` and `run_pass`; SETTLE seconds
later, so that the events of one swap make one write) or every EVERY seconds. It writes
in a worker thread under the apply lock (an apply's transactions fail when another
writer commits under them) and, while an apply holds the lock, tries again RETRY
seconds later. A condition whose text the store refuses (an error message with a byte
that is not UTF-8) is written escaped, or left out and logged; the others are written
all the same. Serve removes the conditions it owns when
it starts and when it stops: they describe a serve that runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from blazar.host.locking import LockTimeout, apply_lock
from blazar.store.db import RECORD_FAULTS, Store, storable

if TYPE_CHECKING:
    from blazar.serve.supervisor.runtime import ModelRuntime
    from blazar.serve.supervisor.scheduler import Member, Scheduler

SERVING, REACHABLE, APPLIED = "Serving", "Reachable", "Applied"
OWNED = (SERVING, REACHABLE, APPLIED)  # the condition types serve writes, and removes
INSTANCE_FAILURES = ("StartFailed", "Restarting", "GaveUp")
EVERY = 1.0  # seconds between looks when nothing pokes the writer
RETRY = 0.25  # seconds before writing again when an apply held the lock
STOP_WAIT = 5.0  # seconds serve waits for the lock at stop to remove its conditions
RESYNC = 30.0  # seconds after which the writer compares with the store even unchanged
# Seconds a poke waits for the next before the writer looks: a swap's stopped, starting
# and ready (milliseconds apart) make one write after it, not one each beside it (a
# write, in a thread, took 4-7 ms of CPU: a swap's ~7 ms, bench/swap_breakdown.py).
SETTLE = 0.2
logger = logging.getLogger("blazar.serve")

Key = tuple[str, str, str]  # (kind, name, type)


@dataclass(frozen=True)
class Status:
    """One condition as serve means it: `status` is True, False or Unknown."""

    kind: str
    name: str
    type: str
    status: str
    reason: str
    message: str

    @property
    def key(self) -> Key:
        return (self.kind, self.name, self.type)

    @property
    def failing(self) -> bool:
        return self.status == "False"


@dataclass(frozen=True)
class InstanceView:
    """What one instance shows (its public views, read only)."""

    key: str  # tiny/0
    state: str  # the instance's State value: stopped, starting, ready, ...
    last_error: str | None = None
    restarts: int = 0
    log: str = ""  # its log file


class RemoteLike(Protocol):
    """What a remote shows (`blazar.serve.state.remotes.Remote`)."""

    @property
    def name(self) -> str: ...
    @property
    def health(self) -> str: ...  # up, down or unknown
    @property
    def drained(self) -> bool: ...
    @property
    def last_error(self) -> str | None: ...


def model_condition(
    name: str,
    instances: Sequence[InstanceView],
    *,
    settings_problem: str | None = None,
    refusal: str | None = None,
    previous: Status | None = None,
) -> Status:
    """Pure: model `name`'s Serving condition from its instances now. `previous` is the
    one judged before for the same runtime (None after the model's declaration changed):
    while an instance starts again after a failure, that failure still stands."""

    def status(ok: bool, reason: str, message: str) -> Status:
        return Status("model", name, SERVING, str(ok), reason, message)

    if settings_problem is not None:
        return status(False, "SettingsRefused", f"not started: {settings_problem}")
    if refusal is not None:
        return status(False, "NoEngine", refusal)
    ready = [i for i in instances if i.state == "ready"]
    if ready:
        return status(True, "Ready", f"{len(ready)} of {len(instances)} instances ready")
    for inst in instances:
        if inst.state == "backoff":
            return status(
                False,
                "Restarting",
                f"instance {inst.key} {inst.last_error or 'exited'}; it is restarted after "
                f"{inst.restarts} restart{'s' if inst.restarts != 1 else ''} so far (log: "
                f"{inst.log})",
            )
    for inst in instances:
        if inst.state == "failed":
            if inst.restarts:
                reason, what = "GaveUp", f"gave up after {inst.restarts} restarts"
            else:
                reason, what = "StartFailed", "could not start"
            return status(
                False,
                reason,
                f"instance {inst.key} {what}: {inst.last_error or 'no error recorded'} "
                f"(log: {inst.log}); a request tries again, and so does a change to the "
                "model's declaration",
            )
    if previous is not None and previous.failing and previous.reason in INSTANCE_FAILURES:
        return previous  # starting again (or stopped) since: not known to work yet
    if any(i.state == "starting" for i in instances):
        return status(True, "Starting", "an instance is starting")
    return status(True, "Idle", "loaded on the next request")


def remote_condition(remote: RemoteLike) -> Status:
    """Pure: a remote's Reachable condition."""
    drained = "; drained: no request is sent to it" if remote.drained else ""
    if remote.health == "up":
        return Status("remote", remote.name, REACHABLE, "True", "Up", f"answers{drained}")
    if remote.health == "down":
        return Status(
            "remote",
            remote.name,
            REACHABLE,
            "False",
            "Down",
            f"{remote.last_error or 'no answer'}; requests go to the next member of each "
            f"failover chain{drained}",
        )
    return Status(
        "remote", remote.name, REACHABLE, "Unknown", "NotProbed", f"not probed yet{drained}"
    )


def applied(
    manifest: Path, reason: str = "Applied", message: str = "", failed: Sequence[str] = ()
) -> Status:
    """Pure: the last pass's apply of `manifest`: Applied (True), ActionsFailed when the
    resources at `failed` did not apply, else `reason` with its message."""
    if failed:
        reason = "ActionsFailed"
        message = f"{', '.join(failed)} failed: their Ready conditions say why"
    ok = reason == "Applied"
    text = message or ("the manifest is applied" if ok else reason)
    return Status("manifest", manifest.name, APPLIED, str(ok), reason, text)


def instance_views(members: Iterable[Member]) -> list[InstanceView]:
    """What each of a pool's instances shows now (read, never decided on)."""
    return [
        InstanceView(
            m.instance.spec.key,
            str(m.instance.state),
            m.instance.last_error,
            m.instance.restarts,
            str(m.instance.spec.log_path),
        )
        for m in members
    ]


def observe(
    scheduler: Scheduler | None,
    remotes: Iterable[RemoteLike],
    apply: Status | None,
    before: dict[str, tuple[ModelRuntime, Status]],
) -> tuple[dict[Key, Status], dict[str, tuple[ModelRuntime, Status]]]:
    """Every condition serve means now, and (for the next look) each model's runtime with
    its condition. `before` is what the last look returned."""
    wanted: dict[Key, Status] = {}
    judged: dict[str, tuple[ModelRuntime, Status]] = {}
    for name, pool in sorted((scheduler.pools if scheduler is not None else {}).items()):
        runtime = pool.runtime
        last = before.get(name)
        condition = model_condition(
            name,
            instance_views(pool.members),
            settings_problem=runtime.settings_problem,
            refusal=runtime.refusal,
            previous=last[1] if last is not None and last[0] == runtime else None,
        )
        judged[name] = (runtime, condition)
        wanted[condition.key] = condition
    for remote in remotes:
        condition = remote_condition(remote)
        wanted[condition.key] = condition
    if apply is not None:
        wanted[apply.key] = apply
    return wanted, judged


class Judge:
    """Serve's conditions now: `observe`, with the memory it needs between looks. The
    daemon sets `apply` after each pass's apply (None: there is no manifest)."""

    def __init__(
        self,
        scheduler: Callable[[], Scheduler | None],
        remotes: Callable[[], Iterable[RemoteLike]],
    ) -> None:
        self.scheduler, self.remotes = scheduler, remotes
        self.apply: Status | None = None
        self.restart = ""  # what the manifest changed that only a restart applies
        self._judged: dict[str, tuple[ModelRuntime, Status]] = {}

    def __call__(self) -> dict[Key, Status]:
        wanted, self._judged = observe(self.scheduler(), self.remotes(), self.apply, self._judged)
        if self.restart:
            status = restart_condition(self.restart)
            wanted[status.key] = status
        return wanted


def restart_condition(pending: str) -> Status:
    """Pure: serve's RestartNeeded condition (`blazar status`): a setting the manifest
    changed that serve applies only when it starts again."""
    message = f"{pending}: restart `blazar serve` to apply it"
    return Status("serve", "gateway", "RestartNeeded", "True", "RestartNeeded", message)


class StatusWriter:
    """Writes serve's conditions to the store as `wanted()` changes (see the module)."""

    def __init__(self, db: Path, lock: Path, wanted: Callable[[], dict[Key, Status]]) -> None:
        self.db, self.lock, self.wanted = db, lock, wanted
        self.written: dict[Key, Status] | None = None  # None: not written yet
        self.written_at = 0.0
        self.poked = asyncio.Event()

    def poke(self) -> None:
        """Look again now (an instance changed state, a pass ended)."""
        self.poked.set()

    async def run(self) -> None:
        """Until cancelled: keep the store's conditions of serve's types what serve means
        (the first write also removes those an earlier serve left)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.poked.wait(), EVERY)
            if self.poked.is_set():
                await asyncio.sleep(SETTLE)  # the pokes that follow join this write
            self.poked.clear()
            if not await self.flush():
                await asyncio.sleep(RETRY)
                self.poked.set()

    async def flush(self) -> bool:
        """Write what changed; False when it could not (an apply holds the lock). Every
        RESYNC seconds it writes anyway: another command may have removed a condition
        (`blazar rm` removes a model's)."""
        wanted = self.wanted()
        now = time.monotonic()
        if wanted == self.written and now - self.written_at < RESYNC:
            return True
        try:
            await asyncio.to_thread(self._write, wanted, 0.0)
        except (LockTimeout, sqlite3.Error):
            return False
        self.written, self.written_at = wanted, now
        return True

    async def close(self) -> None:
        """Remove serve's conditions (serve is stopping), waiting a little for the lock."""
        with contextlib.suppress(LockTimeout, sqlite3.Error):
            await asyncio.to_thread(self._write, {}, STOP_WAIT)

    def _write(self, wanted: dict[Key, Status], timeout: float) -> None:
        """Make the store's conditions of serve's types exactly `wanted`."""
        with apply_lock(self.lock, timeout=timeout), Store(self.db) as store:
            stored = {
                (c.kind, c.name, c.type): Status(
                    c.kind, c.name, c.type, c.status, c.reason, c.message
                )
                for c in store.conditions()
                if c.type in OWNED
            }
            for key in stored.keys() - wanted.keys():
                store.delete_condition(*key)
            for key, status in wanted.items():
                if stored.get(key) != status:
                    _set(store, status)


def _set(store: Store, status: Status) -> None:
    """Write one condition (its own transaction); refused for what it holds, once more
    with its text made `storable`, and left out and logged if refused even so."""
    fields = (*status.key, status.status, status.reason, status.message)
    try:
        store.set_condition(*fields)
        return
    except RECORD_FAULTS:
        pass
    try:
        store.set_condition(*(str(storable(f)) for f in fields))
    except RECORD_FAULTS as exc:
        kind, name, type_ = (storable(f) for f in status.key)
        logger.warning("%s %s: its %s condition is not recorded (%s)", kind, name, type_, exc)
