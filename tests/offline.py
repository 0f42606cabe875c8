"""The default suite is offline: a test not marked `network` reaches nothing beyond loopback.

`tests/conftest.py` applies `guard` to every test without the `network` mark. In the
pytest process it replaces `socket.socket.connect`/`connect_ex` and
`socket.getaddrinfo` (which `socket.create_connection`, urllib, httpx, aiohttp and
asyncio all go through) with versions that refuse any host that is not loopback
(or unspecified, as a bind address is), record the attempt, and raise
`NetworkBlocked`; the test then fails even if the code under test swallowed the
error. Child processes cannot be patched, so pip in them (Blazar's engine wheel
installs, `pip download`) is told to use no index and only the wheel cache
(`PIP_NO_INDEX`, `PIP_FIND_LINKS`): a wheel that is not cached fails the test
instead of being downloaded. `make test` fills that cache first.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HINT = (
    "tests reach only loopback unless marked: add @pytest.mark.network (it then runs "
    "only with BLAZAR_NETWORK=1), or serve what it needs on 127.0.0.1"
)


class NetworkBlocked(OSError):
    """A test without the `network` mark tried to reach a non-loopback host."""


def is_local(host: object) -> bool:
    """Loopback, unspecified (a bind address) or `localhost`; a name that needs DNS is not."""
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return False
    if host in ("", "localhost") or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


_INET = (socket.AF_INET, socket.AF_INET6)


def guard(monkeypatch: pytest.MonkeyPatch, wheel_cache: Path) -> list[str]:
    """Confine this test to loopback; returns the list its refused attempts are added to."""
    attempts: list[str] = []
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def refuse(what: str) -> NetworkBlocked:
        attempts.append(what)
        return NetworkBlocked(errno.ENETUNREACH, f"{what} refused: {HINT}")

    def checked(real: Callable[..., Any]) -> Callable[..., Any]:
        def connect(sock: socket.socket, address: Any) -> Any:
            if sock.family in _INET and not is_local(address[0]):
                raise refuse(f"connect to {address[0]}:{address[1]}")
            return real(sock, address)

        return connect

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_local(host):
            raise refuse(f"resolving {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", checked(real_connect))
    monkeypatch.setattr(socket.socket, "connect_ex", checked(real_connect_ex))
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheel_cache))
    return attempts
