"""The pure parts of sessions: the tokens in a slot file, prefix matching, the bank's bounds.

`blazar.serve.state.sessions` saves and restores slots through the engine and keeps
the records; the decisions it makes are here, as functions of values, tested
with tables:

- `read_tokens`: the token ids a llama-server slot file holds. The file is
  llama.cpp's sequence state: u32 magic `ggsq`, u32 version, u32 n, n int32
  tokens, then the KV data. llama-server (format version 4, seen with xllamacpp
  2026.10) packs its tokens as `[-1, 1, n_text, text tokens..., n_media]`; the
  plain form is the tokens themselves. The count is checked against the save
  response's `n_saved`, so an unknown layout is never taken for tokens.
- `best_match`: the session whose tokens share the longest prefix with a prompt.
- `superseded`: banked sessions a new save makes redundant (a prefix of it).
- `over_budget`: the banked sessions to drop, least recently used first.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

MAGIC = 0x67677371  # 'ggsq': llama.cpp's sequence-state file
PACKED = -1  # llama-server's packed token list starts with LLAMA_TOKEN_NULL
MIN_MATCH = 32  # tokens a banked session must share with a prompt to be worth a restore
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
BANK_PREFIX = "bank-"

Tokens = tuple[int, ...]


def check_name(name: str) -> str | None:
    """Why `name` cannot name a session (None when it can)."""
    if not NAME.fullmatch(name):
        return (
            f"session name {name!r} is not valid: use 1 to 64 letters, digits, '.', '_' or "
            "'-', starting with a letter or digit"
        )
    if name.startswith(BANK_PREFIX):
        return f"session names starting with {BANK_PREFIX!r} are the session bank's: choose another"
    return None


def parse_tokens(head: bytes, n_saved: int | None = None) -> Tokens | None:
    """The tokens at the start of a slot file (`head`: its first bytes, enough to hold
    them); None when the layout is not one this knows or the count disagrees."""
    if len(head) < 12:
        return None
    magic, _version, count = struct.unpack_from("<III", head)
    if magic != MAGIC or len(head) < 12 + 4 * count:
        return None
    ints = struct.unpack_from(f"<{count}i", head, 12)
    tokens: Sequence[int] = ints
    if count >= 3 and ints[0] == PACKED:
        n_text = ints[2]
        if n_text < 0 or 3 + n_text > count:
            return None
        tokens = ints[3 : 3 + n_text]
    if n_saved is not None and len(tokens) != n_saved:
        return None
    return tuple(tokens)


def read_tokens(path: Path, n_saved: int | None = None) -> Tokens | None:
    """The tokens a slot file holds (see `parse_tokens`); None if unreadable or unknown."""
    try:
        with path.open("rb") as fh:
            head = fh.read(12)
            if len(head) < 12:
                return None
            count = struct.unpack_from("<I", head, 8)[0]
            head += fh.read(4 * count)
    except OSError:
        return None
    return parse_tokens(head, n_saved)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def best_match(
    prompt: Sequence[int], candidates: Mapping[str, Tokens], minimum: int = MIN_MATCH
) -> tuple[str, int] | None:
    """(name, shared tokens) of the candidate sharing the longest prefix with `prompt`, at
    least `minimum`; ties go to the shorter session (less to restore). None if none does."""
    best: tuple[int, int, str] | None = None
    for name, tokens in candidates.items():
        shared = common_prefix(prompt, tokens)
        if shared >= minimum and (best is None or (shared, -len(tokens)) > best[:2]):
            best = (shared, -len(tokens), name)
    return (best[2], best[0]) if best else None


def superseded(new: Tokens, banked: Mapping[str, Tokens]) -> tuple[list[str], bool]:
    """([banked sessions `new` extends or repeats], whether `new` itself adds nothing: it is
    a prefix of one already banked)."""
    drop = [name for name, old in banked.items() if len(old) <= len(new) and new[: len(old)] == old]
    redundant = any(len(old) > len(new) and old[: len(new)] == new for old in banked.values())
    return drop, redundant


def over_budget(sizes: Sequence[tuple[str, int]], budget: int) -> list[str]:
    """The sessions to drop so the rest fit `budget` bytes. `sizes` is (name, bytes), most
    recently used first: the least recently used go first, until the rest fit."""
    total = sum(size for _, size in sizes)
    drop = []
    for name, size in reversed(sizes):
        if total <= budget:
            break
        drop.append(name)
        total -= size
    return drop
