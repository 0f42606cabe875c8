"""Blazar beside its peers, in one run: LiteLLM's proxy and llama.cpp's own router.

    .venv/bin/python bench/peers.py [--litellm /tmp/litellm-venv] [--router PATH] [--json]

Two parts, each with everything started here and stopped by PID at the end:

1. **Per request.** `blazar serve` with the tiny test model (16 slots) and, in front of
   the very same llama-server child, LiteLLM's proxy (an openai-compatible model whose
   api_base is the child on 127.0.0.1). Beside them llama.cpp's router
   (`llama-server --models-dir DIR --models-max 1`, the same tiny model, `-c 8192 -np
   16`) and the child the router spawned, asked directly (found through /proc: the
   router gives it a free port). One client (aiohttp, one keep-alive session) sends the
   same small chat request to every path in turn, the order rotated each time; then
   16 clients send it back to back, in timed rounds per path, rotated likewise.
   Printed: median latency per path, the added median of each front against its own
   child (Blazar and LiteLLM against Blazar's child, the router against its child),
   and each front's requests/s with 16 clients as a ratio of its child's.
2. **A model swap.** Two tiny models (different seeds), one loaded at a time: Blazar
   with `serving.max_loaded_models = 1` and `min_residency = "0s"` (its default 5 s
   hold against thrashing would be measured instead), the router with `--models-max 1`, one slot
   each. Requests alternate between the two models, so every request swaps; the
   median seconds per swapped request are printed beside each system's median for a
   request to the model already loaded (the same model twice).

LiteLLM is not the project's dependency: it is installed into a separate venv (`python3
-m venv /tmp/litellm-venv && /tmp/litellm-venv/bin/pip install 'litellm[proxy]'`) and
the bench skips it with a line when `--litellm` has no `bin/litellm`. The router is a
llama-server built from the llama.cpp tree the quantize tool uses (bench/README.md says
how); the bench skips it with a line when `--router` is not there or its `--help` has no
`--models-dir`. Exit status: 0 when it measured, 1 when Blazar's own setup failed.
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
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from served import Serve, SetupFailed, served

from blazar.testing.ports import free_port
from blazar.testing.tiny import write_tiny_model

MODEL = "tiny"
SWAP_MODELS = ("tiny-a", "tiny-b")
ROUTER = Path.home() / ".cache/blazar-tests/engines/tools/llama-server-router/llama-server"
LITELLM = Path("/tmp/litellm-venv")
START_TIMEOUT = 180.0
LITELLM_KEY = "sk-bench-" + "k" * 32
# Headers per base URL (LiteLLM's key goes to LiteLLM only).
AUTH: dict[str, dict[str, str]] = {}
# One model loaded at a time; min_residency 0 s: by default a model loaded on demand stays
# at least 5 s before a load may evict it (so that alternating clients do not thrash), which
# would measure that policy, not the swap (the router has no such hold).
SWAP_SERVING = 'max_loaded_models = 1\nmin_residency = "0s"'


def chat_body(model: str) -> bytes:
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8,
            "temperature": 0,
        }
    ).encode()


@dataclass(frozen=True)
class Options:
    litellm: Path = LITELLM
    router: Path = ROUTER
    pairs: int = 150  # latency: requests per path
    latency_seconds: float = 40.0
    clients: int = 16
    rounds: int = 6  # per path
    round_seconds: float = 2.0
    swaps: int = 8  # swapped requests per system
    json_out: bool = False


@dataclass
class Results:
    latency: dict[str, list[float]] = field(default_factory=dict)  # ms
    rps: dict[str, list[float]] = field(default_factory=dict)
    swap: dict[str, list[float]] = field(default_factory=dict)  # s per swapped request
    warm: dict[str, list[float]] = field(default_factory=dict)  # s, same model again
    errors: dict[str, int] = field(default_factory=dict)
    first_error: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    fronts: dict[str, str] = field(default_factory=dict)  # front -> the path it fronts


# -- the peers' processes --------------------------------------------------------------------


class Proc:
    """A peer's process, its output in a log file, stopped by its PID (SIGTERM, then KILL)."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None):
        self.name = name
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # the router's children too: stopped with its group
            )

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def children_ports(self) -> list[int]:
        """The --port of each direct child (the router's model instances)."""
        ports = []
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            for kid in kids:
                try:
                    argv = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")
                    env = Path(f"/proc/{kid}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                for i, arg in enumerate(argv[:-1]):
                    if arg == b"--port":
                        ports.append(int(argv[i + 1]))
                for entry in env:
                    if entry.startswith(b"LLAMA_ARG_PORT="):
                        ports.append(int(entry.split(b"=", 1)[1]))
        return ports

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@contextmanager
def started(proc: Proc) -> Iterator[Proc]:
    try:
        yield proc
    finally:
        proc.stop()


def router_usable(path: Path) -> str | None:
    """None when `path` is a llama-server with router mode, else why it is skipped."""
    if not path.is_file():
        return f"no llama-server at {path} (bench/README.md says how to build it)"
    try:
        out = subprocess.run(
            [str(path), "--help"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{path} --help failed: {exc!r}"
    if "--models-dir" not in out.stdout + out.stderr:
        return f"{path} has no --models-dir (a llama.cpp older than its router)"
    return None


def litellm_usable(venv: Path) -> str | None:
    if not (venv / "bin" / "litellm").is_file():
        return f"no {venv}/bin/litellm (pip install 'litellm[proxy]' into that venv)"
    return None


def start_router(
    binary: Path, models_dir: Path, log: Path, args: list[str], models_max: int = 1
) -> tuple[Proc, str]:
    port = free_port()
    argv = [str(binary), "--host", "127.0.0.1", "--port", str(port), "--models-dir"]
    argv += [str(models_dir), "--models-max", str(models_max), *args]
    return Proc("router", argv, log), f"http://127.0.0.1:{port}"


def start_litellm(venv: Path, child: str, root: Path) -> tuple[Proc, str]:
    port = free_port()
    config = root / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {child}/v1\n"
        "      api_key: none\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
    )
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR")
    env["LITELLM_MASTER_KEY"] = LITELLM_KEY  # it refuses to start without one
    env["LITELLM_TELEMETRY"] = "False"
    argv = [str(venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--num_workers", "1"]
    url = f"http://127.0.0.1:{port}"
    AUTH[url] = {"Authorization": f"Bearer {LITELLM_KEY}"}
    return Proc("litellm", argv, root / "litellm.log", env), url


async def wait_ready(
    session: aiohttp.ClientSession, proc: Proc, url: str, model: str = MODEL
) -> None:
    """Until a chat request through `url` answers 200 (the process's log tail if not)."""
    deadline = time.monotonic() + START_TIMEOUT
    last = ""
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            break
        try:
            async with session.post(
                f"{url}/v1/chat/completions", data=chat_body(model), headers=AUTH.get(url)
            ) as r:
                last = f"{r.status} {(await r.read())[:200]!r}"
                if r.status == 200:
                    return
        except (aiohttp.ClientError, OSError) as exc:
            last = repr(exc)
        await asyncio.sleep(0.5)
    raise SetupFailed(f"{proc.name} did not answer ({last}):\n{proc.tail()}")


async def find_child(session: aiohttp.ClientSession, serve: Serve) -> str:
    async with session.get(f"{serve.url}/api/blazar/ps") as resp:
        rows = (await resp.json())["instances"]
    ports = [row["port"] for row in rows if row["model"] == MODEL and row["state"] == "ready"]
    if not ports:
        raise SetupFailed(f"no ready instance of {MODEL} in /api/blazar/ps: {rows}")
    return f"http://127.0.0.1:{ports[0]}"


# -- the client ------------------------------------------------------------------------------


class Client:
    def __init__(self, session: aiohttp.ClientSession, results: Results) -> None:
        self.session = session
        self.results = results

    async def chat(self, base: str, path: str, model: str = MODEL) -> float:
        """Seconds for one small chat request; 0.0 (and an error counted) if it failed."""
        start = time.perf_counter()
        try:
            async with self.session.post(
                f"{base}/v1/chat/completions", data=chat_body(model), headers=AUTH.get(base)
            ) as resp:
                body = await resp.read()
                problem = None if resp.status == 200 else f"{resp.status} {body[:300]!r}"
        except (aiohttp.ClientError, OSError) as exc:
            problem = repr(exc)
        elapsed = time.perf_counter() - start
        if problem is not None:
            self.results.errors[path] = self.results.errors.get(path, 0) + 1
            self.results.first_error.setdefault(path, problem)
            return 0.0
        return elapsed


def rotations(names: list[str], n: int) -> Iterator[list[str]]:
    for i in range(n):
        k = i % len(names)
        yield names[k:] + names[:k]


async def measure_latency(client: Client, urls: dict[str, str], options: Options) -> None:
    deadline = time.monotonic() + options.latency_seconds
    for order in rotations(list(urls), options.pairs):
        if time.monotonic() > deadline:
            break
        for path in order:
            seconds = await client.chat(urls[path], path)
            if seconds:
                client.results.latency.setdefault(path, []).append(seconds * 1000)


async def concurrent_round(client: Client, base: str, path: str, options: Options) -> float:
    """Requests/s of `clients` workers sending the chat request back to back for a round."""
    done = 0
    start = time.perf_counter()
    deadline = start + options.round_seconds
    cap = int(options.round_seconds * 10_000)  # bounded by count too

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline and done < cap:
            if await client.chat(base, path):
                done += 1

    await asyncio.gather(*(worker() for _ in range(options.clients)))
    return done / (time.perf_counter() - start)


async def measure_concurrent(client: Client, urls: dict[str, str], options: Options) -> None:
    for order in rotations(list(urls), options.rounds):
        for path in order:
            rate = await concurrent_round(client, urls[path], path, options)
            client.results.rps.setdefault(path, []).append(rate)


async def measure_swaps(client: Client, urls: dict[str, str], options: Options) -> None:
    """Alternate the two models on each system (every request swaps), then the same model
    twice (warm); the systems take turns so that load lands on both."""
    results = client.results
    a, b = SWAP_MODELS
    for name, base in urls.items():  # both models once, so each has loaded before
        for model in (a, b):
            await client.chat(base, name, model)
    await asyncio.sleep(1.5)  # Blazar's fork server starts 0.5 s after its first spawn
    for i in range(options.swaps):
        for name, base in urls.items():
            model = SWAP_MODELS[i % 2]
            seconds = await client.chat(base, name, model)
            if seconds:
                results.swap.setdefault(name, []).append(seconds)
            seconds = await client.chat(base, name, model)  # the same model again: no swap
            if seconds:
                results.warm.setdefault(name, []).append(seconds)


# -- the run ---------------------------------------------------------------------------------


def tiny_manifest(slots: int) -> Callable[[Path], str]:
    def models(root: Path) -> str:
        model = write_tiny_model(root / f"{MODEL}.gguf")
        return f'[models.{MODEL}]\nsource = "{model.as_uri()}"\nctx = 512\nslots = {slots}\n'

    return models


def swap_manifest(root: Path) -> str:
    text = ""
    for seed, name in enumerate(SWAP_MODELS):
        model = write_tiny_model(root / f"{name}.gguf", seed=seed + 1)
        text += f'[models.{name}]\nsource = "{model.as_uri()}"\nctx = 512\nslots = 1\n\n'
    return text


def session() -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=120),
        headers={"Content-Type": "application/json"},
    )


async def per_request(options: Options, results: Results, root: Path) -> None:
    with ExitStack() as stack:
        serve = stack.enter_context(served("blazar-peers-", tiny_manifest(options.clients)))
        async with session() as http:
            async with http.post(f"{serve.url}/v1/chat/completions", data=chat_body(MODEL)) as r:
                if r.status != 200:
                    raise SetupFailed(f"the first request through Blazar: {await r.text()}")
            child = await find_child(http, serve)
            urls = {"blazar child": child, "blazar": serve.url}
            results.fronts["blazar"] = "blazar child"
            why = litellm_usable(options.litellm)
            if why is None:
                proc, url = start_litellm(options.litellm, child, root)
                stack.enter_context(started(proc))
                await wait_ready(http, proc, url)
                urls["litellm"] = url
                results.fronts["litellm"] = "blazar child"
            else:
                results.skipped["litellm"] = why
            why = router_usable(options.router)
            if why is None:
                models_dir = root / "router-models"
                models_dir.mkdir()
                write_tiny_model(models_dir / f"{MODEL}.gguf")
                args = ["-c", str(512 * options.clients), "-np", str(options.clients)]
                proc, url = start_router(options.router, models_dir, root / "router.log", args)
                stack.enter_context(started(proc))
                await wait_ready(http, proc, url)
                ports = proc.children_ports()
                if not ports:
                    raise SetupFailed(f"the router's child has no port in /proc:\n{proc.tail()}")
                urls["router child"] = f"http://127.0.0.1:{ports[0]}"
                urls["router"] = url
                results.fronts["router"] = "router child"
            else:
                results.skipped["router"] = why
            client = Client(http, Results())  # a warm-up, dropped
            warm_up = Options(pairs=20, latency_seconds=10, rounds=1, round_seconds=1)
            await measure_latency(client, urls, warm_up)
            await measure_concurrent(client, urls, warm_up)
            client.results = results
            await measure_latency(client, urls, options)
            await measure_concurrent(client, urls, options)


async def swapping(options: Options, results: Results, root: Path) -> None:
    with ExitStack() as stack:
        serve = stack.enter_context(served("blazar-peers-swap-", swap_manifest, SWAP_SERVING))
        async with session() as http:
            urls = {"blazar": serve.url}
            if "router" not in results.skipped:
                models_dir = root / "swap-models"
                models_dir.mkdir()
                for seed, name in enumerate(SWAP_MODELS):
                    write_tiny_model(models_dir / f"{name}.gguf", seed=seed + 1)
                proc, url = start_router(
                    options.router, models_dir, root / "router-swap.log", ["-c", "512", "-np", "1"]
                )
                stack.enter_context(started(proc))
                await wait_ready(http, proc, url, SWAP_MODELS[0])
                urls["router"] = url
            await measure_swaps(Client(http, results), urls, options)


def run(options: Options) -> Results:
    results = Results()
    root = Path(tempfile.mkdtemp(prefix="blazar-peers-"))
    try:
        asyncio.run(per_request(options, results, root))
        asyncio.run(swapping(options, results, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


# -- the report ------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(results: Results, options: Options) -> dict[str, Any]:
    lat = {path: median(values) for path, values in results.latency.items()}
    rps = {path: median(values) for path, values in results.rps.items()}
    fronts = {
        front: {
            "fronts": child,
            "added_ms": lat.get(front, float("nan")) - lat.get(child, float("nan")),
            "rps_ratio": rps.get(front, float("nan")) / rps.get(child, float("nan")),
        }
        for front, child in results.fronts.items()
    }
    return {
        "latency_ms": lat,
        "latency_n": {path: len(values) for path, values in results.latency.items()},
        "requests_per_s": rps,
        "fronts": fronts,
        "swap_s": {name: median(values) for name, values in results.swap.items()},
        "warm_s": {name: median(values) for name, values in results.warm.items()},
        "swap_n": {name: len(values) for name, values in results.swap.items()},
        "errors": results.errors,
        "first_error": results.first_error,
        "skipped": results.skipped,
        "settings": {
            "clients": options.clients,
            "rounds": options.rounds,
            "round_seconds": options.round_seconds,
            "cpus": os.cpu_count(),
        },
    }


def render(s: dict[str, Any]) -> str:
    lines = [f"{'path':<14} {'median ms':>10} {'req/s x16':>10}", "-" * 36]
    for path, ms in s["latency_ms"].items():
        lines.append(f"{path:<14} {ms:>10.2f} {s['requests_per_s'].get(path, float('nan')):>10.0f}")
    lines += ["", f"{'front':<8} {'over':<13} {'added ms':>9} {'req/s ratio':>12}", "-" * 45]
    for front, f in s["fronts"].items():
        lines.append(
            f"{front:<8} {f['fronts']:<13} {f['added_ms']:>+9.2f} {f['rps_ratio']:>11.3f}x"
        )
    lines += ["", "model swap (two tiny models, one loaded at a time):"]
    for name, seconds in s["swap_s"].items():
        warm = s["warm_s"].get(name, float("nan"))
        lines.append(
            f"  {name:<8} {seconds:.3f} s per swapped request, {warm * 1000:.1f} ms loaded "
            f"({s['swap_n'][name]} swaps)"
        )
    if "blazar" in s["swap_s"] and "router" in s["swap_s"]:
        lines.append(
            f"  blazar/router swap ratio {s['swap_s']['blazar'] / s['swap_s']['router']:.2f}x"
        )
    for name, why in s["skipped"].items():
        lines.append(f"skipped {name}: {why}")
    if s["errors"]:
        lines.append(f"failed requests: {s['errors']}")
    for path, problem in s["first_error"].items():
        lines.append(f"first failure ({path}): {problem}")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> Options:
    d = Options()
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--litellm", type=Path, default=d.litellm, help="LiteLLM's venv")
    p.add_argument("--router", type=Path, default=d.router, help="llama-server with --models-dir")
    p.add_argument("--pairs", type=int, default=d.pairs, help="latency requests per path")
    p.add_argument("--rounds", type=int, default=d.rounds, help="16-client rounds per path")
    p.add_argument("--round-seconds", type=float, default=d.round_seconds)
    p.add_argument("--swaps", type=int, default=d.swaps, help="swapped requests per system")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    return Options(
        litellm=a.litellm,
        router=a.router,
        pairs=a.pairs,
        rounds=a.rounds,
        round_seconds=a.round_seconds,
        swaps=a.swaps,
        json_out=a.json,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started_at, load = time.monotonic(), os.getloadavg()[0]
    try:
        results = run(options)
    except (SetupFailed, aiohttp.ClientError, OSError) as exc:
        print(f"peers: setup failed: {exc}", file=sys.stderr)
        return 1
    summary = summarize(results, options)
    print(render(summary))
    print(
        f"load average (1 min) before {load:.2f}, after {os.getloadavg()[0]:.2f}; "
        f"cpus {os.cpu_count()}; total {time.monotonic() - started_at:.0f} s"
    )
    if options.json_out:
        print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
