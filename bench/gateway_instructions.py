"""Instructions `blazar serve` executes per gateway request, counted by callgrind.

Wall-clock and CPU-time figures on a shared 2-core machine move by +-50 us from run to
run; callgrind counts instructions, the same for the same code and inputs whatever else
the machine does, so it is what a before/after comparison of a change to the request
path uses. Each TREE is a checkout with its own `.venv` (this one by default); the
first is the baseline the others are compared with:

    .venv/bin/python bench/gateway_instructions.py [TREE ...] [--path chat|stream]
        [--requests 300] [--clients 4] [--json]

For each tree it starts `blazar serve` under `valgrind --tool=callgrind` with
instrumentation off, warms the tiny model up, then counts the instructions of N
requests (and subtracts an idle stretch as long, so the timers and the child's log
copying at rest do not count). Needs valgrind (`apt-get install valgrind`); a few
minutes per tree (serve runs about 50x slower under valgrind).
"""

from __future__ import annotations

import argparse
import asyncio
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blazar.testing.ports import free_port  # noqa: E402
from blazar.testing.tiny import write_tiny_model  # noqa: E402
from tests.fixtures import ENGINE_VERSION  # noqa: E402

BODIES = {
    "chat": (
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    ),
    "stream": (
        "/v1/completions",
        {"model": "tiny", "prompt": "x", "max_tokens": 64, "stream": True},
    ),
    "chat-stream": (  # the stream the relay carries (a legacy completion is reshaped)
        "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 64,
            "stream": True,
        },
    ),
}


async def load(url: str, n: int, clients: int, body: bytes) -> None:
    async with aiohttp.ClientSession() as session:
        left = [n]

        async def one() -> None:
            while left[0] > 0:
                left[0] -= 1
                headers = {"Content-Type": "application/json"}
                async with session.post(url, data=body, headers=headers) as answer:
                    await answer.read()
                    assert answer.status == 200, answer.status

        await asyncio.gather(*(one() for _ in range(clients)))


def total(outfile: Path) -> int:
    for line in outfile.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {outfile}")


def measure(tree: Path, path: str, requests: int, clients: int, relay: bool = True) -> float:
    root = Path(tempfile.mkdtemp(prefix="blazar-instructions-"))
    try:
        return _measure(tree, root, path, requests, clients, relay)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _measure(
    tree: Path, root: Path, path: str, requests: int, clients: int, relay: bool = True
) -> float:
    tiny = write_tiny_model(root / "tiny.gguf")
    port = free_port()
    manifest = root / "blazar.toml"
    manifest.write_text(
        f"[serving]\nport = {port}\nkeep_alive = -1\n"
        + ("" if relay else "relay = false\n")
        + f'[engines.llamacpp]\nversion = "{ENGINE_VERSION}"\n'
        f'[models.tiny]\nsource = "{tiny.as_uri()}"\nslots = {clients}\n'
    )
    wheels = Path.home() / ".cache" / "blazar-tests" / "wheels"
    env = dict(
        os.environ,
        BLAZAR_HOME=str(root / "home"),
        BLAZAR_WHEEL_CACHE=os.environ.get("BLAZAR_WHEEL_CACHE", str(wheels)),
    )
    out = root / "callgrind.out"
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        "--instr-atstart=no",
        str(tree / ".venv/bin/python"),
        str(tree / ".venv/bin/blazar"),
        "serve",
        str(manifest),
    ]
    with open(root / "serve.log", "wb") as log:
        serve = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, env=env, cwd=tree)
    ready = threading.Event()

    def watch() -> None:
        for line in serve.stdout:  # type: ignore[union-attr]
            if b"Blazar is serving on" in line:
                ready.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        if not ready.wait(900):
            raise RuntimeError((root / "serve.log").read_text()[-3000:])
        route, payload = BODIES[path]
        url, body = f"http://127.0.0.1:{port}{route}", json.dumps(payload).encode()
        asyncio.run(load(url, 100, clients, body))  # the model loaded, the caches warm
        time.sleep(1.5)  # the trace writer's flush

        def control(*args: str) -> None:
            subprocess.run(
                ["callgrind_control", *args, str(serve.pid)], check=True, capture_output=True
            )

        control("-z")
        control("-i", "on")
        started = time.monotonic()
        asyncio.run(load(url, requests, clients, body))
        time.sleep(1.5)  # finished traces are written within a second
        busy = time.monotonic() - started
        control("-i", "off")
        control("-d")
        control("-z")
        control("-i", "on")
        time.sleep(busy)  # as long, idle
        control("-i", "off")
        control("-d")
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(600)
    dumps = sorted(
        (p for p in root.glob("callgrind.out.*") if p.suffix[1:].isdigit()),
        key=lambda p: int(p.suffix[1:]),
    )
    return (total(dumps[0]) - total(dumps[1])) / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="*", type=Path, default=[ROOT])
    parser.add_argument("--path", choices=sorted(BODIES), default="chat")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--relay",
        choices=("on", "off", "both"),
        default="on",
        help="serving.relay; both: each tree with the relay off, then on (issue 30)",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed: apt-get install valgrind")
    figures = {}
    lanes = {"on": (True,), "off": (False,), "both": (False, True)}[args.relay]
    for tree in args.trees:
        for relay in lanes:
            name = str(tree) if len(lanes) == 1 else f"{tree} relay {'on' if relay else 'off'}"
            figures[name] = measure(tree.resolve(), args.path, args.requests, args.clients, relay)
            print(
                f"{name}: {figures[name] / 1e3:,.0f} k instructions per {args.path} request",
                flush=True,
            )
    base = next(iter(figures.values()))
    first = next(iter(figures))
    for name, count in list(figures.items())[1:]:
        print(f"{name} vs {first}: {count / base:.3f}x")
    if args.json:
        print(json.dumps({"path": args.path, "instructions_per_request": figures}))


if __name__ == "__main__":
    main()
