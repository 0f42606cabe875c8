"""The relay's own reader of client request heads (`relay.read_head`), against hostile heads.

Whatever bytes a client sends, `read_head` never raises, and a head it calls `plain` (one
the relay may carry) is one a strict HTTP/1.1 parser (h11) reads the same way: the same
method, target, header values (names lowercased, repeats joined) and body length. Any head
it is not sure of goes to aiohttp, which answers it as it always did.
"""

from __future__ import annotations

import h11
from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.serve.gateway.relay import HEAD_LIMIT, read_head

TOKEN = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
# Bytes a hostile head may carry anywhere: controls, a bare CR or LF, NUL, high bytes,
# separators, spaces and tabs.
HOSTILE = st.sampled_from(
    [b"\r", b"\n", b"\x00", b"\x7f", b"\xff", b"\xc3\xa9", b" ", b"\t", b":", b"\r\n ", b"%", b"?"]
)
names = st.text(TOKEN, min_size=1, max_size=12).map(str.encode)
values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20).map(str.encode)


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from([b"POST", b"GET", b"P@ST", b"post", b""]))
    target = draw(st.sampled_from([b"/v1/chat/completions", b"/v1/embeddings", b"/x?y=1", b"*"]))
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2"]))
    lines = [b"Host: 127.0.0.1"]
    lines += [
        n + b":" + draw(st.sampled_from([b" ", b"", b"  "])) + v
        for n, v in draw(st.lists(st.tuples(names, values), max_size=6))
    ]
    if draw(st.booleans()):
        lines.append(
            b"Content-Length: "
            + draw(st.sampled_from([b"0", b"12", b"007", b"-1", b"1 2", b"99999999999999"]))
        )
    raw = b" ".join([method, target, version]) + b"\r\n" + b"\r\n".join(lines)
    for _ in range(draw(st.integers(0, 3))):  # hostile bytes spliced in anywhere
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(HOSTILE) + raw[at:]
    return raw + b"\r\n\r\n"


def strict(raw: bytes) -> h11.Request | None:
    """What h11 makes of the head, or None if it refuses it."""
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(raw)
    try:
        event = connection.next_event()
    except h11.RemoteProtocolError:
        return None
    return event if isinstance(event, h11.Request) else None


@settings(max_examples=1500, deadline=None)
@given(heads(), st.integers(min_value=0, max_value=64))
def test_a_plain_head_is_read_as_a_strict_parser_reads_it(raw: bytes, cut: int) -> None:
    if b"\r\n\r\n" not in raw[:cut]:
        assert read_head(raw[:cut]) is None  # not whole: wait for more
    head = read_head(raw)
    assert head is not None
    if not head.plain or "host" not in head.headers:
        return  # (h11 refuses an HTTP/1.1 head without Host; aiohttp and the relay take it
        # alike, and the access layer's Host check decides)
    request = strict(raw[: head.size])
    assert request is not None, raw
    assert head.method.encode() == request.method
    assert head.path.encode() == request.target
    merged: dict[str, str] = {}
    for name, value in request.headers:
        key = name.decode()
        merged[key] = f"{merged[key]}, {value.decode()}" if key in merged else value.decode()
    assert head.headers == merged
    assert head.length == int(merged.get("content-length", "0"))


@given(st.binary(max_size=300))
def test_any_bytes_are_read_or_handed_on_never_raised(data: bytes) -> None:
    head = read_head(data + b"\r\n\r\n")
    assert head is not None  # whole: plain or not, never an exception
    if head.plain and "host" in head.headers:
        assert strict((data + b"\r\n\r\n")[: head.size]) is not None


def test_a_head_that_never_ends_is_handed_on() -> None:
    assert read_head(b"POST / HTTP/1.1\r\nX: " + b"a" * 100) is None  # still coming
    assert read_head(b"POST / HTTP/1.1\r\nX: " + b"a" * HEAD_LIMIT).plain is False  # type: ignore[union-attr]
