"""Observability through a real `blazar serve`: `/metrics` after known traffic, `blazar why`,
sentinels, cache-bust detection and `blazar watch`, with the official clients.

One serve runs the whole module (three tiny models; each test uses its own model or
compares before and after, so the order of tests does not matter). Counters are
checked against what the clients themselves were told (usage, token counts), and
against the child's own `/metrics`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from blazar.testing.tiny import write_tiny_model
from tests.conftest import Blazar
from tests.fixtures import ENGINE, WHEELS
from tests.serving import Served, engine_metric

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Host:
    def __init__(self, served: Served, manifest: Path, home: Path) -> None:
        self.served, self.manifest, self.home = served, manifest, home
        self.openai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
        self.anthropic = anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0)
        self.ollama = ollama.Client(host=served.url)

    def metrics(self) -> Samples:
        with urllib.request.urlopen(self.served.url + "/metrics", timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = resp.read().decode()
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def why(self, trace: str) -> dict[str, Any]:
        # A streamed answer's last byte reaches the client before its request ends on the
        # gateway: `wait` waits for that end (the observer's event), not a guessed time.
        return dict(self.served.get(f"/api/why/{trace}?wait=10"))


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def new_id() -> str:
    return uuid.uuid4().hex


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    root = tmp_path_factory.mktemp("observe")
    tiny = write_tiny_model(root / "tiny.gguf")
    other = write_tiny_model(root / "other.gguf", seed=4)
    manifest = root / "manifest" / "blazar.toml"
    manifest.parent.mkdir()
    home = root / "home"
    served = Served(manifest, home)
    # The daemon's own port in the manifest too: `blazar doctor` checks it is held by it.
    text = f"[serving]\nport = {served.port}\nmax_loaded_models = 3\n\n" + ENGINE
    text += f'[models.tiny]\nsource = "{tiny.as_uri()}"\naliases = ["mini"]\nctx = 1024\n\n'
    text += f'[models.other]\nsource = "{other.as_uri()}"\nctx = 1024\n\n'
    text += f'[models.chatty]\nsource = "{tiny.as_uri()}"\nctx = 1024\n\n'
    manifest.write_text(text)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BLAZAR_HOME", str(home))
        env.setenv("BLAZAR_WHEEL_CACHE", str(WHEELS))
        with served:
            yield Host(served, manifest, home)


def test_metrics_count_known_traffic_per_model(host: Host) -> None:
    host.openai.completions.create(model="other", prompt="warm", max_tokens=1)  # loads both
    host.openai.completions.create(model="tiny", prompt="warm", max_tokens=1)
    before = host.metrics()
    prompt = cached = generated = 0

    def count(usage: Any) -> None:
        nonlocal prompt, cached, generated
        prompt += usage.prompt_tokens
        cached += usage.prompt_tokens_details.cached_tokens
        generated += usage.completion_tokens

    messages = [{"role": "user", "content": "hello there"}]
    for _ in range(2):
        chat = host.openai.chat.completions.create(model="tiny", messages=messages, max_tokens=6)
        count(chat.usage)
    streamed = new_id()
    stream = host.openai.chat.completions.create(
        model="mini",
        messages=messages,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-request-id": streamed},
    )
    chunks = list(stream)
    count(chunks[-1].usage)
    reply = host.anthropic.messages.create(model="tiny", max_tokens=5, messages=messages)
    prompt += reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)
    cached += reply.usage.cache_read_input_tokens or 0
    generated += reply.usage.output_tokens
    host.openai.completions.create(model="other", prompt="the quick", max_tokens=4)
    host.ollama.chat(model="other", messages=messages, options={"num_predict": 3})
    with pytest.raises(openai.NotFoundError):
        host.openai.completions.create(model="nope", prompt="x", max_tokens=1)
    host.why(streamed)  # the one request whose end may trail its answer: ended, counted
    after = host.metrics()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    requests = "blazar_requests_total"
    assert delta(requests, model="tiny", protocol="openai", status="200") == 3
    assert delta(requests, model="tiny", protocol="anthropic", status="200") == 1
    assert delta(requests, model="other", protocol="openai", status="200") == 1
    assert delta(requests, model="other", protocol="ollama", status="200") == 1
    assert delta(requests, model="", protocol="openai", status="404") == 1
    duration = "blazar_request_duration_seconds"
    assert delta(f"{duration}_count", model="tiny", protocol="openai") == 3
    assert delta(f"{duration}_bucket", model="tiny", protocol="openai", le="+Inf") == 3
    assert delta(f"{duration}_sum", model="tiny", protocol="openai") > 0
    assert delta("blazar_time_to_first_token_seconds_count", model="tiny", protocol="openai") == 3
    assert delta("blazar_queue_wait_seconds_count", model="tiny") == 4
    # One gap between each of the streamed tokens.
    assert delta("blazar_inter_token_latency_seconds_count", model="tiny") == 7
    # Exactly what the clients were told, so cached / prompt is the hit ratio they saw.
    assert delta("blazar_prompt_tokens_total", model="tiny") == prompt > 0
    assert delta("blazar_prompt_tokens_cached_total", model="tiny") == cached > 0
    assert delta("blazar_generated_tokens_total", model="tiny") == generated == 6 + 6 + 8 + 5
    # Histogram buckets are cumulative.
    buckets = sorted(
        (float(dict(labels)["le"]), v)
        for (name, labels), v in after.items()
        if name == f"{duration}_bucket"
        and ("model", "tiny") in labels
        and ("protocol", "openai") in labels
    )
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)
    # The children's own counters, labelled with model and replica, as the child says them.
    [port] = [r["port"] for r in host.served.ps() if r["model"] == "tiny"]
    predicted = value(after, "llamacpp:tokens_predicted_total", model="tiny", replica="0")
    assert predicted == engine_metric(port, "tokens_predicted_total") > 0
    assert value(after, "llamacpp:prompt_tokens_total", model="other", replica="0") > 0
    assert value(after, "blazar_instances", model="tiny", state="ready") == 1
    assert value(after, "blazar_instances", model="tiny", state="failed") == 0
    assert ("blazar_queue_depth", frozenset({("model", "tiny")})) in after
    assert value(after, "blazar_build_info", version="0.1.0", engine="b11549-cpu") == 1
    assert value(after, "blazar_model_loads_total", model="tiny") >= 1
    assert value(after, "blazar_model_load_seconds_count", model="tiny") >= 1


def test_why_shows_a_request_routing_trail(host: Host, blazar: Blazar) -> None:
    trace = new_id()
    host.openai.chat.completions.create(
        model="mini",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        extra_headers={"x-request-id": trace},
    )
    record = host.why(trace)
    assert record["requested"] == "mini" and record["model"] == "tiny"
    assert record["alias"] == "mini" and record["instance"] == "tiny/0"
    assert record["decision"] in ("warm", "spawned") and record["status"] == 200
    assert record["generated_tokens"] == 4 and record["finish_reason"] == "length"
    assert record["prompt"]["excerpt"] == "hi"
    shown = blazar("why", trace, "--url", host.served.url).output
    assert f"trace {trace}" in shown
    assert "1. asked for 'mini' -> model tiny (alias 'mini')" in shown
    assert "routed to tiny/0 (engine b11549-cpu)" in shown
    assert "queue wait" in shown and "status 200" in shown
    assert json.loads(blazar("why", trace, "--json", "--url", host.served.url).output) == record
    listed = blazar("why", "--model", "tiny", "--last", "3", "--url", host.served.url).output
    assert listed.splitlines()[0].startswith(trace)
    newest = blazar("why", "--url", host.served.url).output
    assert newest.startswith(f"trace {trace}")
    gone = blazar("why", "no-such-id", "--url", host.served.url, ok=False)
    assert gone.exit_code == 1 and "no trace 'no-such-id'" in gone.output
    with pytest.raises(urllib.error.HTTPError) as bad:
        host.served.get("/api/why?limit=zero")
    assert bad.value.code == 400 and "limit" in json.load(bad.value)["error"]


def test_sentinels_flag_a_truncated_json_answer_and_an_empty_one(host: Host) -> None:
    before = host.metrics()
    truncated, empty, streamed, raw = new_id(), new_id(), new_id(), new_id()
    # JSON asked for (llama-server's json_schema), and too few tokens to finish it.
    host.openai.completions.create(
        model="tiny",
        prompt="a JSON object:",
        max_tokens=4,
        extra_body={"json_schema": {"type": "object"}},
        extra_headers={"x-request-id": truncated},
    )
    # A stop sequence the first token already contains: nothing comes out.
    answer = host.openai.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        stop=[" "],
        extra_headers={"x-request-id": empty},
    )
    assert answer.choices[0].message.content == ""
    list(
        host.openai.completions.create(
            model="tiny",
            prompt="x",
            max_tokens=3,
            stream=True,
            extra_body={"json_schema": {"type": "object"}},
            extra_headers={"x-request-id": streamed},
        )
    )
    request = urllib.request.Request(
        host.served.url + "/api/generate",
        data=json.dumps(
            {
                "model": "tiny",
                "prompt": "x",
                "raw": True,
                "format": "json",
                "stream": False,
                "options": {"num_predict": 3},
            }
        ).encode(),
        headers={"x-request-id": raw},
    )
    urllib.request.urlopen(request, timeout=30).read()
    checks = {t: [s["check"] for s in host.why(t)["sentinels"]] for t in (truncated, empty)}
    assert checks == {truncated: ["truncated", "invalid_json"], empty: ["empty"]}
    assert [s["check"] for s in host.why(streamed)["sentinels"]] == ["truncated", "invalid_json"]
    assert [s["check"] for s in host.why(raw)["sentinels"]] == ["truncated", "invalid_json"]
    after = host.metrics()
    name = "blazar_sentinel_detections_total"
    for check, n in (("truncated", 3), ("invalid_json", 3), ("empty", 1)):
        assert (
            value(after, name, model="tiny", check=check)
            - value(before, name, model="tiny", check=check)
            == n
        ), check


def conversation(system: str, turns: list[str]) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return messages


def test_a_client_mutating_its_system_prompt_is_reported(
    host: Host, blazar: Blazar, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = "You are a helpful assistant who answers in short plain words."
    turns: list[str] = []
    ids = []
    for turn in range(3):  # a counter at the start of the system prompt, every turn
        turns.append(f"question number {turn} about the weather")
        ids.append(new_id())
        chat = host.openai.chat.completions.create(
            model="chatty",
            messages=conversation(f"Turn {turn}. {system}", turns),
            max_tokens=4,
            extra_headers={"x-request-id": ids[-1]},
        )
        turns.append(chat.choices[0].message.content or "ok")
    found = [host.why(trace)["cache"] for trace in ids]
    assert found[0] is None  # nothing to compare the first turn with
    for finding in found[1:]:
        assert finding is not None and finding["finding"] == "cache_bust_system"
        assert "byte-stable" in finding["fix"]
    shown = blazar("why", ids[2], "--url", host.served.url).output
    assert "! cache_bust_system" in shown and "fix: keep the system prompt byte-stable" in shown
    # The same conversation with a stable system prompt reuses the cache and is not flagged.
    turns = []
    stable = []
    for turn in range(3):
        turns.append(f"question number {turn} about the sea")
        stable.append(new_id())
        chat = host.openai.chat.completions.create(
            model="chatty",
            messages=conversation(system, turns),
            max_tokens=4,
            extra_headers={"x-request-id": stable[-1]},
        )
        turns.append(chat.choices[0].message.content or "ok")
    records = [host.why(trace) for trace in stable]
    assert all(r["cache"] is None for r in records)
    assert records[2]["cached_tokens"] / records[2]["prompt_tokens"] > 0.5
    busters = host.served.get("/api/blazar/stats")["cache_busters"]
    assert [(b["client"], b["model"], b["count"]) for b in busters] == [("127.0.0.1", "chatty", 2)]
    monkeypatch.setenv("BLAZAR_HOME", str(host.home))
    doctor = blazar("doctor", str(host.manifest), "--url", host.served.url, ok=False)
    assert doctor.exit_code == 0, doctor.output  # a warning, not an error
    assert "!! client 127.0.0.1 busts the prompt cache of model 'chatty' (2 times)" in doctor.output
    assert "fix: keep the system prompt byte-stable" in doctor.output
    assert f"ok port {host.served.port} on 127.0.0.1: held by this daemon" in doctor.output


def test_watch_shows_each_model(host: Host, blazar: Blazar) -> None:
    host.openai.completions.create(model="tiny", prompt="x", max_tokens=2)
    screen = blazar("watch", "--once", "--url", host.served.url).output
    lines = screen.splitlines()
    assert lines[0].startswith(f"blazar watch  {host.served.url}")
    header = next(line for line in lines if line.startswith("MODEL"))
    for column in ("READY", "IN FLIGHT", "QUEUED", "REQ/S", "TTFT", "TOK/S", "CACHE HIT"):
        assert column in header
    [row] = [line.split() for line in lines if line.startswith("tiny ")]
    assert row[1] == "1/1" and row[2] == "ready"
    assert float(row[5]) > 0  # requests per second over the last minute
