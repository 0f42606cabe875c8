"""Image generation on this machine: seconds per picture through the gateway vs sd-server.

    .venv/bin/python bench/images.py [--runs 3] [--json]

It sets up everything itself in a temporary BLAZAR_HOME: the sdcpp engine from the
tests' cache (`make sd-server` builds it once: about 5 minutes on two cores, figure in
docs/engines.md), the tests' tiny image model (`blazar.testing.tiny_sd`, declared `kind =
"image"`), `blazar serve` on a free port, and beside it the same sd-server binary run
directly on the same model files with the same thread count. Then, for 64x64 and
256x256 at 1 and 4 steps (cfg scale 1, seed 1), the seconds per picture each way, the
runs interleaved (direct, gateway, direct, ...), each figure the median after one
warm-up, and the fastest run of each (other work on shared cores only ever adds time, so
the fastest is the steadier figure there); the ratio is direct seconds / gateway
seconds (1.0: the gateway adds nothing; the goal is >= 0.98). It removes its files when done.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blazar.engines import sdcpp  # noqa: E402
from blazar.engines.launchers.sd_launcher import part_flags  # noqa: E402
from blazar.protocols.openai_images import extra_args  # noqa: E402
from blazar.testing.ports import free_port  # noqa: E402
from blazar.testing.tiny_sd import write_tiny_image_model  # noqa: E402

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "blazar-tests"
CASES = (("64x64", 1), ("64x64", 4), ("256x256", 1), ("256x256", 4))
THREADS = max(1, (os.cpu_count() or 1) // 2)  # as serve gives each child


def post(url: str, body: dict[str, Any]) -> float:
    request = urllib.request.Request(
        url + "/v1/images/generations",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as resp:
        answer = json.loads(resp.read())
    took = time.perf_counter() - started
    assert base64.b64decode(answer["data"][0]["b64_json"])[:4] == b"\x89PNG"
    return took


def wait_ready(url: str, path: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + path, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    engines = CACHE / "engines"
    if sdcpp.built(engines) is None:
        raise SystemExit("no sd-server in the tests' cache: run `make sd-server` first")
    root = Path(tempfile.mkdtemp(prefix="bench-images-"))
    procs: list[subprocess.Popen[str]] = []
    try:
        model = write_tiny_image_model(root / "tiny-image")
        size = sum(f.stat().st_size for f in model.iterdir())
        home = root / "home"
        env = {**os.environ, "BLAZAR_HOME": str(home), "BLAZAR_SDCPP_BUILT": str(engines)}
        blazar = str(Path(sys.executable).with_name("blazar"))
        subprocess.run(
            [blazar, "engine", "install", "--kind", "sdcpp"],
            env=env,
            check=True,
            capture_output=True,
        )
        manifest = root / "blazar.toml"
        manifest.write_text(
            f'[models.tiny-image]\nkind = "image"\nsource = "{model.as_uri()}"\n'
            'image_max_size = "256x256"\n'
        )
        port = free_port()
        procs.append(
            subprocess.Popen(
                [blazar, "serve", str(manifest), "--port", str(port)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
        gateway = f"http://127.0.0.1:{port}"
        wait_ready(gateway, "/health")
        direct_port = free_port()
        server = sdcpp.built(engines)
        assert server is not None
        procs.append(
            subprocess.Popen(
                [
                    str(server),
                    *part_flags(model),
                    "--threads",
                    str(THREADS),
                    "--listen-ip",
                    "127.0.0.1",
                    "--listen-port",
                    str(direct_port),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
        direct = f"http://127.0.0.1:{direct_port}"
        wait_ready(direct, "/v1/models")
        rows = []
        for picture, steps in CASES:
            prompt = "a lighthouse"
            own = {"prompt": prompt + extra_args(steps, 1.0, 1, None), "size": picture}
            ours = {
                "model": "tiny-image",
                "prompt": prompt,
                "size": picture,
                "steps": steps,
                "cfg_scale": 1.0,
                "seed": 1,
            }
            post(direct, own), post(gateway, ours)  # warm-up (the gateway loads the model)
            times: dict[str, list[float]] = {"direct": [], "gateway": []}
            for _ in range(args.runs):
                times["direct"].append(post(direct, own))
                times["gateway"].append(post(gateway, ours))
            d, g = statistics.median(times["direct"]), statistics.median(times["gateway"])
            dmin, gmin = min(times["direct"]), min(times["gateway"])
            rows.append(
                {
                    "size": picture,
                    "steps": steps,
                    "direct_s": d,
                    "gateway_s": g,
                    "ratio": d / g,
                    "direct_min_s": dmin,
                    "gateway_min_s": gmin,
                    "ratio_min": dmin / gmin,
                }
            )
        built = server.parent / "VERSION"
        out = {
            "model_bytes": size,
            "engine": built.read_text().strip() if built.is_file() else "",
            "threads": THREADS,
            "runs": args.runs,
            "cases": rows,
        }
        if args.json:
            print(json.dumps(out, indent=2))
            return
        print(f"tiny image model: {size / 2**20:.1f} MiB; sd-server {out['engine']}")
        print(f"threads {THREADS}, median of {args.runs} after a warm-up")
        print("median and fastest (min) of the runs; on shared cores the fastest is the figure")
        print(
            f"{'size':>8} {'steps':>5} {'direct s':>9} {'gateway s':>9} {'ratio':>6} "
            f"{'min direct':>10} {'min gateway':>11} {'ratio':>6}"
        )
        for r in rows:
            print(
                f"{r['size']:>8} {r['steps']:>5} {r['direct_s']:>9.3f} "
                f"{r['gateway_s']:>9.3f} {r['ratio']:>6.3f} {r['direct_min_s']:>10.3f} "
                f"{r['gateway_min_s']:>11.3f} {r['ratio_min']:>6.3f}"
            )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
