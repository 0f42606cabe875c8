"""The fleet: `[remotes.NAME]`, what each serves, its health, and each model's failover chain.

The daemon hands `Fleet.configure` the manifest on every pass and runs
`Fleet.run`, which probes each remote every `health_interval`: `GET /health`
(a Blazar says so in its answer: then requests reach it in their own
protocol; anything else is treated as an OpenAI-compatible server) and
`GET /v1/models` for the names it serves (unless `models` lists them). Two
failures in a row mark a remote down and one success up again
(`next_health`, pure); a request that fails to reach it counts as a failure
too. Nothing ever waits on a down remote. A remote's `url` is requested as aiohttp
dials it (`blazar.urls.target`); one whose host reads otherwise to a person (full-width
digits, `127.1`) is refused: it stays down with the reason, and nothing is sent to it.

The request path asks two things (`blazar.serve.request.pipeline`): which remote
serves a name this host does not (`remote_for`), and, when this host cannot
serve a model (busy with its queue full, a failed load, a crash before any
byte went out), the next usable member of its `failover` chain (`member`).
Either is answered with a `Forward` value, which the pipeline carries out
(`blazar.serve.request.forward`). `snapshot` is `GET /api/failover` and `blazar remotes`;
`drain` is `POST /api/failover`.

A request a Blazar forwarded carries `x-blazar-forwarded`: it is never
forwarded again (no loops between hosts that name each other), and a Blazar's
`/v1/models` marks the names it serves from remotes (`REMOTE_MARK`), which
another Blazar's probe leaves out for the same reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from aiohttp import (
    ClientResponse,
    ClientSession,
    ClientTimeout,
    ServerDisconnectedError,
    TCPConnector,
    web,
)

from blazar import urls
from blazar.serve.supervisor.child_http import REUSE_IDLE
from specs.manifest import Manifest
from specs.names import parse_name

FALL = 2  # failures in a row that mark a remote down
RISE = 1  # successes in a row that mark it up again
FORWARDED = "x-blazar-forwarded"  # on requests one Blazar forwards to another
REMOTE_MARK = "blazar_remote"  # in /v1/models entries served from a remote
logger = logging.getLogger("blazar.serve")


class Health(StrEnum):
    UNKNOWN = "unknown"  # not probed yet: requests may try it
    UP = "up"
    DOWN = "down"


def next_health(health: Health, streak: int, ok: bool) -> tuple[Health, int]:
    """Pure: a remote's health and its streak (results in a row that disagree with its
    health) after one probe or request came out `ok` or not."""
    if ok:
        if health is Health.UP:
            return Health.UP, 0
        streak = streak + 1 if health is Health.DOWN else RISE
        return (Health.UP, 0) if streak >= RISE else (health, streak)
    if health is Health.DOWN:
        return Health.DOWN, 0
    streak += 1
    return (Health.DOWN, 0) if streak >= FALL else (health, streak)


def base_url(url: str) -> str:
    """A remote's URL without a trailing slash or /v1: requests keep their own paths."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def short(name: str) -> str:
    """A model name's short form (`m:latest` is `m`), or the text as written."""
    try:
        return parse_name(name).short
    except ValueError:
        return name


@dataclass
class Remote:
    """One `[remotes.NAME]`: its settings, what it serves, its health and its counts."""

    name: str
    url: str
    key_env: str | None = None
    declared: tuple[str, ...] = ()  # `models`; empty: what /v1/models lists
    timeout: float = 5.0
    health_interval: float = 10.0
    kind: str = "unknown"  # blazar | openai, from its /health answer
    listed: tuple[str, ...] = ()
    health: Health = Health.UNKNOWN
    streak: int = 0
    drained: bool = False
    last_error: str | None = None
    last_checked: float | None = None  # wall clock
    forwarded: int = 0
    failed: int = 0
    refused: str | None = None  # why its url is never dialled (`blazar.urls.target`)

    def settings(self) -> tuple[object, ...]:
        return (self.url, self.key_env, self.declared, self.timeout, self.health_interval)

    @property
    def key(self) -> str | None:
        """The key to send, read from serve's environment now (never from the manifest)."""
        return os.environ.get(self.key_env) or None if self.key_env else None

    @property
    def models(self) -> tuple[str, ...]:
        return self.declared or self.listed

    @property
    def usable(self) -> bool:
        """Requests may go to it: not drained, not down."""
        return not self.drained and self.health is not Health.DOWN

    def serves(self, name: str) -> bool:
        wanted = short(name)
        return any(short(m) == wanted for m in self.models)

    def headers(self) -> dict[str, str]:
        key = self.key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def probe_headers(self) -> dict[str, str]:
        return {**self.headers(), "Accept-Encoding": "identity"}

    def note(self, ok: bool, error: str | None = None) -> None:
        """A probe's or a request's result: health moves by `next_health`."""
        before = self.health
        self.health, self.streak = next_health(self.health, self.streak, ok)
        self.last_checked = time.time()
        if not ok:
            self.last_error = error
        if self.health is not before:
            said = f": {error}" if error and not ok else ""
            logger.info("remote %s is %s%s", self.name, self.health, said)

    def view(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "kind": self.kind,
            "health": str(self.health),
            "drained": self.drained,
            "last_error": self.last_error,
            "last_checked": self.last_checked,
            "models": list(self.models),
            "forwarded": self.forwarded,
            "failed": self.failed,
        }


@dataclass(frozen=True)
class Forward:
    """The request path's answer "carry this request out on `remote` instead": `reason`
    says why (for the trace), `model` names the model it is for."""

    remote: Remote
    reason: str
    model: str


@dataclass
class Fleet:
    """Every remote and every model's failover chain; the daemon replaces them on reload."""

    remotes: dict[str, Remote] = field(default_factory=dict)
    chains: dict[str, tuple[str, ...]] = field(default_factory=dict)  # model -> remotes
    session: ClientSession | None = None
    fresh: ClientSession | None = None  # no keep-alive: the second try of a request
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    def configure(self, manifest: Manifest) -> None:
        """The manifest's remotes and chains; a remote whose settings did not change keeps
        its health and counts."""
        fresh: dict[str, Remote] = {}
        for name, declared in manifest.remotes.items():
            try:  # requests go to the URL as checked, its host as aiohttp dials it
                url, refused = urls.target(declared.url, credentials=True).url, None
            except urls.RefusedUrl as exc:
                url, refused = declared.url, f"{exc}; fix remotes.{name}.url"
            remote = Remote(
                name,
                base_url(url),
                declared.key_env,
                tuple(declared.models),
                declared.timeout,
                declared.health_interval,
                refused=refused,
            )
            old = self.remotes.get(name)
            if old is not None and old.settings() == remote.settings():
                remote = old
            elif refused is not None:  # down for good: nothing is sent to it
                remote.health, remote.last_error = Health.DOWN, refused
                logger.error("remote %s: %s", name, refused)
            fresh[name] = remote
        changed = fresh.keys() != self.remotes.keys() or any(
            fresh[n] is not self.remotes.get(n) for n in fresh
        )
        self.remotes = fresh
        self.chains = {
            short(name): tuple(model.failover)
            for name, model in manifest.models.items()
            if model.failover
        }
        if changed:
            self._wake.set()  # probe the new ones now

    # -- the request path ---------------------------------------------------------------

    def remote_for(self, requested: str) -> Remote | None:
        """The remote that serves a name this host does not (the first by name), if any;
        `model+adapter` and `model#N` are the remote's to resolve."""
        base = requested.split("+", 1)[0].split("#", 1)[0]
        return next((r for _, r in sorted(self.remotes.items()) if r.serves(base)), None)

    def member(self, model: str, tried: Iterable[str] = ()) -> Remote | None:
        """The next usable remote of `model`'s chain not tried yet; None when none is."""
        skip = set(tried)
        for name in self.chains.get(model, ()):
            remote = self.remotes.get(name)
            if remote is not None and remote.usable and name not in skip:
                return remote
        return None

    def listing(self, local: Callable[[str], bool]) -> list[tuple[str, Remote]]:
        """(name, remote) for every remote model this host does not serve itself."""
        seen: set[str] = set()
        out = []
        for _, remote in sorted(self.remotes.items()):
            for name in remote.models:
                if short(name) in seen or local(name):
                    continue
                seen.add(short(name))
                out.append((name, remote))
        return out

    def snapshot(self) -> dict[str, Any]:
        """`GET /api/failover`: each remote, and each model's chain with its members' state."""
        chains = {
            model: [
                {"member": name, **(self.remotes[name].view() if name in self.remotes else {})}
                for name in members
            ]
            for model, members in sorted(self.chains.items())
        }
        return {"remotes": [r.view() for _, r in sorted(self.remotes.items())], "chains": chains}

    def drain(self, name: str, drained: bool) -> Remote:
        """Mark a remote drained (no request goes to it) or back; KeyError if unknown."""
        remote = self.remotes[name]
        remote.drained = drained
        logger.info("remote %s %s", name, "drained" if drained else "back in service")
        return remote

    # -- probing ------------------------------------------------------------------------

    def client(self) -> ClientSession:
        """The one HTTP client to the remotes (probes and forwarded requests); it keeps
        no connection idle for `REUSE_IDLE` or more."""
        if self.session is None or self.session.closed:
            connector = TCPConnector(keepalive_timeout=REUSE_IDLE)
            self.session = ClientSession(connector=connector, auto_decompress=False)
        return self.session

    async def send(self, method: str, url: str, **options: Any) -> ClientResponse:
        """The request, its answer's head read, on a kept-alive connection; when the
        remote closed that connection as it was reused, with no byte back, once more on a
        new one. A llama-server closes its side after a streamed answer and after 5 s
        idle, and the pool may not have seen the close yet (a loaded machine): that
        request never reached the server. (A server that died while answering is asked
        once more too, and then fails as it did: nothing had come back to the client.)"""
        try:
            return await self.client().request(method, url, **options)
        except ServerDisconnectedError:
            if self.fresh is None or self.fresh.closed:
                connector = TCPConnector(force_close=True)
                self.fresh = ClientSession(connector=connector, auto_decompress=False)
            return await self.fresh.request(method, url, **options)

    async def probe(self, remote: Remote) -> None:
        """One health check: `/health` (else `/v1/models` for servers without one), then
        the names it serves."""
        if remote.refused is not None:
            remote.note(False, remote.refused)
            return
        session = self.client()
        timeout = ClientTimeout(total=remote.timeout)
        try:
            async with session.get(
                remote.url + "/health", headers=remote.probe_headers(), timeout=timeout
            ) as resp:
                body = await _json(resp)
                status = resp.status
            if status == 404:
                status = 200  # no /health: /v1/models below says whether it answers
            elif status != 200:
                raise ConnectionError(f"/health answered {status}")
            remote.kind = "blazar" if body.get("server") == "blazar" else "openai"
            async with session.get(
                remote.url + "/v1/models", headers=remote.probe_headers(), timeout=timeout
            ) as resp:
                listed = await _json(resp)
                if resp.status in (401, 403):
                    raise ConnectionError(f"/v1/models answered {resp.status}: {_key_hint(remote)}")
                if resp.status != 200:
                    raise ConnectionError(f"/v1/models answered {resp.status}")
            remote.listed = _names(listed)
        except (TimeoutError, ConnectionError, OSError) as exc:
            remote.note(False, _reason(exc, remote))
            return
        except Exception as exc:  # aiohttp's ClientError and anything else: a failure
            remote.note(False, _reason(exc, remote))
            return
        remote.note(True)

    async def run(self) -> None:
        """Probe every remote at its interval (and at once when the manifest changes)."""
        due: dict[str, float] = {}
        while True:
            now = time.monotonic()
            todo = [r for n, r in self.remotes.items() if due.get(n, 0.0) <= now]
            if todo:
                await asyncio.gather(*(self.probe(r) for r in todo))
                after = time.monotonic()
                for remote in todo:
                    due[remote.name] = after + remote.health_interval
            waits = [due.get(n, 0.0) - time.monotonic() for n in self.remotes]
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.05, min(waits, default=3600)))
            if self._wake.is_set():
                due = {n: d for n, d in due.items() if n in self.remotes}
                for name in self.remotes:
                    due.setdefault(name, 0.0)

    async def close(self) -> None:
        for session in (self.session, self.fresh):
            if session is not None:
                await session.close()
        self.session = self.fresh = None


FLEET = web.AppKey("fleet", Fleet)  # the gateway app's fleet, for the request path


async def _json(resp: Any) -> Mapping[str, Any]:
    try:
        data = await resp.json(content_type=None)
    except ValueError:
        return {}
    return data if isinstance(data, Mapping) else {}


def _names(listed: Mapping[str, Any]) -> tuple[str, ...]:
    """The model ids of an OpenAI `/v1/models` answer, without a Blazar's remote ones."""
    data = listed.get("data")
    if not isinstance(data, list):
        return ()
    return tuple(
        str(m["id"])
        for m in data
        if isinstance(m, Mapping) and isinstance(m.get("id"), str) and REMOTE_MARK not in m
    )


def _key_hint(remote: Remote) -> str:
    if remote.key_env is None:
        return "it wants a key: set key_env to a variable holding one"
    if remote.key is None:
        return f"{remote.key_env} is not set in serve's environment"
    return f"it refused the key in {remote.key_env}"


def _reason(exc: BaseException, remote: Remote) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {remote.timeout:g} s"
    return str(exc) or type(exc).__name__
