"""Warm pegs: the weight files of unloaded `warm_peg` models kept in host memory.

Used by the scheduler (`core`): when a pegged model unloads, its files' pages are
held resident (`hold`, run in a thread: reading in a big file's pages that are not
cached takes seconds, then `Pegs.add`), so that its next load reads no disk; they are counted
against `serving.warm_peg_budget`, beyond which the least recently used pegs are
released (`keep`, pure); a peg is released when its model is no longer pegged or
declared (`Pegs.sync`) and when serve ends. A model that loads again keeps its peg: its
child maps the same pages (no second copy), and the next unload needs them again.

How the pages are held (docs/serve.md, warm pegs): each file is mapped shared and
read-only with MAP_POPULATE (every page read in now) and madvise(WILLNEED), and the
mapping is kept open. Pages mapped by a process are not dropped by
posix_fadvise(DONTNEED) and are the last the kernel reclaims, and their memory is the
page cache's, shared with the child that maps the same file: no copy. mlock would
also keep them from being reclaimed under pressure, but it needs RLIMIT_MEMLOCK (8 MiB
for a user by default) or CAP_IPC_LOCK, which a serve rarely has: it is not used.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from blazar.host.hardware import Device

logger = logging.getLogger("blazar.serve")


def budget_bytes(setting: int | str, host: Device | None) -> int:
    """Pure: `serving.warm_peg_budget` in bytes: a size, or a share of host RAM ('25%';
    0 when host RAM is not known)."""
    if isinstance(setting, int):
        return setting
    total = host.total if host is not None else 0
    return int(total * float(setting.rstrip("% ")) / 100)


@dataclass(frozen=True)
class Peg:
    """One pegged model as the plan sees it: its files' bytes and when it was last used."""

    model: str
    bytes: int
    last_used: float


def keep(pegs: Sequence[Peg], budget: int) -> frozenset[str]:
    """Pure: the pegs kept within `budget` bytes: the most recently used first; a peg
    that does not fit is released, and an older one that still fits is kept."""
    kept: set[str] = set()
    left = budget
    for peg in sorted(pegs, key=lambda p: -p.last_used):
        if peg.bytes <= left:
            kept.add(peg.model)
            left -= peg.bytes
    return frozenset(kept)


def hold(paths: Iterable[str]) -> Held:
    """The effect: map each file and read its pages in (seconds for a big file whose pages
    are not cached: the scheduler runs it in a thread)."""
    return Held(paths)


class Held:
    """The mappings that keep one model's files resident."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.maps: list[mmap.mmap] = []
        self.bytes = 0
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as err:
                logger.warning("warm peg: cannot open %s: %s", path, err)
                continue
            try:
                size = os.fstat(fd).st_size
                if size == 0:
                    continue
                populate = getattr(mmap, "MAP_POPULATE", 0)
                held = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ)
                if hasattr(held, "madvise") and hasattr(mmap, "MADV_WILLNEED"):
                    held.madvise(mmap.MADV_WILLNEED)
                if not populate:  # no MAP_POPULATE: touch a byte of each page
                    for offset in range(0, size, mmap.PAGESIZE):
                        held[offset]
                self.maps.append(held)
                self.bytes += size
            except (OSError, ValueError) as err:
                logger.warning("warm peg: cannot map %s: %s", path, err)
            finally:
                os.close(fd)  # the mapping keeps the file

    def close(self) -> None:
        for held in self.maps:
            with contextlib.suppress(BufferError, ValueError):
                held.close()
        self.maps.clear()


class Pegs:
    """The pegs held now, by model (the effect: mappings open in serve's process)."""

    def __init__(self) -> None:
        self.held: dict[str, Held] = {}
        self.last_used: dict[str, float] = {}

    def touch(self, model: str, used: float) -> bool:
        """Mark a held peg used now; False when `model` has none."""
        if model not in self.held:
            return False
        self.last_used[model] = used
        return True

    def add(self, model: str, held: Held, used: float) -> None:
        """Keep `held` (made by `hold`, off the event loop) as `model`'s peg."""
        old = self.held.pop(model, None)
        if old is not None:
            old.close()
        self.held[model], self.last_used[model] = held, used
        logger.info("warm peg: holding '%s' (%d bytes)", model, held.bytes)

    def peg(self, model: str, paths: Iterable[str], used: float) -> None:
        """Hold `model`'s files resident now (in the caller's thread)."""
        if not self.touch(model, used):
            self.add(model, hold(paths), used)

    def fit(self, budget: int) -> list[str]:
        """Release the least recently used pegs beyond `budget`; the models released."""
        pegs = [Peg(m, h.bytes, self.last_used.get(m, 0.0)) for m, h in self.held.items()]
        kept = keep(pegs, budget)
        gone = sorted(m for m in self.held if m not in kept)
        for model in gone:
            logger.info("warm peg: releasing '%s' (serving.warm_peg_budget)", model)
            self.release(model)
        return gone

    def sync(self, pegged: Collection[str]) -> None:
        """Release the pegs of models no longer pegged (warm_peg off, or undeclared)."""
        for model in [m for m in self.held if m not in pegged]:
            logger.info("warm peg: releasing '%s' (no longer warm_peg)", model)
            self.release(model)

    def release(self, model: str) -> None:
        held = self.held.pop(model, None)
        self.last_used.pop(model, None)
        if held is not None:
            held.close()

    def sizes(self) -> Mapping[str, int]:
        return {m: h.bytes for m, h in sorted(self.held.items())}

    def close(self) -> None:
        for model in list(self.held):
            self.release(model)
