"""`blazar serve`: the gateway and the control loop in one process.

The control loop is level-triggered: a pass loads the manifest, applies it
(fetching what is missing, under the apply lock, in a worker thread) and
hands the scheduler the models that are now ready; hot reload restarts only
the instances whose arguments changed. Each pass also hands the access layer
(`blazar.serve.gateway.access`) the manifest's keys and `[serving]` settings first, so
a key added or removed applies at once, and the fleet (`blazar.serve.state.remotes`)
its remotes and failover chains, which it probes on their own timers, and the MCP
servers theirs (`blazar.serve.state.mcp`: started, restarted, stopped); records
when keys were last used; reloads a rotated TLS certificate; and removes uploads
no model used. Passes run on start, on a manifest change, when an apply elsewhere
that made a pass skip its own releases the lock, on a timer (`blazar.serve.triggers`)
and when a child exits. Runtime failures are conditions in the store
(`blazar.serve.state.conditions`); the log is `blazar.serve.logs`'s. Sessions
(`blazar.serve.state.sessions`) live under `Paths.sessions`; the session bank saves
a model's slots before the scheduler stops it (serve's own stop included).

Serve refuses to start on an address beyond loopback with no key declared
unless `serving.allow_unauthenticated` says the user means it (then it warns at
every start), and a reload that would remove the last key there keeps the keys
it has. When serve stops (SIGTERM, SIGINT, or an error in its own loop) every
child is stopped; the children also get SIGTERM from the kernel if serve dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
import signal
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from aiohttp import web

from blazar.engines.catalog import CatalogError, load_catalog
from blazar.engines.probe import ensure_probed
from blazar.errors import BlazarError, InvalidManifest
from blazar.host.children import owner_only
from blazar.host.hardware import memory_devices
from blazar.host.locking import LockTimeout, apply_lock
from blazar.paths import Paths
from blazar.reconcile.apply import load, reconcile
from blazar.reconcile.ports import offer_view
from blazar.serve import event_loop, triggers
from blazar.serve import logs as serve_logs
from blazar.serve.gateway.access import Access
from blazar.serve.gateway.app import build_app
from blazar.serve.gateway.audit import AuditLog
from blazar.serve.gateway.listener import GatewaySite, Limits, TLSFiles
from blazar.serve.gateway.policy import exposure, is_loopback
from blazar.serve.request import uploads
from blazar.serve.routes.services import Control, Services
from blazar.serve.state import conditions
from blazar.serve.state.mcp import McpServers
from blazar.serve.state.remotes import Fleet
from blazar.serve.state.sessions import Sessions
from blazar.serve.state.tracing import Observer, Settings
from blazar.serve.supervisor.build import build_runtimes
from blazar.serve.supervisor.child_http import ChildConnections
from blazar.serve.supervisor.instance import Instance
from blazar.serve.supervisor.scheduler import Declared, Groups, Scheduler
from blazar.store.db import Store
from reconcilers.ports import OfferView
from specs.manifest import Manifest
from specs.serving import Serving

REAP_EVERY = 0.25
logger = logging.getLogger("blazar.serve")


class PortInUse(BlazarError):
    pass


class Unprotected(BlazarError):
    """Serving beyond loopback with no API key, without the user saying they mean it."""


@dataclass
class ServeOptions:
    manifest: Path
    host: str | None = None
    port: int | None = None
    apply: bool = True  # reconcile the manifest on each pass (fetch what is missing)
    overlay: str | None = None  # the host overlay to merge (default: this machine's name)


def log(message: str, level: int = logging.INFO) -> None:
    """A line of serve's log (`blazar.serve.logs`: stderr and serve.log)."""
    logger.log(level, message)


def read_timeout(manifest: Manifest) -> float | None:
    """serving.upstream_timeout for the child client: 0 or -1 means no limit."""
    seconds = manifest.serving.upstream_timeout
    return seconds if seconds > 0 else None


def daemon_file(paths: Paths) -> Path:
    return paths.state / "serve.json"


def restart_needed(
    bound: tuple[str, int, bool] | None, host: str | None, port: int | None, serving: Serving
) -> str:
    """Pure: what the manifest changed that only a restart applies, in words ("" when
    nothing): the address serve listens on, and TLS on or off (a rotated certificate is
    reloaded in place). `bound` is (host, port, tls) as serve listens; a `--host` or
    `--port` given to serve wins over the manifest, so a change of that is no change."""
    if bound is None:
        return ""
    was_host, was_port, was_tls = bound
    changed = []
    if host is None and serving.host != was_host:
        changed.append(f"serving.host is {serving.host}, serve listens on {was_host}")
    if port is None and serving.port != was_port:
        changed.append(f"serving.port is {serving.port}, serve listens on {was_port}")
    tls = serving.tls_cert is not None and serving.tls_key is not None
    if tls != was_tls:
        changed.append("TLS is " + ("on" if tls else "off") + " in the manifest, not in serve")
    return "; ".join(changed)


def operator_token_file(paths: Paths) -> Path:
    return paths.state / "operator.token"


def write_operator_token(paths: Paths) -> str:
    """A new token for the local operator, in a file only serve's user can read (as
    Jupyter's token and Docker's socket let their owner in); the gateway takes it as an
    admin key while this serve runs, so `blazar` commands on this machine work once keys
    are declared, without a key in the environment. Returns its sha256."""
    token = f"plm_{secrets.token_urlsafe(32)}"
    path = operator_token_file(paths)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    with open(temporary, "w", opener=owner_only) as fh:
        fh.write(token)
    os.replace(temporary, path)
    return hashlib.sha256(token.encode()).hexdigest()


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
        self.manifest = (
            load(options.manifest, options.overlay) if options.manifest.exists() else Manifest()
        )
        self.store = Store(paths.db)
        self.wake = asyncio.Event()
        self.stopping = asyncio.Event()
        self.scheduler: Scheduler | None = None
        self.sessions: Sessions | None = None
        self.children = ChildConnections(timeout=read_timeout(self.manifest))
        self.observer = Observer(Settings.from_serving(self.manifest.serving), db_path=paths.db)
        self.passing = asyncio.Lock()  # one pass at a time, whoever asks for it
        serving = self.manifest.serving
        self.host = options.host or serving.host
        self.access = Access(bind_host=self.host)
        self.services: Services | None = None
        self.limits = Limits.of(serving)
        self.tls: TLSFiles | None = None
        self.bound: tuple[str, int, bool] | None = None  # (host, port, tls) as it listens
        self.restart_pending = ""  # what the manifest changed that only a restart applies
        self.manifest_keys = self.manifest.keys  # the keys the access layer enforces
        self.fleet = Fleet()  # remotes and failover chains, probed by `Fleet.run`
        self.lock_waiter: asyncio.Task[None] | None = None  # `_after_lock`
        # Runtime failures as conditions in the store (`blazar status`, `blazar doctor`).
        self.judge = conditions.Judge(lambda: self.scheduler, lambda: self.fleet.remotes.values())
        self.status = conditions.StatusWriter(paths.db, paths.state / "apply.lock", self.judge)
        self.mcp = McpServers(paths.logs)  # [mcp.NAME], each with its owner

    def _load(self) -> Manifest | None:
        if not self.options.manifest.exists():
            return None
        try:
            manifest = load(self.options.manifest, self.options.overlay)
        except (InvalidManifest, BlazarError) as exc:
            log(f"manifest not applied, keeping the current state:\n{exc}", logging.ERROR)
            message = f"not applied, serving what ran before: {exc}"
            self.judge.apply = conditions.applied(self.options.manifest, "Invalid", message)
            return None
        if self.judge.apply is not None and self.judge.apply.reason == "Invalid":
            self.judge.apply = None  # valid again: the next apply (if serve applies) says how
        return manifest

    def _apply(self, manifest: Manifest) -> bool:
        """One reconcile pass with its own store connection (it runs in a worker thread).
        False when another apply held the lock, so this pass applied nothing."""
        with Store(self.paths.db) as store:
            try:
                result = reconcile(
                    store, self.paths, manifest, apply=True, lock_timeout=0, now=self.clock()
                )
            except LockTimeout:  # `_after_lock` runs the pass again once it is released
                log("another apply is running; this pass only refreshes what is served")
                return False
            except BlazarError as exc:
                log(f"apply failed: {exc}", logging.ERROR)
                self.judge.apply = conditions.applied(
                    self.options.manifest, "ApplyFailed", str(exc)
                )
                return True
        outcomes = result.report.outcomes if result.report is not None else ()
        for outcome in outcomes:
            state = "ok" if outcome.ok else f"FAILED: {outcome.error}"
            log(f"{outcome.action.address}: {outcome.action.change} {state}")
        failed = [o.action.address for o in outcomes if not o.ok]
        self.judge.apply = conditions.applied(self.options.manifest, failed=failed)
        return True

    def _after_lock(self) -> None:
        """Run the pass an apply elsewhere made this one skip as soon as that apply is done:
        what it declared is served then, not at the next timer pass."""
        if self.lock_waiter is None or self.lock_waiter.done():
            lock = self.paths.state / "apply.lock"
            self.lock_waiter = asyncio.create_task(triggers.when_released(lock, self.wake))

    def _guard(self, manifest: Manifest) -> None:
        """Hand the access layer, the routes and the listener the manifest's settings."""
        keys = manifest.keys
        refused = exposure(self.host, manifest)
        if refused is not None and self.access.keyed:
            log(f"keys not changed: the manifest declares none, and {refused}", logging.WARNING)
            keys = self.manifest_keys
        self.manifest_keys = keys
        serving = manifest.serving
        self.access.configure(serving, keys)
        if serving.audit_log and self.access.audit is None:
            self.access.audit = AuditLog(self.paths.logs / "audit.jsonl")
        elif not serving.audit_log and self.access.audit is not None:
            self.access.audit.close()
            self.access.audit = None
        if self.services is not None:
            self.services.configure(serving)
            self.services.pipeline.cache.keep_keys(set(keys))  # a key removed: its entries go
        self.fleet.configure(manifest)
        self.limits.header_timeout = serving.header_timeout
        self.limits.max_connections_per_client = serving.max_connections_per_client
        if self.tls is not None and (note := self.tls.reload_if_changed()) is not None:
            log(note)
        pending = restart_needed(self.bound, self.options.host, self.options.port, serving)
        if pending != self.restart_pending:
            self.restart_pending = pending
            if pending:
                log(f"{pending}: restart `blazar serve` to apply it", logging.WARNING)
        self.judge.restart = pending

    async def _record_key_use(self) -> None:
        """Write when keys were last used: in a worker thread, under the apply lock (an
        apply's transactions fail if another writer commits under them), and not now if an
        apply holds it: the next pass writes it."""
        used = self.access.take_usage()
        if not used:
            return

        def write() -> None:
            with apply_lock(self.paths.state / "apply.lock", timeout=0), Store(self.paths.db) as db:
                db.record_key_use(used)

        try:
            await asyncio.to_thread(write)
        except (LockTimeout, sqlite3.Error):
            self.access.keep_usage(used)

    async def run_pass(self, reason: str) -> None:
        manifest = self._load()
        if manifest is None and self.options.manifest.exists():
            return  # invalid: keep serving what runs
        manifest = manifest or Manifest()
        self._guard(manifest)  # before the apply, which may download for minutes
        self.manifest = manifest
        applying = self.options.apply and self.options.manifest.exists()
        if applying and not await asyncio.to_thread(self._apply, manifest):
            self._after_lock()
        offers = await asyncio.to_thread(self._engines, manifest)
        runtimes = build_runtimes(self.store, manifest, offers, slot_dir=self.paths.sessions)
        assert self.scheduler is not None
        self.scheduler.max_loaded = manifest.serving.max_loaded_models
        self.scheduler.max_queue = manifest.serving.max_queue
        self.scheduler.queue_timeout = manifest.serving.queue_timeout
        self.scheduler.memory_budget = manifest.serving.memory_budget
        self.scheduler.min_residency = manifest.serving.min_residency
        self.scheduler.forks.configure(manifest.serving.fork_server)
        self.scheduler.groups = Groups.of(manifest)
        self.scheduler.declared = Declared.of(manifest)  # devices, warm pegs, fairness
        self.children.timeout = read_timeout(manifest)
        self._observe(manifest)
        changes = await self.scheduler.update(runtimes)
        if self.services is not None:  # a model no longer declared: its cached answers go
            self.services.pipeline.cache.keep_models(set(runtimes))
        for model, change in sorted(changes.items()):
            log(f"{model}: {change} ({reason})")
            problem = runtimes[model].settings_problem if model in runtimes else None
            if problem is not None and change != "updated":
                log(f"{model}: not started until its settings are fixed: {problem}")
        if self.sessions is not None:
            self.sessions.bank_mb = manifest.serving.session_bank_mb
            self.sessions.prune()  # banked sessions of removed models or changed files

        for name, change in (await self.mcp.configure(manifest.mcp)).items():
            log(f"mcp {name}: {change} ({reason})")
        for gone in uploads.sweep(self.paths, uploads.used_blobs(manifest, self.store)):
            log(f"removed upload {gone.name}: no model used it within an hour")
        await self._record_key_use()
        self.status.poke()

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
        self.status.poke()  # its Serving condition may change
        if event == "exited":
            log(f"{instance.spec.key} exited; it is being restarted", logging.WARNING)
            self.wake.set()
        elif event == "failed":
            log(f"{instance.spec.key}: {instance.last_error}", logging.ERROR)

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

    def _start_checks(self) -> None:
        """Refuse an exposed gateway with no key; warn when the user means it; load TLS."""
        serving = self.manifest.serving
        refused = exposure(self.host, self.manifest)
        if refused is not None:
            raise Unprotected(refused)
        if not is_loopback(self.host) and not self.manifest.keys:
            log(
                f"WARNING: serving on {self.host} with NO API KEY "
                "(serving.allow_unauthenticated = true): anyone who can reach this address "
                "can use every model, pull and delete models, and stop the gateway's models",
                logging.WARNING,
            )
        if serving.tls_cert is not None and serving.tls_key is not None:
            cert, key = (Path(f).expanduser() for f in (serving.tls_cert, serving.tls_key))
            self.tls = TLSFiles(cert, key)

    async def serve(self) -> None:
        serving = self.manifest.serving
        host = self.host
        port = self.options.port if self.options.port is not None else serving.port
        self._start_checks()
        self.scheduler = Scheduler(
            {},
            max_loaded=serving.max_loaded_models,
            max_queue=serving.max_queue,
            queue_timeout=serving.queue_timeout,
            log_dir=self.paths.logs,
            on_event=self._on_instance,
            devices=memory_devices(),  # free memory now: the default budget counts from it
            memory_budget=serving.memory_budget,
            min_residency=serving.min_residency,
            measured=self.store.footprints(),
            on_measured=lambda r, kind, size: self.store.put_footprint(
                r.name, r.sha256, kind, size
            ),
        )
        self.scheduler.starting = True  # until the first pass (below) has run
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
            self.scheduler,
            self.children,
            control,
            observer=self.observer,
            sessions=self.sessions,
            serving=serving,
            fleet=self.fleet,
            mcp=self.mcp,
        )
        self.services = services
        self._guard(self.manifest)
        app = build_app(services, self.access)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        tasks: list[asyncio.Task[None]] = []
        scheme = "https" if self.tls is not None else "http"
        try:
            context = self.tls.context if self.tls is not None else None
            site = GatewaySite(runner, host, port, self.limits, ssl_context=context)
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
            self.scheduler.starting = False  # /health answers 200 from now on
            url = f"{scheme}://{host}:{port}"
            info: dict[str, object] = {"pid": os.getpid(), "host": host, "port": port, "url": url}
            if self.tls is not None:  # the CLI trusts it for this address (blazar.cli.serve)
                info["tls_cert"] = str(self.tls.cert.resolve())
            daemon_file(self.paths).write_text(json.dumps(info))
            self.bound = (host, port, self.tls is not None)
            self.access.allow_operator(write_operator_token(self.paths))
            tasks = [
                asyncio.create_task(self._loop()),
                asyncio.create_task(self._reaper()),
                asyncio.create_task(triggers.timer(self.wake)),
                asyncio.create_task(
                    triggers.watch_manifest(self.options.manifest, self.stopping, self.wake)
                ),
                asyncio.create_task(self.observer.run()),
                asyncio.create_task(self.fleet.run()),
                asyncio.create_task(self.status.run()),
            ]
            log(f"event loop: {event_loop.current()}")
            print(f"Blazar is serving on {url}", flush=True)
            stop = asyncio.create_task(self.stopping.wait())
            done, _ = await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stop and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            self.stopping.set()
            if self.lock_waiter is not None:
                tasks.append(self.lock_waiter)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for hook in services.closing:
                try:
                    await hook()
                except Exception as exc:  # one hook's failure must not leave children running
                    log(f"stopping: {exc!r}")
            await self.mcp.close()
            await self.scheduler.close()
            await self.status.close()  # the conditions of a serve that runs: none now
            await self._record_key_use()
            await runner.cleanup()
            await self.fleet.close()
            await self.observer.close()
            self.children.close()
            with contextlib.suppress(OSError):
                daemon_file(self.paths).unlink()
            with contextlib.suppress(OSError):
                operator_token_file(self.paths).unlink()
            if self.access.audit is not None:
                self.access.audit.close()
            self.store.close()
            log("stopped; no child is left running")


def run(paths: Paths, options: ServeOptions) -> None:
    serve_logs.configure(paths.logs)
    daemon = Daemon(paths, options)
    event_loop.run(daemon.serve())
