"""URLs whose host reads one way to a check and another to the connector (issue 28, class 1).

The fault pinned here: an image URL written `http://１２７.０.０.１:PORT/x.png` (full-width
digits) passed the private-address check, which read the host with `urlsplit` (not an
IP literal, so left to the resolver), while yarl normalised it (IDNA/NFKC) to
`127.0.0.1` and aiohttp connected to that literal without asking the resolver: the
image was fetched from loopback. It reproduces on every run: no DNS, no timing.

`blazar.urls.target` now reads each URL as the connector will and refuses a host
written so that it reads otherwise. Checked here:
- tables of what it accepts and refuses, and a property over arbitrary hosts: whatever
  it accepts, yarl, aiohttp and `inet_aton` read exactly as it says (a name is never an
  address to any of them), and the URL it builds reads back the same;
- the real image fetch (`images.fetch_image`) against a loopback canary that records
  every request and must receive none, over the family of encodings of its address
  (Unicode digits of a dozen scripts, Unicode dots, decimal, hex, octal and short
  forms, leading zeros, trailing dots, IPv4-mapped, NAT64, 6to4 and compatible IPv6,
  zone ids, userinfo, full-width ports), directly and after a redirect from a host
  `image_fetch_networks` allows (on [::1], so that the canary's 127.0.0.1 stays refused);
- a manifest's URLs: a remote, an MCP server, a download and the HF endpoint written
  with full-width digits are refused, and nothing reaches the canary.
The served route's 400 in OpenAI's and Anthropic's shapes is in tests/test_vision.py.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yarl
from aiohttp.helpers import is_canonical_ipv4_address, is_ip_address
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blazar.engines.download import download
from blazar.protocols import ProtocolError
from blazar.serve.request import images
from blazar.serve.request.images import Limits
from blazar.serve.state.remotes import Fleet, Health
from blazar.serve.supervisor.mcp_server import McpServer, McpSpec, McpUnavailable
from blazar.sources.hf import hub_endpoint
from blazar.testing.tiny_vision import png_bytes
from blazar.urls import RefusedUrl, address_refusal, target
from specs.loader import load_manifest_text
from tests.loopback import LoopbackHTTP

PNG = png_bytes(4, 4)
FULL_WIDTH = "１２７.０.０.１"  # the address of the issue, as written there
# Digits of other scripts. The first families fold to ASCII under NFKC (as IDNA does):
# full-width, mathematical bold, double-struck, sans-serif, sans bold, monospace,
# circled, superscript, subscript. The rest stay themselves (Arabic-Indic, extended
# Arabic-Indic, Devanagari, Bengali, Thai, Myanmar): IDNA makes a punycode name of them,
# but `int()` and other parsers read them as numbers.
FOLDING = [
    "".join(chr(base + i) for i in range(10))
    for base in (0xFF10, 0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6)
] + ["⓪①②③④⑤⑥⑦⑧⑨", "⁰¹²³⁴⁵⁶⁷⁸⁹", "₀₁₂₃₄₅₆₇₈₉"]
SCRIPTS = [
    "".join(chr(base + i) for i in range(10))
    for base in (0x0660, 0x06F0, 0x0966, 0x09E6, 0x0E50, 0x1040)
]
DIGITS = FOLDING + SCRIPTS
DOTS = [".", "\u3002", "\uff0e", "\uff61", "\ufe52", "\u2024"]  # all read as "." by IDNA


# -- the pure function -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "host", "address", "sent"),
    [
        ("http://127.0.0.1:8080/a.png#x", "127.0.0.1", "127.0.0.1", "http://127.0.0.1:8080/a.png"),
        ("HTTPS://Example.COM/a", "example.com", None, "https://example.com/a"),
        ("http://bücher.de/a", "xn--bcher-kva.de", None, "http://xn--bcher-kva.de/a"),
        ("http://example.com./a", "example.com.", None, "http://example.com./a"),
        ("http://[::1]:99/a?b=c", "::1", "::1", "http://[::1]:99/a?b=c"),
        (
            "http://[::ffff:127.0.0.1]/",
            "::ffff:7f00:1",
            "::ffff:7f00:1",
            "http://[::ffff:7f00:1]/",
        ),  # an address in kind: the policy decides (by its v4)
        ("http://1.2.3.4.example.com/", "1.2.3.4.example.com", None, "http://1.2.3.4.example.com/"),
        ("http://my_service:8000", "my_service", None, "http://my_service:8000"),
    ],
)
def test_what_target_accepts_and_what_it_sends(
    url: str, host: str, address: str | None, sent: str
) -> None:
    got = target(url)
    assert (got.host, got.url) == (host, sent)
    assert got.address == (ipaddress.ip_address(address) if address else None)
    assert target(got.url) == got  # the URL it sends reads back the same


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (f"http://{FULL_WIDTH}:8080/x", "reads as the address '127.0.0.1'"),
        ("http://127。0。0。1/x", "reads as the address '127.0.0.1'"),
        ("http://12７.0.0.1/x", "written with non-ASCII characters"),  # one digit among ASCII
        ("http://𝟏𝟐𝟕.0.0.1/x", "reads as the address '127.0.0.1'"),
        ("http://١٢٧.٠.٠.١/x", "reads as the address '127.0.0.1'"),  # IDNA: a punycode name
        ("http://⒓7.0.0.1/x", "written with non-ASCII characters"),  # '⒓' is '12.'
        ("http://ｌｏｃａｌｈｏｓｔ/x", "stand for the ASCII name 'localhost'"),
        ("http://ｘｎ--bcher-kva.de/x", "stand for the ASCII name"),
        ("http://2130706433/x", "an IPv4 address in a form resolvers read differently"),
        ("http://0x7f000001/x", "in a form resolvers read differently"),
        ("http://0x7f.1/x", "in a form resolvers read differently"),
        ("http://0177.0.0.1/x", "in a form resolvers read differently"),
        ("http://127.1/x", "in a form resolvers read differently"),
        ("http://127.0.0.01/x", "in a form resolvers read differently"),
        ("http://127.0.0.1./x", "in a form resolvers read differently"),
        ("http://example.0x7f/x", "in a form resolvers read differently"),
        ("http://[::1%25lo]/x", "which is not a plain IPv6 address"),
        ("http://[v1.x]/x", "which is not a plain IPv6 address"),
        ("http://a..b/x", "is not a host name or an address"),
        ("http://127.0.0.1%00.x/x", "is not a host name or an address"),
        ("http://h:８０/x", "a port written with other than ASCII digits"),
        ("http://u:p@example.com/x", "carries credentials"),
        ("http://exa\nmple.com/x", "control characters"),
        ("http:///x", "names no host"),
        ("file:///etc/passwd", "is not an http or https URL"),
        ("http://host:port/x", "is not a URL"),
        ("http://[]@/x", "is not a URL"),  # yarl's IndexError, found by the property below
    ],
)
def test_what_target_refuses(url: str, words: str) -> None:
    with pytest.raises(RefusedUrl) as refused:
        target(url)
    assert words in str(refused.value)


def test_credentials_where_the_caller_allows_them() -> None:
    assert target("https://u:p@example.com/r", credentials=True).url == "https://u:p@example.com/r"
    with pytest.raises(RefusedUrl, match="reads as the address"):
        target(f"https://u:p@{FULL_WIDTH}/r", credentials=True)


HOST_CHARS = st.sampled_from(
    list("0123456789abcdefx.-_:[]%@")
    + [d[i] for d in DIGITS for i in (0, 1, 7)]
    + DOTS[1:]
    + ["ｘ", "ｌ", "ü", "\u00df", "⒈"]
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(host=st.text(HOST_CHARS, min_size=1, max_size=24), port=st.none() | st.integers(1, 65535))
def test_an_accepted_host_reads_the_same_to_every_parser(host: str, port: int | None) -> None:
    """Whatever `target` accepts, yarl (the client's parser), aiohttp's own literal test
    and libc's `inet_aton` read as it says: an address is a canonical literal, and a name
    is an address to none of them."""
    url = f"http://{host}" + (f":{port}" if port else "") + "/p"
    try:
        got = target(url)
    except RefusedUrl:
        return
    assert yarl.URL(got.url).raw_host == got.host and target(got.url) == got
    assert is_ip_address(got.host) == got.is_ip
    if got.address is None:
        with pytest.raises(OSError):
            socket.inet_aton(got.host)
        with pytest.raises(ValueError):
            ipaddress.ip_address(got.host)
    elif got.address.version == 4:
        assert is_canonical_ipv4_address(got.host) and host == got.host
    else:
        assert ipaddress.ip_address(got.host) == got.address


# -- the family of encodings of one address ------------------------------------------------------


def _render(part: int, radix: str) -> str:
    return {
        "dec": str(part),
        "zeros": "00" + str(part),
        "hex": hex(part),
        "HEX": "0X" + format(part, "X"),
        "oct": "0" + format(part, "o"),
    }[radix]


@st.composite
def ipv4_written(draw: st.DrawFn, address: str) -> str:
    """`address` as some parser reads it: dotted or short (a, a.b, a.b.c), each part in
    decimal, hex or octal, perhaps with trailing dots."""
    a, b, c, d = ipaddress.IPv4Address(address).packed
    forms = {
        4: [a, b, c, d],
        3: [a, b, c << 8 | d],
        2: [a, b << 16 | c << 8 | d],
        1: [a << 24 | b << 16 | c << 8 | d],
    }
    parts = forms[draw(st.sampled_from([4, 3, 2, 1]))]
    radix = st.sampled_from(["dec", "dec", "zeros", "hex", "HEX", "oct"])
    text = ".".join(_render(p, draw(radix)) for p in parts)
    return text + "." * draw(st.integers(0, 2))


@st.composite
def in_unicode(draw: st.DrawFn, text: str) -> str:
    """`text` with some of its digits in another script, its dots as other dots, its `x`
    full-width: every character independently, so one odd digit among ASCII ones too."""
    digits = draw(st.sampled_from(DIGITS))
    out = []
    for c in text:
        if c.isdigit() and draw(st.booleans()):
            c = digits[int(c)] if draw(st.integers(0, 3)) else draw(st.sampled_from(DIGITS))[int(c)]
        elif c == "." and draw(st.booleans()):
            c = draw(st.sampled_from(DOTS))
        elif c in "xX" and draw(st.booleans()):
            c = "ｘ"
        out.append(c)
    return "".join(out)


@st.composite
def ipv6_of(draw: st.DrawFn, address: str) -> str:
    """`address` inside IPv6: mapped, compatible, NAT64 or 6to4, in brackets, perhaps with
    a zone id or upper-case hex."""
    v4 = ipaddress.IPv4Address(address)
    hi, lo = int(v4) >> 16, int(v4) & 0xFFFF
    inner = draw(
        st.sampled_from(
            [
                f"::ffff:{v4}",
                f"::ffff:{hi:x}:{lo:x}",
                f"0:0:0:0:0:ffff:{v4}",
                f"::{v4}",
                f"64:ff9b::{v4}",
                f"64:ff9b::{hi:x}:{lo:x}",
                f"2002:{hi:x}:{lo:x}::",
            ]
        )
    )
    if draw(st.booleans()):
        inner = inner.upper()
    zone = draw(st.sampled_from(["", "", "%25lo", "%lo"]))
    return f"[{inner}{zone}]"


def hosts_of(address: str) -> st.SearchStrategy[str]:
    """Every way this file knows to write `address` (an IPv4 loopback or private one)."""
    plain = ipv4_written(address)
    return st.one_of(
        plain,
        plain.flatmap(in_unicode),
        st.just(address).flatmap(in_unicode),
        ipv6_of(address),
        ipv6_of(address).flatmap(in_unicode),
        st.sampled_from(["localhost", "LocalHost", "ｌｏｃａｌｈｏｓｔ"])
        if address == "127.0.0.1"
        else st.nothing(),
    )


@st.composite
def urls_of(draw: st.DrawFn, address: str, port: int) -> str:
    """A URL to `address`:`port` written in one of those ways, with perhaps userinfo and a
    full-width port."""
    host = draw(hosts_of(address))
    userinfo = draw(st.sampled_from(["", "", "", "u@", "u:p@", "example.com@"]))
    written_port = str(port)
    if draw(st.integers(0, 5)) == 0:
        written_port = "".join(chr(0xFF10 + int(c)) for c in written_port)
    scheme = draw(st.sampled_from(["http", "HTTP"]))
    return f"{scheme}://{userinfo}{host}:{written_port}/canary.png"


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_encoding_of_a_private_address_passes_the_policy(data: st.DataObject) -> None:
    """Pure: each written form is refused by `target`, or is an address (the policy then
    refuses it, whatever is inside) or a name to resolve (the resolver's guard decides)."""
    address = data.draw(st.sampled_from(["127.0.0.1", "10.1.2.3", "169.254.169.254"]))
    url = data.draw(urls_of(address, 8080))
    try:
        got = target(url)
    except RefusedUrl:
        return
    if got.address is not None:
        assert address_refusal(str(got.address)) is not None, url
    else:
        assert got.host in ("localhost",), url


# -- the gateway's image fetch, against a canary --------------------------------------------------


class Canary(BaseHTTPRequestHandler):
    """Answers every request with an image, and records it: it must record none."""

    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(f"{self.command} {self.path}")
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)

    do_POST = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def canary() -> Iterator[LoopbackHTTP]:
    server = LoopbackHTTP(Canary)
    yield server
    server.stop()


def port_of(server: LoopbackHTTP) -> int:
    return int(server.url.rsplit(":", 1)[1])


def fetch(url: str, limits: Limits) -> str:
    return asyncio.run(images.fetch_image(url, "messages[0].content[1].image_url", limits))


def test_a_full_width_loopback_url_is_not_fetched(canary: LoopbackHTTP) -> None:
    """The issue's reproduction: fetched from the canary before the fix."""
    Canary.hits = []
    url = f"http://{FULL_WIDTH}:{port_of(canary)}/canary.png"
    with pytest.raises(ProtocolError) as refused:
        fetch(url, Limits())
    assert refused.value.status == 400
    assert "reads as the address '127.0.0.1'" in refused.value.message
    assert Canary.hits == []
    # the same address written plainly, where it is allowed, is fetched: the canary works
    loopback = Limits(networks=(ipaddress.ip_network("127.0.0.1/32"),))
    assert fetch(f"{canary.url}/canary.png", loopback).startswith("data:image/png;base64,")
    assert Canary.hits == ["GET /canary.png"]
    Canary.hits = []


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_no_encoding_of_loopback_reaches_the_canary(
    canary: LoopbackHTTP, data: st.DataObject
) -> None:
    Canary.hits = []
    url = data.draw(urls_of("127.0.0.1", port_of(canary)))
    with pytest.raises(ProtocolError) as refused:
        fetch(url, Limits(timeout=5.0))
    assert refused.value.status == 400
    assert Canary.hits == [], url


class IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class Redirector(BaseHTTPRequestHandler):
    """`/to/<base64url of a location>` answers 302 to that location."""

    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        location = base64.urlsafe_b64decode(self.path.removeprefix("/to/")).decode()
        self.send_response(302)
        # in UTF-8, as a server that redirects to a Unicode host sends it (`send_header`
        # encodes latin-1, which cannot hold most of these)
        self._headers_buffer.append(b"Location: " + location.encode() + b"\r\n")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def redirector() -> Iterator[str]:
    """A redirector on [::1], the one loopback address the redirect test allows."""
    import threading

    server = IPv6Server(("::1", 0), Redirector)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://[::1]:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_no_redirect_to_an_encoding_of_loopback_reaches_the_canary(
    canary: LoopbackHTTP, redirector: str, data: st.DataObject
) -> None:
    """The first hop is allowed (`image_fetch_networks = ["::1/128"]`); the location it
    names is checked as the connector reads it, and refused."""
    Canary.hits, Redirector.hits = [], []
    location = data.draw(urls_of("127.0.0.1", port_of(canary)))
    if data.draw(st.booleans()):
        location = location.split(":", 1)[1]  # scheme-relative: //host:port/path
    hop = base64.urlsafe_b64encode(location.encode()).decode()
    allowed = Limits(timeout=5.0, networks=(ipaddress.ip_network("::1/128"),))
    with pytest.raises(ProtocolError) as refused:
        fetch(f"{redirector}/to/{hop}", allowed)
    assert refused.value.status == 400
    assert Redirector.hits == [f"/to/{hop}"], location  # the redirect was followed to the check
    assert Canary.hits == [], location


# -- a manifest's URLs: private addresses allowed, ambiguous hosts not ---------------------------


def test_a_remote_written_ambiguously_is_down_and_never_dialled(canary: LoopbackHTTP) -> None:
    Canary.hits = []
    port = port_of(canary)
    fleet = Fleet()
    fleet.configure(
        load_manifest_text(
            f'[remotes.odd]\nurl = "http://{FULL_WIDTH}:{port}"\n\n'
            f'[remotes.plain]\nurl = "http://127.0.0.1:{port}/v1"\n'
        )
    )
    odd, plain = fleet.remotes["odd"], fleet.remotes["plain"]
    assert odd.health is Health.DOWN and not odd.usable
    assert odd.last_error is not None and "reads as the address '127.0.0.1'" in odd.last_error
    assert "fix remotes.odd.url" in odd.last_error
    assert plain.url == f"http://127.0.0.1:{port}"  # a private address: the operator's choice

    async def probe() -> None:
        await fleet.probe(odd)
        await fleet.close()

    asyncio.run(probe())
    assert odd.health is Health.DOWN and Canary.hits == []


def test_an_mcp_server_written_ambiguously_does_not_start(canary: LoopbackHTTP) -> None:
    Canary.hits = []

    async def main() -> None:
        url = f"http://{FULL_WIDTH}:{port_of(canary)}/mcp"
        server = McpServer(McpSpec("odd", url=url, timeout=5), backoff=())
        with pytest.raises(McpUnavailable, match=r"reads as the address '127\.0\.0\.1'"):
            await server.ensure_ready()
        await server.close()

    asyncio.run(main())
    assert Canary.hits == []


def test_a_download_and_the_hub_endpoint_written_ambiguously(
    canary: LoopbackHTTP, tmp_path: Path
) -> None:
    Canary.hits = []
    odd = f"http://{FULL_WIDTH}:{port_of(canary)}"
    with pytest.raises(RefusedUrl, match=r"reads as the address '127\.0\.0\.1'"):
        download(f"{odd}/m.gguf", tmp_path / "m.gguf", sha256=None)
    with pytest.raises(RefusedUrl, match=r"reads as the address '127\.0\.0\.1'"):
        hub_endpoint({"HF_ENDPOINT": odd})
    assert Canary.hits == [] and not list(tmp_path.iterdir())
    assert hub_endpoint({"HF_ENDPOINT": f"{canary.url}/"}) == canary.url
    assert download(f"{canary.url}/m.gguf", tmp_path / "m.gguf", sha256=None).read_bytes() == PNG
    assert Canary.hits == ["GET /m.gguf"]
    Canary.hits = []
