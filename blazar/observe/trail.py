"""A trace record as a routing trail: one line a step, for `blazar why`.

Pure: `render(record)` turns the dict `Trace.record` made (read back from the
gateway's `/api/why` or from the store) into lines a person reads top to bottom:
what was asked, what it resolved to, which instance and why, how long it waited and
loaded, what the prompt cache reused, how the answer came and how it was decoded
(speculative decoding's mode and acceptance rate), how it ended, and what
the sentinels and the cache-bust check found, each with its fix.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

DECISIONS = {
    "warm": "already loaded, a slot was free",
    "least_loaded": "the least loaded of {replicas} replicas ({in_flight} in flight there)",
    "affinity": "the replica of {replicas} that served this prompt's prefix within the last "
    "minute ({in_flight} in flight there): its cache holds it",
    "spawned": "the model was not running: started it",
    "queued": "every slot was busy: waited for one to free up",
}


COLD_LOAD_MS = 1000.0  # a load this slow gets the guide's "slow after idle" hint


def _ms(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.1f} ms"


def when(record: dict[str, Any]) -> str:
    stamp = datetime.fromtimestamp(float(record.get("time") or 0), UTC)
    return stamp.isoformat(timespec="seconds").replace("+00:00", "Z")


def render(record: dict[str, Any]) -> list[str]:
    """The routing trail of one request."""
    r = record
    who = (r.get("key") and f"key {r['key']}") or f"client {r.get('client') or '-'}"
    mode = "streamed" if r.get("stream") else "whole"
    lines = [f"trace {r['id']}  {when(r)}  {r.get('protocol')} POST {r.get('route')}  ({who})"]
    step = _Steps(lines)
    requested = r.get("requested")
    if requested is None:
        step("request: no model named")
    elif r.get("model") is None:
        step(f"asked for {requested!r}: not resolved")
    else:
        via = f" (alias {r['alias']!r})" if r.get("alias") else ""
        adapter = f" with adapter {r['adapter']!r}" if r.get("adapter") else ""
        step(f"asked for {requested!r} -> model {r['model']}{via}{adapter}")
    looked = r.get("response_cache")
    if looked:
        step(_response_cache(looked))
    if r.get("instance"):
        why = DECISIONS.get(r.get("decision") or "", r.get("decision") or "")
        why = why.format(replicas=r.get("replicas"), in_flight=r.get("in_flight"))
        step(f"routed to {r['instance']} (engine {r.get('engine')}): {why}")
        room = r.get("waited_for_room")
        if room:
            gone = ", ".join(room.get("evicted") or []) or "no model"
            step(
                f"waited_for_room {room['seconds']:.2f} s: the models holding the memory "
                f"were busy or just loaded (serving.min_residency); then evicted {gone}"
            )
        elif r.get("evicted"):
            step(
                f"evicted {', '.join(r['evicted'])} to make room "
                "(serving.memory_budget, serving.max_loaded_models)"
            )
        step(f"queue wait {_ms(r.get('queue_ms'))}, load {_ms(r.get('load_ms'))}")
    if r.get("remote"):
        step(f"forwarded to remote {r['remote']}: {r.get('remote_reason') or '-'}")
    prompt, cached = r.get("prompt_tokens"), r.get("cached_tokens")
    if prompt is not None:
        share = f" ({100 * cached / prompt:.0f}% reused)" if cached is not None and prompt else ""
        step(f"prompt {prompt} tokens, {cached if cached is not None else '-'} cached{share}")
    if r.get("generated_tokens") is not None or r.get("ttft_ms") is not None:
        rate = r.get("tokens_per_second")
        rate_text = f" at {rate:.1f} tokens/s" if rate else ""
        step(
            f"answer {mode}: first token after {_ms(r.get('ttft_ms'))}, "
            f"{r.get('generated_tokens') if r.get('generated_tokens') is not None else '-'} "
            f"tokens{rate_text}, finish {r.get('finish_reason') or '-'}"
        )
    drawn = r.get("image")
    if drawn:
        steps, per = drawn.get("steps"), drawn.get("seconds_per_step")
        how = f" in {steps} steps, {per:.3f} s a step" if steps and per is not None else ""
        step(f"drew {drawn.get('images')} picture(s) in {drawn.get('seconds')} s{how}")
    if r.get("spec") is not None:
        step(_speculation(r))
    for n, rounds in enumerate(r.get("tool_rounds") or [], 1):
        calls = ", ".join(
            f"{c['server']}.{c['tool']} {_ms(c.get('ms'))}" + (" (error)" if c.get("error") else "")
            for c in rounds.get("calls") or []
        )
        step(
            f"tool round {n}: finish {rounds.get('finish') or '-'}"
            + (f"; called {calls}" if calls else "")
        )
    status = f"status {r.get('status')} in {_ms(r.get('duration_ms'))}"
    if r.get("error"):
        code = f" [{r['code']}]" if r.get("code") else ""
        status += f": {r['error']}{code}"
    if r.get("rejected"):
        status += f" (rejected: {r['rejected']})"
    step(status)
    if r.get("decision") == "spawned" and (r.get("load_ms") or 0) >= COLD_LOAD_MS:
        model = r.get("model")
        lines.append(f"  ! cold load: {_ms(r.get('load_ms'))} to start '{model}' before its answer")
        lines.append(
            f"    fix: models.{model}.warm_peg = true keeps its weights in memory after it "
            f"unloads (the next load reads no disk); keep_alive = -1 keeps it loaded; "
            f"serving.session_bank restores its conversations"
        )
    for found in r.get("sentinels") or []:
        lines.append(f"  ! sentinel {found['check']}: {found['detail']}")
    cache = r.get("cache")
    if cache:
        lines.append(f"  ! {cache['finding']}: {cache['detail']}")
        lines.append(f"    fix: {cache['fix']}")
    return lines


def _response_cache(looked: dict[str, Any]) -> str:
    """The response cache's lookup: a hit names the tier, the similarity, the entry's age
    and the request that produced it."""
    result = looked.get("result") or "-"
    if looked.get("produced_by") is None:
        return f"response cache: {result}"
    similarity = looked.get("similarity")
    near = f", similarity {similarity:.2f}" if similarity is not None else ""
    return (
        f"response cache: {looked.get('tier')} hit{near}, an answer {looked.get('age_s')} s old "
        f"produced by trace {looked['produced_by']}: no model was called"
    )


def _speculation(r: dict[str, Any]) -> str:
    """The decoding mode, and what the draft gave (the engine's draft_n / draft_n_accepted)."""
    spec, drafted, accepted = r["spec"], r.get("draft_tokens"), r.get("draft_accepted")
    if spec == "off":
        return "decoding: dense (speculative decoding off)"
    if not drafted:
        return f"decoding: speculative ({spec}), nothing drafted for this answer"
    rate = (accepted or 0) / drafted
    return (
        f"decoding: speculative ({spec}), {accepted or 0} of {drafted} drafted tokens "
        f"accepted ({rate:.0%})"
    )


class _Steps:
    def __init__(self, lines: list[str]) -> None:
        self.lines, self.n = lines, 0

    def __call__(self, text: str) -> None:
        self.n += 1
        self.lines.append(f"  {self.n}. {text}")


def summary(record: dict[str, Any]) -> str:
    """One line per request, for `blazar why --model M --last N`."""
    r = record
    found = ",".join(s["check"] for s in r.get("sentinels") or [])
    cache = r["cache"]["finding"] if r.get("cache") else ""
    flags = " ".join(x for x in (found, cache) if x)
    return (
        f"{r['id']}  {when(r)}  {r.get('model') or r.get('requested') or '-'}  "
        f"{r.get('status')}  {_ms(r.get('duration_ms'))}  ttft {_ms(r.get('ttft_ms'))}  "
        f"{r.get('generated_tokens') if r.get('generated_tokens') is not None else '-'} tok"
        + (f"  {flags}" if flags else "")
    )
