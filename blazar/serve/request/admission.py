"""Step 6 of the request path: a leased request admitted, and its bytes made.

`admitted` gives a request that sets no output limit the model's default
(`steps.with_output_limit`: a base model's), runs the prompt preflight
(`prompts.Prompts.preflight`: a prompt that cannot fit its slot is a 400; an output
that cannot is capped), both caps said in `x-blazar-max-tokens-capped`; then the
sessions' slot routing (`id_slot`, restoring a banked session into it first), else the
slot the gateway chose for the prompt's prefix (`scheduler.affinity`: with several
slots), and puts the adapters' `lora` list and the model's defaults in the body
(`steps.engine_body`). A body nothing changed goes as the client's bytes.
`blazar.serve.request.pipeline` calls it after the lease.
"""

from __future__ import annotations

from typing import Any

from blazar.protocols import EngineRequest
from blazar.serve.request import steps
from blazar.serve.request.asks import Ask
from blazar.serve.request.exchange import Sent, dumps
from blazar.serve.request.prompts import KINDS, Prompts
from blazar.serve.state.sessions import Sessions
from blazar.serve.supervisor.scheduler import Lease

CAPPED = "x-blazar-max-tokens-capped"  # the output limit a request was served with


async def admitted(
    prompts: Prompts,
    sessions: Sessions | None,
    lease: Lease,
    ask: Ask,
    engine: EngineRequest,
    *,
    slot: int | None = None,
) -> Sent:
    """The preflight, the sessions' slot, the adapters and defaults: what to send.
    `slot`: the one the gateway chose for the prompt's prefix (`scheduler.affinity`),
    sent unless the sessions route the request to another."""
    runtime = lease.runtime
    body = steps.with_output_limit(engine.body, engine.path, runtime.max_tokens)
    # A default limit is a cap the request did not ask for: the answer says so.
    cap = None if body is engine.body else runtime.max_tokens
    kind = KINDS.get(engine.path)
    chosen, slot = slot if kind is not None else None, None
    routed = kind is not None and sessions is not None and sessions.wants_tokens(lease)
    if kind is not None and (routed or runtime.preflight != "off"):
        slot, fitted = await _admit(
            prompts, sessions, lease, kind, body, ask.size or len(dumps(body)), routed
        )
        cap = fitted if fitted is not None else cap
    slot = chosen if slot is None else slot
    sent = steps.engine_body(lease, body, engine.path)
    if cap is None and slot is None:
        if sent is ask.body and ask.raw is not None:
            return Sent(ask.raw, sent, {})  # the common case: the client's bytes
        return Sent(dumps(sent), sent, {})
    out = dict(sent)
    if slot is not None:
        out["id_slot"] = slot
    headers = {}
    if cap is not None:
        for key in steps.OUTPUT_LIMITS:
            if key in out:
                out[key] = cap
        headers[CAPPED] = str(cap)
    return Sent(dumps(out), out, headers)


async def _admit(
    prompts: Prompts,
    sessions: Sessions | None,
    lease: Lease,
    kind: str,
    body: dict[str, Any],
    size: int,
    routed: bool,
) -> tuple[int | None, int | None]:
    """(the slot the sessions route the request to, the output cap of the preflight)."""
    runtime = lease.runtime
    tokens = None
    if routed:
        try:
            tokens = await prompts.token_ids(lease.url, kind, body)
        except ConnectionError:
            tokens = None
    cap = None
    if runtime.preflight != "off":
        cap = await prompts.preflight(
            lease.member.instance,
            lease.url,
            model=runtime.name,
            ctx=runtime.slot_ctx,
            kind=kind,
            body=body,
            size=size,
            tokens=tokens,
            strict=runtime.preflight == "strict",
        )
    slot = None
    if sessions is not None and tokens is not None:
        slot = await sessions.route(lease, tokens)
    return slot, cap


# -- 7 and 8. call and answer -------------------------------------------------------
