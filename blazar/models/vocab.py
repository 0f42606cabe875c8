"""Whether one GGUF can draft for another: their vocabularies, read from the tokenizer keys.

Speculative decoding with a draft model only works when both models speak the same
tokens: the draft proposes token ids that the target checks. llama.cpp compares the
two vocabularies when it loads a draft (`common_speculative_are_compatible`); Blazar
checks the same things from the files' headers before anything is spawned, so a
mismatch is refused with its reason at `blazar diff` (a `!` note), in `blazar drafts`,
and before a spawn (the model is refused, never started with a draft it cannot use):

- the same tokenizer model (`tokenizer.ggml.model`: llama, gpt2, ...);
- the same BOS and EOS ids and whether each is added;
- vocabulary sizes at most 128 apart (llama.cpp's limit), and the same token texts
  from id 5 on over the ids both have (ids below 5 are control tokens that may differ).

The token list is walked through a memory map, not parsed into Python strings: Gemma 3's
262k tokens take about 0.1 s this way (about 1 s decoded one by one). Each file's summary
is kept per process, keyed by its path, size and modification time. Callers:
`blazar.serve.supervisor.runtime` (before a spawn), `blazar.reconcile.apply` (diff notes),
`blazar.cli.tune` (`blazar drafts`).
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from blazar.errors import NotGGUF

FIRST_COMPARED = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID
MAX_SIZE_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF types
_FORMATS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_KEYS = {
    "tokenizer.ggml.model": "model",
    "tokenizer.ggml.bos_token_id": "bos",
    "tokenizer.ggml.eos_token_id": "eos",
    "tokenizer.ggml.add_bos_token": "add_bos",
    "tokenizer.ggml.add_eos_token": "add_eos",
}

_LABELS = {
    "bos": "BOS token ids",
    "eos": "EOS token ids",
    "add_bos": "add-BOS settings",
    "add_eos": "add-EOS settings",
}


@dataclass(frozen=True)
class Vocabulary:
    """A GGUF's vocabulary, summarized for comparison."""

    model: str | None  # tokenizer.ggml.model
    size: int
    bos: int | None
    eos: int | None
    add_bos: bool | None
    add_eos: bool | None
    digest: str  # sha256 of the token texts from id FIRST_COMPARED on (as stored)


def vocabulary(path: Path) -> Vocabulary:
    """The vocabulary of the GGUF at `path`; NotGGUF when it has none or is not one."""
    stat = path.stat()
    return _vocabulary(str(path), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=64)
def _vocabulary(path: str, size: int, mtime_ns: int) -> Vocabulary:
    facts, start, end, count = _walk(Path(path), FIRST_COMPARED)
    with Path(path).open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        digest = hashlib.sha256(buf[start:end]).hexdigest()
    return Vocabulary(size=count, digest=digest, **facts)  # type: ignore[arg-type]


def mismatch(target: Vocabulary, draft: Vocabulary) -> str | None:
    """Why `draft` cannot draft for `target` (None: it can), decided from the summaries
    alone; sizes that differ but within the limit need `common_tokens_equal` too."""
    if target.model != draft.model:
        return f"their tokenizers differ ({target.model or 'none'} and {draft.model or 'none'})"
    if abs(target.size - draft.size) > MAX_SIZE_DIFFERENCE:
        return (
            f"their vocabularies differ in size ({target.size} and {draft.size} tokens; "
            f"at most {MAX_SIZE_DIFFERENCE} apart can draft)"
        )
    for what, label in _LABELS.items():
        mine, theirs = getattr(target, what), getattr(draft, what)
        if mine != theirs:
            return f"their {label} differ ({mine} and {theirs})"
    if target.size == draft.size and target.digest != draft.digest:
        return f"their token texts differ (both have {target.size} tokens)"
    return None


def draft_problem(target: Path, draft: Path) -> str | None:
    """Why the GGUF at `draft` cannot draft for the one at `target`; None when it can."""
    try:
        mine, theirs = vocabulary(target), vocabulary(draft)
    except (OSError, NotGGUF) as exc:
        return f"its vocabulary cannot be read ({exc})"
    found = mismatch(mine, theirs)
    if found is None and mine.size != theirs.size:
        common = min(mine.size, theirs.size)
        if _span_digest(target, common) != _span_digest(draft, common):
            found = f"their token texts differ (over the {common} ids both have)"
    return found


def _span_digest(path: Path, count: int) -> str:
    _, start, end, _ = _walk(path, FIRST_COMPARED, until=count)
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return hashlib.sha256(buf[start:end]).hexdigest()


def _walk(
    path: Path, first: int, until: int | None = None
) -> tuple[dict[str, object], int, int, int]:
    """(tokenizer facts, offset of token `first`, offset past token `until` (default:
    the last), token count) from the GGUF's header."""
    with path.open("rb") as fh:
        try:
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            raise NotGGUF(f"{path} is not a GGUF model") from None
    with buf:
        try:
            return _read(buf, first, until, str(path))
        except (struct.error, IndexError, ValueError) as exc:
            raise NotGGUF(f"{path} is not a whole GGUF file ({exc})") from None


def _read(
    buf: mmap.mmap, first: int, until: int | None, where: str
) -> tuple[dict[str, object], int, int, int]:
    if buf[:4] != b"GGUF":
        raise NotGGUF(f"{where} is not a GGUF model")
    n_kv = struct.unpack_from("<Q", buf, 16)[0]
    at = 24
    facts: dict[str, object] = dict.fromkeys(_KEYS.values())
    span: tuple[int, int, int] | None = None

    def string(at: int) -> tuple[str, int]:
        n = struct.unpack_from("<Q", buf, at)[0]
        return buf[at + 8 : at + 8 + n].decode("utf-8", "replace"), at + 8 + n

    for _ in range(n_kv):
        key, at = string(at)
        vtype = struct.unpack_from("<I", buf, at)[0]
        at += 4
        if vtype == _ARRAY:
            etype, count = struct.unpack_from("<IQ", buf, at)
            at += 12
            if key == "tokenizer.ggml.tokens" and etype == _STRING:
                start = end = at
                last = count if until is None else min(until, count)
                for i in range(count):
                    if i == first:
                        start = at
                    at += 8 + struct.unpack_from("<Q", buf, at)[0]
                    if i + 1 == last:
                        end = at
                span = (start, end, count)
            elif etype == _STRING:
                for _ in range(count):
                    at += 8 + struct.unpack_from("<Q", buf, at)[0]
            else:
                at += _SIZES[etype] * count
        elif vtype == _STRING:
            text, at = string(at)
            if key in _KEYS:
                facts[_KEYS[key]] = text
        else:
            value = struct.unpack_from(_FORMATS[vtype], buf, at)[0]
            at += _SIZES[vtype]
            if key in _KEYS:
                facts[_KEYS[key]] = value
    if span is None:
        raise NotGGUF(f"{where} has no vocabulary (tokenizer.ggml.tokens)")
    return facts, *span
