"""LoRA adapters end to end: `blazar lora`, `model+adapter` on every protocol, concurrency,
always-on adapters, `model+none` and per-request scales, and removal while in use.

The tiny model's adapters each make one word win (`write_tiny_lora`: fox, owl,
yak), and the base model never says those words, so "this request used that
adapter, and only that one" is what each check reads from the answer itself.
The real engine serves them; each serve test starts one `blazar serve` and
groups its checks, since a start costs seconds.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
import tomlkit

from blazar.paths import Paths
from blazar.testing.tiny import is_tiny_text
from tests.conftest import Blazar
from tests.fixtures import ENGINE, lora_block, model_block
from tests.serving import Served
from tests.waiting import wait_until

HI = [{"role": "user", "content": "hello there"}]


def only(word: str, text: str) -> bool:
    """The answer is that adapter's word and nothing else."""
    words = text.split()
    return bool(words) and all(w == word for w in words)


def plain(text: str) -> bool:
    """The base model's words, no adapter word among them."""
    return is_tiny_text(text.strip(), allow=())


# --- the CLI: declare, fetch, list, remove -------------------------------------------------


def test_lora_add_list_rm_edit_the_manifest(
    blazar: Blazar, paths: Paths, lora_files: dict[str, Path]
) -> None:
    blazar("pull", lora_files["tiny"].as_uri(), "--name", "tiny")
    text = paths.manifest.read_text()
    paths.manifest.write_text("# my models\n" + text)

    out = blazar("lora", "add", "tiny", str(lora_files["fox"])).output
    assert "added adapter fox for tiny" in out and "tiny+fox" in out
    out = blazar(
        "lora",
        "add",
        "tiny",
        str(lora_files["owl"]),
        "--name",
        "night",
        "--always-on",
        "--scale",
        "0.5",
    ).output
    assert "on for every request" in out
    doc = tomlkit.parse(paths.manifest.read_text())
    assert paths.manifest.read_text().startswith("# my models\n")  # comments kept
    assert doc["loras"]["fox"] == {"model": "tiny", "source": lora_files["fox"].as_uri()}
    assert doc["loras"]["night"]["always_on"] is True and doc["loras"]["night"]["scale"] == 0.5

    rows = [json.loads(line) for line in blazar("lora", "list", "--json").output.splitlines()]
    by_name = {r["name"]: r for r in rows}
    assert sorted(by_name) == ["fox", "night"]
    fox = by_name["fox"]
    assert fox["model"] == "tiny" and fox["request_as"] == "tiny+fox" and fox["held"]
    assert fox["size"] == lora_files["fox"].stat().st_size and not fox["always_on"]
    held = Path(fox["path"])
    assert held.samefile(lora_files["fox"])  # hardlinked into the store, the user's file untouched
    assert by_name["night"]["always_on"] and by_name["night"]["scale"] == 0.5
    table = blazar("lora", "list").output
    assert "tiny+night" in table and "ready" in table

    before = paths.manifest.read_text()
    r = blazar("lora", "add", "nomodel", str(lora_files["fox"]), ok=False)
    assert r.exit_code == 1 and "model 'nomodel' is not declared" in r.output
    r = blazar("lora", "add", "tiny", str(lora_files["other"]), "--name", "bad", ok=False)
    assert r.exit_code == 1 and "not a LoRA adapter" in r.output
    r = blazar("lora", "add", "tiny", str(lora_files["fox"]), "--name", "none", ok=False)
    assert r.exit_code == 1 and "'none' is reserved" in r.output
    r = blazar("lora", "add", "tiny", "/nowhere/x.gguf", ok=False)
    assert r.exit_code == 1 and "no such file" in r.output
    assert paths.manifest.read_text() == before  # every failure left the manifest as it was

    out = blazar("lora", "rm", "fox").output
    assert "removed adapter fox and its declaration" in out
    assert "fox" not in tomlkit.parse(paths.manifest.read_text())["loras"]
    assert not held.exists() and lora_files["fox"].exists()  # Blazar's link gone, the file kept
    r = blazar("lora", "rm", "fox", ok=False)
    assert r.exit_code == 1 and "'fox' not found" in r.output and "night" in r.output


# --- serving ------------------------------------------------------------------------------


def serve_manifest(paths: Paths, lora_files: dict[str, Path]) -> Path:
    text = ENGINE
    text += model_block("tiny", lora_files["tiny"], slots=4, ctx=512, keep_alive="-1")
    text += model_block("other", lora_files["other"], keep_alive="-1")
    text += lora_block("fox", "tiny", lora_files["fox"])
    text += lora_block("owl", "tiny", lora_files["owl"], scale=0.8)
    text += lora_block("yak", "other", lora_files["yak"], always_on=True)
    paths.manifest.parent.mkdir(parents=True, exist_ok=True)
    paths.manifest.write_text(text)
    return paths.manifest


def openai_text(client: openai.OpenAI, model: str, n: int = 6) -> str:
    reply = client.chat.completions.create(model=model, messages=HI, max_tokens=n)  # type: ignore[arg-type]
    return reply.choices[0].message.content or ""


def check_openai(served: Served) -> None:
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
    listed = {m.id for m in client.models.list()}
    assert {"tiny", "tiny+fox", "tiny+owl", "other", "other+yak"} <= listed
    assert plain(openai_text(client, "tiny"))
    assert only("fox", openai_text(client, "tiny+fox"))
    assert only("owl", openai_text(client, "tiny:latest+owl"))
    assert only("fox", openai_text(client, "tiny#fox"))  # the older spelling
    assert plain(openai_text(client, "tiny+fox:0"))  # a per-request scale of 0: off
    assert only("fox", openai_text(client, "tiny+fox+owl:0"))
    assert only("fox", openai_text(client, "tiny#0+fox"))  # replica 0, adapter on
    streamed = client.chat.completions.create(
        model="tiny+owl",
        messages=HI,
        max_tokens=5,
        stream=True,  # type: ignore[arg-type]
    )
    assert only("owl", "".join(c.choices[0].delta.content or "" for c in streamed if c.choices))
    completion = client.completions.create(model="tiny+fox", prompt="the cat", max_tokens=4)
    assert only("fox", completion.choices[0].text)
    # always-on: every plain request has it; +none or a scale of 0 turns it off
    assert only("yak", openai_text(client, "other"))
    assert plain(openai_text(client, "other+none"))
    assert plain(openai_text(client, "other+yak:0"))
    assert only("yak", openai_text(client, "other+yak"))
    # a client's mistakes are 4xx in OpenAI's shape
    with pytest.raises(openai.NotFoundError) as missing:
        openai_text(client, "tiny+nope")
    assert "no adapter 'nope'" in str(missing.value) and "tiny+fox, tiny+owl" in str(missing.value)
    with pytest.raises(openai.NotFoundError) as replica:
        openai_text(client, "tiny#3")
    assert "no replica #3" in str(replica.value)
    with pytest.raises(openai.BadRequestError) as bad:
        openai_text(client, "tiny+fox:big")
    assert "'big' is not a scale" in str(bad.value)


def check_ollama(served: Served) -> None:
    client = ollama.Client(host=served.url)
    listed = {m.model for m in client.list().models}
    assert {"tiny:latest", "tiny:latest+fox", "tiny:latest+owl", "other:latest+yak"} <= listed
    chat = client.chat(model="tiny+fox", messages=HI, options={"num_predict": 5})
    assert only("fox", chat.message.content or "")
    five = {"num_predict": 5}
    generated = client.generate(model="tiny:latest+owl", prompt="the cat", options=five)
    assert only("owl", generated.response)
    streamed = client.chat(model="other+none", messages=HI, options={"num_predict": 5}, stream=True)
    assert plain("".join(part.message.content or "" for part in streamed))
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="other+fox", messages=HI)
    assert missing.value.status_code == 404 and "other+yak" in missing.value.error


def check_anthropic(served: Served) -> None:
    client = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
    hi: Any = HI

    def text(model: str) -> str:
        reply = client.messages.create(model=model, max_tokens=6, messages=hi)
        assert reply.model == model and reply.stop_reason == "max_tokens"
        assert reply.usage.output_tokens == 6 and reply.usage.input_tokens > 0
        return "".join(b.text for b in reply.content if b.type == "text")

    assert plain(text("tiny"))
    assert only("fox", text("tiny+fox"))
    assert only("yak", text("other"))
    assert plain(text("other+none"))
    with client.messages.stream(model="tiny+owl", max_tokens=5, messages=hi) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert only("owl", streamed) and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 5 and final.usage.input_tokens > 0
    with pytest.raises(anthropic.NotFoundError) as missing:
        text("tiny+nope")
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


async def interleaved(url: str) -> list[tuple[str, str]]:
    """Eight concurrent requests on one instance of four slots, MODEL and MODEL+fox by turns."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    models = ["tiny", "tiny+fox"] * 4

    async def one(model: str) -> tuple[str, str]:
        reply = await client.chat.completions.create(
            model=model,
            messages=HI,
            max_tokens=48,  # type: ignore[arg-type]
        )
        return model, reply.choices[0].message.content or ""

    try:
        return list(await asyncio.gather(*(one(m) for m in models)))
    finally:
        await client.close()


def test_adapters_per_request_on_every_protocol(
    blazar: Blazar, paths: Paths, blazar_home: Path, lora_files: dict[str, Path]
) -> None:
    with Served(serve_manifest(paths, lora_files), blazar_home) as served:
        wait_until(lambda: "tiny+fox" in json.dumps(served.get("/v1/models")), "the adapters")
        check_openai(served)
        pids = {row["pid"] for row in served.ps() if row["model"] == "tiny"}
        check_ollama(served)
        check_anthropic(served)
        for _ in range(2):  # twice: the first round also finds slots holding older prompts
            answers = asyncio.run(interleaved(served.url))
            for model, answer in answers:
                assert only("fox", answer) if model == "tiny+fox" else plain(answer), answers
        # adapters cost no extra instance and no restart: the same one child throughout
        rows = [row for row in served.ps() if row["model"] == "tiny"]
        assert len(rows) == 1 and {rows[0]["pid"]} == pids
        check_lora_add_keeps_the_child(served, blazar, paths, lora_files["bark"])
        assert "restarted" not in served.log


def check_lora_add_keeps_the_child(
    served: Served, blazar: Blazar, paths: Paths, adapter: Path
) -> None:
    """Regression: `blazar lora add` restarted the model's child ("tiny: restarted"): its
    arguments name every adapter, and llama-server cannot load one into a running child.
    Now the child keeps serving (same pid, its cache kept), a request for the new adapter
    starts a child with every adapter, and after `blazar stop` the model comes back as
    that one child. Base requests run throughout and none may fail."""
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="-", max_retries=0)
    [before] = [r for r in served.ps() if r["model"] == "tiny"]
    answers: list[str] = []
    failures: list[str] = []
    stop = threading.Event()

    def base_traffic() -> None:
        own = openai.OpenAI(base_url=f"{served.url}/v1", api_key="-", max_retries=0)
        while not stop.is_set():
            try:
                answers.append(openai_text(own, "tiny", n=4))
            except openai.APIError as exc:
                failures.append(repr(exc))

    traffic = threading.Thread(target=base_traffic)
    traffic.start()
    try:
        blazar("lora", "add", "tiny", str(adapter), "--name", "bark")
        # The CLI's own apply held the lock during serve's watcher pass: touching the
        # manifest asks for a pass now rather than at the next timer.
        paths.manifest.write_text(paths.manifest.read_text())
        wait_until(lambda: "tiny: adapters added (bark)" in served.log, "the adapter served")
        assert only("yak", openai_text(client, "tiny+bark"))
        assert only("fox", openai_text(client, "tiny+fox"))  # on the child that had it
        seen = len(answers)
        wait_until(lambda: len(answers) > seen + 2, "base requests after the add")
    finally:
        stop.set()
        traffic.join(timeout=60)
    assert failures == [] and answers and all(plain(a) for a in answers), failures
    rows = {tuple(r["adapters"]): r for r in served.ps() if r["model"] == "tiny"}
    assert rows.keys() == {("fox", "owl"), ("bark", "fox", "owl")}, rows
    assert rows[("fox", "owl")]["pid"] == before["pid"]
    # converged: once stopped, the model comes back as one child with every adapter
    assert served.post("/api/blazar/stop", {"model": "tiny"})["stopped"] is True
    assert plain(openai_text(client, "tiny"))
    assert only("yak", openai_text(client, "tiny+bark"))
    assert only("owl", openai_text(client, "tiny+owl"))
    [after] = [r for r in served.ps() if r["model"] == "tiny"]
    assert after["adapters"] == ["bark", "fox", "owl"] and after["pid"] != before["pid"]


def test_lora_rm_while_a_request_uses_it_lets_it_finish(
    blazar: Blazar, paths: Paths, blazar_home: Path, lora_files: dict[str, Path]
) -> None:
    text = ENGINE + model_block("tiny", lora_files["tiny"], ctx=2048, keep_alive="-1")
    paths.manifest.parent.mkdir(parents=True, exist_ok=True)
    paths.manifest.write_text(text + lora_block("fox", "tiny", lora_files["fox"]))
    # top_logprobs make each chunk about 5 KB: 1500 of them (8 MB) outgrow the socket
    # buffers, so the request stays in flight while this test does not read
    body = {
        "model": "tiny+fox",
        "messages": HI,
        "max_tokens": 1500,
        "stream": True,
        "logprobs": True,
        "top_logprobs": 60,
    }
    with Served(paths.manifest, blazar_home) as served, httpx.Client(timeout=120) as http:
        wait_until(lambda: "tiny+fox" in json.dumps(served.get("/v1/models")), "the adapter")
        with http.stream("POST", f"{served.url}/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            first = [next(lines) for _ in range(6)]
            assert blazar("lora", "rm", "fox").exit_code == 0
            wait_until(lambda: "tiny: restarted" in served.log, "serve to reload the manifest")
            rows = served.ps()
            old = [r for r in rows if r["model"] == "tiny" and r["retired"]]
            assert len(old) == 1 and old[0]["in_flight"] == 1, rows  # still answering it
            with pytest.raises(openai.NotFoundError, match="no adapter 'fox'"):
                client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="-", max_retries=0)
                openai_text(client, "tiny+fox")
            assert plain(openai_text(client, "tiny"))  # on the new instance, meanwhile
            rest = list(lines)
        events = [json.loads(line[6:]) for line in [*first, *rest] if line.startswith("data: {")]
        text_out = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
        assert only("fox", text_out) and len(text_out.split()) == 1500  # whole, with the adapter
        assert events[-1]["choices"][0]["finish_reason"] == "length" and "data: [DONE]" in rest
        wait_until(lambda: not [r for r in served.ps() if r["retired"]], "the old instance to stop")
