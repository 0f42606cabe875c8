"""Where a model swap's time goes: serve's view, the supervisor's parts, and llama.cpp's router.

    .venv/bin/python bench/swap_breakdown.py [--swaps 8] [--router PATH] [--no-parts]
                                             [--no-fork-server] [--json]

The swap of bench/peers.py (two tiny models, one loaded at a time: `max_loaded_models =
1`, `min_residency = "0s"`, one slot each; requests alternate, so every request swaps),
measured three ways in one run, everything started here and stopped by PID:

1. **Through serve.** `blazar serve` with the two models; each swapped request's client
   time beside what serve's trace (`/api/why/{id}`) says of it: `load_ms` (waiting for
   the other model's child to stop, the new child's start and readiness) and the rest
   (the request itself). A request to the model already loaded is timed beside it.
   When the router is there (bench/README.md, peers.py), it swaps in the same run, its
   requests interleaved with serve's, its children with Blazar's thread count (half
   the cores; peers.py leaves llama.cpp's default, all of them).
2. **The supervisor's parts.** The engine command serve ran (read from its instance log),
   started by two `Instance`s in this process, alternately, the way a swap does: the old
   child's stop (SIGTERM to its exit), `spawn`, then inside the child (a wrapper around
   the launcher prints wall-clock stamps): the interpreter's start, `import xllamacpp`,
   the launcher's own imports and flags, llama.cpp's load (`xllamacpp.Server`), then
   serve's side again: the listening line seen, `/health` answered (ready), and a
   streamed chat request's first token and its end, asked of the child directly.
   Then the same with the children forked by a fork server (`Forks`, serve's default:
   docs/serve.md), where the parts before the listening line are one: the fork to it.

Printed: medians (and ranges) per part in ms, the sum of the parts beside the swap seen
through serve, and serve/router. Exit status 0 when it measured, 1 when setup failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from peers import (
    ROUTER,
    SWAP_MODELS,
    SWAP_SERVING,
    Proc,
    chat_body,
    router_usable,
    start_router,
    started,
    swap_manifest,
    wait_ready,
)
from served import SetupFailed, served

from blazar.host import children
from blazar.serve.supervisor.forks import Forks
from blazar.serve.supervisor.instance import Instance, InstanceSpec
from blazar.testing.tiny import write_tiny_model

# Runs in the child, under the engine's Python: stamps (wall clock) at its start, after
# `import xllamacpp`, as the launcher calls xllamacpp.Server and when it returns; then the
# launcher runs as it would (`runpy`, as __main__).
WRAPPER = """\
import time
T0 = time.time()
import os, runpy, sys
import xllamacpp
T1 = time.time()
_server = xllamacpp.Server
def Server(params):
    T2 = time.time()
    made = _server(params)
    os.write(1, ("bench-stamps %r %r %r %r\\n" % (T0, T1, T2, time.time())).encode())
    return made
xllamacpp.Server = Server
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
STAMPS = re.compile(rb"bench-stamps (\S+) (\S+) (\S+) (\S+)")
PARTS = (
    "stop",  # old.stop(): SIGTERM to the old child's exit, seen by its owner
    "spawn",  # children.spawn: fork and exec returned
    "python",  # exec to the wrapper's first line: the interpreter's start
    "import",  # import xllamacpp
    "launcher",  # the launcher's imports and flags, to xllamacpp.Server
    "load",  # xllamacpp.Server: llama.cpp loads the model and listens
    "seen",  # the listening line read by serve's watcher
    "health",  # /health answered: ensure_ready returns
    "first token",  # a streamed chat request to the child: its first token
    "answer",  # ... to its end (8 tokens)
)


@dataclass
class Results:
    serve: list[dict[str, float]] = field(default_factory=list)  # per swapped request
    warm: list[float] = field(default_factory=list)  # s, the same model again
    router: list[float] = field(default_factory=list)  # s per swapped request
    router_warm: list[float] = field(default_factory=list)
    parts: list[dict[str, float]] = field(default_factory=list)  # ms per part, per swap
    forked: list[dict[str, float]] = field(default_factory=list)  # the same, forked children
    errors: list[str] = field(default_factory=list)


# -- through serve (and the router) --------------------------------------------------------


async def timed_chat(
    http: aiohttp.ClientSession, base: str, model: str
) -> tuple[float, str | None, str | None]:
    """Seconds for one small chat request, its request id, and a problem if it failed."""
    start = time.perf_counter()
    try:
        async with http.post(f"{base}/v1/chat/completions", data=chat_body(model)) as resp:
            body = await resp.read()
            rid = resp.headers.get("x-request-id")
            problem = None if resp.status == 200 else f"{resp.status} {body[:200]!r}"
    except (aiohttp.ClientError, OSError) as exc:
        return 0.0, None, repr(exc)
    return time.perf_counter() - start, rid, problem


async def trace(http: aiohttp.ClientSession, base: str, rid: str | None) -> dict[str, Any]:
    if rid is None:
        return {}
    async with http.get(f"{base}/api/why/{rid}", params={"wait": "5"}) as resp:
        return dict(await resp.json()) if resp.status == 200 else {}


async def through_serve(
    http: aiohttp.ClientSession, urls: dict[str, str], swaps: int, results: Results
) -> None:
    for base in urls.values():  # both models once, so each has loaded before
        for model in SWAP_MODELS:
            await timed_chat(http, base, model)
    await asyncio.sleep(1.5)  # serve's fork server starts 0.5 s after the first spawn
    for i in range(swaps):
        model = SWAP_MODELS[i % 2]
        for name, base in urls.items():
            seconds, rid, problem = await timed_chat(http, base, model)
            if problem is not None:
                results.errors.append(f"{name}: {problem}")
                continue
            again, _, problem = await timed_chat(http, base, model)  # loaded: no swap
            if name == "router":
                results.router.append(seconds)
                results.router_warm.append(again)
                continue
            record = await trace(http, base, rid)
            results.warm.append(again)
            results.serve.append(
                {
                    "total": seconds * 1000,
                    "load": float(record.get("load_ms") or 0.0),
                    "decision": 1.0 if record.get("decision") == "spawned" else 0.0,
                }
            )


def engine_argv(log: Path) -> list[str]:
    """The argv serve started a child with, from its instance log's `blazar: starting`."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("blazar: starting "):
            return shlex.split(line.removeprefix("blazar: starting "))
    raise SetupFailed(f"no 'blazar: starting' line in {log}")


# -- the supervisor's parts ----------------------------------------------------------------


class Clock:
    """Wall-clock stamps of this process's side of a start (spawn, listening seen)."""

    def __init__(self) -> None:
        self.spawn: tuple[float, float] = (0.0, 0.0)
        self.seen = 0.0

    def install(self) -> Callable[[], None]:
        """Wrap `children.spawn` and `children.watch_log` (as Instance calls them); the
        undo."""
        spawn, watch_log = children.spawn, children.watch_log

        async def timed_spawn(argv: Sequence[str], output: int | None = None, **kw: Any) -> Any:
            before = time.time()
            proc = await spawn(argv, output, **kw)
            self.spawn = (before, time.time())
            return proc

        async def timed_watch(proc: Any, log: Any, on_port: Callable[[int], None]) -> None:
            def seen(port: int) -> None:
                self.seen = time.time()
                on_port(port)

            await watch_log(proc, log, seen)

        children.spawn, children.watch_log = timed_spawn, timed_watch  # type: ignore[assignment]

        def undo() -> None:
            children.spawn, children.watch_log = spawn, watch_log  # type: ignore[assignment]

        return undo


async def first_token(http: aiohttp.ClientSession, url: str, model: str) -> tuple[float, float]:
    """Wall-clock time of a streamed chat request's first token, and of its end."""
    body = json.loads(chat_body(model))
    body["stream"] = True
    first = 0.0
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        async for line in resp.content:
            if not first and line.startswith(b"data: {") and b'"content":"' in line:
                first = time.time()
        if resp.status != 200:
            raise SetupFailed(f"the child answered {resp.status}")
    return first or time.time(), time.time()


def spec(key: str, command: Sequence[str], args: Sequence[str], log: Path) -> InstanceSpec:
    return InstanceSpec(
        key=key,
        model=key,
        replica=0,
        engine_tag="bench",
        command=tuple(command),
        args=tuple(args),
        log_path=log,
        health_timeout=60.0,
    )


async def supervisor_parts(
    argv: list[str], models: dict[str, Path], root: Path, swaps: int, forked: bool
) -> list[dict[str, float]]:
    """Two Instances of serve's engine command, alternately: each swap's parts in ms.
    `forked`: their children forked by a fork server (serve's default), else fresh
    processes under the stamping wrapper."""
    python, launcher = argv[0], argv[1]
    args = argv[2:-4]  # without --host H --port 0
    wrapper = root / "stamps.py"
    wrapper.write_text(WRAPPER)
    clock = Clock()
    undo = clock.install()
    forks = Forks()

    async def spawn(argv: Sequence[str], output: int) -> Any:
        before = time.time()
        proc = await forks.spawn(argv, output)
        clock.spawn = (before, time.time())
        return proc

    instances = []
    for name, model in models.items():
        own = [*args]
        own[own.index("--model") + 1] = str(model)
        log = root / ("forked" if forked else "fresh") / f"{name}.log"
        command = [python, launcher] if forked else [python, str(wrapper), launcher]
        starter = spawn if forked else None
        instances.append(Instance(spec(name, command, own, log), spawn=starter))
    parts: list[dict[str, float]] = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            await instances[0].ensure_ready()
            if forked:  # the fork server starts after the first child: let it get ready
                while forks.starting:
                    await asyncio.wait(list(forks.starting.values()))
                for server in forks.servers.values():
                    await asyncio.wait_for(server.ready.wait(), 30)
            for i in range(swaps + 1):
                old, new = instances[i % 2], instances[(i + 1) % 2]
                a = time.time()
                await old.stop()
                b = time.time()
                log_start = new._log.size()
                url = await new.ensure_ready()
                ready = time.time()
                token, end = await first_token(http, url, new.spec.model)
                spawn_a, spawn_b = clock.spawn
                if i == 0:
                    continue  # the first start of this model: its file's pages come in
                part = {
                    "stop": (b - a) * 1000,
                    "gap": (spawn_a - b) * 1000,
                    "spawn": (spawn_b - spawn_a) * 1000,
                }
                if forked:
                    part["load"] = (clock.seen - spawn_b) * 1000  # fork to listening seen
                else:
                    match = STAMPS.search(new._log.read(log_start))
                    if match is None:
                        raise SetupFailed(f"no stamps in {new.spec.log_path}:\n{new.log_tail()}")
                    t0, t1, t2, t3 = (float(x) for x in match.groups())
                    part |= {
                        "python": (t0 - spawn_b) * 1000,
                        "import": (t1 - t0) * 1000,
                        "launcher": (t2 - t1) * 1000,
                        "load": (t3 - t2) * 1000,
                        "seen": (clock.seen - t3) * 1000,
                    }
                part |= {
                    "health": (ready - clock.seen) * 1000,
                    "first token": (token - ready) * 1000,
                    "answer": (end - token) * 1000,
                    "total": (end - a) * 1000,
                }
                parts.append(part)
    finally:
        undo()
        await asyncio.gather(*(inst.close() for inst in instances))
        await forks.close()
    return parts


# -- the run ---------------------------------------------------------------------------------


async def measure(options: argparse.Namespace, results: Results, root: Path) -> None:
    with ExitStack() as stack:
        serving = SWAP_SERVING + ("" if options.fork_server else "\nfork_server = false")
        serve = stack.enter_context(served("blazar-swapbd-", swap_manifest, serving))
        timeout = aiohttp.ClientTimeout(total=120)
        headers = {"Content-Type": "application/json"}
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
            urls = {"blazar": serve.url}
            if router_usable(options.router) is None:
                models_dir = root / "router-models"
                models_dir.mkdir()
                for seed, name in enumerate(SWAP_MODELS):
                    write_tiny_model(models_dir / f"{name}.gguf", seed=seed + 1)
                # the threads Blazar gives its children (half the cores): with more,
                # llama.cpp's spinning threads stall when another process takes a core
                threads = str(max(1, (os.cpu_count() or 2) // 2))
                args = ["-c", "512", "-np", "1", "-t", threads, "-tb", threads]
                proc: Proc
                proc, url = start_router(options.router, models_dir, root / "router.log", args)
                stack.enter_context(started(proc))
                await wait_ready(http, proc, url, SWAP_MODELS[0])
                urls["router"] = url
            await through_serve(http, urls, options.swaps, results)
            logs = sorted((serve.root / "home").glob(f"**/logs/{SWAP_MODELS[0]}-0.log"))
            if not logs:
                raise SetupFailed(f"no instance log of {SWAP_MODELS[0]} under {serve.root}")
            argv = engine_argv(logs[0])
        if options.parts:
            models = {name: root / f"{name}.gguf" for name in SWAP_MODELS}
            for seed, path in enumerate(models.values()):
                write_tiny_model(path, seed=seed + 1)
            results.parts = await supervisor_parts(argv, models, root, options.swaps, False)
            results.forked = await supervisor_parts(argv, models, root, options.swaps, True)


def spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(results: Results) -> dict[str, Any]:
    serve_total = [r["total"] for r in results.serve]
    serve_load = [r["load"] for r in results.serve]

    def table(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
        names = [n for n in ("stop", "gap", *PARTS[1:], "total") if rows and n in rows[0]]
        return {name: spread([row[name] for row in rows]) for name in names}

    return {
        "serve_ms": spread(serve_total),
        "serve_load_ms": spread(serve_load),
        "serve_rest_ms": spread(
            [t - load for t, load in zip(serve_total, serve_load, strict=True)]
        ),
        "serve_warm_ms": spread([s * 1000 for s in results.warm]),
        "spawned": sum(r["decision"] for r in results.serve),
        "router_ms": spread([s * 1000 for s in results.router]),
        "router_warm_ms": spread([s * 1000 for s in results.router_warm]),
        "parts_ms": table(results.parts),
        "forked_ms": table(results.forked),
        "swaps": len(results.serve),
        "errors": results.errors,
    }


def render(s: dict[str, Any]) -> str:
    def row(name: str, v: dict[str, float]) -> str:
        return f"  {name:<22} {v['median']:8.1f} ms  ({v['min']:.1f}-{v['max']:.1f})"

    lines = [f"through serve ({s['swaps']} swapped requests, {s['spawned']:.0f} spawned):"]
    lines.append(row("swapped request", s["serve_ms"]))
    lines.append(row("  of which load_ms", s["serve_load_ms"]))
    lines.append(row("  the rest", s["serve_rest_ms"]))
    lines.append(row("request, loaded", s["serve_warm_ms"]))
    if s["router_ms"]["median"] == s["router_ms"]["median"]:  # not NaN
        lines.append(row("router swapped", s["router_ms"]))
        lines.append(row("router, loaded", s["router_warm_ms"]))
        ratio = s["serve_ms"]["median"] / s["router_ms"]["median"]
        lines.append(f"  serve/router swap {ratio:.2f}x")
    for key, what in (("parts_ms", "a fresh child"), ("forked_ms", "a forked child")):
        if not s[key]:
            continue
        lines.append(f"the supervisor's parts (two Instances, {what} each swap):")
        for name, v in s[key].items():
            lines.append(row(name, v))
        parts = sum(v["median"] for n, v in s[key].items() if n != "total")
        lines.append(f"  sum of the medians      {parts:8.1f} ms")
    for error in s["errors"][:5]:
        lines.append(f"failed: {error}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--swaps", type=int, default=8, help="swapped requests per system")
    p.add_argument("--router", type=Path, default=ROUTER, help="llama-server with --models-dir")
    p.add_argument("--no-parts", dest="parts", action="store_false", help="serve's view only")
    p.add_argument(
        "--no-fork-server",
        dest="fork_server",
        action="store_false",
        help="serve with serving.fork_server = false (every child a fresh process)",
    )
    p.add_argument("--json", action="store_true")
    options = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started_at, load = time.monotonic(), os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="blazar-swapbd-"))
    results = Results()
    try:
        asyncio.run(measure(options, results, root))
    except (SetupFailed, aiohttp.ClientError, OSError) as exc:
        print(f"swap_breakdown: setup failed: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = summarize(results)
    print(render(summary))
    print(
        f"load average (1 min) before {load:.2f}, after {os.getloadavg()[0]:.2f}; "
        f"cpus {os.cpu_count()}; total {time.monotonic() - started_at:.0f} s"
    )
    if options.json:
        print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
