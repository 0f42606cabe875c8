"""The access layer's decisions, apart from its effects: origins, hosts, rates, body memory.

Pure functions and small state holders that `blazar.serve.gateway.access` consults for
each request, tested with tables:

- `OriginPolicy`: which browser origins may call the gateway (ollama's defaults:
  pages on localhost/127.0.0.1/[::1] at any port, and app://, file://, tauri://,
  vscode-webview://, vscode-file:// pages; plus `serving.cors_origins`).
- `host_allowed`: whether a `Host` header names this gateway (DNS rebinding: a
  page on evil.example whose name later resolves to 127.0.0.1 sends
  `Host: evil.example`).
- `take_token`: a token bucket per key, `rpm` requests a minute with bursts of
  up to `rpm`; the wait until the next token is the 429's `Retry-After`.
- `BodyBudget`: the bytes of request bodies held in memory at once.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from specs.manifest import Manifest

DEFAULT_ORIGINS = (
    *(
        f"{scheme}://{host}{port}"
        for scheme in ("http", "https")
        for host in ("localhost", "127.0.0.1", "[::1]")
        for port in ("", ":*")
    ),
    "app://*",
    "file://*",
    "tauri://*",
    "vscode-webview://*",
    "vscode-file://*",
)
CACHE_LIMIT = 1024  # decisions remembered per policy; a flood of new values is recomputed


def origin_pattern(pattern: str) -> re.Pattern[str]:
    """An origin pattern as a regex: '*' matches within one part; a trailing ':*' is a port."""
    text = pattern.strip().lower().rstrip("/")
    if text == "*":
        return re.compile(r".*")
    port = text.endswith(":*")
    body = re.escape(text[:-2] if port else text).replace(r"\*", r"[^/]*")
    return re.compile(body + (r":[0-9]{1,5}" if port else ""))


class OriginPolicy:
    """Which `Origin` values may call the gateway; decisions are cached per origin."""

    def __init__(self, extra: Iterable[str] = ()) -> None:
        self.patterns = [origin_pattern(p) for p in (*DEFAULT_ORIGINS, *extra)]
        self._seen: dict[str, bool] = {}

    def allows(self, origin: str) -> bool:
        known = self._seen.get(origin)
        if known is None:
            # "null" (sandboxed frames, some file:// pages) is any page's: never allowed.
            text = origin.lower()
            known = text != "null" and any(p.fullmatch(text) for p in self.patterns)
            if len(self._seen) < CACHE_LIMIT:
                self._seen[origin] = known
        return known


def host_name(header: str) -> str:
    """The name in a Host header, lowercased, without its port: `[::1]:80` -> `::1`."""
    text = header.strip().lower()
    if text.startswith("["):
        return text[1:].partition("]")[0]
    name, _, port = text.rpartition(":")
    return (name if name and port.isdigit() else text).rstrip(".")


def host_allowed(header: str | None, names: frozenset[str]) -> bool:
    """Whether a request's Host names this gateway: localhost (and *.localhost), an IP
    address (a page cannot rebind a name it does not own to an address it has no server
    on), or one of `names` (bind address, this machine's hostname, serving.allowed_hosts;
    '*' for any). A request without Host (HTTP/1.0) is allowed: browsers always send one."""
    if not header:
        return True
    name = host_name(header)
    if "*" in names or name in names or name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """Whether a bind address reaches only this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class Bucket:
    """A key's token bucket: tokens left and when they were counted."""

    tokens: float
    at: float


def take_token(bucket: Bucket | None, rpm: int, now: float) -> tuple[Bucket, float | None]:
    """Take one request from the bucket: (the bucket after, None) or (unchanged, seconds to
    wait). A new bucket is full: `rpm` requests at once, then one every 60/rpm s."""
    rate = rpm / 60.0
    if bucket is None:
        bucket = Bucket(float(rpm), now)
    tokens = min(float(rpm), bucket.tokens + (now - bucket.at) * rate)
    if tokens >= 1.0:
        return Bucket(tokens - 1.0, now), None
    return Bucket(tokens, now), (1.0 - tokens) / rate


class BodyBudget:
    """Bytes of request bodies in memory at once, all requests together.

    `take` reserves `size` when it fits now; `reserve` also waits for releases up to
    `timeout`; a single body larger than the whole budget
    waits until it is alone. Event-loop thread only."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._freed = asyncio.Event()

    def _fits(self, size: int) -> bool:
        return self.used + size <= self.limit or self.used == 0

    def take(self, size: int) -> bool:
        """Reserve `size` bytes if they fit now (no waiting)."""
        if self._fits(size):
            self.used += size
            return True
        return False

    async def reserve(self, size: int, timeout: float) -> bool:
        """Reserve `size` bytes; False when they did not become free within `timeout`."""
        if self.take(size):
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self._fits(size):
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._freed.clear()
            try:
                async with asyncio.timeout(left):
                    await self._freed.wait()
            except TimeoutError:
                return False
        self.used += size
        return True

    def release(self, size: int) -> None:
        self.used -= size
        if size:
            self._freed.set()


def exposure(host: str, manifest: Manifest) -> str | None:
    """Why serving `manifest` on `host` is refused (None: it is not): an address beyond
    loopback with no key declared, unless serving.allow_unauthenticated."""
    if is_loopback(host) or manifest.keys or manifest.serving.allow_unauthenticated:
        return None
    return (
        f"refusing to serve on {host} with no API key: anyone who can reach it could use "
        "and manage this host. Add a key (`blazar keys add NAME --scope admin`), serve on "
        "127.0.0.1, or set serving.allow_unauthenticated = true if you mean it"
    )
