"""Many streams at once through the gateway and straight to the child: what each costs.

    .venv/bin/python bench/gateway_scale.py [--streams 16 64 256] [--tokens 64]
        [--slots 64] [--relay on|off] [--json]

It sets up serve as bench/gateway_overhead.py does (the tiny model, here with
`--slots` slots, default 64), then for each N in `--streams` opens N streaming chat
completions at once (aiohttp, one connection each), first to the child (direct) then
through the gateway, and reports for each:

- aggregate tokens/s at the clients (all streams' tokens over the wall time from
  the first request to the last stream's end), gateway and direct, and their ratio;
- serve's CPU time per streamed token (one SSE event: `/proc`, over the gateway
  round, less what serve spent per token in the direct round: it copies the
  child's log on both);
- serve's resident memory per open stream: VmRSS sampled while the gateway's
  streams are open (the highest sample) less VmRSS before the round, over N.

With more streams than slots the gateway's scheduler queues what the direct path
leaves to llama-server's own queue, so the ratio then includes the queue.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from served import Serve, run_served

from blazar.testing.tiny import write_tiny_model

MODEL = "tiny"
# Room for every stream: its connection, its place in the queue, its wait there.
SERVING = 'max_queue = 512\nqueue_timeout = "300s"\nmax_connections_per_client = 1024\n'


def models(slots: int) -> Any:
    def make(root: Path) -> str:
        model = write_tiny_model(root / "tiny.gguf")
        return f'[models.{MODEL}]\nsource = "{model.as_uri()}"\nctx = 8192\nslots = {slots}\n'

    return make


def body(tokens: int) -> bytes:
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Once upon a time"}],
            "max_tokens": tokens,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def one(session: aiohttp.ClientSession, url: str, data: bytes) -> tuple[int, int]:
    """(chunks, token events) of one stream."""
    chunks = events = 0
    headers = {"Content-Type": "application/json", "Connection": "close"}
    async with session.post(f"{url}/v1/chat/completions", data=data, headers=headers) as resp:
        if resp.status != 200:
            raise AssertionError(f"{url}: {resp.status} {(await resp.read())[:300]!r}")
        async for piece in resp.content.iter_any():
            chunks += 1
            events += piece.count(b'"content":"')
    return chunks, events


async def round_of(url: str, n: int, data: bytes, pid: int) -> dict[str, float]:
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    peak = [rss_kib(pid)]
    before = peak[0]
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_kib(pid))
            await asyncio.sleep(0.05)

    async with aiohttp.ClientSession(connector=connector) as session:
        sampler = asyncio.create_task(sample())
        start = time.perf_counter()
        results = await asyncio.gather(*(one(session, url, data) for _ in range(n)))
        wall = time.perf_counter() - start
        done.set()
        await sampler
    chunks = sum(c for c, _ in results)
    tokens = sum(t for _, t in results)
    return {"wall": wall, "chunks": chunks, "tokens": tokens, "rss_kib": peak[0] - before}


def measure(serve: Serve, options: argparse.Namespace) -> dict[str, Any]:
    gateway = serve.url
    direct = asyncio.run(child_url(gateway))
    assert serve.proc is not None
    pid = serve.proc.pid
    data = body(options.tokens)
    out: dict[str, Any] = {}
    asyncio.run(round_of(gateway, 4, data, pid))  # warm both
    asyncio.run(round_of(direct, 4, data, pid))
    for n in options.streams:
        cpu0 = serve.cpu_seconds()
        d = asyncio.run(round_of(direct, n, data, pid))
        cpu1 = serve.cpu_seconds()
        g = asyncio.run(round_of(gateway, n, data, pid))
        cpu2 = serve.cpu_seconds()
        direct_cpu_per_token = (cpu1 - cpu0) / max(1, d["tokens"])
        gateway_cpu = (cpu2 - cpu1) - direct_cpu_per_token * g["tokens"]
        out[str(n)] = {
            "tokens_per_s": {"direct": d["tokens"] / d["wall"], "gateway": g["tokens"] / g["wall"]},
            "ratio": (g["tokens"] / g["wall"]) / (d["tokens"] / d["wall"]),
            "serve_cpu_us_per_token": 1e6 * gateway_cpu / max(1, g["tokens"]),
            "serve_rss_kib_per_stream": g["rss_kib"] / n,
            "chunks": g["chunks"],
        }
    return out


async def child_url(gateway: str) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{gateway}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        ) as resp:
            await resp.read()
        async with session.get(f"{gateway}/api/blazar/ps") as resp:
            rows = (await resp.json())["instances"]
    row = next(r for r in rows if r["model"] == MODEL and r["state"] == "ready")
    return f"http://127.0.0.1:{row['port']}"


def render(summary: dict[str, Any]) -> str:
    lines = ["streams  tok/s direct  tok/s gateway  ratio  serve CPU us/token  RSS KiB/stream"]
    for n, row in summary.items():
        rate = row["tokens_per_s"]
        lines.append(
            f"{n:>7}  {rate['direct']:>12.0f}  {rate['gateway']:>13.0f}  {row['ratio']:>5.2f}"
            f"  {row['serve_cpu_us_per_token']:>18.1f}  {row['serve_rss_kib_per_stream']:>14.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--streams", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--relay", choices=("on", "off"), default="on")
    p.add_argument("--json", action="store_true")
    options = p.parse_args(argv)
    return run_served(
        "gateway_scale",
        models(options.slots),
        lambda serve: measure(serve, options),
        lambda results: results,
        render,
        json_out=options.json,
        errors=(aiohttp.ClientError, OSError, AssertionError),
        serving=SERVING + ("" if options.relay == "on" else "relay = false\n"),
    )


if __name__ == "__main__":
    sys.exit(main())
