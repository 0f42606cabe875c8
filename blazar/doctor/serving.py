"""`blazar doctor`'s checks of what is served: MODELS (each declared model's file is there
with its recorded size; `deep` re-hashes it), CHANNELS (the gateway's port is free or held
by this daemon, TLS files readable, keys declared when bound beyond loopback) and RUNTIME
(the daemon's live summary: failing or restarting instances, a low prompt-cache hit
ratio, cache-busting clients, refused requests), and a finding for each False condition
in the store (apply's Ready, serve's Serving, Reachable and Applied: docs/serve.md).
MODELS also names a model that can never fit any device's memory budget, judged from
`blazar coreside`'s answer (`fit_findings`). `blazar.doctor.examine` calls them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from blazar.doctor.findings import ERROR, INFO, OK, WARNING, DaemonView, Finding
from blazar.models.hashing import sha256_file
from blazar.observe.cachebust import FIX as BUSTER_FIX
from blazar.store.db import Condition, ModelRecord, Store
from specs.manifest import Manifest
from specs.names import parse_name

LOW_HIT_RATIO, MIN_PROMPT_TOKENS = 0.2, 2000
LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


# -- MODELS -------------------------------------------------------------------------------


def fit_findings(coreside: Mapping[str, Any] | None) -> list[Finding]:
    """Pure: an error for each model whose footprint is over every device's memory budget
    (and all of them together), from `blazar coreside`'s answer (the daemon's, or one
    computed from the store with none running); nothing when there is none."""
    if not coreside:
        return []
    budget = ", ".join(f"{d['device']} {_gib(d['budget'])}" for d in coreside.get("devices", ()))
    return [
        Finding(
            "MODELS",
            ERROR,
            f"model '{m['model']}' needs {_gib(m['footprint'])} ({m['footprint_source']}) and "
            f"the memory budget is {budget or 'no device'}: it can never be loaded here",
            f"use a smaller quantization, a smaller ctx or slots, a quantized cache_type "
            f"(q8_0), or raise serving.memory_budget; `blazar fit {m['model']}` shows what fits",
        )
        for m in coreside.get("models", ())
        if m.get("never_fits")
    ]


def _gib(size: int) -> str:
    return f"{size / 1024**3:.2f} GiB" if size >= 1024**2 else f"{size} bytes"


def model_findings(store: Store, manifest: Manifest, *, deep: bool) -> list[Finding]:
    out = []
    declared = {parse_name(name).short for name in manifest.models}
    for name in sorted(declared):
        record = store.find_model(parse_name(name))
        if record is None:
            out.append(
                Finding(
                    "MODELS",
                    ERROR,
                    f"model '{name}' is declared but not in the store",
                    "`blazar apply` to fetch it",
                )
            )
            continue
        path = Path(record.path)
        if record.is_set:  # a set of files (docs/audio.md; a safetensors model)
            out.append(_set_finding(name, record, path, deep))
            continue
        if not path.is_file():
            out.append(
                Finding(
                    "MODELS",
                    ERROR,
                    f"model '{name}': its file {path} is missing",
                    "`blazar apply` to fetch it again (or `blazar rm "
                    f"{name}` if you no longer want it)",
                )
            )
            continue
        size = path.stat().st_size
        if size != record.size:
            out.append(
                Finding(
                    "MODELS",
                    ERROR,
                    f"model '{name}': {path} has {size} bytes, the store recorded {record.size}",
                    f"`blazar apply` to fetch it again after `blazar rm {name}`",
                )
            )
            continue
        if deep:
            digest, _ = sha256_file(path)
            if digest != record.sha256:
                out.append(
                    Finding(
                        "MODELS",
                        ERROR,
                        f"model '{name}': {path} does not hash to the "
                        f"recorded sha256 {record.sha256[:12]}...",
                        f"`blazar rm {name}` then `blazar apply` to fetch it again",
                    )
                )
                continue
        checked = "present, size and sha256 match" if deep else "present with its recorded size"
        out.append(Finding("MODELS", OK, f"model '{name}': {checked}"))
    for record in store.list_models():
        if record.ref.short not in declared:
            out.append(
                Finding(
                    "MODELS",
                    INFO,
                    f"model '{record.ref.short}' is held but not "
                    "declared; it is served with [serving]'s defaults",
                )
            )
    return out


# -- CHANNELS -----------------------------------------------------------------------------


def channel_findings(manifest: Manifest, daemon: DaemonView) -> list[Finding]:
    serving = manifest.serving
    host, port = serving.host, serving.port
    ours = daemon.up and daemon.url.rstrip("/").endswith(f":{port}")
    out = []
    if ours:
        pid = f" (pid {daemon.pid})" if daemon.pid else ""
        out.append(Finding("CHANNELS", OK, f"port {port} on {host}: held by this daemon{pid}"))
    elif _listening("127.0.0.1" if host in ("0.0.0.0", "::") else host, port):
        out.append(
            Finding(
                "CHANNELS",
                ERROR,
                f"port {port} on {host} is held by another program: `blazar serve` cannot listen",
                "stop that program, or choose another port: `blazar config set serving.port "
                f"{port + 1}`",
            )
        )
    else:
        out.append(Finding("CHANNELS", OK, f"port {port} on {host}: free"))
    for field in ("tls_cert", "tls_key"):
        value = getattr(serving, field)
        if value is not None and not os.access(Path(value).expanduser(), os.R_OK):
            out.append(
                Finding(
                    "CHANNELS",
                    ERROR,
                    f"serving.{field} {value} is not readable",
                    f"fix the path or its permissions for serving.{field}",
                )
            )
    if host not in LOOPBACK and not manifest.keys:
        out.append(
            Finding(
                "CHANNELS",
                ERROR,
                f"the gateway listens on {host} beyond loopback and no API key is declared: "
                "anyone who reaches it can use every model",
                'declare a key (`blazar keys add NAME`), or set serving.host = "127.0.0.1"',
            )
        )
    return out


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


# -- RUNTIME ------------------------------------------------------------------------------


def runtime_findings(daemon: DaemonView, covered: Iterable[str] = ()) -> list[Finding]:
    """Judgments on the daemon's live summary (pure). `covered`: models whose failing
    instances a condition reports already (`condition_findings`), not repeated here."""
    covered = set(covered)
    if not daemon.up:
        return [
            Finding(
                "RUNTIME",
                WARNING,
                f"no daemon answers at {daemon.url}",
                "`blazar serve` (or `blazar launch CMD`) to start one",
            )
        ]
    stats = daemon.stats or {}
    out = [Finding("RUNTIME", OK, f"daemon up at {daemon.url}")]
    for inst in stats.get("instances", []):
        key = f"{inst['model']}/{inst['replica']}"
        if inst.get("state") in ("failed", "backoff") and inst["model"] not in covered:
            out.append(
                Finding(
                    "RUNTIME",
                    ERROR,
                    f"instance {key} is {inst['state']}: "
                    f"{inst.get('last_error') or 'no error recorded'}",
                    f"read its log under the state directory's logs/, fix the model's "
                    f"args in the manifest, or `blazar stop {inst['model']}`",
                )
            )
        elif inst.get("restarts") and inst.get("state") not in ("failed", "backoff"):
            out.append(
                Finding(
                    "RUNTIME",
                    WARNING,
                    f"instance {key} restarted {inst['restarts']} "
                    f"times (last: {inst.get('last_error') or 'unknown'})",
                    "read its log under the state directory's logs/",
                )
            )
    for model, row in (stats.get("models") or {}).items():
        prompt, cached = row.get("prompt_tokens") or 0, row.get("cached_tokens") or 0
        if prompt >= MIN_PROMPT_TOKENS and cached / prompt < LOW_HIT_RATIO:
            out.append(
                Finding(
                    "RUNTIME",
                    WARNING,
                    f"model '{model}' reuses only "
                    f"{100 * cached / prompt:.0f}% of its prompt tokens from cache",
                    "give clients stable prompt prefixes (see the cache-busting "
                    "clients below), or raise the model's slots",
                )
            )
    for model, row in (stats.get("models") or {}).items():
        cold = row.get("cold_loads") or {}
        if cold.get("count"):
            out.append(
                Finding(
                    "RUNTIME",
                    WARNING,
                    f"model '{model}' was slow to first token after idle: {cold['count']} "
                    f"requests waited for it to start (up to {cold['max_ms'] / 1000:.1f} s)",
                    f"models.{model}.warm_peg = true keeps its weights in memory after it "
                    f"unloads (the next load reads no disk); keep_alive = -1 keeps it loaded; "
                    f"serving.session_bank restores its conversations",
                )
            )
    for buster in stats.get("cache_busters") or []:
        out.append(
            Finding(
                "RUNTIME",
                WARNING,
                f"client {buster['client']} busts the prompt cache of model '{buster['model']}' "
                f"({buster['count']} times): its system prompt changes every turn",
                BUSTER_FIX,
            )
        )
    for reason, count in sorted((stats.get("rejected") or {}).items()):
        if count:
            out.append(
                Finding(
                    "RUNTIME",
                    WARNING,
                    f"{count:.0f} requests refused ({reason})",
                    _REJECTION_FIX.get(reason),
                )
            )
    return out


_REJECTION_FIX = {
    "busy": "raise the model's slots or replicas, serving.max_queue or serving.max_loaded_models",
    "preflight": "`blazar why --last 20` shows which requests and why",
    "auth": "check the clients' keys (`blazar why --last 20` names the key of each request)",
    "rate": "raise the key's rate limit, or slow the client down",
}


def _set_finding(name: str, record: ModelRecord, path: Path, deep: bool) -> Finding:
    """A transcription model's or voice's files: each present, of its size and (deep) sha256."""
    files = record.facts.get("files") or {}
    missing = [f for f in files if not (path / f).is_file()]
    if not path.is_dir() or missing:
        gone = ", ".join(missing) if path.is_dir() else f"its directory {path}"
        return Finding(
            "MODELS",
            ERROR,
            f"model '{name}': {gone} is missing",
            f"`blazar rm {name}` then `blazar apply` to fetch it again",
        )
    if sum((path / f).stat().st_size for f in files) != record.size:
        return Finding(
            "MODELS",
            ERROR,
            f"model '{name}': its files are not the size the store recorded",
            f"`blazar rm {name}` then `blazar apply` to fetch it again",
        )
    if deep:
        changed = [f for f, digest in files.items() if sha256_file(path / f)[0] != digest]
        if changed:
            return Finding(
                "MODELS",
                ERROR,
                f"model '{name}': {', '.join(changed)} no longer hash to the recorded sha256",
                f"`blazar rm {name}` then `blazar apply` to fetch it again",
            )
    checked = "present, sizes and sha256 match" if deep else "present with their recorded sizes"
    return Finding("MODELS", OK, f"model '{name}' ({record.kind}): {len(files)} files {checked}")


# -- CONDITIONS -----------------------------------------------------------------------------

# The types `blazar serve` writes (blazar.serve.state.conditions); they describe a serve
# that runs, so a dead serve's are not reported.
SERVE_TYPES = ("Serving", "Reachable", "Applied")
_GROUPS = {"engine": "ENGINES", "model": "MODELS", "lora": "MODELS", "key": "CHANNELS"}
_FIXES = {
    "StartFailed": "read its log (named above), fix models.{name} in the manifest (args, ctx, "
    "cache fields) and save it: serve starts it again",
    "GaveUp": "read its log (named above), fix models.{name} in the manifest and save it: "
    "serve starts it again",
    "Restarting": "read its log (named above); `blazar stop {name}` stops the restarts",
    "SettingsRefused": "change models.{name} as the message says and save the manifest",
    "NoEngine": "install an engine that serves it, as the message says, then `blazar apply`",
    "Down": "check that the remote runs and answers at its url (`blazar remotes` shows its "
    "last error)",
    "Invalid": "fix the manifest (`blazar diff` names each problem) and save it",
    "ApplyFailed": "`blazar diff` shows the plan; fix what the message names and save",
    "ActionsFailed": "`blazar status` shows each resource's condition; fix and save",
}


def condition_findings(conditions: Iterable[Condition], daemon: DaemonView) -> list[Finding]:
    """Pure: a finding for each False condition in the store: apply's Ready ones, and
    serve's (Serving, Reachable, Applied) while a daemon answers."""
    out = []
    for c in conditions:
        if c.status != "False" or (c.type in SERVE_TYPES and not daemon.up):
            continue
        if c.type == "Reachable":
            group, severity, what = "RUNTIME", WARNING, f"remote '{c.name}' is down"
        elif c.type in SERVE_TYPES:
            group, severity = "RUNTIME", ERROR
            what = f"{c.kind} '{c.name}' is not {'applied' if c.type == 'Applied' else 'served'}"
        else:
            group, severity, what = _GROUPS.get(c.kind, "SYSTEM"), ERROR, f"{c.kind} '{c.name}'"
            what += " is not ready"
        fix = _FIXES.get(c.reason, "`blazar status` shows it; `blazar apply` tries again")
        what = f"{what} ({c.reason}, since {c.last_transition}): {c.message}"
        out.append(Finding(group, severity, what, fix.format(name=c.name)))
    return out


def failing_models(conditions: Iterable[Condition]) -> set[str]:
    """Models whose Serving condition is False (their instances' state says no more)."""
    return {c.name for c in conditions if c.type == "Serving" and c.status == "False"}
