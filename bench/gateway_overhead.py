"""How much the gateway costs: the same requests sent to a llama.cpp child directly and
through `blazar serve`, interleaved in one run.

    .venv/bin/python bench/gateway_overhead.py [--pairs 300] [--stream-tokens 256] ...

It sets up everything itself: a temporary BLAZAR_HOME, the tiny test model, a manifest,
a `blazar serve` subprocess (the engine wheel comes from BLAZAR_WHEEL_CACHE, by default
the tests' cache ~/.cache/blazar-tests/wheels), and it finds the child's port through
`GET /api/blazar/ps`. Then, with one client (aiohttp, one keep-alive session, the same
code for both paths; uvloop when it is installed), it measures:

1. latency of a small chat request, one at a time, direct and gateway alternating (the
   order flips every pair): the added median (gateway - direct) and both medians and p90s;
2. tokens/s of a streamed completion of N tokens, measured at the client from sending
   the request to the end of the stream, runs alternating: gateway / direct;
3. requests/s with 16 concurrent clients sending the small chat request, in alternating
   timed rounds: gateway / direct.

Every loop is bounded in count and in time, so the run ends by itself (about a minute
after setup). It prints a table with the targets (added <= 1 ms, stream >= 0.95,
concurrent >= 0.9) and whether each is met, stops serve (SIGTERM; serve stops its
child) and removes its files. Exit status: 0 when it measured (met or not), 1 when the
setup failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from blazar.engines.process import free_port
from blazar.testing.tiny import write_tiny_model

ENGINE_VERSION = "2026.10.11549"
MODEL = "tiny"
TARGET_ADDED_MS = 1.0
TARGET_STREAM = 0.95
TARGET_CONCURRENT = 0.90
SETUP_TIMEOUT = 180.0


class SetupFailed(Exception):
    """The benchmark could not start what it measures."""


@dataclass
class Options:
    pairs: int = 300  # latency: direct/gateway pairs (stops early at latency_seconds)
    latency_seconds: float = 25.0
    stream_tokens: int = 256
    stream_runs: int = 6  # per path
    stream_seconds: float = 30.0
    clients: int = 16
    rounds: int = 3  # concurrency: rounds per path
    round_seconds: float = 4.0
    slots: int = 4
    json_out: bool = False


@dataclass
class Results:
    latency: dict[str, list[float]] = field(default_factory=lambda: {"direct": [], "gateway": []})
    stream: dict[str, list[float]] = field(default_factory=lambda: {"direct": [], "gateway": []})
    rps: dict[str, list[float]] = field(default_factory=lambda: {"direct": [], "gateway": []})
    errors: dict[str, int] = field(default_factory=lambda: {"direct": 0, "gateway": 0})
    first_error: dict[str, str] = field(default_factory=dict)


# -- setup ---------------------------------------------------------------------------------


class Serve:
    """`blazar serve` in a subprocess, in a temporary home; stopped by PID."""

    def __init__(self, root: Path, slots: int) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = root / "serve.log"
        # In a folder of its own: serve watches the manifest's folder, and a pass on every
        # write of the log or the store would be measured too.
        self.manifest = root / "manifest" / "blazar.toml"
        self.manifest.parent.mkdir()
        model = write_tiny_model(root / "tiny.gguf")
        self.manifest.write_text(
            f"[serving]\nport = {self.port}\nkeep_alive = -1\n\n"
            f'[engines.llamacpp]\nversion = "{ENGINE_VERSION}"\n\n'
            f'[models.{MODEL}]\nsource = "{model.as_uri()}"\nctx = 512\nslots = {slots}\n'
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(os.environ, BLAZAR_HOME=str(self.root / "home"))
        default_cache = Path.home() / ".cache" / "blazar-tests" / "wheels"
        if "BLAZAR_WHEEL_CACHE" not in env and default_cache.is_dir():
            env["BLAZAR_WHEEL_CACHE"] = str(default_cache)
        exe = Path(sys.executable).with_name("blazar")
        command = [str(exe), "serve", str(self.manifest)] if exe.exists() else None
        command = command or [sys.executable, "-m", "blazar.cli.main", "serve", str(self.manifest)]
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, env=env)
        log.close()
        ready = threading.Event()
        threading.Thread(target=self._read_stdout, args=(ready,), daemon=True).start()
        deadline = time.monotonic() + SETUP_TIMEOUT
        while not ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SetupFailed(f"blazar serve did not start:\n{self.log_tail()}")

    def _read_stdout(self, ready: threading.Event) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:  # read to the end so serve never blocks on the pipe
            if b"Blazar is serving on" in line:
                ready.set()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # serve stops its child
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def served(options: Options) -> Iterator[Serve]:
    root = Path(tempfile.mkdtemp(prefix="blazar-bench-"))
    serve = Serve(root, options.slots)
    try:
        serve.start()
        yield serve
    finally:
        serve.stop()
        shutil.rmtree(root, ignore_errors=True)


# -- the client ----------------------------------------------------------------------------

CHAT = json.dumps(
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "temperature": 0,
    }
).encode()


def stream_body(tokens: int) -> bytes:
    return json.dumps(
        {
            "model": MODEL,
            "prompt": "Once upon a time",
            "max_tokens": tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
    ).encode()


HEADERS = {"Content-Type": "application/json"}


class Client:
    """One keep-alive session; the same code sends to either base URL."""

    def __init__(self, session: aiohttp.ClientSession, results: Results) -> None:
        self.session = session
        self.results = results

    async def chat(self, base: str, path: str) -> float:
        """Seconds for one small chat request (0.0 and an error counted if it failed)."""
        start = time.perf_counter()
        try:
            async with self.session.post(f"{base}/v1/chat/completions", data=CHAT) as resp:
                body = await resp.read()
                problem = None if resp.status == 200 else f"{resp.status} {body[:300]!r}"
        except aiohttp.ClientError as exc:
            problem = repr(exc)
        elapsed = time.perf_counter() - start
        if problem is not None:
            self.failed(path, problem)
            return 0.0
        return elapsed

    def failed(self, path: str, problem: str) -> None:
        self.results.errors[path] += 1
        self.results.first_error.setdefault(path, problem)

    async def stream(self, base: str, path: str, body: bytes, tokens: int) -> float:
        """Tokens/s of one streamed completion, from sending it to the end of the stream."""
        start = time.perf_counter()
        received = bytearray()
        try:
            async with self.session.post(f"{base}/v1/completions", data=body) as resp:
                async for chunk in resp.content.iter_any():
                    received += chunk
                problem = None if resp.status == 200 else f"{resp.status} {received[:300]!r}"
        except aiohttp.ClientError as exc:
            problem = repr(exc)
        elapsed = time.perf_counter() - start
        # One event per token, then the last one(s) and [DONE]: fewer means it stopped early.
        if problem is None and received.count(b"data: ") <= tokens:
            problem = f"the stream ended early: {bytes(received[-300:])!r}"
        if problem is not None:
            self.failed(path, problem)
            return 0.0
        return tokens / elapsed


# -- the three measurements ----------------------------------------------------------------


async def measure_latency(client: Client, urls: dict[str, str], options: Options) -> None:
    deadline = time.monotonic() + options.latency_seconds
    for i in range(options.pairs):
        if time.monotonic() > deadline:
            break
        order = ("direct", "gateway") if i % 2 == 0 else ("gateway", "direct")
        for path in order:
            seconds = await client.chat(urls[path], path)
            if seconds:
                client.results.latency[path].append(seconds * 1000)


async def measure_stream(client: Client, urls: dict[str, str], options: Options) -> None:
    body = stream_body(options.stream_tokens)
    deadline = time.monotonic() + options.stream_seconds
    for i in range(options.stream_runs):
        if time.monotonic() > deadline:
            break
        order = ("direct", "gateway") if i % 2 == 0 else ("gateway", "direct")
        for path in order:
            rate = await client.stream(urls[path], path, body, options.stream_tokens)
            if rate:
                client.results.stream[path].append(rate)


async def concurrent_round(client: Client, base: str, path: str, options: Options) -> float:
    """Requests/s of `clients` workers sending chat requests back to back for a round."""
    done = 0
    start = time.perf_counter()
    deadline = start + options.round_seconds
    cap = int(options.round_seconds * 5000)  # bound by count too

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline and done < cap:
            if await client.chat(base, path):
                done += 1

    await asyncio.gather(*(worker() for _ in range(options.clients)))
    return done / (time.perf_counter() - start)


async def measure_concurrent(client: Client, urls: dict[str, str], options: Options) -> None:
    for i in range(options.rounds):
        order = ("direct", "gateway") if i % 2 == 0 else ("gateway", "direct")
        for path in order:
            rate = await concurrent_round(client, urls[path], path, options)
            client.results.rps[path].append(rate)


async def find_child(session: aiohttp.ClientSession, gateway: str) -> str:
    """Load the model through the gateway, then read the child's port from /api/blazar/ps."""
    async with session.post(f"{gateway}/v1/chat/completions", data=CHAT) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise SetupFailed(f"the first request through the gateway failed: {text}")
    async with session.get(f"{gateway}/api/blazar/ps") as resp:
        rows = (await resp.json())["instances"]
    ports = [row["port"] for row in rows if row["model"] == MODEL and row["state"] == "ready"]
    if not ports:
        raise SetupFailed(f"no ready instance of {MODEL} in /api/blazar/ps: {rows}")
    return f"http://127.0.0.1:{ports[0]}"


async def run(gateway: str, options: Options) -> Results:
    results = Results()
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=HEADERS, auto_decompress=False
    ) as session:
        urls = {"direct": await find_child(session, gateway), "gateway": gateway}
        client = Client(session, results)
        warm = Options(
            pairs=30, latency_seconds=5, stream_tokens=32, stream_runs=2, rounds=1, round_seconds=1
        )
        warm.clients = options.clients
        steps: list[Callable[[Client, dict[str, str], Options], Awaitable[None]]] = [
            measure_latency,
            measure_stream,
            measure_concurrent,
        ]
        for step in steps:
            await step(client, urls, warm)
        client.results = results = Results()  # the warm-up does not count
        for step in steps:
            await step(client, urls, options)
    return results


# -- the report ----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(results: Results, options: Options) -> dict[str, Any]:
    lat = results.latency
    added = median(lat["gateway"]) - median(lat["direct"])
    stream_ratio = median(results.stream["gateway"]) / median(results.stream["direct"])
    rps_ratio = sum(results.rps["gateway"]) / sum(results.rps["direct"])
    return {
        "latency_ms": {
            path: {
                "median": median(lat[path]),
                "p90": percentile(lat[path], 0.9),
                "n": len(lat[path]),
            }
            for path in lat
        },
        "added_ms": added,
        "stream_tokens_per_s": {path: median(v) for path, v in results.stream.items()},
        "stream_ratio": stream_ratio,
        "requests_per_s": {path: sum(v) / len(v) for path, v in results.rps.items()},
        "concurrent_ratio": rps_ratio,
        "errors": results.errors,
        "met": {
            "added": added <= TARGET_ADDED_MS,
            "stream": stream_ratio >= TARGET_STREAM,
            "concurrent": rps_ratio >= TARGET_CONCURRENT,
        },
        "settings": {
            "pairs": len(lat["direct"]),
            "stream_tokens": options.stream_tokens,
            "stream_runs": len(results.stream["direct"]),
            "clients": options.clients,
            "rounds": options.rounds,
            "round_seconds": options.round_seconds,
            "slots": options.slots,
            "loop": type(asyncio.get_event_loop_policy()).__module__.split(".")[0],
            "cpus": os.cpu_count(),
        },
    }


def render(s: dict[str, Any]) -> str:
    def yes(ok: bool) -> str:
        return "yes" if ok else "NO"

    lat, settings = s["latency_ms"], s["settings"]
    rows = [
        ("measure", "direct", "gateway", "result", "target", "met"),
        (
            f"chat latency median, ms (n={settings['pairs']})",
            f"{lat['direct']['median']:.2f}",
            f"{lat['gateway']['median']:.2f}",
            f"+{s['added_ms']:.2f} ms",
            f"<= {TARGET_ADDED_MS:g} ms",
            yes(s["met"]["added"]),
        ),
        (
            "chat latency p90, ms",
            f"{lat['direct']['p90']:.2f}",
            f"{lat['gateway']['p90']:.2f}",
            f"+{lat['gateway']['p90'] - lat['direct']['p90']:.2f} ms",
            "",
            "",
        ),
        (
            f"stream tokens/s (N={settings['stream_tokens']}, runs={settings['stream_runs']})",
            f"{s['stream_tokens_per_s']['direct']:.0f}",
            f"{s['stream_tokens_per_s']['gateway']:.0f}",
            f"{s['stream_ratio']:.3f}x",
            f">= {TARGET_STREAM:g}x",
            yes(s["met"]["stream"]),
        ),
        (
            f"requests/s, {settings['clients']} clients ({settings['rounds']}x"
            f"{settings['round_seconds']:g}s)",
            f"{s['requests_per_s']['direct']:.0f}",
            f"{s['requests_per_s']['gateway']:.0f}",
            f"{s['concurrent_ratio']:.3f}x",
            f">= {TARGET_CONCURRENT:g}x",
            yes(s["met"]["concurrent"]),
        ),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    errors = s["errors"]
    lines.append("")
    lines.append(
        f"client loop: {settings['loop']}; cpus: {settings['cpus']}; model slots: "
        f"{settings['slots']}; failed requests: direct {errors['direct']}, "
        f"gateway {errors['gateway']}"
    )
    return "\n".join(lines)


def parse(argv: list[str] | None) -> Options:
    d = Options()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=d.pairs, help="latency pairs (direct+gateway)")
    p.add_argument("--stream-tokens", type=int, default=d.stream_tokens)
    p.add_argument("--stream-runs", type=int, default=d.stream_runs, help="per path")
    p.add_argument("--clients", type=int, default=d.clients)
    p.add_argument("--rounds", type=int, default=d.rounds, help="concurrency rounds per path")
    p.add_argument("--round-seconds", type=float, default=d.round_seconds)
    p.add_argument("--slots", type=int, default=d.slots, help="the model's slots (--parallel)")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON too")
    a = p.parse_args(argv)
    return Options(
        pairs=a.pairs,
        stream_tokens=a.stream_tokens,
        stream_runs=a.stream_runs,
        clients=a.clients,
        rounds=a.rounds,
        round_seconds=a.round_seconds,
        slots=a.slots,
        json_out=a.json,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        pass
    else:
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    started = time.monotonic()
    try:
        with served(options) as serve:
            print(f"blazar serve is up at {serve.url} ({time.monotonic() - started:.1f} s)")
            try:
                results = asyncio.run(run(serve.url, options))
            except SetupFailed:
                raise
            except aiohttp.ClientError as exc:
                raise SetupFailed(f"{exc}\n{serve.log_tail()}") from None
    except SetupFailed as exc:
        print(f"gateway_overhead: setup failed: {exc}", file=sys.stderr)
        return 1
    summary = summarize(results, options)
    print(render(summary))
    if options.json_out:
        print(json.dumps(summary, indent=2))
    print(f"total {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
