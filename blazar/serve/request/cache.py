"""The response cache (docs/cache.md): a reproducible request answered from an earlier
identical one's answer, exact or semantic, before any slot is leased.

`Pipeline.serve` asks `ResponseCache.lookup` once the request is routed and planned
(step 4) and before the lease (step 5): a hit is replayed through the plan's own
`Answer` (`replay`: whole or streamed, in the client's protocol, the engine's shapes
written by `blazar.protocols.replay`), a miss goes on with the plan's answer wrapped
(`Recording`) so that a finished answer is stored, and a bypass goes on untouched. The
decisions are pure functions (`cache_applies`, `wanted_tiers`, `not_reproducible`,
`exact_key`, `bucket_key`, `last_user_text`, `identity`); the effects (the store's
`cache_entries`, the in-memory vectors, the embedding call) are `ResponseCache`'s.

Safe by construction: an exact key names the scope (the API key, unless global), the
model's identity (weights, engine, template, defaults, system prompt, adapters: every
setting that changes an answer) and the whole canonical engine request; only a
reproducible request (temperature 0, or a seed on a deterministic model; never n > 1
or logprobs) is stored or answered. A semantic hit needs everything but the last user
message byte-identical (the prefix bucket: the same system prompt, earlier turns,
tools and sampling), so an agent's conversation with any earlier turn changed is in
another bucket and never hits.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from blazar.observe.trace import CURRENT, current
from blazar.protocols import EngineRequest, ProtocolError
from blazar.protocols.replay import (
    PATHS,
    Collector,
    Recorded,
    engine_stream,
    engine_whole,
    recorded,
)
from blazar.protocols.sse import SSEDecoder
from blazar.serve.http import KEY_NAME, trace_id
from blazar.serve.request.asks import Answer, Answering, Ask, Plan
from blazar.serve.request.steps import EMBEDDINGS
from blazar.store.cache_entries import CacheEntry, CacheTable

if TYPE_CHECKING:
    from pathlib import Path

    import numpy as np

    from blazar.serve.supervisor.runtime import ModelRuntime
    from blazar.serve.supervisor.scheduler import Target
    from specs.serving import ResponseCache as CacheSettings

logger = logging.getLogger("blazar.serve")

HEADER = "x-blazar-cache"
EXACT, SEMANTIC = "exact", "semantic"
# Fields of an engine body that change how an answer travels, not what it says.
TRANSPORT = frozenset({"stream", "stream_options", "model", "keep_alive", "cache_prompt"})
Embed = Callable[[str, str], Awaitable[list[float]]]


# -- decisions (pure) ---------------------------------------------------------------


def cache_applies(settings: CacheSettings, model: str, headers: Mapping[str, str]) -> bool:
    """Whether a request for `model` with these headers may be answered from the cache:
    for the relay lane's up-front decision (such requests take the interpreted path).
    The embeddings model of the semantic tier is never cached."""
    return bool(settings.enabled and model != settings.model and wanted_tiers(settings, headers))


def wanted_tiers(settings: CacheSettings, headers: Mapping[str, str]) -> tuple[str, ...]:
    """The tiers a request may use: the manifest's, narrowed by `x-blazar-cache`
    (off | exact | semantic) and `Cache-Control` (no-cache, no-store: none)."""
    if not settings.enabled:
        return ()
    control = headers.get("Cache-Control", "").lower()
    if "no-cache" in control or "no-store" in control:
        return ()
    asked = headers.get(HEADER, "").strip().lower()
    tiers = tuple(t for t in (EXACT, SEMANTIC) if t in settings.tiers)
    if SEMANTIC in tiers and settings.model is None:
        tiers = tuple(t for t in tiers if t != SEMANTIC)
    if asked == "off":
        return ()
    if asked == EXACT:
        return tuple(t for t in tiers if t == EXACT)
    return tiers


def bypass_reason(settings: CacheSettings, headers: Mapping[str, str]) -> str:
    control = headers.get("Cache-Control", "").lower()
    if "no-store" in control:
        return "no-store"
    if "no-cache" in control:
        return "no-cache"
    if headers.get(HEADER, "").strip().lower() == "off":
        return "off"
    return "no tier"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def not_reproducible(
    body: Mapping[str, Any], params: Mapping[str, Any], deterministic: bool
) -> str | None:
    """Why the answer to `body` may differ from one call to the next (None: it may not):
    sampled (temperature above 0, unless a seed on a model served deterministic), several
    choices, or log probabilities asked for."""
    n = body.get("n", 1)
    if n not in (1, None):
        return "n > 1"
    if body.get("logprobs") or body.get("top_logprobs") or body.get("n_probs"):
        return "logprobs"
    temperature = body.get("temperature", params.get("temperature"))
    if _number(temperature) and temperature == 0:
        return None
    seed = body.get("seed", params.get("seed"))
    if deterministic and isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
        return None
    return "not reproducible: set temperature 0, or a seed on a deterministic model"


def _digest(*parts: Any) -> str:
    return hashlib.sha256(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)).hexdigest()


def canonical(path: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The request as the cache names it: the engine endpoint and body, without what only
    changes how the answer travels (streamed or not, the name it was asked by)."""
    return {"path": path, "body": {k: v for k, v in body.items() if k not in TRANSPORT}}


def exact_key(scope: str, model_identity: str, request: Mapping[str, Any]) -> str:
    return _digest("exact", scope, model_identity, request)


def last_user_text(body: Mapping[str, Any]) -> str | None:
    """The last message's text, when the conversation ends with a user's text message
    (OpenAI's and Anthropic's shapes); None: no semantic lookup."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return None
    last = messages[-1]
    if last.get("role") != "user":
        return None
    content = last.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                return None  # images, tool results: exact only
            texts.append(str(part.get("text") or ""))
        return "\n".join(texts)
    return None


def bucket_key(scope: str, model_identity: str, request: Mapping[str, Any]) -> str:
    """The prefix bucket: everything but the last user message (the same system prompt,
    earlier turns, tools and sampling). `request` is `canonical`'s."""
    body = dict(request["body"])
    body["messages"] = body["messages"][:-1]
    return _digest("bucket", scope, model_identity, request["path"], body)


def _file(path: str | None) -> str | None:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return path
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def identity(runtime: ModelRuntime, target: Target) -> str:
    """Everything about a model that changes its answers: the weights (sha256, else the
    file's size and time), the engine, how it is started, the chat template, the system
    prompt and defaults, the adapters (files, scales, the request's choice), the cache
    settings, the projector."""
    return _digest(
        runtime.sha256 or _file(runtime.path),
        runtime.engine_tag,
        runtime.engine_lane,
        list(runtime.command),
        list(runtime.extra_args),
        runtime.has_template,
        runtime.chat_template,
        runtime.system,
        dict(runtime.params),
        runtime.max_tokens,
        [(a.name, _file(a.path), a.scale, a.always_on) for a in runtime.adapters],
        repr(target.adapters),
        repr(runtime.cache),
        _file(runtime.projector),
    )


# -- the lookup's result ------------------------------------------------------------


@dataclass(slots=True)
class Lookup:
    """What the cache said about one request: `header` for the answer's `x-blazar-cache`;
    a hit's `entry` (and `similarity` for a semantic one); on a miss, what storing the
    answer needs (`key`, `bucket`, `vector`)."""

    header: str
    tier: str | None = None
    entry: CacheEntry | None = None
    similarity: float | None = None
    stores: bool = False
    key: str = ""
    scope: str = ""
    model: str = ""
    identity: str = ""
    bucket: str = ""
    request: str = ""
    vector: bytes | None = None
    path: str = ""

    @property
    def hit(self) -> bool:
        return self.entry is not None

    def trail(self, now: float) -> dict[str, Any]:
        """For the request's trace (`blazar why`)."""
        out: dict[str, Any] = {"result": self.header, "tier": self.tier}
        if self.entry is not None:
            out["similarity"] = self.similarity
            out["age_s"] = round(now - self.entry.created, 3)
            out["produced_by"] = self.entry.trace_id
        return out


def bypass(reason: str) -> Lookup:
    return Lookup(f"bypass ({reason})")


# -- the in-memory vectors of the semantic tier --------------------------------------


class _Bucket:
    """One prefix bucket's vectors: unit rows of one growing float32 matrix (a removed
    entry's row is zeroed: cosine 0, never a hit) and, past INDEX_AT rows where the
    optional `usearch` package is installed (`pip install 'blazar[cache]'`), an HNSW
    index over them. The brute-force scan is one matrix-vector product: measured at 100k
    rows, 6.5 ms at 64 dimensions and 26 ms at 640 (docs/cache.md), over the 5 ms goal;
    the index answers in about 0.2 ms. It is built in a thread from a snapshot (100k rows
    of 640 take minutes on two cores) while the scan goes on answering; rows added since
    are added to it when it is adopted, and each new row after that."""

    INDEX_AT = 20_000  # rows: the scan of 20k rows of 640 floats is about 5 ms
    CANDIDATES = 8  # the index's nearest, rescored exactly (it keeps int8)
    # Build workers: 0 is every core. The build is once per bucket (then one row per
    # store) and the scan answers meanwhile, so it is done as fast as the machine can.
    THREADS = 0

    def __init__(self) -> None:
        self.keys: list[str | None] = []  # by row; None: removed
        self.rows: dict[str, int] = {}
        self.matrix: Any = None  # np.ndarray, capacity doubled as it fills
        self.index: Any = None  # usearch.index.Index over rows [0, indexed)
        self.indexed = 0
        self._building: threading.Thread | None = None
        self._built: tuple[Any, int] | None = None  # (index, rows in it), from the thread
        self._removed: list[int] = []  # rows removed while a build runs
        self.built_s: float | None = None  # how long the last build took

    @classmethod
    def of(cls, keys: list[str], blobs: list[bytes]) -> _Bucket:
        """A bucket of stored float32 vectors at once (the load from the store): one
        matrix, normalized in one go; a vector of another width than the first (another
        embeddings model's) or zero is left out, as `add` leaves it. Past INDEX_AT rows
        the index's build starts."""
        import numpy as np

        bucket = cls()
        if not blobs:
            return bucket
        width = len(blobs[0])
        kept = [(k, b) for k, b in zip(keys, blobs, strict=True) if len(b) == width]
        matrix = np.frombuffer(b"".join(b for _, b in kept), dtype=np.float32)
        matrix = matrix.reshape(len(kept), width // 4).copy()
        norms = np.linalg.norm(matrix, axis=1)
        good = np.isfinite(norms) & (norms > 0)
        matrix = matrix[good] / norms[good, None]
        bucket.matrix = np.ascontiguousarray(matrix, dtype=np.float32)
        live = [k for (k, _), g in zip(kept, good, strict=True) if g]
        bucket.keys = list(live)
        bucket.rows = {k: n for n, k in enumerate(live)}
        if len(bucket.keys) >= cls.INDEX_AT:
            bucket._build(len(bucket.keys))
        return bucket

    def add(self, key: str, vector: np.ndarray) -> None:
        import numpy as np

        if key in self.rows:
            self.remove(key)
        n = len(self.keys)
        if self.matrix is None or self.matrix.shape[1] != vector.shape[0]:
            if self.matrix is not None and n:
                return  # another embeddings model's vector: that model's entries are stale
            self.matrix = np.zeros((16, vector.shape[0]), dtype=np.float32)
        elif n == self.matrix.shape[0]:
            grown = np.zeros((2 * n, self.matrix.shape[1]), dtype=np.float32)
            grown[:n] = self.matrix
            self.matrix = grown
        self.matrix[n] = vector
        self.keys.append(key)
        self.rows[key] = n
        if self.index is not None and self.indexed == n:
            self.index.add(n, vector)
            self.indexed = n + 1

    def remove(self, key: str) -> None:
        row = self.rows.pop(key, None)
        if row is None:
            return
        self.keys[row] = None
        self.matrix[row] = 0.0
        if self.index is not None and row < self.indexed:
            self.index.remove(row)
        if self._building is not None:
            self._removed.append(row)

    def best(self, vector: np.ndarray) -> tuple[str, float] | None:
        """The nearest live entry by cosine (rows and `vector` are unit vectors)."""
        import numpy as np

        self._adopt()
        n = len(self.keys)
        if not self.rows or self.matrix.shape[1] != vector.shape[0]:
            return None  # empty, or another embeddings model's vectors
        if self.index is None:
            if n >= self.INDEX_AT:
                self._build(n)
            scores = self.matrix[:n] @ vector
            at = int(np.argmax(scores))
            key = self.keys[at]
            return (key, float(scores[at])) if key is not None else None
        found = self.index.search(vector, self.CANDIDATES)
        rows = [int(k) for k in np.atleast_1d(found.keys)]
        rows += range(self.indexed, n)  # not in the index yet
        live = [r for r in rows if 0 <= r < n and self.keys[r] is not None]
        if not live:
            return None
        scores = self.matrix[live] @ vector
        at = int(np.argmax(scores))
        key = self.keys[live[at]]
        assert key is not None
        return key, float(scores[at])

    def _build(self, n: int) -> None:
        """Start building the index over rows [0, n), in a thread, if `usearch` is here."""
        import numpy as np

        if self._building is not None:
            return
        try:
            from usearch.index import Index
        except ImportError:
            return
        snapshot = self.matrix[:n].copy()

        def build() -> None:
            # A wider search than usearch's default (64): a candidate it misses is a miss,
            # never a wrong hit (candidates are rescored exactly), but a miss all the same;
            # at 100k random rows of 640, 128 found a stored row 97.0% of the time, 256
            # 99.8% (docs/cache.md). int8 rows: the build is about 3x faster than with
            # f16, and the candidates are rescored in float32 anyway.
            begin = time.perf_counter()
            index = Index(ndim=snapshot.shape[1], metric="ip", dtype="i8", expansion_search=256)
            live = np.flatnonzero(snapshot.any(axis=1))  # removed rows are zeroed
            if live.size:  # one batch: usearch releases the GIL and spreads it over cores
                index.add(live.astype(np.uint64), snapshot[live], threads=self.THREADS)
            self.built_s = time.perf_counter() - begin
            logger.info(
                "response cache: a bucket's index of %d rows built in %.1f s", n, self.built_s
            )
            self._built = (index, n)

        self._building = threading.Thread(target=build, name="cache-index", daemon=True)
        self._building.start()

    def _adopt(self) -> None:
        """A finished build: rows added and removed since its snapshot brought up to date."""
        built = self._built
        if built is None:
            return
        index, upto = built
        self._built, self._building = None, None
        for row in self._removed:
            if row < upto:
                index.remove(row)  # a row not in it (zeroed before the snapshot): a no-op
        self._removed = []
        for row in range(upto, len(self.keys)):
            if self.keys[row] is not None:
                index.add(row, self.matrix[row])
        self.index, self.indexed = index, len(self.keys)


def load_buckets(db: Path) -> dict[str, _Bucket]:
    """Every semantic entry's vector in the store at `db`, by bucket (run in a thread:
    it opens its own connection)."""
    grouped: dict[str, tuple[list[str], list[bytes]]] = {}
    table = CacheTable(db)
    try:
        for bucket, key, blob, _created in table.vectors():
            keys, blobs = grouped.setdefault(bucket, ([], []))
            keys.append(key)
            blobs.append(blob)
    finally:
        table.close()
    return {bucket: _Bucket.of(keys, blobs) for bucket, (keys, blobs) in grouped.items()}


def unit(values: list[float] | bytes) -> np.ndarray | None:
    """A float32 unit vector; None for an empty or zero one."""
    import numpy as np

    if isinstance(values, bytes):
        vector = np.frombuffer(values, dtype=np.float32)
    else:
        vector = np.asarray(values, dtype=np.float32)
    norm = float(np.linalg.norm(vector)) if vector.size else 0.0
    if not norm or not np.isfinite(norm):
        return None
    return (vector / norm).astype(np.float32)


# -- the cache ----------------------------------------------------------------------


@dataclass
class Counters:
    hits: dict[str, int] = field(default_factory=lambda: {EXACT: 0, SEMANTIC: 0})
    misses: dict[str, int] = field(default_factory=lambda: {EXACT: 0, SEMANTIC: 0})
    bypasses: int = 0
    stored: int = 0
    evictions: dict[str, int] = field(default_factory=dict)  # by reason

    def evicted(self, reason: str, count: int) -> None:
        if count:
            self.evictions[reason] = self.evictions.get(reason, 0) + count


class ResponseCache:
    """The cache's entries (the store's `cache_entries` at `db`; None: nothing is kept),
    the semantic tier's vectors in memory, and the counters `/metrics` reads. Lives on
    serve's event loop: every method is called from it."""

    SWEEP_S = 60.0  # how often at most a store sweeps entries past their ttl

    def __init__(self, db: Path | None, embed: Embed | None = None) -> None:
        self.db = db
        self.embed = embed
        self._table: CacheTable | None = None
        self._buckets: dict[str, _Bucket] | None = None
        # The vectors' load from the store, in a thread (100k rows take seconds): what
        # is stored or deleted meanwhile waits in `_pending`, applied once it is in.
        self._loading: asyncio.Future[dict[str, _Bucket]] | None = None
        self._pending: list[tuple[str, str, np.ndarray | None]] = []
        self._identities: dict[str, str] = {}  # model -> the identity its entries have
        self._memo: tuple[Any, Any, str] | None = None
        self.counters = Counters()
        self._swept = 0.0
        self._bytes: int | None = None

    # -- the store, opened on first use ---------------------------------------------

    def _opened(self) -> CacheTable | None:
        if self._table is None and self.db is not None:
            self._table = CacheTable(self.db)
        return self._table

    async def _vectors(self) -> dict[str, _Bucket]:
        """The semantic tier's buckets, loaded from the store on first use in a thread,
        so that the event loop goes on serving meanwhile (one load, however many
        lookups wait for it)."""
        if self._buckets is not None:
            return self._buckets
        assert self.db is not None
        if self._loading is None:
            self._pending = []
            self._loading = asyncio.ensure_future(asyncio.to_thread(load_buckets, self.db))
        loading = self._loading
        try:
            buckets = await asyncio.shield(loading)
        except Exception:
            if self._loading is loading:
                self._loading = None
            raise
        if self._buckets is None:  # the first waiter back applies what happened meanwhile
            for bucket, key, vector in self._pending:
                if vector is None:
                    if bucket in buckets:
                        buckets[bucket].remove(key)
                else:
                    buckets.setdefault(bucket, _Bucket()).add(key, vector)
            self._buckets, self._pending, self._loading = buckets, [], None
        return self._buckets

    def _vector_added(self, bucket: str, key: str, vector: np.ndarray | None) -> None:
        """A vector stored (or, `None`, removed): into its bucket, or queued for the load
        under way. Before any load nothing is kept: the load reads it from the store."""
        if self._buckets is not None:
            if vector is not None:
                self._buckets.setdefault(bucket, _Bucket()).add(key, vector)
            elif bucket in self._buckets:
                self._buckets[bucket].remove(key)
        elif self._loading is not None:
            self._pending.append((bucket, key, vector))

    def close(self) -> None:
        if self._table is not None:
            self._table.close()
            self._table = None

    def _forget(self, gone: list[tuple[str, str]], reason: str) -> int:
        for bucket, key in gone:
            if bucket:
                self._vector_added(bucket, key, None)
        self.counters.evicted(reason, len(gone))
        self._bytes = None
        return len(gone)

    # -- the lookup -----------------------------------------------------------------

    def _identity(self, runtime: ModelRuntime, target: Target) -> str:
        memo = self._memo
        if memo is not None and memo[0] is runtime and memo[1] == target.adapters:
            return memo[2]
        found = identity(runtime, target)
        self._memo = (runtime, target.adapters, found)
        return found

    def _same_model(self, table: CacheTable, model: str, found: str) -> None:
        """A model's entries made under another identity (new weights, a changed setting,
        an adapter replaced; a hot reload or a restart) are dropped when it is next seen."""
        if self._identities.get(model) == found:
            return
        self._identities[model] = found
        self._forget(table.delete("model = ? AND identity != ?", (model, found)), "model changed")

    async def lookup(
        self, request: web.Request, ask: Ask, target: Target, plan: Plan, settings: CacheSettings
    ) -> Lookup:
        """Step 4b: a hit, a miss to store, or a bypass (with why), noted on the request's
        trace (`blazar why`)."""
        look = await self._lookup(request, ask, target, plan, settings)
        if (trace := current()) is not None:
            trace.result.response_cache = look.trail(time.time())
        return look

    async def _lookup(
        self, request: web.Request, ask: Ask, target: Target, plan: Plan, settings: CacheSettings
    ) -> Lookup:
        tiers = wanted_tiers(settings, request.headers)
        if not tiers:
            self.counters.bypasses += 1
            return bypass(bypass_reason(settings, request.headers))
        runtime = target.runtime
        engine = plan.engine
        if engine.path not in PATHS or plan.prepare is not None or ask.body.get("mcp") is not None:
            self.counters.bypasses += 1
            return bypass(f"{engine.path} is not cached")
        why = not_reproducible(engine.body, runtime.params, runtime.cache.deterministic)
        if why is not None:
            self.counters.bypasses += 1
            return bypass(why)
        table = self._opened()
        if table is None:
            return bypass("no store")
        now = time.time()
        scope = "*" if settings.scope == "global" else (request.get(KEY_NAME) or "")
        found = self._identity(runtime, target)
        self._same_model(table, runtime.name, found)
        canon = canonical(engine.path, engine.body)
        key = exact_key(scope, found, canon)
        look = Lookup(
            "miss",
            stores="no-store" not in request.headers.get("Cache-Control", "").lower(),
            key=key,
            scope=scope,
            model=runtime.name,
            identity=found,
            request=orjson.dumps(canon, option=orjson.OPT_SORT_KEYS).decode(),
            path=engine.path,
        )
        entry = table.get(key) if EXACT in tiers or SEMANTIC in tiers else None
        if entry is not None and self._fresh(table, entry, now, settings):
            self.counters.hits[EXACT] += 1
            look.header, look.tier, look.entry = "hit-exact", EXACT, entry
            table.touch(key, now)
            return look
        self.counters.misses[EXACT] += 1
        text = last_user_text(canon["body"]) if SEMANTIC in tiers else None
        if text is None or self.embed is None or settings.model is None:
            return look
        look.bucket = bucket_key(scope, found, canon)
        try:
            vector = unit(await self._embedding(settings.model, text))
        except ProtocolError as exc:  # the embeddings model failed: exact tier only
            look.header = f"miss (semantic: {exc.message})"
            return look
        if vector is None:
            return look
        look.vector = vector.tobytes()
        nearest = (await self._vectors()).get(look.bucket)
        best = nearest.best(vector) if nearest is not None else None
        if best is not None and best[1] >= settings.threshold:
            entry = table.get(best[0])
            if entry is not None and self._fresh(table, entry, now, settings):
                self.counters.hits[SEMANTIC] += 1
                look.header = f"hit-semantic; similarity={best[1]:.2f}"
                look.tier, look.entry, look.similarity = SEMANTIC, entry, round(best[1], 4)
                table.touch(entry.key, now)
                return look
        self.counters.misses[SEMANTIC] += 1
        return look

    async def _embedding(self, model: str, text: str) -> list[float]:
        """The embedding, through the one pipeline, off the client's trace (the trace
        is the client's request, not this helper call)."""
        assert self.embed is not None
        token = CURRENT.set(None)
        try:
            return await self.embed(model, text)
        finally:
            CURRENT.reset(token)

    def _fresh(
        self, table: CacheTable, entry: CacheEntry, now: float, settings: CacheSettings
    ) -> bool:
        if settings.ttl >= 0 and now - entry.created > settings.ttl:
            self._forget(table.delete("key = ?", (entry.key,)), "ttl")
            return False
        return True

    # -- storing an answer ----------------------------------------------------------

    def store(self, look: Lookup, rec: Recorded, produced_by: str, settings: CacheSettings) -> None:
        table = self._opened()
        if table is None or not look.stores:
            return
        now = time.time()
        answer = rec.to_json()
        size = len(answer) + len(look.request) + len(look.vector or b"") + 200
        if size > settings.max_bytes:
            return
        entry = CacheEntry(
            look.key,
            look.scope,
            look.model,
            look.identity,
            look.bucket if look.vector is not None else "",
            look.request,
            answer,
            look.vector,
            now,
            now,
            size,
            produced_by,
        )
        table.put(entry)
        self.counters.stored += 1
        if look.vector is not None:
            vector = unit(look.vector)
            if vector is not None:
                self._vector_added(look.bucket, look.key, vector)
        if self._bytes is not None:
            self._bytes += size
        self._bound(table, now, settings)

    def _bound(self, table: CacheTable, now: float, settings: CacheSettings) -> None:
        """TTL (at most once a SWEEP_S) and max_bytes (least recently used out).

        The table's size is a running count (`_bytes`: summed once, then each stored
        entry added; forgotten on any delete): summing the table on every store cost a
        miss ~70 ms at 100k entries (bench/cache.py --fill) vs 12.8 ms at 3,000. A
        replaced entry counts twice, so the sum is taken again before evicting."""
        if settings.ttl >= 0 and now - self._swept >= self.SWEEP_S:
            self._swept = now
            self._forget(table.delete("created < ?", (now - settings.ttl,)), "ttl")
        if self._bytes is None or self._bytes > settings.max_bytes:
            _, self._bytes = table.totals()
        if self._bytes > settings.max_bytes:
            gone = table.oldest_used(self._bytes - settings.max_bytes)
            self._forget(table.delete_keys([k for _, k in gone]), "max_bytes")

    # -- the API's actions ----------------------------------------------------------

    def clear(self, model: str | None = None, key: str | None = None) -> int:
        """Delete the entries of `model` and/or of API key `key` (neither: all)."""
        table = self._opened()
        if table is None:
            return 0
        where, args = ["1 = 1"], []
        if model is not None:
            where.append("model = ?")
            args.append(model)
        if key is not None:
            where.append("scope = ?")
            args.append(key)
        return self._forget(table.delete(" AND ".join(where), tuple(args)), "cleared")

    def keep_keys(self, names: set[str]) -> None:
        """The manifest's keys now: a removed key's entries are dropped."""
        table = self._opened()
        if table is None:
            return
        marks = ",".join("?" for _ in names)
        where = "scope NOT IN ('', '*')" + (f" AND scope NOT IN ({marks})" if names else "")
        self._forget(table.delete(where, tuple(sorted(names))), "key removed")

    def keep_models(self, names: set[str]) -> None:
        """The models served now: a removed model's entries are dropped."""
        table = self._opened()
        if table is None:
            return
        marks = ",".join("?" for _ in names)
        where = f"model NOT IN ({marks})" if names else "1 = 1"
        self._forget(table.delete(where, tuple(sorted(names))), "model removed")
        for gone in set(self._identities) - names:
            del self._identities[gone]

    def stats(self) -> dict[str, Any]:
        table = self._opened()
        entries, size = table.totals() if table is not None else (0, 0)
        models = table.by_model() if table is not None else []
        c = self.counters
        hits, misses = sum(c.hits.values()), c.misses[EXACT]
        return {
            "entries": entries,
            "bytes": size,
            "hits": dict(c.hits),
            "misses": dict(c.misses),
            "bypasses": c.bypasses,
            "stored": c.stored,
            "evictions": dict(c.evictions),
            "hit_ratio": round(hits / (hits + misses), 4) if hits + misses else None,
            "models": [{"model": m, "entries": n, "bytes": b} for m, n, b in models],
            "semantic": self._semantic_stats(),
        }

    def _semantic_stats(self) -> dict[str, Any]:
        """The vectors in memory: loaded yet, rows, and the buckets' indexes (built, or
        building in a thread; `build_s`: the slowest build's seconds)."""
        buckets = list((self._buckets or {}).values())
        built = [b for b in buckets if b.index is not None or b._built is not None]
        times = [b.built_s for b in buckets if b.built_s is not None]
        return {
            "loaded": self._buckets is not None,
            "buckets": len(buckets),
            "rows": sum(len(b.rows) for b in buckets),
            "indexes_built": len(built),
            "indexes_building": sum(
                1 for b in buckets if b._building is not None and b._built is None
            ),
            "build_s": round(max(times), 2) if times else None,
        }


# -- a hit replayed, a miss recorded ------------------------------------------------


def _answer_id() -> str:
    return uuid.uuid4().hex[:24]


async def replay(
    request: web.Request, ask: Ask, plan: Plan, look: Lookup, answering: Answering
) -> web.StreamResponse:
    """A hit, answered in the client's protocol through the plan's own `Answer`: the
    engine's answer written back from the entry, whole or streamed."""
    assert look.entry is not None
    rec = Recorded.from_json(look.entry.answer)
    engine = plan.engine
    answer = plan.answer(answering)
    headers = ask.envelope.headers(request)
    headers[HEADER] = look.header
    headers["Age"] = str(max(0, int(time.time() - look.entry.created)))
    created = int(time.time())
    payload = engine_whole(engine.path, rec, ask.model, _answer_id(), created)
    if (trace := current()) is not None:
        trace.sending(engine.path, engine.body)
        trace.answered(payload, 200)
    if not engine.stream:
        out = await answer.whole(payload)
        headers["Content-Type"] = "application/json"
        body = out if isinstance(out, bytes) else orjson.dumps(out)
        return web.Response(body=body, headers=headers)
    events = engine_stream(engine.path, rec, ask.model, _answer_id(), created)
    response = web.StreamResponse(
        headers={
            "Content-Type": answer.content_type or "text/event-stream",
            "Cache-Control": "no-cache",
            **headers,
        }
    )
    await response.prepare(request)
    try:
        if answer.raw:
            out = answer.feed_bytes(events) if answer.rewrites else events
            parts = [out]
        else:
            decoded = SSEDecoder().feed(events)
            parts = [answer.start(), *(answer.feed(e.data) for e in decoded)]
        parts.append(await answer.end())
        await response.write(b"".join(parts))
        await response.write_eof()
    except ConnectionError:  # the client went away
        pass
    return response


class Recording(Answer):
    """The plan's `Answer`, reading what passes through it: a finished answer (whole, or
    a stream that ended as a whole answer does) is stored under the miss's key."""

    def __init__(
        self,
        inner: Answer,
        cache: ResponseCache,
        look: Lookup,
        settings: CacheSettings,
        produced_by: str,
    ) -> None:
        super().__init__(inner.answering, inner.envelope)
        self.inner = inner
        self.content_type = inner.content_type
        self.raw = inner.raw
        self.rewrites = True  # every chunk passes here, to be read
        self.cache, self.look, self.settings, self.produced_by = cache, look, settings, produced_by
        self.collector = Collector(look.path)
        self.decoder = SSEDecoder() if inner.raw else None

    def _store(self, rec: Recorded | None) -> None:
        if rec is not None:
            self.cache.store(self.look, rec, self.produced_by, self.settings)

    async def whole(self, payload: bytes) -> bytes | dict[str, Any]:
        with contextlib.suppress(orjson.JSONDecodeError):
            self._store(recorded(self.look.path, orjson.loads(payload)))
        return await self.inner.whole(payload)

    def start(self) -> bytes:
        return self.inner.start()

    def feed(self, data: Any) -> bytes:
        self.collector.feed(data)
        return self.inner.feed(data)

    def feed_bytes(self, chunk: bytes) -> bytes:
        if self.decoder is not None:
            for event in self.decoder.feed(chunk):  # data: parsed JSON, or "[DONE]"
                self.collector.feed(event.data)
        return self.inner.feed_bytes(chunk) if self.inner.rewrites else chunk

    async def end(self) -> bytes:
        self._store(self.collector.result())
        return await self.inner.end()

    def error(self, failed: ProtocolError) -> bytes:
        self.collector.spoiled = True
        return self.inner.error(failed)

    def refusal(self, status: int, payload: Any) -> ProtocolError | None:
        return self.inner.refusal(status, payload)


def recording(
    plan: Plan, cache: ResponseCache, look: Lookup, settings: CacheSettings, request: web.Request
) -> Plan:
    """The plan with its answer read on the way out, to store a finished one."""
    from dataclasses import replace

    make = plan.answer
    produced_by = trace_id(request)
    return replace(
        plan,
        answer=lambda answering: Recording(make(answering), cache, look, settings, produced_by),
    )


# -- the embeddings call, as an Ask of the one pipeline ----------------------------------


class _Embedding(Answer):
    async def whole(self, payload: bytes) -> bytes:
        return payload


@dataclass
class EmbedAsk(Ask):
    """The semantic tier's embedding of one text, asked of the declared embeddings model
    through the pipeline (loaded and evicted like any model)."""

    text: str = ""

    def native(self, runtime: ModelRuntime, target: Target) -> Plan:
        engine = EngineRequest("/v1/embeddings", {"input": self.text, "model": self.model}, False)
        return Plan(engine, _Embedding)

    def openai(self, runtime: ModelRuntime | None) -> Plan:
        return self.native(runtime, None)  # type: ignore[arg-type]


def embed_ask(model: str, text: str) -> EmbedAsk:
    return EmbedAsk(model, "/v1/embeddings", {}, need=EMBEDDINGS, text=text)


def embedding_of(answer: Any) -> list[float]:
    """The vector of an OpenAI embeddings answer (`/v1/embeddings`)."""
    try:
        vector = answer["data"][0]["embedding"]
    except (KeyError, IndexError, TypeError):
        raise ProtocolError(
            502, "the embeddings model gave no embedding", "upstream_error"
        ) from None
    if not isinstance(vector, list):
        raise ProtocolError(502, "the embeddings model gave no embedding", "upstream_error")
    return vector
