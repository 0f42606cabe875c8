"""A free loopback port, for tests and benchmarks that start `blazar serve` on one.

Engine children never need this: they start with `--port 0` and say which port
they took (`blazar.host.children`). `blazar serve` itself takes its port from the
manifest or `--port`, so the tests (`tests/serving.py`) and `bench/` pick one
here; the small race (another process taking it first) is theirs to accept.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at the moment of asking."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
