"""`Pipeline.events`, the streamed internal call (a realtime answer), with the real engine.

A real llama-server child (the xllamacpp launcher, the tiny model) serves a scheduler
whose instance is a stand-in that reports the child's URL (tests.gateway_harness), so
the pipeline's own steps run for real: resolve, require, lease, the preflight and
admit against the engine, the trace, the release. What a caller would notice is
checked: the events are the engine's, in order, the trace shows the answer's tokens,
the slot is back after the stream, and a consumer that stops early makes the engine
stop generating.
"""

from __future__ import annotations

import asyncio
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from blazar.engines.launchers import llama_launcher as launcher
from blazar.observe.trace import CURRENT, Trace
from blazar.protocols.sse import DONE
from blazar.serve.request.pipeline import Pipeline
from blazar.serve.request.realtime_turn import ChatAsk
from blazar.serve.supervisor.child_http import ChildConnections
from blazar.serve.supervisor.scheduler import ModelNotFound, Scheduler
from blazar.testing.tiny import is_tiny_text, write_tiny_model
from tests.gateway_harness import StandIn, runtime
from tests.serving import assert_generation_cancelled, tokens_in_progress, tokens_predicted

LISTENING = "blazar-launcher: listening on "
HI = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The launcher serving the tiny model, with /metrics; its URL."""
    model = write_tiny_model(tmp_path_factory.mktemp("events") / "tiny.gguf")
    command = [
        sys.executable,
        str(Path(launcher.__file__)),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--model",
        str(model),
        "--ctx-size",
        "1024",
        "--threads",
        "2",
        "--metrics",
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout or ()], daemon=True).start()
    try:
        while not (line := lines.get(timeout=30)).startswith(LISTENING):
            pass
        yield line.removeprefix(LISTENING).strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def pipeline_for(url: str) -> Pipeline:
    class Instance(StandIn):
        url_of_child = url

    runtimes = {"tiny": runtime("tiny", ctx=1024)}
    scheduler = Scheduler(
        runtimes,
        max_loaded=1,
        max_queue=4,
        queue_timeout=5.0,
        log_dir=Path("/x"),
        make_instance=Instance,
    )
    return Pipeline(scheduler, ChildConnections())


def in_flight(pipeline: Pipeline) -> int:
    return sum(m.in_flight for m in pipeline.scheduler.pools["tiny"].members)


def ask(max_tokens: int) -> ChatAsk:
    body = {
        "model": "tiny",
        "messages": HI,
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    return ChatAsk("tiny", "/v1/realtime", body)


def test_events_stream_the_engines_answer_on_the_trace_and_give_the_slot_back(child: str) -> None:
    async def run() -> tuple[list[Any], dict[str, Any], int]:
        pipeline = pipeline_for(child)
        trace = Trace("t-events", "openai", "/v1/realtime")
        token = CURRENT.set(trace)
        try:
            async with aclosing(pipeline.events(ask(12))) as events:
                seen = [event async for event in events]
        finally:
            CURRENT.reset(token)
        record = trace.record(scrub=False)
        return seen, record, in_flight(pipeline)

    seen, record, held = asyncio.run(run())
    assert seen[-1] == DONE and held == 0
    text = "".join(
        c["delta"].get("content") or "" for e in seen[:-1] for c in e.get("choices") or ()
    )
    assert is_tiny_text(text.strip(), allow=())
    usage = next(e["usage"] for e in seen[:-1] if e.get("usage"))
    assert usage["completion_tokens"] == 12
    assert record["model"] == "tiny" and record["stream"] is True
    assert record["generated_tokens"] == 12 and record["finish_reason"] == "length"
    assert record["instance"] and record["ttft_ms"] is not None


def test_a_consumer_that_stops_early_stops_the_engine(child: str) -> None:
    port = int(child.rsplit(":", 1)[1])

    async def run() -> tuple[int, float]:
        pipeline = pipeline_for(child)
        async with aclosing(pipeline.events(ask(1000))) as events:
            count = 0
            async for _ in events:
                count += 1
                if count == 3:
                    break
        # counted once the consumer has stopped (closed the events), so what the child
        # generates while these reads run is not laid to the pipeline's charge
        at_stop = await asyncio.to_thread(lambda: tokens_predicted(port) + tokens_in_progress(port))
        return in_flight(pipeline), at_stop

    held, at_stop = asyncio.run(run())
    assert held == 0  # given back as the consumer stopped, not when the engine is done
    assert_generation_cancelled(port, at_stop, max_tokens=1000)  # ctx 1024: 997 if never told


def test_an_unknown_model_is_refused_before_any_lease(child: str) -> None:
    async def run() -> int:
        pipeline = pipeline_for(child)
        refused = ChatAsk("nope", "/v1/realtime", {"model": "nope", "messages": HI})
        with pytest.raises(ModelNotFound, match="model 'nope' not found"):
            async with aclosing(pipeline.events(refused)) as events:
                async for _ in events:
                    pass
        return in_flight(pipeline)

    assert asyncio.run(run()) == 0
