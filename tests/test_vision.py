"""Images on a live `blazar serve`: a model with a vision projector, on all three protocols
(and OpenAI's Responses API).

The model is the tiny test model with a tiny projector (`blazar.testing.tiny_vision`,
LFM2-VL's layout: a bigger image becomes more prompt tokens), both written here and
served by the real engine; the clients are the official `openai`, `ollama` and
`anthropic` packages. What a user would notice is checked: a request with an image
counts more prompt tokens than the same request without it, a bigger image more still,
and an image sent by URL counts exactly as the same image sent inline. Image URLs are
served by a loopback server the manifest allows (`serving.image_fetch_networks`); the
fetch guard's refusals (a private or loopback address, directly or by redirect, an
image over `serving.image_max_size`, a page that is not an image, a format the engine
cannot decode) are 400s in each protocol's own shape, and a model without a projector
still refuses images. The projector is declared while serve runs, as `blazar mmproj`
does: the control loop fetches it and the model's instance restarts with `--mmproj`.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import anthropic
import ollama
import openai
import pytest

from blazar.testing.tiny import write_tiny_model
from blazar.testing.tiny_vision import png_bytes, write_tiny_projector
from tests.fixtures import ENGINE, model_block, write_manifest
from tests.loopback import LoopbackHTTP
from tests.serving import Served

SMALL, BIG = png_bytes(128, 128), png_bytes(256, 256, (20, 90, 200))
WEBP = base64.b64decode("UklGRhoAAABXRUJQVlA4TA0AAAAvAAAAEAcQERGIiP4HAA==")
CAP = 64 * 1024  # serving.image_max_size below
HUGE = SMALL + b"\0" * CAP  # a PNG padded past the cap
PRIVATE = "http://10.255.255.1/x.png"  # refused before any connection is tried
FULL_WIDTH = "１２７.０.０.１"  # 127.0.0.1 to aiohttp, a name to urlsplit: fetched until issue 28
QUESTION = "what is this"


class Images(BaseHTTPRequestHandler):
    """The loopback image host: path -> (status, headers, body); records each hit."""

    routes: ClassVar[dict[str, tuple[int, dict[str, str], bytes]]] = {}
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        status, headers, body = self.routes.get(self.path, (404, {}, b"not here"))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        if "Content-Length" not in headers and self.path != "/streamed-huge":
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def images() -> Iterator[LoopbackHTTP]:
    png = {"Content-Type": "image/png"}
    Images.routes = {
        "/small.png": (200, png, SMALL),
        "/big.png": (200, png, BIG),
        "/moved": (302, {"Location": "/small.png"}, b""),
        "/to-private": (302, {"Location": PRIVATE}, b""),
        "/huge.png": (200, png, HUGE),
        "/streamed-huge": (200, {**png, "Connection": "close"}, HUGE),  # no Content-Length
        "/page": (200, {"Content-Type": "text/html"}, b"<html>an image</html>"),
        "/pic.webp": (200, {"Content-Type": "image/webp"}, WEBP),
    }
    Images.hits = []
    server = LoopbackHTTP(Images)
    yield server
    server.stop()


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def check_openai(served: Served, host: str) -> int:
    """Prompt tokens grow with the image; a URL counts as the same image inline; the
    refusals are OpenAI 400s. Returns the small image's prompt tokens."""
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)

    def prompt_tokens(*urls: str, model: str = "eye") -> int:
        parts: list[Any] = [{"type": "text", "text": QUESTION}]
        parts += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": parts}], max_tokens=2
        )
        assert chat.usage is not None
        return chat.usage.prompt_tokens

    text, small, big = prompt_tokens(), prompt_tokens(data_url(SMALL)), prompt_tokens(data_url(BIG))
    assert text < small < big, (text, small, big)
    assert prompt_tokens(data_url(SMALL), data_url(BIG)) == small + big - text
    assert prompt_tokens(f"{host}/small.png") == small  # fetched, sent inline
    assert prompt_tokens(f"{host}/moved") == small  # a redirect is followed
    assert "/moved" in Images.hits and Images.hits.count("/small.png") == 2
    stream = client.chat.completions.create(
        model="eye",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": QUESTION},
                    {"type": "image_url", "image_url": {"url": f"{host}/big.png"}},
                ],
            }
        ],
        max_tokens=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert [c.usage.prompt_tokens for c in stream if c.usage] == [big]

    refusals = {
        PRIVATE: "private address 10.255.255.1",
        f"{host}/to-private": "private address 10.255.255.1",  # checked again on a redirect
        f"http://[::1]:{host.rsplit(':', 1)[1]}/small.png": "loopback address ::1",
        # allowed as 127.0.0.1, refused as written: the host reads otherwise to a person
        f"http://{FULL_WIDTH}:{host.rsplit(':', 1)[1]}/small.png": "reads as the address",
        f"{host}/huge.png": "over the gateway's limit of 0.1 MiB",
        f"{host}/streamed-huge": "over the gateway's limit",
        data_url(HUGE): "over the gateway's limit",
        f"{host}/page": "its content type is text/html, not an image",
        f"{host}/pic.webp": "image/webp, which this engine cannot decode",
        "file:///etc/passwd": "must be http(s) or data: URLs",
    }
    for url, words in refusals.items():
        with pytest.raises(openai.BadRequestError) as refused:
            prompt_tokens(url)
        assert refused.value.status_code == 400 and words in refused.value.message, url
        assert refused.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as plain:
        prompt_tokens(data_url(SMALL), model="tiny")
    assert "no vision or audio projector" in plain.value.message
    return small


def check_responses(served: Served, host: str, small_chat: int) -> None:
    """The Responses API's `input_image` parts: the same image counts as on chat, by data
    URL or fetched; the fetch guard's refusal and a model without a projector are 400s."""
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)

    def input_tokens(*urls: str, model: str = "eye") -> int:
        parts: list[Any] = [{"type": "input_text", "text": QUESTION}]
        parts += [{"type": "input_image", "image_url": u} for u in urls]
        response = client.responses.create(
            model=model, input=[{"role": "user", "content": parts}], max_output_tokens=2
        )
        assert response.usage is not None
        return response.usage.input_tokens

    assert input_tokens() < input_tokens(data_url(SMALL)) == small_chat
    assert input_tokens(f"{host}/small.png") == small_chat  # fetched, sent inline
    with pytest.raises(openai.BadRequestError, match=r"private address 10\.255\.255\.1"):
        input_tokens(PRIVATE)
    with pytest.raises(openai.BadRequestError, match="has no vision projector"):
        input_tokens(data_url(SMALL), model="tiny")


def check_ollama(served: Served, small_chat: int) -> None:
    """ollama's `images` (base64) on /api/chat and /api/generate; /api/show says vision."""
    client = ollama.Client(host=served.url)

    def chat(*images: bytes, model: str = "eye") -> int:
        message: dict[str, Any] = {"role": "user", "content": QUESTION}
        if images:
            message["images"] = list(images)
        answer = client.chat(model=model, messages=[message], options={"num_predict": 2})
        return int(answer.prompt_eval_count or 0)

    text, small, big = chat(), chat(SMALL), chat(BIG)
    assert text < small < big and small == small_chat  # the same prompt as OpenAI's
    generated = client.generate(
        model="eye", prompt=QUESTION, images=[SMALL], options={"num_predict": 2}
    )
    assert generated.prompt_eval_count == small
    for image, words in (
        (HUGE, "over the gateway's limit"),
        (b"no image", "not an image"),
        (WEBP, "a WebP image, which this engine cannot decode"),
    ):
        with pytest.raises(ollama.ResponseError) as refused:
            chat(image)
        assert refused.value.status_code == 400 and words in refused.value.error
    with pytest.raises(ollama.ResponseError) as plain:
        chat(SMALL, model="tiny")
    assert plain.value.status_code == 400 and "no vision projector" in plain.value.error
    assert "vision" in (client.show("eye").capabilities or [])
    assert "vision" not in (client.show("tiny").capabilities or [])


def check_anthropic(served: Served, host: str, small_chat: int) -> None:
    """Anthropic `image` blocks, base64 and url sources, on /v1/messages."""
    client = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)

    def source(image: bytes) -> dict[str, Any]:
        data = base64.b64encode(image).decode()
        return {"type": "base64", "media_type": "image/png", "data": data}

    def input_tokens(*sources: dict[str, Any], model: str = "eye") -> int:
        content: list[Any] = [{"type": "text", "text": QUESTION}]
        content += [{"type": "image", "source": s} for s in sources]
        message = client.messages.create(
            model=model, max_tokens=2, messages=[{"role": "user", "content": content}]
        )
        usage = message.usage
        return usage.input_tokens + (usage.cache_read_input_tokens or 0)  # both: the prompt

    text, small, big = input_tokens(), input_tokens(source(SMALL)), input_tokens(source(BIG))
    assert text < small < big and small == small_chat
    assert input_tokens({"type": "url", "url": f"{host}/small.png"}) == small
    url_image = {"type": "image", "source": {"type": "url", "url": f"{host}/big.png"}}
    counted = client.messages.count_tokens(
        model="eye",
        messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}, url_image]}],
    )
    assert counted.input_tokens == big
    full_width = f"http://{FULL_WIDTH}:{host.rsplit(':', 1)[1]}"  # allowed as 127.0.0.1
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"type": "url", "url": PRIVATE}, "private address 10.255.255.1"),
        ({"type": "url", "url": f"{full_width}/small.png"}, "reads as the address '127.0.0.1'"),
        ({"type": "url", "url": f"{host}/huge.png"}, "over the gateway's limit"),
        (source(HUGE), "over the gateway's limit"),
        ({"type": "url", "url": f"{host}/page"}, "not an image"),
    ]
    for bad, words in refusals:
        with pytest.raises(anthropic.BadRequestError) as refused:
            input_tokens(bad)
        assert refused.value.status_code == 400 and words in refused.value.message
        assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as plain:
        input_tokens(source(SMALL), model="tiny")
    assert "no vision projector" in plain.value.message


@pytest.fixture(scope="session")
def vision_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny model and its projector, written once per test session."""
    where = tmp_path_factory.mktemp("vision")
    model = write_tiny_model(where / "tiny.gguf")
    return model, write_tiny_projector(where / "mmproj-tiny.gguf")


def test_images_reach_the_engine_on_all_three_protocols(
    tmp_path: Path,
    blazar_home: Path,
    images: LoopbackHTTP,
    vision_files: tuple[Path, Path],
) -> None:
    model, projector = vision_files
    serving = f'[serving]\nimage_max_size = "{CAP}"\nimage_fetch_networks = ["127.0.0.1/32"]\n\n'
    text = serving + ENGINE + model_block("eye", model) + model_block("tiny", model)
    manifest = write_manifest(tmp_path, text)
    with Served(manifest, blazar_home) as served:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
        image = {"type": "image_url", "image_url": {"url": data_url(SMALL)}}
        with pytest.raises(openai.BadRequestError, match="no vision or audio projector"):
            client.chat.completions.create(
                model="eye", messages=[{"role": "user", "content": [image]}], max_tokens=2
            )
        # Declared while serve runs: the control loop fetches it, the model restarts with it.
        text = serving + ENGINE + model_block("eye", model, mmproj=projector.as_uri())
        manifest.write_text(text + model_block("tiny", model))
        deadline = time.monotonic() + 60
        while "vision" not in (served.post("/api/show", {"model": "eye"}).get("capabilities")):
            assert time.monotonic() < deadline, served.log
            time.sleep(0.2)
        small = check_openai(served, images.url)
        check_responses(served, images.url, small)
        check_ollama(served, small)
        check_anthropic(served, images.url, small)
