"""Which GGUF architectures a mainstream engine loads, by a load probe (once per engine, arch).

llama.cpp checks `general.architecture` before anything else when it loads a
model and fails with "unknown model architecture: 'X'" for one it does not
know. The probe starts the engine on a tiny model written under that
architecture's name (`blazar.testing.tiny`, a few hundred KB): a server that
comes up, or one that fails for any other reason (a missing tensor: the tiny
llama weights do not fit architecture X, which llama.cpp therefore knows),
means supported. The answer is recorded in the store's `engine_support`, so
each engine is probed once per architecture; a fork's support comes from the
catalog instead. A mistralrs lane is probed the same way (mistral.rs's word is
"Unknown normal-model GGUF architecture"). The engines port (`blazar.reconcile.ports`) and
the gateway's passes (`blazar.serve.daemon`) call `ensure_probed` before they route
models.

It also records, once per engine, the flags its server takes (`engine_flags`, read from
its `--help`): a manifest field that needs a flag the engine lacks (speculative decoding
on an engine whose launcher predates it) is refused before a spawn, not ignored
(`blazar.serve.supervisor.runtime`). Not probed yet counts as taking every flag.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

from blazar.engines.lanes import MAINSTREAM, LaneStore
from blazar.engines.ledger import EngineRecord
from blazar.engines.process import EngineServer, EngineStartError
from blazar.errors import BlazarError
from blazar.paths import Paths
from blazar.store.db import Store, utcnow

# llama.cpp's words for an architecture it does not know, and mistral.rs's (the mistralrs
# lane's launcher says what the package raised).
UNKNOWN = re.compile(
    r"unknown model architecture: '([^']*)'|Unknown normal-model GGUF architecture `([^`]*)`"
)
PROBED_KINDS = ("llamacpp", "mistralrs")  # the kinds that load GGUF architectures
FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][a-zA-Z0-9-]*)")
PROBE_ARGS = ("--ctx-size", "256", "--parallel", "1", "--threads", "1", "--threads-batch", "1")


def probe_model(cache: Path, architecture: str) -> Path:
    """The tiny model written under `architecture`'s name (made once, kept in the cache)."""
    from blazar.testing.tiny import write_tiny_model

    safe = architecture if re.fullmatch(r"[a-z0-9._-]{1,64}", architecture) else None
    name = safe or hashlib.sha256(architecture.encode()).hexdigest()[:16]
    path = cache / "probes" / f"{name}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        write_tiny_model(tmp, architecture=architecture, chat_template=None)
        tmp.replace(path)
    return path


async def _probe(engine: EngineRecord, model: Path, log: Path) -> tuple[bool, str]:
    server = EngineServer(engine.command, ["--model", str(model), *PROBE_ARGS], log)
    try:
        async with server:
            return True, "loaded"
    except EngineStartError as exc:
        text = str(exc)
        if UNKNOWN.search(text):
            return False, UNKNOWN.search(text).group(0)  # type: ignore[union-attr]
        return True, "known (the probe model's tensors do not fit it): " + text.splitlines()[-1]


def probe(engine: EngineRecord, architecture: str, paths: Paths) -> tuple[bool, str]:
    """(supported, what the probe saw) for `architecture` on `engine`."""
    model = probe_model(paths.cache, architecture)
    log = paths.logs / f"probe-{engine.kind}-{engine.tag}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    return asyncio.run(_probe(engine, model, log))


def ensure_probed(store: Store, paths: Paths, architectures: Iterable[str]) -> list[str]:
    """Probe each active mainstream engine for every architecture it has no answer for.

    Returns "lane tag architecture: yes|no" for each probe run now.
    """
    lanes = LaneStore(store)
    done = []
    for lane in lanes.all():
        if lane.origin != MAINSTREAM or lane.kind not in PROBED_KINDS:  # GGUF architectures
            continue
        engine = lanes.engines.active(lane.lane)
        if engine is None or not Path(engine.path).is_dir():
            continue
        known = lanes.support(lane.lane, engine.tag)
        for architecture in sorted(set(architectures) - set(known)):
            try:
                supported, detail = probe(engine, architecture, paths)
            except (BlazarError, OSError) as exc:  # unknown stays unknown; the load will tell
                done.append(f"{lane.lane} {engine.tag} {architecture}: probe failed: {exc}")
                continue
            lanes.record_support(lane.lane, engine.tag, architecture, supported, "probe", detail)
            done.append(f"{lane.lane} {engine.tag} {architecture}: {'yes' if supported else 'no'}")
    return done + ensure_flags(store)


def engine_flags(store: Store, lane: str, tag: str) -> frozenset[str] | None:
    """The flags the engine's server takes, as its `--help` lists them; None: not probed."""
    row = store.db.execute(
        "SELECT flags FROM engine_flags WHERE lane = ? AND tag = ?", [lane, tag]
    ).fetchone()
    return frozenset(json.loads(row[0])) if row else None


def help_flags(text: str) -> frozenset[str]:
    """Every flag a server's `--help` output names (llama-server's and the launcher's)."""
    return frozenset(FLAG.findall(text))


def ensure_flags(store: Store) -> list[str]:
    """Record the flags of every lane's active llama.cpp engine not probed yet: "lane tag:
    N flags" for each probed now (an engine whose --help fails stays unknown)."""
    lanes, done = LaneStore(store), []
    for lane in lanes.all():
        engine = lanes.engines.active(lane.lane) if lane.kind == "llamacpp" else None
        if engine is None or not Path(engine.path).is_dir():
            continue
        if engine_flags(store, lane.lane, engine.tag) is not None:
            continue
        try:
            shown = subprocess.run(
                [*engine.command, "--help"], capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            done.append(f"{lane.lane} {engine.tag}: --help failed: {exc}")
            continue
        flags = help_flags(shown.stdout + shown.stderr)
        if shown.returncode != 0 or "--model" not in flags:
            done.append(f"{lane.lane} {engine.tag}: --help exited {shown.returncode}")
            continue
        row = {
            "lane": lane.lane,
            "tag": engine.tag,
            "flags": json.dumps(sorted(flags)),
            "probed_at": utcnow(),
        }
        with store.db.atomic():
            store.db["engine_flags"].insert(row, replace=True)  # type: ignore[union-attr]
        done.append(f"{lane.lane} {engine.tag}: {len(flags)} flags")
    return done
