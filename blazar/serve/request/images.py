"""Images in requests for a model with a vision projector: checked, and fetched when sent
by URL, before the engine sees them.

Each protocol's translator (`blazar.protocols.openai_requests`, `ollama`, `anthropic`)
finds its request's images (`image_refs`: where each is, and its URL: a `data:` URL or
an http(s) one) and puts them back (`with_images`); each route's `Ask.resolved` makes
one call (`openai_body`, `ollama_images`, `anthropic_request`) once the model is known
and before the pipeline leases a slot, so no slot waits on a download. Every image
reaches the engine as a `data:` URL: llama-server fetches an http(s) URL itself when it
is given one (seen with xllamacpp 2026.10.11549), from wherever it points, so none is
passed on.

The checks are pure (`check_url`, `content_type_refusal`, `decode_data_url`,
`check_image`, `sniff`, and `blazar.urls.address_refusal`); `fetch_image` is the one
effect. It takes the limits of `[serving]` (`Limits.of`): `image_max_size` bytes,
`image_fetch_timeout` seconds in all, redirects followed by hand (at most
`MAX_REDIRECTS`, each location checked again), and no address that is private,
loopback, link-local, shared, multicast, reserved or unspecified, unless it lies in
`image_fetch_networks`. Every hop's URL goes through `blazar.urls.target` first, which
reads its host as aiohttp will (IDNA/NFKC: `１２７.０.０.１` is 127.0.0.1) and refuses one
written so that it reads otherwise to a person; the request goes to the URL it built. An
address literal is checked before connecting, a name after DNS resolution by the
connection's own resolver (`GuardedResolver`), so the address checked is the one
connected to. Only PNG, JPEG, GIF and BMP, which this engine decodes, are passed (by
their bytes, whatever a header or media type claims). Every refusal is a 400 in the
protocol's shape that says which image, what is wrong and what to do.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
import yarl
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from blazar.protocols import (
    EngineRequest,
    ImageRef,
    ProtocolError,
    anthropic,
    ollama,
    openai_requests,
)
from blazar.urls import RefusedUrl, Target, address_refusal, target
from specs.serving import Serving

__all__ = [
    "Limits",
    "address_refusal",
    "anthropic_request",
    "check_image",
    "check_url",
    "content_type_refusal",
    "decode_data_url",
    "dimensions",
    "fetch_image",
    "ollama_images",
    "openai_body",
    "resolve_refs",
    "sniff",
]

MAX_REDIRECTS = 5
MAX_IMAGES = 32  # images per request; each URL is one fetch
# What this engine decodes (stb_image), by the bytes files start with.
MAGIC = {
    b"\x89PNG\r\n\x1a\n": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
    b"GIF87a": "image/gif",
    b"GIF89a": "image/gif",
    b"BM": "image/bmp",
}
SUPPORTED = frozenset(MAGIC.values())
# Formats clients send that it cannot decode, recognised to say so.
OTHER_MAGIC = {b"RIFF": "WebP", b"<svg": "SVG", b"<?xml": "SVG", b"II*\x00": "TIFF"}
CONVERT = "convert it to PNG or JPEG"
# The most pixels a picture may declare: an engine (stb_image) allocates width x height x 4
# bytes before decoding, so a 100-byte PNG whose header says 100000x100000 asks it for
# 40 GB. 8192 x 8192 (256 MiB decoded) covers any photo a model is shown or edits.
MAX_PIXELS = 8192 * 8192


def _bad(message: str) -> ProtocolError:
    return ProtocolError(400, message, "invalid_request_error")


@dataclass(frozen=True)
class Limits:
    """How far the gateway goes for images (`[serving]`)."""

    max_bytes: int = 20 * 1024**2
    timeout: float = 10.0
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @classmethod
    def of(cls, serving: Serving) -> Limits:
        allowed = serving.image_fetch_networks
        networks = tuple(ipaddress.ip_network(n, strict=False) for n in allowed)
        return cls(serving.image_max_size, serving.image_fetch_timeout, networks)


# -- pure checks ---------------------------------------------------------------------------


def sniff(data: bytes) -> str | None:
    """The media type of image bytes this engine decodes; None for anything else."""
    return next((kind for magic, kind in MAGIC.items() if data.startswith(magic)), None)


def _megabytes(n: int) -> str:
    return f"{n / 1024**2:.1f} MiB"


def check_image(data: bytes, where: str, limits: Limits) -> str:
    """The media type of an image's bytes, or a 400 saying why they cannot be passed on."""
    if len(data) > limits.max_bytes:
        raise _too_large(where, len(data), limits)
    kind = sniff(data)
    if kind is None:
        other = next((name for magic, name in OTHER_MAGIC.items() if data.startswith(magic)), None)
        what = f"a {other} image, which this engine cannot decode" if other else "not an image"
        raise _bad(f"{where}: the image is {what}: send PNG, JPEG, GIF or BMP ({CONVERT})")
    size = dimensions(data, kind)
    if size is None:
        raise _bad(f"{where}: the {kind} image's header cannot be read: {CONVERT} again")
    width, height = size
    if width * height > MAX_PIXELS:
        raise _bad(
            f"{where}: the image says it is {width}x{height} pixels, over the "
            f"{MAX_PIXELS:,} the gateway passes on: send a smaller image"
        )
    return kind


def dimensions(data: bytes, kind: str) -> tuple[int, int] | None:
    """(width, height) as the image's header declares them, read without decoding; None
    when the header is cut short or malformed."""
    try:
        if kind == "image/png":  # IHDR, the first chunk
            if len(data) < 24 or data[12:16] != b"IHDR":
                return None
            return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        if kind == "image/gif":  # the logical screen
            if len(data) < 10:
                return None
            return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
        if kind == "image/bmp":  # BITMAPINFOHEADER (a negative height: top-down rows)
            if len(data) < 26:
                return None
            width = int.from_bytes(data[18:22], "little", signed=True)
            height = int.from_bytes(data[22:26], "little", signed=True)
            return abs(width), abs(height)
        return _jpeg_dimensions(data)
    except IndexError:
        return None


# JPEG markers that start a frame (SOF0-15 but DHT, JPG and DAC): they hold its size.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_dimensions(data: bytes) -> tuple[int, int] | None:
    """A JPEG's size from its first frame header, walking the segments before it."""
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # no length
            at += 2
            continue
        length = int.from_bytes(data[at + 2 : at + 4], "big")
        if length < 2:
            return None
        if marker in _SOF:
            if at + 9 > len(data):
                return None
            height = int.from_bytes(data[at + 5 : at + 7], "big")
            return int.from_bytes(data[at + 7 : at + 9], "big"), height
        at += 2 + length
    return None


def _too_large(where: str, size: int, limits: Limits) -> ProtocolError:
    return _bad(
        f"{where}: the image is {_megabytes(size)}, over the gateway's limit of "
        f"{_megabytes(limits.max_bytes)} (serving.image_max_size): send a smaller image"
    )


def decode_data_url(url: str, where: str, limits: Limits) -> tuple[str, bytes]:
    """A `data:image/...;base64,` URL's declared media type and bytes (a 400 if it is not
    one, or decodes to more than the limit)."""
    head, comma, payload = url.partition(",")
    declared = head.removeprefix("data:").split(";")[0].strip().lower()
    if not comma or ";base64" not in head.lower():
        raise _bad(f"{where}: a data URL must be base64: data:image/png;base64,...")
    if not declared.startswith("image/"):
        raise _bad(f"{where}: the data URL is {declared or 'untyped'}, not an image")
    if len(payload) * 3 // 4 > limits.max_bytes + 3:  # before decoding it
        raise _too_large(where, len(payload) * 3 // 4, limits)
    try:
        data = base64.b64decode(payload.strip(), validate=False)
    except (binascii.Error, ValueError):
        raise _bad(f"{where}: the data URL's image is not valid base64") from None
    return declared, data


def check_url(url: str, where: str) -> Target:
    """Where fetching an image URL connects (`blazar.urls.target`: http or https, no
    credentials, a host that reads the same to the connector as to a person), or a 400."""
    try:
        scheme = urlsplit(url).scheme
    except ValueError:
        raise _bad(f"{where}: {url[:200]!r} is not a URL") from None
    if scheme not in ("http", "https"):
        raise _bad(f"{where}: image URLs must be http(s) or data: URLs, not {scheme or 'a path'}")
    try:
        return target(url)
    except RefusedUrl as exc:
        raise _bad(f"{where}: {exc}") from None


def content_type_refusal(content_type: str | None) -> str | None:
    """Why a fetched response is not an image this engine decodes (None: it may be)."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if not kind.startswith("image/"):
        return f"its content type is {kind or 'missing'}, not an image"
    if kind not in SUPPORTED and kind != "image/jpg":
        return f"it is {kind}, which this engine cannot decode ({CONVERT})"
    return None


def _refused_address(hop: Target, where: str, limits: Limits) -> None:
    """An address literal is checked before any connection (aiohttp asks no resolver for
    one); a name is checked once resolved (`GuardedResolver`)."""
    if hop.address is not None:
        why = address_refusal(str(hop.address), limits.networks)
        if why is not None:
            raise _refused(where, why)


def _refused(where: str, why: str) -> ProtocolError:
    return _bad(
        f"{where}: the gateway does not fetch images from a {why}: send the image inline "
        "(base64), or list that network in serving.image_fetch_networks"
    )


# -- the fetch -------------------------------------------------------------------------------


class RefusedAddress(OSError):
    """A name resolved to an address the gateway may not fetch from."""


class GuardedResolver(AbstractResolver):
    """DNS resolution that refuses a name with any address the gateway may not reach:
    the connection then goes only to addresses that were checked."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self.inner.resolve(host, port, family)
        for result in found:
            why = address_refusal(result["host"], self.limits.networks)
            if why is not None:
                raise RefusedAddress(f"{host} resolves to a {why}")
        return found

    async def close(self) -> None:
        await self.inner.close()


async def fetch_image(url: str, where: str, limits: Limits) -> str:
    """Fetch an image URL within the limits; return it as a `data:` URL."""
    connector = aiohttp.TCPConnector(resolver=GuardedResolver(limits), use_dns_cache=False)
    timeout = aiohttp.ClientTimeout(total=limits.timeout)
    try:
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, trust_env=False
        ) as session:
            for _ in range(MAX_REDIRECTS + 1):
                hop = check_url(url, where)
                _refused_address(hop, where, limits)
                # its host is ASCII as checked: yarl reads it back unchanged (a property
                # tests/test_urls_hostile.py checks)
                async with session.get(yarl.URL(hop.url), allow_redirects=False) as response:
                    if response.status in (301, 302, 303, 307, 308):
                        location = response.headers.get("Location")
                        if not location:
                            raise _bad(f"{where}: {url} redirects without a Location")
                        try:  # checked on the next turn
                            url = urljoin(hop.url, location)
                        except ValueError:  # urlsplit's: brackets around a non-address
                            raise _bad(
                                f"{where}: {hop.url} redirects to {location[:200]!r}, which "
                                "is not a URL"
                            ) from None
                        continue
                    data = await _body(response, url, where, limits)
                    kind = check_image(data, where, limits)
                    return f"data:{kind};base64,{base64.b64encode(data).decode()}"
            raise _bad(f"{where}: the image URL redirects more than {MAX_REDIRECTS} times")
    except TimeoutError:
        raise _bad(
            f"{where}: fetching {url} took longer than {limits.timeout:g} s "
            "(serving.image_fetch_timeout): send the image inline (base64)"
        ) from None
    except aiohttp.ClientConnectorError as exc:
        if isinstance(exc.os_error, RefusedAddress):
            raise _refused(where, str(exc.os_error).split(" resolves to a ", 1)[1]) from None
        raise _bad(f"{where}: cannot fetch {url}: {exc.os_error or exc}") from None
    except aiohttp.ClientError as exc:
        raise _bad(f"{where}: cannot fetch {url}: {exc or type(exc).__name__}") from None


async def _body(response: aiohttp.ClientResponse, url: str, where: str, limits: Limits) -> bytes:
    if response.status != 200:
        raise _bad(f"{where}: fetching {url} answered HTTP {response.status}")
    why = content_type_refusal(response.headers.get("Content-Type"))
    if why is not None:
        raise _bad(f"{where}: {url} is not an image this engine reads: {why}")
    length = response.content_length
    if length is not None and length > limits.max_bytes:
        raise _too_large(where, length, limits)
    data = bytearray()
    async for chunk in response.content.iter_chunked(64 * 1024):
        data += chunk
        if len(data) > limits.max_bytes:
            raise _too_large(where, len(data), limits)
    return bytes(data)


async def resolve_refs(refs: Sequence[ImageRef], limits: Limits) -> list[str] | None:
    """Each image as a checked `data:` URL, in order; None when every one was a valid
    `data:` URL already (the body then travels as it came)."""
    if len(refs) > MAX_IMAGES:
        raise _bad(f"a request may carry at most {MAX_IMAGES} images; it has {len(refs)}")
    out: list[str | None] = []
    for ref in refs:  # every image checked before anything is fetched
        if ref.url.startswith("data:"):
            check_image(decode_data_url(ref.url, ref.where, limits)[1], ref.where, limits)
            out.append(ref.url)
        else:
            check_url(ref.url, ref.where)
            out.append(None)
    if all(url is not None for url in out):
        return None
    try:
        async with asyncio.TaskGroup() as group:  # the first refusal cancels the others
            tasks = {
                i: group.create_task(fetch_image(ref.url, ref.where, limits))
                for i, ref in enumerate(refs)
                if out[i] is None
            }
    except* ProtocolError as failed:
        raise failed.exceptions[0] from None
    return [url if url is not None else tasks[i].result() for i, url in enumerate(out)]


# -- one call per route ---------------------------------------------------------------------


async def openai_body(
    serving: Serving, has_vision: bool, body: bytes, data: dict[str, Any]
) -> tuple[bytes, dict[str, Any]]:
    """An OpenAI chat body with its image URLs fetched: (bytes, parsed), as they came when
    nothing changed. A model without a projector is left to `shape_request`'s refusal."""
    refs = openai_requests.image_refs(data) if has_vision else []
    urls = await resolve_refs(refs, Limits.of(serving)) if refs else None
    if urls is None:
        return body, data
    inlined = openai_requests.with_images(data, urls)
    return json.dumps(inlined).encode(), inlined


async def ollama_images(serving: Serving, has_vision: bool, body: dict[str, Any]) -> None:
    """An ollama request's images (base64, in `body`) checked; the translated request
    needs no change (they are `data:` URLs already). Refused earlier without a projector."""
    refs = ollama.image_refs(body) if has_vision else []
    if refs:
        await resolve_refs(refs, Limits.of(serving))


async def anthropic_request(
    serving: Serving, has_vision: bool, req: EngineRequest
) -> EngineRequest:
    """An Anthropic request with its image blocks checked and `url` sources fetched (sent
    as base64 sources); refused (400) when the model has no projector."""
    refs = anthropic.image_refs(req.body)
    if not refs:
        return req
    if not has_vision:
        raise anthropic.no_projector(refs[0].where)
    urls = await resolve_refs(refs, Limits.of(serving))
    return req if urls is None else replace(req, body=anthropic.with_images(req.body, urls))
