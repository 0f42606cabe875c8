"""How much memory large request bodies cost `blazar serve`: N concurrent bodies of M MB.

    .venv/bin/python bench/body_memory.py [--bodies 10] [--mb 60] [--max-buffered 256MiB]

It starts `blazar serve` with an empty manifest in a temporary BLAZAR_HOME (no
model: each body is a JSON chat request for a model that is not served, so the
gateway reads and parses it and answers 404), sends the bodies at once from
one aiohttp client, and reports serve's resident memory before and its peak
(`VmHWM` in /proc) after, with the statuses it answered. `--max-buffered` sets
`serving.max_buffered` (omit it to use the default, or on a Blazar without
it). Serve is stopped by its PID and its files removed. Exit status 0 when it
measured, 1 when serve did not start.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp

from blazar.testing.ports import free_port


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


async def send(url: str, bodies: int, size: int) -> collections.Counter[int]:
    filler = "x" * size
    body = json.dumps({"model": "nope", "messages": [{"role": "user", "content": filler}]})
    data = body.encode()
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one() -> int:
            headers = {"Content-Type": "application/json"}
            async with session.post(f"{url}/v1/chat/completions", data=data, headers=headers) as r:
                await r.read()
                return r.status

        return collections.Counter(await asyncio.gather(*(one() for _ in range(bodies))))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--bodies", type=int, default=10)
    parser.add_argument("--mb", type=int, default=60, help="size of each body in MB")
    parser.add_argument("--max-buffered", default=None, help="serving.max_buffered")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="blazar-body-memory-"))
    port = free_port()
    manifest = root / "manifest" / "blazar.toml"
    manifest.parent.mkdir()
    serving = f"[serving]\nport = {port}\n"
    if args.max_buffered:
        serving += f'max_buffered = "{args.max_buffered}"\nbody_timeout = "120s"\n'
    manifest.write_text(serving)
    exe = Path(sys.executable).with_name("blazar")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "blazar.cli.main"]
    env = dict(os.environ, BLAZAR_HOME=str(root / "home"))
    proc = subprocess.Popen(
        [*command, "serve", str(manifest), "--no-apply"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        for line in proc.stdout:
            if "Blazar is serving on" in line:
                break
            if time.monotonic() > deadline:
                break
        else:
            print("blazar serve did not start", file=sys.stderr)
            return 1
        drain = threading.Thread(target=collections.deque, args=(proc.stdout, 0), daemon=True)
        drain.start()  # a full pipe would block serve
        before = memory_kib(proc.pid, "VmRSS")
        began = time.monotonic()
        statuses = asyncio.run(send(f"http://127.0.0.1:{port}", args.bodies, args.mb * 10**6))
        took = time.monotonic() - began
        peak = memory_kib(proc.pid, "VmHWM")
        print(
            f"{args.bodies} bodies of {args.mb} MB, max_buffered {args.max_buffered or 'default'}:"
            f" RSS before {before / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB"
            f" (+{(peak - before) / 1024:.0f} MiB), {took:.1f} s, statuses {dict(statuses)}"
        )
        return 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
