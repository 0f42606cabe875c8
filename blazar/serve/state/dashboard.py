"""What the dashboard (`/ui`) shows, as plain JSON values: the models view and request rows.

`models_view` joins what is declared (the reconcile conditions the last apply left in
the store, kind "model") with what is served (the scheduler's runtimes and its
`snapshot` of instances, each with its resident memory) and the models remotes serve
(`remote_row`, made by the caller from the fleet);
`for_grant` cuts it down to what an inference key may see (its models only; no pids,
ports or condition messages, as `/api/ps` shows). `request_row` is a finished
request's trace record reduced to one row of the Requests page, `running_row` one still
in flight. Called by `blazar.serve.state.events.EventBus`; pure but for the
`rss` function it is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from blazar.observe.trace import Trace
from blazar.serve.supervisor.scheduler import Scheduler
from blazar.store.db import Condition
from specs.names import InvalidName, parse_name

Sees = Callable[[str, Iterable[str]], bool]
ADMIN_ONLY_INSTANCE = ("pid", "port")


def _short(name: str) -> str:
    try:
        return parse_name(name).short
    except InvalidName:
        return name


def condition_json(c: Condition) -> dict[str, Any]:
    return {
        "type": c.type,
        "status": c.status,
        "reason": c.reason,
        "message": c.message,
        "since": c.last_transition,
    }


def models_view(
    scheduler: Scheduler | None,
    conditions: Sequence[Condition],
    remote_rows: Sequence[dict[str, Any]] = (),
    rss: Callable[[int | None], int | None] = lambda pid: None,
) -> list[dict[str, Any]]:
    """Every model declared or served, with its conditions and its instances; then
    `remote_rows` (`remote_row` of each model only a remote serves)."""
    declared: dict[str, list[dict[str, Any]]] = {}
    for c in conditions:
        if c.kind == "model":
            declared.setdefault(_short(c.name), []).append(condition_json(c))
    runtimes = scheduler.runtimes if scheduler is not None else {}
    instances: dict[str, list[dict[str, Any]]] = {}
    for inst in scheduler.snapshot() if scheduler is not None else []:
        inst = {**inst, "memory_bytes": rss(inst.get("pid"))}
        instances.setdefault(inst["model"], []).append(inst)
    rows = []
    for name in sorted(set(runtimes) | set(declared)):
        runtime = runtimes.get(name)
        pool = scheduler.pools.get(name) if scheduler is not None else None
        conds = declared.get(name, [])
        ready = next((c for c in conds if c["type"] == "Ready"), None)
        row: dict[str, Any] = {
            "name": name,
            "declared": bool(conds),
            "served": runtime is not None,
            "ready": ready,
            "conditions": conds,
            "instances": instances.get(name, []),
            "loaded": bool(pool and pool.loaded),
            "remote": None,
        }
        if runtime is not None:
            row.update(
                kind=runtime.kind,
                aliases=list(runtime.aliases),
                variants=list(runtime.variants),
                can_chat=runtime.kind == "chat" and runtime.can_chat,
                engine=runtime.engine_tag,
                lane=runtime.engine_lane,
                slots=runtime.slots,
                ctx=runtime.slot_ctx,
                replicas=runtime.replicas,
                pin=runtime.pin,
                keep_alive=runtime.keep_alive,
                size=runtime.facts.get("size"),
                problem=runtime.refusal or runtime.settings_problem or runtime.template_problem,
            )
        rows.append(row)
    rows.extend(remote_rows)
    return rows


def memory_view(scheduler: Scheduler | None) -> list[dict[str, Any]]:
    """The Models page's memory bar per device: its budget (serving.memory_budget) and
    total, the bytes each model's placement holds on it (loaded, or still stopping), and
    on host RAM the warm pegs' bytes (their budget: serving.warm_peg_budget). On a host
    of GPUs only, the pegs get a bar of their own ("host"). [] without a scheduler."""
    if scheduler is None:
        return []
    held: dict[str, dict[str, int]] = {}
    for pool in scheduler.all_pools():
        if pool.placement is None or not (pool.loaded or pool.stopping is not None):
            continue
        for device, size in pool.placement.shares:
            on = held.setdefault(device, {})
            on[pool.runtime.name] = on.get(pool.runtime.name, 0) + size
    pegs = scheduler.pegs.sizes()
    pegged = [{"name": n, "bytes": b} for n, b in pegs.items()]
    bars = [
        {
            "device": b.device,
            "budget": b.bytes,
            "total": b.total,
            "models": [
                {"name": n, "bytes": size} for n, size in sorted(held.get(b.device, {}).items())
            ],
            "pegged": pegged if b.kind == "cpu" else [],
            "peg_budget": scheduler.peg_budget if b.kind == "cpu" else 0,
        }
        for b in scheduler.budgets
    ]
    if pegs and not any(b.kind == "cpu" for b in scheduler.budgets):
        budget = scheduler.peg_budget
        bars.append(
            {
                "device": "host",
                "budget": budget,
                "total": 0,
                "models": [],
                "pegged": pegged,
                "peg_budget": budget,
            }
        )
    return bars


def memory_for_grant(
    bars: list[dict[str, Any]], admin: bool, names: set[str]
) -> list[dict[str, Any]]:
    """The bars a key may see: an inference key sees its models by name, the others'
    bytes as one "other models" share."""
    if admin:
        return bars

    def cut(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        mine = [i for i in items if i["name"] in names]
        rest = sum(i["bytes"] for i in items if i["name"] not in names)
        return mine + ([{"name": "other models", "bytes": rest}] if rest else [])

    return [{**b, "models": cut(b["models"]), "pegged": cut(b["pegged"])} for b in bars]


def remote_row(name: str, remote: str, state: str) -> dict[str, Any]:
    """A model served by a remote only (`state`: its health, or drained)."""
    return {
        "name": name,
        "declared": False,
        "served": True,
        "ready": None,
        "conditions": [],
        "instances": [],
        "loaded": False,
        "kind": "chat",
        "aliases": [],
        "variants": [],
        "can_chat": True,
        "pin": False,
        "remote": remote,
        "remote_state": state,
    }


def for_grant(rows: list[dict[str, Any]], admin: bool, sees: Sees) -> list[dict[str, Any]]:
    """The rows a key may see: its models; for an inference key without admin details."""
    out = []
    for row in rows:
        if not sees(row["name"], row.get("aliases") or ()):
            continue
        if not admin:
            instances = [
                {k: v for k, v in inst.items() if k not in ADMIN_ONLY_INSTANCE}
                for inst in row["instances"]
            ]
            ready = row["ready"] and {"type": "Ready", "status": row["ready"]["status"]}
            row = {**row, "instances": instances, "conditions": [], "ready": ready}
        out.append(row)
    return out


def row_key(trace_id: str, wall: float) -> str:
    """One request's key on the page: its id and start (a client may repeat an id)."""
    return f"{trace_id}@{wall:.6f}"


def request_row(record: dict[str, Any]) -> dict[str, Any]:
    """A finished request's row on the Requests page."""
    prompt, cached = record.get("prompt_tokens"), record.get("cached_tokens")
    ratio = cached / prompt if prompt and cached is not None else None
    return {
        "key": row_key(record["id"], record["time"]),
        "id": record["id"],
        "time": record["time"],
        "done": True,
        "protocol": record.get("protocol"),
        "route": record.get("route"),
        "stream": record.get("stream"),
        "model": record.get("model") or record.get("requested"),
        "adapter": record.get("adapter"),
        "instance": record.get("instance"),
        "decision": record.get("decision"),
        "key_name": record.get("key"),
        "status": record.get("status"),
        "error": record.get("error"),
        "ttft_ms": record.get("ttft_ms"),
        "duration_ms": record.get("duration_ms"),
        "tokens_per_second": record.get("tokens_per_second"),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "generated_tokens": record.get("generated_tokens"),
        "cache_hit_ratio": None if ratio is None else round(ratio, 4),
        "sentinels": [s.get("check") for s in record.get("sentinels") or []],
        "cache_finding": (record.get("cache") or {}).get("finding"),
        "remote": record.get("remote"),
    }


def running_row(trace: Trace, now: float | None = None) -> dict[str, Any]:
    """A request still in flight, as far as it has got."""
    now = time.time() if now is None else now
    asked, placement = trace.asked, trace.placement
    return {
        "key": row_key(asked.id, asked.wall),
        "id": asked.id,
        "time": asked.wall,
        "done": False,
        "protocol": asked.protocol,
        "route": asked.route,
        "model": placement.model or asked.requested,
        "adapter": placement.adapter,
        "instance": placement.instance,
        "elapsed_ms": round(max(0.0, now - asked.wall) * 1000, 1),
    }
