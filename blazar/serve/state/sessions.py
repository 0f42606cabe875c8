"""KV sessions: slots saved to disk and restored, by name or by the session bank.

`Sessions` is made by the daemon and used from three places:

- the sessions API (`blazar.serve.routes.sessions_api`, `blazar session ...`):
  `save` a slot of a loaded model under a name, `restore` it into a free slot
  (loading the model), `remove`, `records`;
- the scheduler, whose `before_stop` hook is `bank`: before an instance is
  stopped for any reason but a crash, the slots that hold a conversation are
  saved as banked sessions (when the model has `session_bank`);
- the request path (`blazar.serve.request.pipeline.admit`): `wants_tokens` says whether
  a request's prompt tokens matter here; `route` then gives the slot it must go
  to (llama-server's `id_slot`): a slot restored for it, or one the banked
  session sharing the longest prefix is restored into first.

The engine writes the slot file itself into `--slot-save-path`
(`Paths.sessions`) under a temporary name Blazar picks; Blazar checks the size
against the engine's answer, renames it, and records model, engine tag, model
sha256, KV cache type, tokens and size in the store. A session is only restored
into the model, file, engine build and cache type it was saved from. The
decisions (tokens in a file, prefix matching, the bank's budget) are pure
functions in `blazar.serve.state.session_files`. Only this event-loop's code writes
session records, so the bank's index is kept in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from blazar.protocols import ProtocolError
from blazar.serve.state import session_files
from blazar.serve.state.session_files import Tokens
from blazar.serve.supervisor.child_http import ChildConnections, UpstreamError
from blazar.serve.supervisor.dialects import OPENAI, sessions_refusal
from blazar.serve.supervisor.instance import Instance, InstanceId, State, instance_id
from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler import Lease, Pool
from blazar.store.db import SessionRecord, Store

SAVED, BANK = "saved", "bank"
MIB = 1024 * 1024
logger = logging.getLogger("blazar.serve")


def incompatibility(record: SessionRecord, runtime: ModelRuntime) -> str | None:
    """Why `record` cannot be restored into `runtime`'s instances (None when it can)."""
    name = record.name
    if runtime.dialect == OPENAI:  # a mistralrs lane: no slots at all
        return sessions_refusal(runtime.name)
    if record.model != runtime.name:
        return (
            f"session '{name}' was saved from model '{record.model}', not '{runtime.name}': "
            f"restore it into '{record.model}' (`blazar session restore {record.model} {name}`)"
        )
    if record.model_sha256 != runtime.sha256:
        return (
            f"session '{name}' was saved from another file of model '{runtime.name}' (sha256 "
            f"{record.model_sha256[:12]}, now {runtime.sha256[:12]}): its KV state does not fit "
            f"this one; remove it (`blazar session rm {name}`)"
        )
    if record.engine_tag != runtime.engine_tag:
        return (
            f"session '{name}' was saved by engine {record.engine_tag}, and model "
            f"'{runtime.name}' runs on {runtime.engine_tag}, whose slot files may differ: "
            f"remove it (`blazar session rm {name}`), or serve the model on that engine"
        )
    if record.cache_type != runtime.cache.kv_type:
        return (
            f"session '{name}' holds a {record.cache_type} KV cache, and model "
            f"'{runtime.name}' is served with cache_type {runtime.cache.kv_type}: set it back, "
            f"or remove the session (`blazar session rm {name}`)"
        )
    return None


def choose_slot(slots: Sequence[Mapping[str, Any]], reserved: set[int]) -> int | None:
    """Pure: the slot to restore into: idle, not holding a restored session yet to be used,
    and never used or else the one used longest ago. None when every slot is busy."""
    idle = [s for s in slots if not s.get("is_processing") and isinstance(s.get("id"), int)]
    free = [s for s in idle if s["id"] not in reserved] or idle
    if not free:
        return None
    return int(min(free, key=lambda s: (s.get("id_task") is not None, s.get("id_task") or 0))["id"])


class Sessions:
    """Saved sessions and the session bank, for one daemon."""

    def __init__(
        self,
        store: Store,
        children: ChildConnections,
        directory: Path,
        *,
        runtimes: Callable[[], Mapping[str, ModelRuntime]] = dict,
        bank_mb: int = 4096,
    ) -> None:
        self.store = store
        self.children = children
        self.directory = directory
        self._runtimes = runtimes  # the models served now (the scheduler's)
        self.bank_mb = bank_mb
        directory.mkdir(parents=True, exist_ok=True)
        self._bank: dict[str, dict[str, SessionRecord]] = {}  # model -> name -> banked session
        for record in store.list_sessions(kind=BANK):
            self._bank.setdefault(record.model, {})[record.name] = record
        self._tokens: dict[str, Tokens | None] = {}
        self._restored: dict[InstanceId, set[str]] = {}  # restored into this child already
        self._routes: dict[InstanceId, dict[int, Tokens]] = {}  # restored, awaiting a request
        self._locks: dict[InstanceId, asyncio.Lock] = {}

    # -- what the API calls -----------------------------------------------------------

    def records(self) -> list[SessionRecord]:
        return self.store.list_sessions()

    def find(self, name: str) -> SessionRecord:
        record = self.store.find_session(name)
        if record is None:
            raise ProtocolError(404, f"no session '{name}': `blazar session list` shows them")
        return record

    async def save(
        self, pool: Pool, name: str, *, slot: int | None = None, replica: int = 0
    ) -> SessionRecord:
        """Save a slot of a loaded model as session `name` (replacing one of that name)."""
        runtime = pool.runtime
        if (problem := session_files.check_name(name)) is not None:
            raise ProtocolError(400, problem)
        if runtime.dialect == OPENAI:
            raise ProtocolError(400, sessions_refusal(runtime.name))
        if not 0 <= replica < len(pool.members):
            raise ProtocolError(400, f"model '{runtime.name}' has no replica {replica}")
        instance = pool.members[replica].instance
        if not pool.loaded or instance.state is not State.READY or instance.url is None:
            raise ProtocolError(
                409,
                f"model '{runtime.name}' is not loaded, so no slot holds a conversation: "
                "send it a request first",
            )
        slots = await self._slots(instance.url)
        used = [s for s in slots if s.get("id_task") is not None]
        if slot is None:
            if not used:
                raise ProtocolError(409, f"no slot of model '{runtime.name}' holds a conversation")
            slot = int(max(used, key=lambda s: s["id_task"])["id"])
        elif not 0 <= slot < runtime.slots:
            raise ProtocolError(
                400,
                f"slot {slot} does not exist: model '{runtime.name}' has slots 0 to "
                f"{runtime.slots - 1}",
            )
        record = await self._save_slot(instance.url, slot, runtime, name, SAVED)
        if record is None:
            raise ProtocolError(409, f"slot {slot} of model '{runtime.name}' holds no conversation")
        old = self.store.find_session(name)
        self.store.put_session(record)
        if old is not None and old.file != record.file:
            self._forget_file(old)
        return record

    async def restore(self, lease: Lease, record: SessionRecord) -> int:
        """Restore `record` into a free slot of the leased instance; the slot's number."""
        if (problem := incompatibility(record, lease.runtime)) is not None:
            raise ProtocolError(400, problem)
        slot = await self._restore(lease, record)
        if slot is None:
            raise ProtocolError(
                409, f"every slot of model '{lease.runtime.name}' is busy: retry in a moment"
            )
        return slot

    def remove(self, name: str) -> SessionRecord:
        record = self.find(name)
        self._drop(record, "removed")
        return record

    # -- the bank ---------------------------------------------------------------------

    async def bank(self, pool: Pool) -> None:
        """The scheduler's `before_stop` hook: bank the slots that hold a conversation."""
        runtime = pool.runtime
        current = self._runtimes().get(runtime.name)
        if not runtime.session_bank or current is None or current.sha256 != runtime.sha256:
            return  # banking off, or the model was removed or its file changed
        for member in pool.members:
            url = member.instance.url
            if member.instance.state is not State.READY or url is None:
                continue
            try:
                slots = await self._slots(url)
            except UpstreamError:
                continue
            for slot in slots:
                if slot.get("id_task") is None or slot.get("is_processing"):
                    continue
                name = f"{session_files.BANK_PREFIX}{uuid.uuid4().hex[:12]}"
                with contextlib.suppress(UpstreamError, ProtocolError):
                    record = await self._save_slot(url, int(slot["id"]), runtime, name, BANK)
                    if record is not None:
                        self._add_to_bank(record)
        self.prune()

    def _add_to_bank(self, record: SessionRecord) -> None:
        tokens = self.tokens(record)
        if tokens is None:  # a layout Blazar cannot read: nothing to match a prompt with
            self._forget_file(record)
            return
        banked = self._bank.setdefault(record.model, {})
        known = {n: t for n, r in banked.items() if (t := self.tokens(r)) is not None}
        drop, redundant = session_files.superseded(tokens, known)
        if redundant:
            self._forget_file(record)
            return
        for name in drop:
            self._drop(banked[name], "superseded")
        self.store.put_session(record)
        banked[record.name] = record

    def prune(self) -> None:
        """Drop banked sessions of removed models or changed files, then the least recently
        used ones beyond `bank_mb`."""
        records = self.store.list_sessions(kind=BANK)
        runtimes = self._runtimes()
        for record in records:
            runtime = runtimes.get(record.model)
            if runtime is None or runtime.sha256 != record.model_sha256:
                self._drop(record, "model removed" if runtime is None else "model changed")
        kept = [r for r in records if r.name in self._bank.get(r.model, {})]
        sizes = [(r.name, r.size) for r in kept]
        by_name = {r.name: r for r in kept}
        for name in session_files.over_budget(sizes, self.bank_mb * MIB):
            self._drop(by_name[name], "over session_bank_mb")

    def sweep(self) -> None:
        """Remove files no record names (a save interrupted by a crash)."""
        named = {r.file for r in self.store.list_sessions()}
        for path in self.directory.iterdir():
            if path.is_file() and path.name not in named:
                with contextlib.suppress(OSError):
                    path.unlink()

    # -- the request path -------------------------------------------------------------

    def wants_tokens(self, lease: Lease) -> bool:
        """Whether `route` needs this request's prompt tokens: a restored slot awaits its
        request, or banked sessions of the model are not restored into this child yet."""
        key = instance_id(lease.member.instance)
        if self._routes.get(key):
            return True
        runtime = lease.runtime
        banked = self._bank.get(runtime.name)
        if not runtime.session_bank or not banked:
            return False
        restored = self._restored.get(key, set())
        return any(
            n not in restored and incompatibility(r, runtime) is None for n, r in banked.items()
        )

    async def route(self, lease: Lease, prompt: Sequence[int]) -> int | None:
        """The slot this prompt must go to, restoring a banked session into one first; None
        to let the engine choose."""
        key = instance_id(lease.member.instance)
        routes = self._routes.get(key, {})
        waiting = {str(slot): tokens for slot, tokens in routes.items()}
        if (hit := session_files.best_match(prompt, waiting, minimum=1)) is not None:
            slot = int(hit[0])
            del self._routes[key][slot]  # its request came; the engine's own matching follows
            return slot
        runtime = lease.runtime
        if not runtime.session_bank:
            return None
        restored = self._restored.get(key, set())
        candidates = {
            name: tokens
            for name, record in self._bank.get(runtime.name, {}).items()
            if name not in restored
            and incompatibility(record, runtime) is None
            and (tokens := self.tokens(record)) is not None
        }
        hit = session_files.best_match(prompt, candidates)
        if hit is None:
            return None
        record = self._bank[runtime.name][hit[0]]
        try:
            restored_into = await self._restore(lease, record)
        except (ProtocolError, UpstreamError):
            return None  # served without the cache: slower, never wrong
        if restored_into is not None:
            self._routes.get(key, {}).pop(restored_into, None)  # this request is its own
        return restored_into

    # -- the engine ---------------------------------------------------------------------

    def tokens(self, record: SessionRecord) -> Tokens | None:
        """The tokens a session's file holds (read once)."""
        if record.file not in self._tokens:
            path = self.directory / record.file
            self._tokens[record.file] = session_files.read_tokens(path, record.n_tokens)
        return self._tokens[record.file]

    async def _slots(self, url: str) -> list[dict[str, Any]]:
        status, slots = await self.children.json(url, "/slots")
        if status != 200 or not isinstance(slots, list):
            raise ProtocolError(502, f"the engine did not list its slots ({status}): {slots}")
        return [s for s in slots if isinstance(s, dict)]

    async def _save_slot(
        self, url: str, slot: int, runtime: ModelRuntime, name: str, kind: str
    ) -> SessionRecord | None:
        """Have the engine write slot `slot` to a temporary file, check it and rename it;
        the record to keep, or None when the slot held nothing."""
        stem = uuid.uuid4().hex
        partial = self.directory / f"{stem}.part"
        try:
            status, data = await self.children.json(
                url, f"/slots/{slot}?action=save", {"filename": partial.name}
            )
            if status != 200 or not isinstance(data, dict):
                raise ProtocolError(502, f"the engine did not save slot {slot}: {data}")
            n_saved, written = data.get("n_saved"), data.get("n_written")
            size = partial.stat().st_size
            if not isinstance(n_saved, int) or size != written:
                raise ProtocolError(
                    502, f"slot {slot}'s file has {size} bytes, the engine says {written}"
                )
            if n_saved == 0:
                return None
            final = self.directory / f"{stem}.slot"
            os.replace(partial, final)
        finally:
            with contextlib.suppress(OSError):
                partial.unlink()
        return SessionRecord(
            name=name,
            model=runtime.name,
            kind=kind,
            file=final.name,
            n_tokens=n_saved,
            size=size,
            model_sha256=runtime.sha256,
            engine_tag=runtime.engine_tag,
            cache_type=runtime.cache.kv_type,
        )

    async def _restore(self, lease: Lease, record: SessionRecord) -> int | None:
        instance: Instance = lease.member.instance
        key = instance_id(instance)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            routes = self._routes.setdefault(key, {})
            slot = choose_slot(await self._slots(lease.url), set(routes))
            if slot is None:
                return None
            status, data = await self.children.json(
                lease.url, f"/slots/{slot}?action=restore", {"filename": record.file}
            )
            if status != 200 or not isinstance(data, dict):
                logger.warning("restoring session %s failed: %s", record.name, data)
                if record.kind == BANK:
                    self._drop(record, "restore failed")
                raise ProtocolError(
                    502, f"the engine did not restore session '{record.name}': {data}"
                )
            self._restored.setdefault(key, set()).add(record.name)
            for stale in [k for k in self._routes if k[0] == key[0] and k != key]:
                self._routes.pop(stale, None)  # an earlier child of this instance
                self._restored.pop(stale, None)
                self._locks.pop(stale, None)
            if (tokens := self.tokens(record)) is not None:
                routes[slot] = tokens
            self.store.touch_session(record.name)
            return slot

    # -- records and files ---------------------------------------------------------------

    def _drop(self, record: SessionRecord, reason: str) -> None:
        self.store.delete_session(record.name, reason)
        self._bank.get(record.model, {}).pop(record.name, None)
        self._forget_file(record)

    def _forget_file(self, record: SessionRecord) -> None:
        self._tokens.pop(record.file, None)
        with contextlib.suppress(OSError):
            (self.directory / record.file).unlink()
