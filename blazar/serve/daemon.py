"""`blazar serve`: the gateway and the control loop in one process.

The control loop is level-triggered: a pass loads the manifest, applies it
(fetching what is missing, under the apply lock, in a worker thread) and
hands the scheduler the models that are now ready; hot reload restarts only
the instances whose arguments changed. Passes run on start, on a manifest
change (watchfiles), when a child exits, and on a timer. Sessions
(`blazar.serve.sessions`) live under `Paths.sessions`; the session bank saves a
model's slots before the scheduler stops it (serve's own stop included). When serve stops
(SIGTERM, SIGINT, or an error in its own loop) every child is stopped; the
children also get SIGTERM from the kernel if serve itself dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from aiohttp import web

from blazar.engines.catalog import CatalogError, load_catalog
from blazar.engines.probe import ensure_probed
from blazar.errors import BlazarError
from blazar.locking import LockTimeout
from blazar.paths import Paths
from blazar.reconcile import InvalidManifest, load, reconcile
from blazar.serve.app import build_app
from blazar.serve.child_http import ChildConnections
from blazar.serve.instance import Instance
from blazar.serve.observer import Observer, Settings
from blazar.serve.runtime import build_runtimes
from blazar.serve.scheduler import Scheduler
from blazar.serve.services import Control, Services
from blazar.serve.sessions import Sessions
from blazar.store import Store
from blazar.wiring import offer_view
from reconcilers.ports import OfferView
from specs.manifest import Manifest

TIMER = 30.0
REAP_EVERY = 0.25


class PortInUse(BlazarError):
    pass


@dataclass
class ServeOptions:
    manifest: Path
    host: str | None = None
    port: int | None = None
    apply: bool = True  # reconcile the manifest on each pass (fetch what is missing)


def log(message: str) -> None:
    print(f"blazar serve: {message}", file=sys.stderr, flush=True)


def read_timeout(manifest: Manifest) -> float | None:
    """serving.upstream_timeout for the child client: 0 or -1 means no limit."""
    seconds = manifest.serving.upstream_timeout
    return seconds if seconds > 0 else None


def daemon_file(paths: Paths) -> Path:
    return paths.state / "serve.json"


def utc_now() -> datetime:
    return datetime.now(UTC)


class Daemon:
    def __init__(
        self, paths: Paths, options: ServeOptions, clock: Callable[[], datetime] = utc_now
    ) -> None:
        self.paths = paths
        self.options = options
        self.clock = clock  # what fork retirement reads
        # A manifest that is refused at start stops serve (exit 1, every problem named);
        # one refused on a later reload leaves what runs as it is (see `_load`).
        self.manifest = load(options.manifest) if options.manifest.exists() else Manifest()
        self.store = Store(paths.db)
        self.wake = asyncio.Event()
        self.stopping = asyncio.Event()
        self.scheduler: Scheduler | None = None
        self.sessions: Sessions | None = None
        self.children = ChildConnections(timeout=read_timeout(self.manifest))
        self.observer = Observer(Settings.from_serving(self.manifest.serving), db_path=paths.db)
        self.passing = asyncio.Lock()  # one pass at a time, whoever asks for it

    def _load(self) -> Manifest | None:
        if not self.options.manifest.exists():
            return None
        try:
            return load(self.options.manifest)
        except (InvalidManifest, BlazarError) as exc:
            log(f"manifest not applied, keeping the current state:\n{exc}")
            return None

    def _apply(self, manifest: Manifest) -> None:
        """One reconcile pass with its own store connection (it runs in a worker thread)."""
        with Store(self.paths.db) as store:
            try:
                result = reconcile(
                    store, self.paths, manifest, apply=True, lock_timeout=0, now=self.clock()
                )
            except LockTimeout:
                log("another apply is running; this pass only refreshes what is served")
                return
            except BlazarError as exc:
                log(f"apply failed: {exc}")
                return
        if result.report is not None:
            for outcome in result.report.outcomes:
                state = "ok" if outcome.ok else f"FAILED: {outcome.error}"
                log(f"{outcome.action.address}: {outcome.action.change} {state}")

    async def run_pass(self, reason: str) -> None:
        manifest = self._load()
        if manifest is None and self.options.manifest.exists():
            return  # invalid: keep serving what runs
        manifest = manifest or Manifest()
        self.manifest = manifest
        if self.options.apply and self.options.manifest.exists():
            await asyncio.to_thread(self._apply, manifest)
        offers = await asyncio.to_thread(self._engines, manifest)
        runtimes = build_runtimes(self.store, manifest, offers, slot_dir=self.paths.sessions)
        assert self.scheduler is not None
        self.scheduler.max_loaded = manifest.serving.max_loaded_models
        self.scheduler.max_queue = manifest.serving.max_queue
        self.scheduler.queue_timeout = manifest.serving.queue_timeout
        self.children.timeout = read_timeout(manifest)
        self._observe(manifest)
        changes = await self.scheduler.update(runtimes)
        for model, change in sorted(changes.items()):
            log(f"{model}: {change} ({reason})")
            problem = runtimes[model].settings_problem if model in runtimes else None
            if problem is not None and change != "updated":
                log(f"{model}: not started until its settings are fixed: {problem}")
        if self.sessions is not None:
            self.sessions.bank_mb = manifest.serving.session_bank_mb
            self.sessions.prune()  # banked sessions of removed models or changed files

    def _observe(self, manifest: Manifest) -> None:
        try:
            self.observer.configure(Settings.from_serving(manifest.serving))
        except BlazarError as exc:  # the OTLP extra is missing: serve on, and say so
            log(str(exc))

    def _engines(self, manifest: Manifest) -> tuple[OfferView, ...]:
        """Probe active mainstream engines for the held models' architectures not probed yet
        (apply does it too; serve without a manifest does not apply), and read the catalog's
        offers from disk or the cache (never the network here) for refusal messages."""
        with Store(self.paths.db) as store:
            wanted = {m.architecture for m in store.list_models() if m.architecture}
            for line in ensure_probed(store, self.paths, wanted):
                log(f"engine probe: {line}")
        try:
            catalog = load_catalog(manifest.engine_catalog, self.paths.cache, fetch=False)
        except CatalogError:
            return ()
        return tuple(offer_view(o) for o in catalog.offers.values())

    async def refresh(self, reason: str) -> None:
        """Run a pass once no other runs (the loop's, or one a gateway route asked for)."""
        async with self.passing:
            await self.run_pass(reason)

    def _on_instance(self, instance: Instance, event: str) -> None:
        self.observer.instance_event(instance, event)
        if event == "exited":
            log(f"{instance.spec.key} exited; it is being restarted")
            self.wake.set()

    async def _watch(self) -> None:
        from watchfiles import awatch

        target = self.options.manifest.resolve()
        watch_dir = target if target.is_dir() else target.parent
        watch_dir.mkdir(parents=True, exist_ok=True)

        def is_manifest(change: object, path: str) -> bool:
            """Only the manifest's own files: other files in its folder (logs, editors'
            swap files) must not trigger a reconcile pass."""
            if target.is_dir():
                name = Path(path).name
                return (
                    Path(path).parent == target
                    and not name.startswith(".")
                    and (name.endswith((".toml", ".yaml", ".yml")))
                )
            return Path(path) == target

        async for _ in awatch(
            watch_dir, stop_event=self.stopping, debounce=200, step=50, watch_filter=is_manifest
        ):
            self.wake.set()

    async def _timer(self) -> None:
        while True:
            await asyncio.sleep(TIMER)
            self.wake.set()

    async def _reaper(self) -> None:
        assert self.scheduler is not None
        draining = False
        while True:
            await asyncio.sleep(REAP_EVERY)
            await self.scheduler.reap()
            if draining and not self.scheduler.retired:
                self.wake.set()  # drained: a pass may now remove an engine nothing runs
            draining = bool(self.scheduler.retired)

    async def _loop(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            await self.refresh("manifest change, child exit or timer")

    async def serve(self) -> None:
        serving = self.manifest.serving
        host = self.options.host or serving.host
        port = self.options.port if self.options.port is not None else serving.port
        self.scheduler = Scheduler(
            {},
            max_loaded=serving.max_loaded_models,
            max_queue=serving.max_queue,
            queue_timeout=serving.queue_timeout,
            log_dir=self.paths.logs,
            on_event=self._on_instance,
        )
        scheduler = self.scheduler
        self.sessions = Sessions(
            self.store,
            self.children,
            self.paths.sessions,
            runtimes=lambda: scheduler.runtimes,
            bank_mb=serving.session_bank_mb,
        )
        self.sessions.sweep()
        scheduler.before_stop = self.sessions.bank
        control = Control(self.paths, self.options.manifest, self.store, self.refresh)
        services = Services(
            self.scheduler, self.children, control, observer=self.observer, sessions=self.sessions
        )
        runner = web.AppRunner(build_app(services), handler_cancellation=True, access_log=None)
        await runner.setup()
        tasks: list[asyncio.Task[None]] = []
        try:
            site = web.TCPSite(runner, host, port)
            try:
                await site.start()
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PortInUse(
                        f"port {port} on {host} is already in use: stop what listens there, "
                        "or pass --port"
                    ) from None
                raise
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stopping.set)
            await self.refresh("start")
            info = {"pid": os.getpid(), "host": host, "port": port, "url": f"http://{host}:{port}"}
            daemon_file(self.paths).write_text(json.dumps(info))
            tasks = [
                asyncio.create_task(self._loop()),
                asyncio.create_task(self._reaper()),
                asyncio.create_task(self._timer()),
                asyncio.create_task(self._watch()),
                asyncio.create_task(self.observer.run()),
            ]
            print(f"Blazar is serving on http://{host}:{port}", flush=True)
            stop = asyncio.create_task(self.stopping.wait())
            done, _ = await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stop and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            self.stopping.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.scheduler.close()
            await runner.cleanup()
            await self.observer.close()
            self.children.close()
            with contextlib.suppress(OSError):
                daemon_file(self.paths).unlink()
            self.store.close()
            log("stopped; no child is left running")


def run(paths: Paths, options: ServeOptions) -> None:
    daemon = Daemon(paths, options)
    asyncio.run(daemon.serve())
