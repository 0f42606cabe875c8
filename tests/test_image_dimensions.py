"""Pictures whose header claims more pixels than an engine can allocate (a decompression
bomb: a few bytes that say 100000x100000) are refused with a 400 before they reach a
child, on the vision routes and on /v1/images/edits alike (`images.check_image`); the
header is read without decoding, whatever its bytes (Hypothesis over each format)."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.protocols import ProtocolError
from blazar.serve.request.images import MAX_PIXELS, Limits, check_image, dimensions, sniff
from blazar.testing.tiny_vision import png_bytes

LIMITS = Limits()


def png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(ihdr))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
    )


def gif_header(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00"


def bmp_header(width: int, height: int) -> bytes:
    info = struct.pack("<IiiHHI", 40, width, height, 1, 24, 0) + b"\x00" * 20
    return b"BM" + struct.pack("<IHHI", 14 + len(info), 0, 0, 14 + len(info)) + info


def jpeg_header(width: int, height: int, app_segments: int = 1) -> bytes:
    app = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + b"\x00" * 9
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app * app_segments + sof


WRITERS = [png_header, gif_header, bmp_header, jpeg_header]
sides = st.integers(min_value=1, max_value=65535)


@settings(max_examples=300)
@given(st.sampled_from(WRITERS), sides, sides)
def test_every_format_is_refused_past_the_pixels_and_passed_within(
    write: object, width: int, height: int
) -> None:
    data = write(width, height)  # type: ignore[operator]
    kind = sniff(data)
    assert kind is not None and dimensions(data, kind) == (width, height)
    if width * height > MAX_PIXELS:
        with pytest.raises(ProtocolError) as refused:
            check_image(data, "'image'", LIMITS)
        assert refused.value.status == 400
        assert f"{width}x{height}" in str(refused.value)
    else:
        assert check_image(data, "'image'", LIMITS) == kind


@settings(max_examples=500)
@given(st.sampled_from([b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF89a", b"BM"]), st.binary())
def test_any_bytes_after_a_magic_are_a_kind_or_a_400_never_an_error(
    magic: bytes, rest: bytes
) -> None:
    data = magic + rest
    try:
        assert check_image(data, "'image'", LIMITS) == sniff(data)
    except ProtocolError as refused:
        assert refused.status == 400


@settings(max_examples=200)
@given(st.sampled_from(WRITERS), sides, sides, st.data())
def test_a_header_cut_short_is_unreadable_not_a_size(
    write: object, width: int, height: int, data: st.DataObject
) -> None:
    whole = write(width, height)  # type: ignore[operator]
    cut = whole[: data.draw(st.integers(min_value=0, max_value=len(whole) - 1))]
    kind = sniff(cut)
    if kind is not None:
        assert dimensions(cut, kind) in (None, (width, height))


def test_a_whole_png_reads_as_written() -> None:
    data = png_bytes(37, 21)
    assert dimensions(data, "image/png") == (37, 21)
    assert check_image(data, "'image'", LIMITS) == "image/png"
