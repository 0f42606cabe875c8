"""Vision without a gateway: the image checks and the fetch guard, the translators' image
parts, the projector's declaration, fetch, registration and CLI, the launcher's flag.

The fetch guard runs against a loopback HTTP server: a name that resolves to a
loopback address is refused by the connection's resolver before any request reaches
the server (its hits are counted), a redirect to a refused address is not followed,
and a slow server meets the timeout. Projectors are the tiny ones
`blazar.testing.tiny_vision` writes; `auto` finds one in a Hugging Face repo served on
loopback (`tests.hf_endpoint.FakeHub`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
import tomlkit

from blazar.engines.launchers import launcher_common
from blazar.engines.launchers import llama_launcher as launcher
from blazar.errors import InvalidInput
from blazar.host.hardware import Device
from blazar.models.fit import estimate
from blazar.models.registry import Registry
from blazar.paths import Paths
from blazar.protocols import (
    EngineRequest,
    ImageRef,
    ProtocolError,
    anthropic,
    ollama,
    openai_requests,
)
from blazar.serve.request import images
from blazar.serve.request.images import Limits
from blazar.sources.base import FetchError
from blazar.sources.projector_files import select_projector
from blazar.sources.projectors import import_projector, projector_facts
from blazar.store.db import Store
from blazar.testing.tiny import write_tiny_model
from blazar.testing.tiny_vision import png_bytes, write_tiny_projector
from specs.manifest import Manifest
from specs.names import parse_name
from specs.sources import HFSource
from tests.conftest import Blazar
from tests.hf_endpoint import FakeHub
from tests.loopback import LoopbackHTTP

PNG = png_bytes(4, 4)
WEBP = base64.b64decode("UklGRhoAAABXRUJQVlA4TA0AAAAvAAAAEAcQERGIiP4HAA==")
LOOPBACK = ("127.0.0.0/8",)


def limits(*networks: str, max_bytes: int = 1024, timeout: float = 5.0) -> Limits:
    manifest = Manifest.model_validate({"serving": {"image_fetch_networks": list(networks)}})
    return Limits(max_bytes, timeout, Limits.of(manifest.serving).networks)


# -- pure checks -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "networks", "refused"),
    [
        ("8.8.8.8", (), None),
        ("2001:4860:4860::8888", (), None),
        ("127.0.0.1", (), "loopback address 127.0.0.1"),
        ("127.0.0.1", LOOPBACK, None),
        ("::1", LOOPBACK, "loopback address ::1"),  # an IPv4 network allows no IPv6
        ("10.1.2.3", (), "private address 10.1.2.3"),
        ("192.168.0.9", (), "private address 192.168.0.9"),
        ("172.16.0.1", (), "private address 172.16.0.1"),
        ("169.254.169.254", (), "link-local address 169.254.169.254"),  # cloud metadata
        ("fe80::1", (), "link-local address fe80::1"),
        ("fd00::1", (), "private address fd00::1"),
        ("100.64.0.1", (), "non-public address 100.64.0.1"),
        ("0.0.0.0", (), "unspecified address 0.0.0.0"),
        ("224.0.0.1", (), "multicast address 224.0.0.1"),
        ("::ffff:127.0.0.1", (), "loopback address 127.0.0.1"),  # IPv4-mapped
        ("64:ff9b::a00:1", (), "private address 10.0.0.1"),  # NAT64
        ("2002:a00:1::", (), "private address 10.0.0.1"),  # 6to4
    ],
)
def test_which_addresses_the_gateway_fetches_from(
    address: str, networks: tuple[str, ...], refused: str | None
) -> None:
    assert images.address_refusal(address, limits(*networks).networks) == refused


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("file:///etc/passwd", "must be http(s) or data: URLs, not file"),
        ("ftp://host/x.png", "not ftp"),
        ("/x.png", "not a path"),
        ("http:///x.png", "names no host"),
        ("http://user:pw@host/x.png", "carries credentials"),
        ("http://host:port/x.png", "is not a URL"),
    ],
)
def test_image_urls_the_gateway_refuses_to_fetch(url: str, words: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(words)) as refused:
        images.check_url(url, "messages[0].content[1].image_url")
    assert refused.value.status == 400
    assert refused.value.message.startswith("messages[0].content[1].image_url: ")


def test_image_bytes_and_data_urls() -> None:
    small = limits(max_bytes=1024)
    assert images.check_image(PNG, "x", small) == "image/png"
    assert images.sniff(b"\xff\xd8\xff\xe0rest") == "image/jpeg"
    assert images.sniff(b"GIF89a...") == "image/gif" and images.sniff(b"BM...") == "image/bmp"
    for data, words in (
        (WEBP, "a WebP image"),
        (b"<svg/>", "SVG"),
        (b"hello", "not an image"),
        (PNG + b"\0" * 2000, "over the gateway's limit"),
    ):
        with pytest.raises(ProtocolError, match=words):
            images.check_image(data, "x", small)
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert images.decode_data_url(url, "x", small) == ("image/png", PNG)
    bad_urls = {
        "data:image/png,raw": "must be base64",
        "data:text/plain;base64,aGk=": "text/plain, not an image",
        "data:image/png;base64," + "A" * 4000: "over the gateway's limit",
    }
    for bad, words in bad_urls.items():
        with pytest.raises(ProtocolError, match=words):
            images.decode_data_url(bad, "x", small)


@pytest.mark.parametrize(
    ("content_type", "refused"),
    [
        ("image/png", None),
        ("image/jpeg; charset=binary", None),
        ("text/html", "its content type is text/html, not an image"),
        (None, "its content type is missing, not an image"),
        (
            "image/svg+xml",
            f"it is image/svg+xml, which this engine cannot decode ({images.CONVERT})",
        ),
    ],
)
def test_content_types(content_type: str | None, refused: str | None) -> None:
    assert images.content_type_refusal(content_type) == refused


# -- the fetch, against a loopback server ------------------------------------------------------


class Host(BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []
    target = ""  # where /elsewhere redirects

    def do_GET(self) -> None:
        self.hits.append(self.path)
        if self.path == "/slow.png":
            time.sleep(1.0)
        if self.path == "/elsewhere":
            self.send_response(302)
            self.send_header("Location", self.target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):  # the slow one's client has gone
            self.wfile.write(PNG)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def host() -> Iterator[LoopbackHTTP]:
    Host.hits = []
    server = LoopbackHTTP(Host)
    yield server
    server.stop()


def fetch(url: str, guard: Limits) -> str:
    return asyncio.run(images.fetch_image(url, "images[0]", guard))


def test_the_fetch_guard(host: LoopbackHTTP) -> None:
    port = host.url.rsplit(":", 1)[1]
    fetched = fetch(f"{host.url}/a.png", limits("127.0.0.1/32"))
    assert fetched == "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert Host.hits == ["/a.png"]

    # a name is checked after DNS resolution: localhost's address is loopback
    loopback = re.escape("from a loopback address 127.0.0.1")
    with pytest.raises(ProtocolError, match=loopback) as refused:
        fetch(f"http://localhost:{port}/a.png", limits())
    assert "serving.image_fetch_networks" in refused.value.message
    with pytest.raises(ProtocolError, match=re.escape("loopback address 127.0.0.1")):
        fetch(f"{host.url}/a.png", limits())  # a literal address, before connecting
    assert Host.hits == ["/a.png"]  # neither reached the server

    # a redirect's location is checked again, and not followed when refused
    Host.target = f"http://[::1]:{port}/a.png"
    with pytest.raises(ProtocolError, match=re.escape("loopback address ::1")):
        fetch(f"{host.url}/elsewhere", limits("127.0.0.1/32"))
    Host.target = "file:///etc/passwd"
    with pytest.raises(ProtocolError, match="not file"):
        fetch(f"{host.url}/elsewhere", limits("127.0.0.1/32"))
    assert Host.hits == ["/a.png", "/elsewhere", "/elsewhere"]

    with pytest.raises(ProtocolError, match=r"took longer than 0\.3 s"):
        fetch(f"{host.url}/slow.png", limits("127.0.0.1/32", timeout=0.3))


def test_inline_images_are_passed_unchanged_and_urls_become_data(host: LoopbackHTTP) -> None:
    inline = "data:image/png;base64," + base64.b64encode(PNG).decode()
    guard = limits("127.0.0.1/32")
    assert asyncio.run(images.resolve_refs([ImageRef("a", inline)], guard)) is None
    got = asyncio.run(
        images.resolve_refs([ImageRef("a", inline), ImageRef("b", f"{host.url}/b.png")], guard)
    )
    assert got == [inline, inline]
    mixed = [ImageRef("b", f"{host.url}/b.png"), ImageRef("c", "http://10.9.9.9/c.png")]
    with pytest.raises(ProtocolError, match=r"^c: .*private address 10\.9\.9\.9"):
        asyncio.run(images.resolve_refs(mixed, guard))  # one refusal answers for the request
    too_many = [ImageRef(str(i), inline) for i in range(images.MAX_IMAGES + 1)]
    with pytest.raises(ProtocolError, match="at most 32 images"):
        asyncio.run(images.resolve_refs(too_many, guard))


# -- the translators' image parts ----------------------------------------------------------------


def test_openai_image_parts_found_and_replaced_in_order() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "two"},
                    {"type": "image_url", "image_url": {"url": "http://a/1.png", "detail": "low"}},
                    {"type": "image_url", "image_url": "data:image/png;base64,AAAA"},
                ],
            },
        ],
    }
    refs = openai_requests.image_refs(body)
    assert refs == [
        ImageRef("messages[1].content[1].image_url", "http://a/1.png"),
        ImageRef("messages[1].content[2].image_url", "data:image/png;base64,AAAA"),
    ]
    out = openai_requests.with_images(body, ["data:image/png;base64,ONE", "data:x"])
    parts = out["messages"][1]["content"]
    assert parts[1]["image_url"] == {"url": "data:image/png;base64,ONE", "detail": "low"}
    assert parts[2]["image_url"] == {"url": "data:x"}
    assert out["messages"][0] is body["messages"][0]  # untouched messages are shared
    assert body["messages"][1]["content"][1]["image_url"]["url"] == "http://a/1.png"  # a copy

    shaped = openai_requests.shape_request("/v1/chat/completions", body, has_vision=True)
    assert shaped.body is None  # images pass for a vision model
    with pytest.raises(ProtocolError, match="no vision or audio projector"):
        openai_requests.shape_request("/v1/chat/completions", body)
    audio = {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}
    with pytest.raises(ProtocolError, match="Blazar loads vision projectors only"):
        openai_requests.shape_request("/v1/chat/completions", audio, has_vision=True)


def test_anthropic_image_blocks_found_and_put_back_as_base64() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://a/1.png"}}
    inline = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/gif", "data": "R0lG"},
    }
    body = {
        "model": "m",
        "max_tokens": 4,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "see"}, image]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": [inline]}],
            },
        ],
    }
    req = anthropic.messages_request(body, has_vision=True)
    assert anthropic.image_refs(req.body) == [
        ImageRef("messages.0.content.1", "https://a/1.png"),
        ImageRef("messages.2.content.0.content.0", "data:image/gif;base64,R0lG"),
    ]
    out = anthropic.with_images(
        req.body, ["data:image/png;base64,UE5H", "data:image/gif;base64,R0lG"]
    )
    assert out["messages"][0]["content"][1]["source"] == {
        "type": "base64",
        "media_type": "image/png",
        "data": "UE5H",
    }
    assert out["messages"][2]["content"][0]["content"][0] == inline
    bad = {**body, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}
    with pytest.raises(ProtocolError, match=re.escape("source.type: Input should be 'base64'")):
        anthropic.messages_request(bad, has_vision=True)


def test_ollama_images_as_refs_in_the_translated_order() -> None:
    png = base64.b64encode(PNG).decode()
    chat = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "a", "images": [png, png]},
            {"role": "user", "content": "b", "images": [png]},
        ],
    }
    refs = ollama.image_refs(chat)
    assert [r.where for r in refs] == [
        "messages[0].images[0]",
        "messages[0].images[1]",
        "messages[1].images[0]",
    ]
    req = ollama.chat_request(chat, model_ctx=512, has_vision=True)
    assert isinstance(req, EngineRequest)
    assert openai_requests.image_refs(req.body) == [
        ImageRef(f"messages[{i}].content[{j}].image_url", r.url)
        for (i, j), r in zip([(0, 1), (0, 2), (1, 1)], refs, strict=True)
    ]
    assert ollama.image_refs({"model": "m", "prompt": "x", "images": [png]})[0].where == "images[0]"


# -- the projector: declared, selected, registered, served ----------------------------------


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"source": "file:///m.gguf", "mmproj": "auto"}, "takes the projector from the model's"),
        (
            {"source": "hf://o/r:Q4_K_M", "mmproj": "auto", "mmproj_sha256": "a" * 64},
            "verified against the hub's own sha256",
        ),
        ({"source": "file:///m.gguf", "mmproj": "https://h/p.gguf"}, "mmproj_sha256 is required"),
        ({"source": "file:///m.gguf", "mmproj": "ollama://llava"}, "cannot come from"),
        ({"source": "file:///m.gguf", "mmproj": "hf://o/r:F16"}, "names a quantization"),
        ({"source": "file:///m.gguf", "mmproj": "nope://x"}, "unknown source scheme"),
        ({"source": "file:///m.gguf", "mmproj_sha256": "a" * 64}, "mmproj is not"),
        ({"source": "file:///m.gguf", "args": ["--mmproj", "p.gguf"]}, "use mmproj"),
    ],
)
def test_bad_projector_declarations(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        Manifest.model_validate({"models": {"m": fields}})


def test_which_repo_file_is_the_projector() -> None:
    repo = HFSource("o/vis-GGUF")
    names = ["vis-Q4_K_M.gguf", "mmproj-vis-bf16.gguf", "mmproj-vis-f16.gguf", "README.md"]
    assert select_projector(repo, names) == ["mmproj-vis-f16.gguf"]
    assert select_projector(repo, ["vis-Q4_K_M.gguf", "mmproj-Q8_0.gguf"]) == ["mmproj-Q8_0.gguf"]
    named = HFSource("o/vis-GGUF", filename="mmproj-vis-bf16.gguf")
    assert select_projector(named, names) == ["mmproj-vis-bf16.gguf"]
    with pytest.raises(FetchError, match="holds no vision projector"):
        select_projector(repo, ["vis-Q4_K_M.gguf"])
    with pytest.raises(FetchError, match="several projectors"):
        select_projector(repo, ["mmproj-a-Q4_0.gguf", "mmproj-b-Q4_0.gguf"])


def test_a_projector_is_checked_against_its_model(tmp_path: Path, paths: Paths) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf")
    good = write_tiny_projector(tmp_path / "mmproj.gguf")
    other = write_tiny_projector(tmp_path / "mmproj-32.gguf", projection_dim=32)
    assert projector_facts(good) == {
        "projector_type": "lfm2",
        "projection_dim": 64,
        "vision": True,
        "audio": False,
    }
    with Store(paths.db) as store:
        registry = Registry(store, paths)
        registry.import_file(model, parse_name("tiny"))
        with pytest.raises(InvalidInput, match="not a vision projector"):
            import_projector(registry, model, parse_name("tiny"), source="x", settings={})
        with pytest.raises(InvalidInput, match="projects images to 32 dimensions, but model"):
            import_projector(registry, other, parse_name("tiny"), source="x", settings={})
        held = import_projector(registry, good, parse_name("tiny"), source="s", settings={})
        assert Path(held.path).parent == paths.blobs and store.find_projector("tiny") == held
        registry.remove(parse_name("tiny"))  # the model's projector goes with it
        assert store.find_projector("tiny") is None and not Path(held.path).exists()


def test_the_launcher_and_the_runtime_pass_the_projector(tmp_path: Path) -> None:
    params = launcher.parse_args(["-m", "m.gguf", "--mmproj", "/p/mmproj.gguf"])
    assert params.mmproj.path == "/p/mmproj.gguf"
    model = write_tiny_model(tmp_path / "tiny.gguf")
    missing = launcher.main(["-m", str(model), "--mmproj", str(tmp_path / "none.gguf")])
    assert missing == launcher_common.LOAD_ERROR
    report = estimate(
        "m",
        {"size": 1000},
        [Device("cpu", 0, "ram", 10**9, 10**9)],
        ctx=16,
        cache_type="f16",
        projector=500,
    )
    assert (
        report.projector == 500
        and report.needed == report.weights + report.kv + report.compute + 500
    )


def test_mmproj_command_declares_fetches_and_removes(
    blazar: Blazar, paths: Paths, tmp_path: Path
) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf")
    projector = write_tiny_projector(tmp_path / "mmproj-tiny.gguf")
    wrong = write_tiny_projector(tmp_path / "mmproj-other.gguf", projection_dim=32)
    blazar("pull", model.as_uri(), "--name", "tiny")
    out = blazar("mmproj", "tiny", str(projector)).output
    assert "tiny reads images now" in out
    doc = tomlkit.parse(paths.manifest.read_text())
    assert doc["models"]["tiny"]["mmproj"] == projector.as_uri()
    shown = json.loads(blazar("mmproj", "tiny", "--json").output)
    assert shown["declared"] == projector.as_uri() and shown["projector_type"] == "lfm2"
    assert "No changes." in blazar("diff").output
    fit = json.loads(blazar("fit", "tiny", "--json").output)
    assert fit["projector"] == projector.stat().st_size  # loaded beside the model

    failed = blazar("mmproj", "tiny", str(wrong), ok=False)
    assert failed.exit_code == 1 and "projects images to 32 dimensions" in failed.output
    assert tomlkit.parse(paths.manifest.read_text())["models"]["tiny"]["mmproj"] == (
        projector.as_uri()
    )  # put back

    assert "removed the projector of tiny" in blazar("mmproj", "tiny", "--remove").output
    assert "mmproj" not in tomlkit.parse(paths.manifest.read_text())["models"]["tiny"]
    with Store(paths.db) as store:
        assert store.find_projector("tiny") is None
    assert "has no projector" in blazar("mmproj", "tiny").output


def test_auto_takes_the_projector_from_the_models_repo(
    blazar: Blazar, paths: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf").read_bytes()
    projector = write_tiny_projector(tmp_path / "p.gguf").read_bytes()
    with FakeHub() as hub:
        hub.add_repo(
            "test/vis-GGUF",
            {
                "vis-Q8_0.gguf": model,
                "mmproj-vis-f16.gguf": projector,
                "mmproj-vis-bf16.gguf": b"GGUF other",
            },
        )
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        paths.manifest.parent.mkdir(parents=True, exist_ok=True)
        paths.manifest.write_text(
            '[models.vis]\nsource = "hf://test/vis-GGUF:Q8_0"\nmmproj = "auto"\n'
        )
        plan = blazar("diff").output
        assert "  + projectors.vis\n        # (not held)" in plan
        blazar("apply", "--yes")
        with Store(paths.db) as store:
            held = store.find_projector("vis")
            assert held is not None and held.source == "auto"
            assert held.facts["resolved"]["filename"] == "mmproj-vis-f16.gguf"
        assert hub.seen("GET", "/resolve/")
        assert "No changes." in blazar("diff").output
