"""Memory-aware scheduling with real children (issue 31): `blazar serve`, the real engine,
three tiny models and a `serving.memory_budget` that holds two of them, not three.

The budget comes from what the children really used: a first serve loads each model
once (keep_alive 0: each unloads after its request, and is measured then, its peak
resident set), and the store keeps those footprints; a second serve starts from them,
so its decisions (and `ps`) use the measured bytes, not `fit`'s estimate.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import aiohttp
import openai

from blazar.paths import resolve_paths
from blazar.store.db import Store
from tests.conftest import Blazar
from tests.fixtures import ENGINE, model_block, write_manifest, write_models
from tests.serving import Served
from tests.waiting import wait_until

NAMES = ("tiny", "other", "made")
CTX = 4096  # the same in both serves: a footprint is per model file and device kind


def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)


def loaded(served: Served) -> list[str]:
    return sorted(r["model"] for r in served.ps())


def test_a_load_that_does_not_fit_evicts_by_memory_and_waits_for_busy_models(
    tmp_path: Path, blazar_home: Path, blazar: Blazar
) -> None:
    models = write_models(tmp_path / "models", *NAMES)
    for each in ("first", "second"):
        (tmp_path / each).mkdir()
    first = ENGINE + "".join(
        model_block(n, models[n], ctx=CTX, slots=1, keep_alive="0") for n in NAMES
    )
    with Served(write_manifest(tmp_path / "first", first), blazar_home) as served:
        for name in NAMES:
            client(served).completions.create(model=name, prompt="a", max_tokens=4)
            wait_until(lambda name=name: name not in loaded(served), f"{name} unloaded")
    with Store(resolve_paths().db) as store:
        measured = {model: size for (model, _, kind), size in store.footprints().items()}
    assert sorted(measured) == sorted(NAMES), measured
    biggest = max(measured.values())
    budget = int(biggest * 2.5)  # two fit, three do not (max_loaded_models stays 3)

    second = (
        f'[serving]\nmemory_budget = {budget}\nmin_residency = "0s"\nqueue_timeout = "60s"\n\n'
        + ENGINE
        + model_block("tiny", models["tiny"], ctx=CTX, slots=1, pin=True)
        + model_block("other", models["other"], ctx=CTX, slots=1)
        + model_block("made", models["made"], ctx=CTX, slots=1)
    )
    with Served(write_manifest(tmp_path / "second", second), blazar_home) as served:
        oai = client(served)
        for name in ("tiny", "other"):
            oai.completions.create(model=name, prompt="a", max_tokens=2)
        assert loaded(served) == ["other", "tiny"]
        rows = {r["model"]: r for r in served.ps()}
        for name in ("tiny", "other"):  # measured (again, once ready): not the estimate
            assert rows[name]["footprint_source"] == "measured"
            assert abs(rows[name]["footprint"] - measured[name]) < measured[name] * 0.25
            assert rows[name]["devices"] == ["cpu:0"]
        # a third does not fit: the idle one goes, by memory (the count allows three);
        # the pin stays
        oai.completions.create(model="made", prompt="a", max_tokens=2)
        assert loaded(served) == ["made", "tiny"]

        # 'made' busy (a stream the test does not read): 'other' needs its room, and
        # waits for it (no 503) until the stream's client leaves
        answered: list[Any] = []

        def ask_other() -> None:
            try:
                raw = oai.completions.with_raw_response.create(
                    model="other", prompt="a", max_tokens=2
                )
                answered.append(raw.headers["x-request-id"])
            except Exception as exc:  # asserted below
                answered.append(exc)

        async def hold_made() -> None:
            hold = {
                "model": "made",
                "prompt": "a",
                "max_tokens": 4000,
                "stream": True,
                "logprobs": 100,  # chunks of ~8 KB: the socket buffers fill
            }
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{served.url}/v1/completions", json=hold) as stream,
            ):
                await stream.content.readline()  # in flight
                asker = threading.Thread(target=ask_other)
                asker.start()
                await asyncio.sleep(1.5)  # 'other' waits for room meanwhile
                rows = {r["model"]: r for r in served.ps()}
                assert sorted(rows) == ["made", "tiny"] and rows["made"]["in_flight"] == 1
                assert answered == []  # still waiting, not refused
                stream.close()  # its client leaves: 'made' goes idle, 'other' evicts it
                await asyncio.to_thread(asker.join, 60)

        asyncio.run(hold_made())
        assert len(answered) == 1 and not isinstance(answered[0], Exception), answered
        assert loaded(served) == ["other", "tiny"]
        # `blazar why` names the wait: the seconds and the model evicted once room was made
        record = served.get(f"/api/why/{answered[0]}?wait=10")
        room = record["waited_for_room"]
        assert room["evicted"] == ["made"] and room["seconds"] >= 1.0, room
        trail = blazar("why", answered[0], "--url", served.url).output
        assert "waited_for_room" in trail and "evicted made" in trail, trail
