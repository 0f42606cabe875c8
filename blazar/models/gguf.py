"""Read a GGUF file's facts without loading its tensors.

`gguf.GGUFReader` parses every metadata array into numpy objects; for Gemma 3's
262k-token vocabulary that took 8.7 s here. Blazar only needs the scalar keys,
array lengths and tensor shapes, so this module walks the header with `struct`
(arrays longer than a few entries are skipped, only their length kept) and
takes its constants (value types, quantization block sizes, file types) from
the `gguf` package. It also proves the file is whole: the header must parse and
every tensor's bytes must lie inside the file.
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType
from gguf.constants import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC

from blazar.errors import NotGGUF

_SCALARS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
# Arrays up to this length are kept (per-layer head counts, small lists);
# longer ones (vocabularies, merges, scores) are skipped and only counted.
_KEEP_ARRAY = 512
_MAX_STRING = 64 * 1024 * 1024  # a sanity bound: no real key is bigger


class _Truncated(Exception):
    pass


@dataclass(frozen=True)
class Array:
    """A metadata array too long to keep: its element type and length."""

    type: str
    length: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type: str
    n_elements: int
    n_bytes: int
    offset: int


@dataclass(frozen=True)
class GGUFFacts:
    """What Blazar knows about a model file from its header alone."""

    gguf_version: int
    file_kind: str  # general.type: model | adapter | ...
    architecture: str
    name: str | None
    parameters: int
    quantization: str
    context_length: int | None
    embedding_length: int | None
    block_count: int | None
    feed_forward_length: int | None
    head_count: int | None
    head_count_kv: int | None
    key_length: int | None
    value_length: int | None
    sliding_window: int | None
    rope_dimension_count: int | None
    rope_freq_base: float | None
    rope_scaling_type: str | None  # none | linear | yarn | ..., when the GGUF declares one
    rope_scaling_factor: float | None
    vocab_size: int | None
    tokenizer_model: str | None
    has_chat_template: bool
    chat_template: str | None
    tensor_count: int
    size: int
    license: str | None = None  # general.license, shown by ollama's /api/show

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Reader:
    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh

    def take(self, n: int) -> bytes:
        data = self.fh.read(n)
        if len(data) != n:
            raise _Truncated
        return data

    def scalar(self, vtype: GGUFValueType) -> Any:
        fmt = _SCALARS[vtype]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def u32(self) -> int:
        return int(self.scalar(GGUFValueType.UINT32))

    def u64(self) -> int:
        return int(self.scalar(GGUFValueType.UINT64))

    def string(self) -> str:
        n = self.u64()
        if n > _MAX_STRING:
            raise ValueError(f"a string of {n} bytes in the header")
        return self.take(n).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.u64()
        if n > _MAX_STRING:
            raise ValueError(f"a string of {n} bytes in the header")
        self.fh.seek(n, 1)

    def value(self, vtype: GGUFValueType) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            etype = GGUFValueType(self.u32())
            length = self.u64()
            if length <= _KEEP_ARRAY:
                return [self.value(etype) for _ in range(length)]
            self.skip_array(etype, length)
            return Array(etype.name, length)
        return self.scalar(vtype)

    def skip_array(self, etype: GGUFValueType, length: int) -> None:
        if etype == GGUFValueType.STRING:
            for _ in range(length):
                self.skip_string()
        elif etype == GGUFValueType.ARRAY:
            for _ in range(length):
                self.value(GGUFValueType.ARRAY)
        else:
            self.fh.seek(struct.calcsize(_SCALARS[etype]) * length, 1)


class HeaderIncomplete(NotGGUF):
    """The bytes read so far end inside the header: read more of the file."""


def has_gguf_magic(head: bytes) -> bool:
    """Whether a file's first 8 bytes start a GGUF file of a version Blazar reads (2 or 3);
    the gateway checks an upload with this before keeping more of it."""
    if len(head) < 8:
        return False
    magic, version = struct.unpack("<II", head[:8])
    return bool(magic == GGUF_MAGIC and version in (2, 3))


def read_header(path: Path) -> tuple[int, dict[str, Any], list[TensorInfo], int]:
    """Parse a GGUF header: (version, metadata, tensors, data start offset).

    Raises NotGGUF for a file that is not GGUF, is truncated or is malformed.
    """
    with path.open("rb") as raw:
        return _parse(raw, path.stat().st_size, str(path), prefix=False)


def _parse(
    raw: BinaryIO, size: int, where: str, *, prefix: bool
) -> tuple[int, dict[str, Any], list[TensorInfo], int]:
    """Parse from `raw`, the file's first bytes (`prefix`) or all of them; `size` is the
    whole file's size, so the tensors are checked against it either way."""
    reader = _Reader(raw)
    try:
        magic = struct.unpack("<I", reader.take(4))[0]
    except _Truncated:
        magic = None
    if magic != GGUF_MAGIC:
        raise NotGGUF(
            f"{where} is not a GGUF model (its first bytes are not 'GGUF'); "
            "Blazar serves GGUF files: convert it with llama.cpp's convert_hf_to_gguf.py"
        )
    try:
        version = reader.u32()
        if version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version}")
        n_tensors, n_kv = reader.u64(), reader.u64()
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = reader.string()
            meta[key] = reader.value(GGUFValueType(reader.u32()))
        tensors = [_tensor_info(reader) for _ in range(n_tensors)]
        header_end = raw.tell()
    except _Truncated:
        if prefix:
            raise HeaderIncomplete(f"the first bytes of {where} end inside its header") from None
        raise NotGGUF(
            f"{where} is a truncated GGUF file (its header ends early); "
            "the download or copy did not finish: fetch it again"
        ) from None
    except (ValueError, struct.error, UnicodeDecodeError, KeyError) as exc:
        raise NotGGUF(f"{where} is a damaged GGUF file ({exc}); fetch it again") from None
    alignment = int(meta.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
    data_start = -(-header_end // alignment) * alignment
    end = max((data_start + t.offset + t.n_bytes for t in tensors), default=header_end)
    if end > size:
        raise NotGGUF(
            f"{where} is a truncated GGUF file ({size} bytes; its tensors need {end}); "
            "the download or copy did not finish: fetch it again"
        )
    return version, meta, tensors, data_start


def _tensor_info(reader: _Reader) -> TensorInfo:
    name = reader.string()
    n_dims = reader.u32()
    if n_dims > 8:
        raise ValueError(f"tensor {name!r} has {n_dims} dimensions")
    shape = tuple(reader.u64() for _ in range(n_dims))
    qtype = GGMLQuantizationType(reader.u32())
    offset = reader.u64()
    n_elements = 1
    for dim in shape:
        n_elements *= dim
    block, type_size = GGML_QUANT_SIZES[qtype]
    return TensorInfo(name, shape, qtype.name, n_elements, n_elements // block * type_size, offset)


def _int(meta: dict[str, Any], key: str) -> int | None:
    value = meta.get(key)
    if isinstance(value, list):  # per-layer values (e.g. head counts): report the largest
        value = max(value) if value else None
    return int(value) if isinstance(value, int | float) else None


def _float(meta: dict[str, Any], key: str) -> float | None:
    value = meta.get(key)
    return float(value) if isinstance(value, int | float) else None


def _text(meta: dict[str, Any], key: str) -> str | None:
    value = meta.get(key)
    return value if isinstance(value, str) else None


def _length(value: Any) -> int | None:
    if isinstance(value, Array):
        return value.length
    if isinstance(value, list):
        return len(value)
    return None


def quantization_name(meta: dict[str, Any], tensors: list[TensorInfo]) -> str:
    """`Q4_K_M`-style name from general.file_type, else the commonest 2-D tensor type."""
    file_type = meta.get("general.file_type")
    if isinstance(file_type, int):
        try:
            name = LlamaFileType(file_type).name
        except ValueError:
            return f"file_type_{file_type}"
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    counts: dict[str, int] = {}
    for t in tensors:
        if len(t.shape) >= 2:
            counts[t.type] = counts.get(t.type, 0) + t.n_elements
    return max(counts, key=lambda k: counts[k]) if counts else "unknown"


def inspect_gguf(path: Path) -> GGUFFacts:
    """Read a GGUF file's facts; raise NotGGUF if it is not a whole GGUF file."""
    version, meta, tensors, _ = read_header(path)
    return _facts(version, meta, tensors, path.stat().st_size)


def rope_facts(path: Path) -> dict[str, Any]:
    """The RoPE keys of a GGUF, read from its header (a record imported before they were
    recorded lacks them); {} when the file cannot be read: the engine decides then."""
    try:
        facts = inspect_gguf(path).to_dict()
    except (OSError, ValueError, NotGGUF):
        return {}
    return {k: v for k, v in facts.items() if k.startswith("rope_")}


def inspect_prefix(data: bytes, size: int, where: str) -> GGUFFacts:
    """The facts of a GGUF file of `size` bytes from its first bytes `data` (a ranged
    download: `blazar fit` before pulling); HeaderIncomplete when `data` is too short."""
    import io

    version, meta, tensors, _ = _parse(io.BytesIO(data), size, where, prefix=True)
    return _facts(version, meta, tensors, size)


def _facts(version: int, meta: dict[str, Any], tensors: list[TensorInfo], size: int) -> GGUFFacts:
    arch = str(meta.get("general.architecture", "unknown"))
    template = meta.get("tokenizer.chat_template")
    template = template if isinstance(template, str) else None
    tokenizer = meta.get("tokenizer.ggml.model")
    name = meta.get("general.name")
    license_ = meta.get("general.license")

    def key(suffix: str) -> int | None:
        return _int(meta, f"{arch}.{suffix}")

    return GGUFFacts(
        gguf_version=version,
        file_kind=str(meta.get("general.type", "model")),
        architecture=arch,
        name=name if isinstance(name, str) else None,
        parameters=sum(t.n_elements for t in tensors),
        quantization=quantization_name(meta, tensors),
        context_length=key("context_length"),
        embedding_length=key("embedding_length"),
        block_count=key("block_count"),
        feed_forward_length=key("feed_forward_length"),
        head_count=key("attention.head_count"),
        head_count_kv=key("attention.head_count_kv") or key("attention.head_count"),
        key_length=key("attention.key_length"),
        value_length=key("attention.value_length"),
        sliding_window=key("attention.sliding_window"),
        rope_dimension_count=key("rope.dimension_count"),
        rope_freq_base=_float(meta, f"{arch}.rope.freq_base"),
        rope_scaling_type=_text(meta, f"{arch}.rope.scaling.type"),
        rope_scaling_factor=_float(meta, f"{arch}.rope.scaling.factor"),
        vocab_size=_length(meta.get("tokenizer.ggml.tokens")) or key("vocab_size"),
        tokenizer_model=tokenizer if isinstance(tokenizer, str) else None,
        has_chat_template=template is not None,
        chat_template=template,
        tensor_count=len(tensors),
        size=size,
        license=license_ if isinstance(license_, str) else None,
    )
