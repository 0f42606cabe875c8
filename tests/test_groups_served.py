"""Groups with real children (issue 31): `blazar serve`, the real engine, four tiny
models: 'tiny' and 'other' in an exclusive group, 'made' and 'plain' together.

An exclusive group swaps: loading one unloads the other, and a busy one is drained
(its request in flight goes on; the load waits for it, no 503). A together group is
loaded as one and stopped as one.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import aiohttp
import openai

from tests.fixtures import ENGINE, model_block, write_manifest, write_models
from tests.serving import Served
from tests.waiting import wait_until

NAMES = ("tiny", "other", "made", "plain")
GROUPS = """
[groups.swap]
models = ["tiny", "other"]
exclusive = true

[groups.pair]
models = ["made", "plain"]
together = true
"""


def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)


def loaded(served: Served) -> list[str]:
    return sorted(r["model"] for r in served.ps())


def test_exclusive_groups_swap_and_together_groups_load_and_stop_as_one(
    tmp_path: Path, blazar_home: Path
) -> None:
    models = write_models(tmp_path / "models", *NAMES)
    text = (
        '[serving]\nmax_loaded_models = 4\nmin_residency = "0s"\nqueue_timeout = "60s"\n\n'
        + ENGINE
        + "".join(model_block(n, models[n], ctx=4096, slots=1) for n in NAMES)
        + GROUPS
    )
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        oai = client(served)
        oai.completions.create(model="tiny", prompt="a", max_tokens=2)
        assert loaded(served) == ["tiny"]
        # the other of the group: 'tiny' goes, though three more models would fit
        oai.completions.create(model="other", prompt="a", max_tokens=2)
        assert loaded(served) == ["other"]
        assert "unloading 'tiny' to load 'other' (exclusive group)" in served.log

        # 'other' busy (a stream the test does not read): 'tiny' waits for it to drain
        answered: list[Any] = []

        def ask_tiny() -> None:
            try:
                answered.append(oai.completions.create(model="tiny", prompt="a", max_tokens=2))
            except Exception as exc:  # asserted below
                answered.append(exc)

        async def hold_other() -> None:
            hold = {
                "model": "other",
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
                asker = threading.Thread(target=ask_tiny)
                asker.start()
                await asyncio.sleep(1.5)  # 'tiny' waits meanwhile
                rows = {r["model"]: r for r in served.ps()}
                assert sorted(rows) == ["other"] and rows["other"]["in_flight"] == 1
                assert answered == []  # waiting, not refused, and 'other' not cut
                stream.close()  # its client leaves: 'other' drained, 'tiny' loads
                await asyncio.to_thread(asker.join, 60)

        asyncio.run(hold_other())
        assert len(answered) == 1 and not isinstance(answered[0], Exception), answered
        assert loaded(served) == ["tiny"]

        # together: asking for one loads both; stopping one stops both
        oai.completions.create(model="made", prompt="a", max_tokens=2)
        wait_until(
            lambda: {r["model"]: r["state"] for r in served.ps()}.get("plain") == "ready",
            "'plain' loaded beside 'made'",
        )
        assert loaded(served) == ["made", "plain", "tiny"]
        assert served.post("/api/blazar/stop", {"model": "plain"})["stopped"] is True
        wait_until(lambda: loaded(served) == ["tiny"], "'made' stopped with 'plain'")
