"""A passed-through stream's events, as the trace reads them once the request is done,
whatever the bytes: the same events the gateway's own SSE decoder finds.

The trace splits the kept chunks with bytes methods (`trace._sse`), with a fast path for
a chunk that is one whole event (what llama-server sends per token) and `[DONE]` said
before the JSON parsers fail on it. Hypothesis draws streams of JSON events, `[DONE]`,
comments, named events and data split over several lines, cut anywhere into chunks
(at event boundaries too, the fast path), with LF or CRLF line ends, and the events read
must be the decoder's, in order.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.observe.trace import _sse
from blazar.protocols.sse import SSEDecoder

OBJECTS = st.dictionaries(
    st.text("abcxyz_", min_size=1, max_size=4),
    st.one_of(st.integers(-5, 5), st.text(max_size=6), st.none(), st.booleans()),
    max_size=3,
)
EVENTS = st.one_of(
    OBJECTS.map(lambda o: f"data: {json.dumps(o)}\n\n"),  # llama-server's every event
    OBJECTS.map(lambda o: f"event: delta\ndata: {json.dumps(o)}\n\n"),
    OBJECTS.map(lambda o: "data: " + json.dumps(o, indent=1).replace("\n", "\ndata: ") + "\n\n"),
    st.just("data: [DONE]\n\n"),
    st.just(": keep-alive\n\n"),
)


def decoded(stream: bytes) -> list[Any]:
    decoder = SSEDecoder()
    events = decoder.feed(stream) + decoder.close()
    return [e.data for e in events if isinstance(e.data, dict)]


@settings(max_examples=300)
@given(st.lists(EVENTS, max_size=8), st.data(), st.booleans())
def test_the_trace_reads_the_events_the_decoder_reads(
    events: list[str], data: st.DataObject, crlf: bool
) -> None:
    text = "".join(events)
    stream = (text.replace("\n", "\r\n") if crlf else text).encode()
    boundaries = [len(stream)]
    if stream:
        cuts = data.draw(st.lists(st.integers(1, len(stream)), max_size=10))
        ends = [len(e.replace("\n", "\r\n") if crlf else e) for e in events]
        at_events = [sum(ends[: i + 1]) for i in range(len(ends))]
        boundaries = sorted({*cuts, *data.draw(st.sets(st.sampled_from(at_events))), len(stream)})
    chunks, start = [], 0
    for end in boundaries:
        chunks.append(stream[start:end])
        start = end
    times = list(range(len(chunks)))
    assert [event for _, event in _sse(chunks, times)] == decoded(stream)
