"""How much the gateway costs: the same requests sent to a llama.cpp child directly and
through `blazar serve`, interleaved in one run.

    .venv/bin/python bench/gateway_overhead.py [--json] [--pairs 300] [--rounds 6] ...

It sets up everything itself: a temporary BLAZAR_HOME, the tiny test model, a manifest,
a `blazar serve` subprocess (the engine wheel comes from BLAZAR_WHEEL_CACHE, by default
the tests' cache ~/.cache/blazar-tests/wheels), and it finds the child's port through
`GET /api/blazar/ps`. Then one client (aiohttp, one keep-alive session, the same code
for both paths; uvloop when it is installed) warms both paths up and measures:

1. latency of a small chat request, one request at a time, direct and gateway
   alternating (the order flips every pair): both medians and p90s, and the added
   median (gateway - direct);
2. tokens/s of a streamed completion of N tokens, at the client, from sending the
   request to the end of the stream; runs alternate, and the ratio is the median of
   each adjacent (direct, gateway) pair's gateway/direct;
3. requests/s with 16 concurrent clients sending the small chat request back to back,
   in alternating timed rounds; the ratio is again the median of the pairs' ratios.
   The model has as many slots as there are clients (`--slots` to change that).

Pairing adjacent runs keeps a burst of load from something else on the machine from
landing on one path only. It also reports the CPU time `blazar serve` spends per request
in the concurrent rounds (read from /proc): the direct path costs it something too (it
copies the child's log lines), so the difference is what the gateway itself costs.

Every loop is bounded in count and in time, so the run ends by itself, in about a
minute. It prints a table with the targets (added <= 1 ms, stream >= 0.95, concurrent
>= 0.9) and whether each is met, stops serve by its PID (SIGTERM; serve stops its child)
and removes its files. Exit status: 0 when it measured (targets met or not), 1 when the
setup failed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from served import Serve, SetupFailed, run_served

from blazar.testing.ports import free_port
from blazar.testing.tiny import write_tiny_model

MODEL = "tiny"
PATHS = ("direct", "gateway")
TARGET_ADDED_MS = 1.0
TARGET_STREAM = 0.95
TARGET_CONCURRENT = 0.90


@dataclass(frozen=True)
class Options:
    pairs: int = 300  # latency: (direct, gateway) pairs
    latency_seconds: float = 20.0  # ... or fewer, if they take longer than this
    stream_tokens: int = 256
    stream_runs: int = 12  # per path
    stream_seconds: float = 30.0
    clients: int = 16
    rounds: int = 8  # concurrency: rounds per path
    round_seconds: float = 2.0
    # The model's slots (llama-server --parallel): one per client, so that neither path
    # queues; with fewer, the gateway's scheduler queues requests that the direct path
    # leaves to llama-server, and that is measured too (see docs/performance.md).
    slots: int = 16
    json_out: bool = False
    key: bool = False  # declare an API key: the gateway checks it on every request
    relay: bool = True  # serving.relay: false measures the interpreted lane
    stream_route: str = "chat"  # chat (/v1/chat/completions) or completions (/v1/completions)
    front: str = "blazar"  # what the "gateway" column measures: blazar, or floor (floor_proxy.py)


def _per_path() -> dict[str, Any]:
    return {path: [] for path in PATHS}


@dataclass
class Results:
    latency: dict[str, list[float]] = field(default_factory=_per_path)  # ms per request
    stream: list[tuple[float, float]] = field(default_factory=list)  # (direct, gateway) tok/s
    rps: list[tuple[float, float]] = field(default_factory=list)  # (direct, gateway) req/s
    serve_cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PATHS, 0.0))
    served: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PATHS, 0))
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PATHS, 0))
    first_error: dict[str, str] = field(default_factory=dict)


# -- setup ---------------------------------------------------------------------------------


def tiny_models(slots: int, key: bool = False) -> Callable[[Path], str]:
    def models(root: Path) -> str:
        model = write_tiny_model(root / "tiny.gguf")
        text = f'[models.{MODEL}]\nsource = "{model.as_uri()}"\nctx = 512\nslots = {slots}\n'
        if key:  # an admin key: find_child reads /api/blazar/ps with it
            digest = hashlib.sha256(KEY.encode()).hexdigest()
            text += f'\n[keys.bench]\nsha256 = "{digest}"\nscope = "admin"\n'
        return text

    return models


# -- the client ----------------------------------------------------------------------------

HEADERS = {"Content-Type": "application/json"}
KEY = "plm_bench-" + "k" * 40  # with --key; sent to the child too, which ignores it
CHAT = json.dumps(
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "temperature": 0,
    }
).encode()


def stream_body(tokens: int, route: str = "chat") -> bytes:
    asked: dict[str, Any] = {"model": MODEL}
    if route == "chat":  # the relay carries a chat stream; a legacy completion is reshaped
        asked["messages"] = [{"role": "user", "content": "Once upon a time"}]
    else:
        asked["prompt"] = "Once upon a time"
    asked.update(max_tokens=tokens, ignore_eos=True, temperature=0, stream=True)
    return json.dumps(asked).encode()


STREAM_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class Client:
    """One keep-alive session; the same code sends to either base URL."""

    def __init__(self, session: aiohttp.ClientSession, results: Results) -> None:
        self.session = session
        self.results = results

    def failed(self, path: str, problem: str) -> None:
        self.results.errors[path] += 1
        self.results.first_error.setdefault(path, problem)

    async def chat(self, base: str, path: str) -> float:
        """Seconds for one small chat request; 0.0 (and an error counted) if it failed."""
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

    async def stream(
        self, base: str, path: str, body: bytes, tokens: int, route: str = "/v1/completions"
    ) -> float:
        """Tokens/s of one streamed completion, from sending it to the end of the stream."""
        # llama-server closes its connection after a stream: reuse none, on either path.
        headers = {"Connection": "close"}
        start = time.perf_counter()
        received = bytearray()
        try:
            async with self.session.post(f"{base}{route}", data=body, headers=headers) as resp:
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


def orders(n: int) -> Iterator[tuple[str, str]]:
    """Which path goes first, flipped every time."""
    for i in range(n):
        yield PATHS if i % 2 == 0 else PATHS[::-1]


# -- the three measurements ----------------------------------------------------------------


async def measure_latency(client: Client, urls: dict[str, str], options: Options) -> None:
    deadline = time.monotonic() + options.latency_seconds
    for order in orders(options.pairs):
        if time.monotonic() > deadline:
            break
        for path in order:
            seconds = await client.chat(urls[path], path)
            if seconds:
                client.results.latency[path].append(seconds * 1000)


async def measure_stream(client: Client, urls: dict[str, str], options: Options) -> None:
    body = stream_body(options.stream_tokens, options.stream_route)
    route = STREAM_PATHS[options.stream_route]
    deadline = time.monotonic() + options.stream_seconds
    for order in orders(options.stream_runs):
        if time.monotonic() > deadline:
            break
        rate = {}
        for path in order:
            rate[path] = await client.stream(urls[path], path, body, options.stream_tokens, route)
        if rate["direct"] and rate["gateway"]:
            client.results.stream.append((rate["direct"], rate["gateway"]))


async def concurrent_round(client: Client, base: str, path: str, options: Options) -> int:
    """Requests done by `clients` workers sending chat requests back to back for a round."""
    done = 0
    deadline = time.perf_counter() + options.round_seconds
    cap = int(options.round_seconds * 10_000)  # bounded by count too

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline and done < cap:
            if await client.chat(base, path):
                done += 1

    await asyncio.gather(*(worker() for _ in range(options.clients)))
    return done


async def measure_concurrent(
    client: Client, urls: dict[str, str], options: Options, cpu: Callable[[], float]
) -> None:
    results = client.results
    for order in orders(options.rounds):
        rate = {}
        for path in order:
            cpu_before, start = cpu(), time.perf_counter()
            done = await concurrent_round(client, urls[path], path, options)
            rate[path] = done / (time.perf_counter() - start)
            results.serve_cpu[path] += cpu() - cpu_before
            results.served[path] += done
        if rate["direct"] and rate["gateway"]:
            results.rps.append((rate["direct"], rate["gateway"]))


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


async def measure(serve: Serve, options: Options) -> Results:
    # keepalive_timeout under llama-server's 5 s: never reuse a connection it is closing.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4)
    timeout = aiohttp.ClientTimeout(total=60)
    headers = {**HEADERS, "Authorization": f"Bearer {KEY}"} if options.key else HEADERS
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=headers, auto_decompress=False
    ) as session:
        urls = {"direct": await find_child(session, serve.url), "gateway": serve.url}
        cpu = serve.cpu_seconds
        floor = None
        if options.front == "floor":  # the bare proxy in front of the same child instead
            floor = start_floor(urls["direct"])
            urls["gateway"], cpu = floor.url, floor.cpu_seconds
        warm_up = replace(options, pairs=50, stream_tokens=32, stream_runs=2, rounds=1)
        results = Results()
        client = Client(session, results)
        for opts in (warm_up, options):
            client.results = results = Results()  # the warm-up's numbers are dropped
            steps: list[Awaitable[None]] = [
                measure_latency(client, urls, opts),
                measure_stream(client, urls, opts),
                measure_concurrent(client, urls, opts, cpu),
            ]
            try:
                for step in steps:
                    await step
            except BaseException:
                if floor is not None:
                    floor.stop()
                raise
        if floor is not None:
            floor.stop()
    return results


class Floor:
    """bench/floor_proxy.py in a subprocess, in front of the child; stopped by its PID."""

    def __init__(self, child: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        script = Path(__file__).with_name("floor_proxy.py")
        loop = ["--uvloop"] if _has_uvloop() else []
        self.proc = subprocess.Popen(
            [sys.executable, str(script), child, str(self.port), *loop],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        assert self.proc.stdout is not None
        if b"floor proxy on" not in self.proc.stdout.readline():
            self.stop()
            raise SetupFailed("bench/floor_proxy.py did not start")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def start_floor(child: str) -> Floor:
    return Floor(child)


def _has_uvloop() -> bool:
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
    except ImportError:
        return False
    return True


# -- the report ----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def pair_ratio(pairs: list[tuple[float, float]]) -> float:
    return median([gateway / direct for direct, gateway in pairs])


def summarize(results: Results, options: Options) -> dict[str, Any]:
    lat = results.latency
    added = median(lat["gateway"]) - median(lat["direct"])
    stream_ratio = pair_ratio(results.stream)
    rps_ratio = pair_ratio(results.rps)
    cpu_us = {
        path: 1e6 * results.serve_cpu[path] / results.served[path] if results.served[path] else 0
        for path in PATHS
    }
    return {
        "latency_ms": {
            path: {"median": median(lat[path]), "p90": percentile(lat[path], 0.9)} for path in PATHS
        },
        "added_ms": added,
        "stream_tokens_per_s": {
            path: median([pair[i] for pair in results.stream]) for i, path in enumerate(PATHS)
        },
        "stream_ratio": stream_ratio,
        "requests_per_s": {
            path: median([pair[i] for pair in results.rps]) for i, path in enumerate(PATHS)
        },
        "concurrent_ratio": rps_ratio,
        "serve_cpu_us_per_request": cpu_us,
        "errors": results.errors,
        "first_error": results.first_error,
        "met": {
            "added": added <= TARGET_ADDED_MS,
            "stream": stream_ratio >= TARGET_STREAM,
            "concurrent": rps_ratio >= TARGET_CONCURRENT,
        },
        "settings": {
            "latency_pairs": min(len(lat["direct"]), len(lat["gateway"])),
            "stream_tokens": options.stream_tokens,
            "stream_pairs": len(results.stream),
            "clients": options.clients,
            "round_pairs": len(results.rps),
            "round_seconds": options.round_seconds,
            "slots": options.slots,
            "relay": options.relay,
            "front": options.front,
            "stream_route": options.stream_route,
            "api_key": options.key,
            "client_loop": type(asyncio.get_event_loop_policy()).__module__.split(".")[0],
            "cpus": os.cpu_count(),
        },
    }


def render(s: dict[str, Any]) -> str:
    def met(ok: bool) -> str:
        return "yes" if ok else "NO"

    lat, settings, cpu = s["latency_ms"], s["settings"], s["serve_cpu_us_per_request"]
    rows = [
        ("measure", "direct", "gateway", "result", "target", "met"),
        (
            f"chat latency median, ms ({settings['latency_pairs']} pairs)",
            f"{lat['direct']['median']:.2f}",
            f"{lat['gateway']['median']:.2f}",
            f"{s['added_ms']:+.2f} ms",
            f"<= {TARGET_ADDED_MS:g} ms",
            met(s["met"]["added"]),
        ),
        (
            "chat latency p90, ms",
            f"{lat['direct']['p90']:.2f}",
            f"{lat['gateway']['p90']:.2f}",
            f"{lat['gateway']['p90'] - lat['direct']['p90']:+.2f} ms",
            "",
            "",
        ),
        (
            f"stream tokens/s, N={settings['stream_tokens']} ({settings['stream_pairs']} pairs)",
            f"{s['stream_tokens_per_s']['direct']:.0f}",
            f"{s['stream_tokens_per_s']['gateway']:.0f}",
            f"{s['stream_ratio']:.3f}x",
            f">= {TARGET_STREAM:g}x",
            met(s["met"]["stream"]),
        ),
        (
            f"requests/s, {settings['clients']} clients ({settings['round_pairs']} pairs "
            f"of {settings['round_seconds']:g} s)",
            f"{s['requests_per_s']['direct']:.0f}",
            f"{s['requests_per_s']['gateway']:.0f}",
            f"{s['concurrent_ratio']:.3f}x",
            f">= {TARGET_CONCURRENT:g}x",
            met(s["met"]["concurrent"]),
        ),
        (
            "serve CPU per request, us (in those rounds)",
            f"{cpu['direct']:.0f}",
            f"{cpu['gateway']:.0f}",
            f"{cpu['gateway'] - cpu['direct']:+.0f} us",
            "",
            "",
        ),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    errors = s["errors"]
    lines.append("")
    lines.append(
        f"client loop: {settings['client_loop']}; cpus: {settings['cpus']}; model slots: "
        f"{settings['slots']}; relay: {'on' if settings.get('relay', True) else 'off'}; "
        f"front: {settings.get('front', 'blazar')}; "
        f"stream: {settings.get('stream_route', 'completions')}; "
        f"API key: {'yes' if settings.get('api_key') else 'no'}; "
        f"failed requests: direct {errors['direct']}, "
        f"gateway {errors['gateway']}"
    )
    for path, problem in s["first_error"].items():
        lines.append(f"first failure ({path}): {problem}")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> Options:
    d = Options()
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=d.pairs, help="latency pairs")
    p.add_argument("--stream-tokens", type=int, default=d.stream_tokens)
    p.add_argument("--stream-runs", type=int, default=d.stream_runs, help="per path")
    p.add_argument("--clients", type=int, default=d.clients)
    p.add_argument("--rounds", type=int, default=d.rounds, help="concurrent rounds per path")
    p.add_argument("--round-seconds", type=float, default=d.round_seconds)
    p.add_argument("--slots", type=int, default=d.slots, help="the model's slots (--parallel)")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON too")
    p.add_argument("--key", action="store_true", help="declare an API key and send it")
    p.add_argument("--relay", choices=("on", "off"), default="on", help="serving.relay")
    p.add_argument("--stream-route", choices=sorted(STREAM_PATHS), default=d.stream_route)
    p.add_argument(
        "--front",
        choices=("blazar", "floor"),
        default=d.front,
        help="floor: bench/floor_proxy.py (a bare asyncio pass-through) in place of the gateway",
    )
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
        key=a.key,
        relay=a.relay == "on",
        stream_route=a.stream_route,
        front=a.front,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        pass
    else:
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return run_served(
        "gateway_overhead",
        tiny_models(options.slots, options.key),
        lambda serve: asyncio.run(measure(serve, options)),
        lambda results: summarize(results, options),
        render,
        json_out=options.json_out,
        errors=(aiohttp.ClientError, OSError),
        serving="" if options.relay else "relay = false",
    )


if __name__ == "__main__":
    sys.exit(main())
