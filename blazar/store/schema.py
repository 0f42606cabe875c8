"""Append-only schema migrations for Blazar's SQLite store.

Each migration is a function registered in order; applied ones are recorded in
`_migrations` by name, so a migration never runs twice and new ones are
appended, never edited. Later features (engines, instances, conditions) add
their tables by appending here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the store imports sqlite-utils when it opens (`blazar.store.db.open_database`)
    import sqlite_utils

Migration = Callable[["sqlite_utils.Database"], None]
MIGRATIONS: list[Migration] = []


def migration(fn: Migration) -> Migration:
    MIGRATIONS.append(fn)
    return fn


def migrate(db: sqlite_utils.Database) -> list[str]:
    """Apply every migration not yet applied, each in its own transaction.

    Returns the names applied now.
    """
    db["_migrations"].create(  # type: ignore[union-attr]
        {"name": str, "applied_at": str}, pk="name", if_not_exists=True
    )
    done = {row["name"] for row in db["_migrations"].rows}
    applied = []
    for fn in MIGRATIONS:
        if fn.__name__ in done:
            continue
        with db.atomic():
            fn(db)
            db.execute(
                "INSERT INTO _migrations (name, applied_at) VALUES (?, datetime('now'))",
                [fn.__name__],
            )
        applied.append(fn.__name__)
    return applied


@migration
def m001_models(db: sqlite_utils.Database) -> None:
    """Models Blazar holds: one row per name:tag, pointing at a verified file."""
    db["models"].create(  # type: ignore[union-attr]
        {
            "name": str,
            "tag": str,
            "path": str,  # absolute path of the bytes Blazar serves
            "held": str,  # hardlink | copy | reference
            "size": int,
            "sha256": str,
            "source": str,  # where it came from, e.g. file:///abs/path.gguf
            "architecture": str,
            "parameters": int,
            "quantization": str,
            "context_length": int,
            "facts": str,  # JSON: every GGUF fact Blazar read at import
            "added_at": str,  # ISO 8601, UTC
        },
        pk=("name", "tag"),
        not_null={"name", "tag", "path", "held", "size", "sha256", "added_at"},
    )
    db["models"].create_index(["sha256"])  # type: ignore[union-attr]


@migration
def m002_events(db: sqlite_utils.Database) -> None:
    """An append-only journal of what Blazar did and why."""
    db["events"].create(  # type: ignore[union-attr]
        {
            "id": int,
            "time": str,
            "kind": str,  # resource kind: model, engine, ...
            "subject": str,  # resource name
            "action": str,  # imported, removed, ...
            "message": str,
        },
        pk="id",
        not_null={"time", "kind", "subject", "action"},
    )
    db["events"].create_index(["kind", "subject"])  # type: ignore[union-attr]


@migration
def m003_engines(db: sqlite_utils.Database) -> None:
    """Installed engines, which one is active per lane, every switch, and bench figures."""
    db["engines"].create(  # type: ignore[union-attr]
        {
            "kind": str,  # lane: llamacpp
            "tag": str,  # b11549-cpu
            "method": str,  # wheel | release | source
            "version": str,
            "path": str,  # the engine's directory
            "command": str,  # JSON argv that starts its server
            "details": str,  # JSON: asset, sha256, cmake args, ...
            "active": int,  # 1 for the one active engine of its lane
            "installed_at": str,
        },
        pk=("kind", "tag"),
        not_null={"kind", "tag", "method", "version", "path", "command", "installed_at"},
        defaults={"active": 0, "details": "{}"},
    )
    db["engine_switches"].create(  # type: ignore[union-attr]
        {
            "id": int,
            "time": str,
            "kind": str,
            "from_tag": str,  # NULL when the lane had no active engine
            "to_tag": str,
            "reason": str,  # use | update | rollback | first install
        },
        pk="id",
        not_null={"time", "kind", "to_tag", "reason"},
    )
    db["bench"].create(  # type: ignore[union-attr]
        {
            "id": int,
            "time": str,
            "model": str,
            "sha256": str,  # the model file benchmarked
            "kind": str,
            "tag": str,
            "prompt_tps": float,  # prompt processing tokens/s
            "decode_tps": float,  # generation tokens/s
            "prompt_n": int,
            "predicted_n": int,
            "runs": int,
            "note": str,  # bench | update gate
        },
        pk="id",
        not_null={"time", "model", "kind", "tag", "prompt_tps", "decode_tps"},
    )
    db["bench"].create_index(["kind", "tag"])  # type: ignore[union-attr]


@migration
def m004_manifest_state(db: sqlite_utils.Database) -> None:
    """What apply needs: which models a manifest owns, adapters, keys, and conditions."""
    db["models"].add_column("managed", int, not_null_default=0)  # type: ignore[union-attr]
    db["models"].add_column("settings", str, not_null_default="{}")  # type: ignore[union-attr]
    db["loras"].create(  # type: ignore[union-attr]
        {
            "name": str,
            "model": str,  # the base model's name
            "path": str,
            "size": int,
            "sha256": str,
            "source": str,
            "architecture": str,
            "settings": str,  # JSON: scale
            "managed": int,
            "added_at": str,
        },
        pk="name",
        not_null={"name", "model", "path", "size", "sha256", "source", "added_at"},
        defaults={"settings": "{}", "managed": 1},
    )
    db["keys"].create(  # type: ignore[union-attr]
        {
            "name": str,
            "sha256": str,  # of the key; the key itself is never stored
            "models": str,  # JSON list, ["*"] for all
            "managed": int,
            "added_at": str,
        },
        pk="name",
        not_null={"name", "sha256", "models", "added_at"},
        defaults={"managed": 1},
    )
    db["conditions"].create(  # type: ignore[union-attr]
        {
            "kind": str,
            "name": str,
            "type": str,  # Ready
            "status": str,  # True | False | Unknown
            "reason": str,  # CamelCase: Applied, ApplyFailed, UpToDate, ...
            "message": str,
            "last_transition": str,  # when status last changed
            "updated_at": str,  # when the condition was last written
        },
        pk=("kind", "name", "type"),
        not_null={"kind", "name", "type", "status", "last_transition", "updated_at"},
    )


@migration
def m005_traces(db: sqlite_utils.Database) -> None:
    """Request traces (`blazar why`): one row per request, pruned by serving.trace_retention."""
    db["traces"].create(  # type: ignore[union-attr]
        {
            "id": int,  # insertion order; trace ids may repeat (a client's x-request-id)
            "trace_id": str,
            "time": float,  # seconds since the epoch
            "model": str,  # NULL when the name did not resolve
            "status": int,
            "record": str,  # JSON: the whole trace (blazar.observe.trace.Trace.record)
        },
        pk="id",
        not_null={"trace_id", "time", "record"},
    )
    db["traces"].create_index(["trace_id"])  # type: ignore[union-attr]
    db["traces"].create_index(["model", "id"])  # type: ignore[union-attr]
    db["traces"].create_index(["time"])  # type: ignore[union-attr]


@migration
def m006_engine_lanes(db: sqlite_utils.Database) -> None:
    """Engine lanes beside `engines` (whose `kind` column holds the lane's name), and what
    each engine can load."""
    db["lanes"].create(  # type: ignore[union-attr]
        {
            "lane": str,  # llamacpp, or a fork's offer id
            "kind": str,  # the server's contract: llamacpp (whisper, piper, ...)
            "origin": str,  # mainstream | fork
            "offer": str,  # JSON: the catalog offer a fork was installed from
            "architectures": str,  # JSON list: what a fork adds
            "state": str,  # active | retiring | retired
            "state_since": str,  # when it entered that state (ISO 8601, UTC)
            "reason": str,  # why it is in that state
            "updated_at": str,
        },
        pk="lane",
        not_null={"lane", "kind", "origin", "state", "state_since", "updated_at"},
        defaults={"offer": "{}", "architectures": "[]", "reason": ""},
    )
    db["engine_support"].create(  # type: ignore[union-attr]
        {
            "lane": str,
            "tag": str,
            "architecture": str,  # a GGUF general.architecture
            "supported": int,
            "how": str,  # probe | catalog
            "detail": str,  # what the probe saw
            "checked_at": str,
        },
        pk=("lane", "tag", "architecture"),
        not_null={"lane", "tag", "architecture", "supported", "how", "checked_at"},
    )


@migration
def m007_sessions(db: sqlite_utils.Database) -> None:
    """Saved KV sessions: explicit ones (`blazar session save`) and the session bank's."""
    db["sessions"].create(  # type: ignore[union-attr]
        {
            "name": str,
            "model": str,  # the model's short name
            "kind": str,  # saved | bank
            "file": str,  # its file's name under Paths.sessions
            "n_tokens": int,  # tokens the engine saved (its save response)
            "size": int,  # bytes of the file
            "model_sha256": str,  # of the model file it was saved from
            "engine_tag": str,  # the engine build that wrote it
            "cache_type": str,  # KV cache element type: the state is only valid for it
            "created_at": str,
            "last_used": str,  # saved or restored; the bank drops the oldest first
        },
        pk="name",
        not_null={"name", "model", "kind", "file", "n_tokens", "size", "created_at"},
    )
    db["sessions"].create_index(["model", "kind"])  # type: ignore[union-attr]


@migration
def m008_key_usage(db: sqlite_utils.Database) -> None:
    """When each API key was last used, by key name (never the key, nor its hash)."""
    db["key_usage"].create(  # type: ignore[union-attr]
        {"name": str, "last_used": str},  # ISO 8601, UTC
        pk="name",
        not_null={"name", "last_used"},
    )


@migration
def m009_audio_jobs(db: sqlite_utils.Database) -> None:
    """Async transcription jobs (`POST /v1/audio/transcriptions` with async=true)."""
    db["audio_jobs"].create(  # type: ignore[union-attr]
        {
            "id": str,  # audiojob_<hex>
            "status": str,  # queued | running | succeeded | failed | cancelled
            "model": str,  # the name the client asked for
            "task": str,  # transcribe | translate
            "params": str,  # JSON: language, prompt, temperature, response_format, ...
            "file": str,  # the audio's path in the cache (removed once it is not needed)
            "filename": str,  # the client's file name, for the record
            "size": int,  # bytes of audio
            "done_s": float,  # seconds of audio transcribed
            "total_s": float,  # seconds of audio in the file (known once it runs)
            "result": str,  # the answer in the requested format
            "content_type": str,
            "error": str,  # why it failed
            "retryable": int,  # a failed job that may run again (`/retry`)
            "attempts": int,
            "created_at": str,  # ISO 8601, UTC
            "started_at": str,
            "finished_at": str,
        },
        pk="id",
        not_null={"id", "status", "model", "created_at"},
    )
    db["audio_jobs"].create_index(["status"])  # type: ignore[union-attr]


@migration
def m010_projectors(db: sqlite_utils.Database) -> None:
    """Vision projectors (llama.cpp mmproj GGUFs): at most one per model, by its short name."""
    db["projectors"].create(  # type: ignore[union-attr]
        {
            "model": str,  # the model's short name (name or name:tag)
            "path": str,  # the verified blob (blobs/sha256-<hex>)
            "size": int,
            "sha256": str,
            "source": str,  # as declared: a source, or "auto"
            "facts": str,  # JSON: projector_type, projection_dim, vision, audio, resolved
            "settings": str,  # JSON: what the declaration was resolved against
            "managed": int,
            "added_at": str,  # ISO 8601, UTC
        },
        pk="model",
        not_null={"model", "path", "size", "sha256", "source", "added_at"},
    )


@migration
def m011_tune(db: sqlite_utils.Database) -> None:
    """`blazar tune`: each model's profile (the settings its runs won, newest row current),
    the flags each engine's server takes (what a manifest field needs), and the decoding
    mode of each bench figure."""
    db["profiles"].create(  # type: ignore[union-attr]
        {
            "id": int,
            "time": str,  # ISO 8601, UTC
            "model": str,  # short name
            "sha256": str,  # of the model file tuned: another file does not take the profile
            "engine": str,  # lane and tag it was measured on: llamacpp b11549-cpu
            "settings": str,  # JSON: spec, draft, ngram/draft knobs, slots, batch, threads, ...
            "figures": str,  # JSON: the winner's and dense's figures, the runs behind them
            "argv": str,  # JSON: the winner's child arguments, as tune started it
            "workload": str,  # repetitive | chat | long-prompt | a path
            "note": str,  # spec-race | search | ngram | cache-reuse | forget
        },
        pk="id",
        not_null={"time", "model", "settings"},
    )
    db["profiles"].create_index(["model"])  # type: ignore[union-attr]
    db["engine_flags"].create(  # type: ignore[union-attr]
        {"lane": str, "tag": str, "flags": str, "probed_at": str},  # flags: JSON list
        pk=("lane", "tag"),
        not_null={"lane", "tag", "flags"},
    )
    db["bench"].add_column("spec", str)  # type: ignore[union-attr]  # off | ngram | draft


@migration
def m012_message_batches(db: sqlite_utils.Database) -> None:
    """Anthropic message batches (`/v1/messages/batches`): a batch, and its requests."""
    db["message_batches"].create(  # type: ignore[union-attr]
        {
            "id": str,  # msgbatch_<hex>
            "key": str,  # the name of the API key that made it (only it sees the batch)
            "status": str,  # in_progress | canceling | ended
            "requests": int,  # how many
            "created_at": str,  # ISO 8601, UTC
            "expires_at": str,
            "ended_at": str,
            "cancel_initiated_at": str,
        },
        pk="id",
        not_null={"id", "status", "requests", "created_at", "expires_at"},
    )
    db["message_batch_requests"].create(  # type: ignore[union-attr]
        {
            "batch_id": str,
            "idx": int,  # its place in the batch's requests
            "custom_id": str,
            "state": str,  # queued | succeeded | errored | canceled | expired
            "params": str,  # JSON: the Messages request; cleared once it has a result
            "result": str,  # JSON: Anthropic's `result` object (succeeded with the message, ...)
        },
        pk=("batch_id", "idx"),
        not_null={"batch_id", "idx", "custom_id", "state"},
        foreign_keys=[("batch_id", "message_batches", "id")],
    )


@migration
def m013_owners(db: sqlite_utils.Database) -> None:
    """Which manifest applied each model, adapter, projector and key last (its resolved
    path): `apply --prune` of one manifest removes only what it applied, not what another
    manifest sharing the store declared."""
    db["owners"].create(  # type: ignore[union-attr]
        {"kind": str, "name": str, "manifest": str},  # kind: model | lora | projector | key
        pk=("kind", "name"),
        not_null={"kind", "name", "manifest"},
    )


@migration
def m014_footprints(db: sqlite_utils.Database) -> None:
    """What a model's child really used once loaded (one instance), per model file and
    device kind: the scheduler's footprint for it from then on, instead of `fit`'s
    estimate (docs/serve.md, the scheduler)."""
    db["footprints"].create(  # type: ignore[union-attr]
        {
            "model": str,
            "sha256": str,  # of the model file: another file is estimated again
            "device": str,  # gpu | cpu
            "bytes": int,
            "measured_at": str,  # ISO 8601, UTC
        },
        pk=("model", "sha256", "device"),
        not_null={"model", "sha256", "device", "bytes"},
    )


@migration
def m015_response_cache(db: sqlite_utils.Database) -> None:
    """The response cache's entries (docs/cache.md): one answer per exact key (a hash of
    the scope, the model's identity and the canonical request), with the semantic tier's
    prefix bucket and the last user message's embedding (float32) where it has one."""
    db["cache_entries"].create(  # type: ignore[union-attr]
        {
            "key": str,  # sha256 hex of (scope, identity, canonical request)
            "scope": str,  # the API key's name ("" without keys), or "*" when global
            "model": str,  # the model's served name: cleared with it
            "identity": str,  # sha256 hex of everything about the model that changes output
            "bucket": str,  # sha256 hex of the request but its last user message; "" none
            "request": str,  # the canonical request, JSON
            "answer": str,  # protocol-neutral: text, tool_calls, finish, usage (JSON)
            "vector": bytes,  # the last user message's embedding, float32; NULL: exact only
            "created": float,  # unix seconds
            "used": float,  # unix seconds, for least recently used
            "bytes": int,
            "trace_id": str,  # the request that produced the answer
        },
        pk="key",
        not_null={"key", "scope", "model", "identity", "request", "answer", "created"},
    )
    db["cache_entries"].create_index(["bucket"])  # type: ignore[union-attr]
    db["cache_entries"].create_index(["model"])  # type: ignore[union-attr]
    db["cache_entries"].create_index(["used"])  # type: ignore[union-attr]
