"""`blazar why` (a request's routing trail) and `blazar watch` (a live view of the gateway).

Both ask the running daemon (`/api/why`, `/api/blazar/stats`, `/api/blazar/ps`; see
`blazar.serve.routes.observe_api`); `why` reads the store directly when no daemon answers,
so a trace can be read after serve has stopped. The trail itself is rendered by
`blazar.observe.trail`.
"""

from __future__ import annotations

import sys
import time
import urllib.parse
from typing import Any

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.format import echo_json, table
from blazar.cli.serve import URL_OPTION, NoDaemon, call, daemon_url
from blazar.errors import BlazarError, NotFound
from blazar.observe import trace_store as trace_store
from blazar.observe import trail


class NoTrace(NotFound):
    pass


def _fetch(ctx: Context, url: str | None, trace: str | None, model: str | None, last: int) -> Any:
    """A trace (by id) or the newest traces, from the daemon or else from the store."""
    base = daemon_url(ctx.paths, url)
    try:
        if trace is not None:
            return call(base, f"/api/why/{urllib.parse.quote(trace, safe='')}")
        query = urllib.parse.urlencode({"limit": last, **({"model": model} if model else {})})
        return call(base, f"/api/why?{query}")["traces"]
    except NoDaemon:
        pass  # read what serve left in the store
    except BlazarError as exc:
        if trace is not None and ": 404:" in str(exc):
            raise NoTrace(_missing(trace)) from None
        raise
    if trace is not None:
        found = trace_store.find(ctx.store, trace)
        if found is None:
            raise NoTrace(_missing(trace))
        return found
    return trace_store.recent(ctx.store, model=model, limit=last)


def _missing(trace: str) -> str:
    return (
        f"no trace {trace!r}: not a request id this host answered, or older than "
        "serving.trace_retention keeps; `blazar why --last 20` lists recent ones"
    )


@click.command("why")
@click.argument("trace", required=False)
@click.option("--model", default=None, help="Only requests for this model.")
@click.option("--last", type=click.IntRange(1, 1000), default=None, help="List the N newest.")
@click.option("--json", "as_json", is_flag=True, help="The trace(s) as JSON.")
@URL_OPTION
@pass_context
def why(
    ctx: Context,
    trace: str | None,
    model: str | None,
    last: int | None,
    as_json: bool,
    url: str | None,
) -> None:
    """Why a request went as it did: its routing trail, one line a step.

    TRACE is a request's x-request-id (default: the most recent request). With --model
    or --last, one line per request, newest first."""
    if trace is None and model is None and last is None:
        newest = _fetch(ctx, url, None, None, 1)
        if not newest:
            raise NoTrace("no request has been traced yet: send one, then run `blazar why`")
        found: Any = newest[0]
    elif trace is not None:
        found = _fetch(ctx, url, trace, None, 1)
    else:
        rows = _fetch(ctx, url, None, model, last or 20)
        if as_json:
            for row in rows:
                echo_json(row)
        elif not rows:
            click.echo("No request has been traced" + (f" for {model}." if model else "."))
        for row in [] if as_json else rows:
            click.echo(trail.summary(row))
        return
    if as_json:
        echo_json(found)
        return
    click.echo("\n".join(trail.render(found)))


def _ratio(row: dict[str, Any]) -> str:
    prompt = row.get("prompt_tokens") or 0
    return f"{100 * (row.get('cached_tokens') or 0) / prompt:.0f}%" if prompt else "-"


def _value(value: Any, unit: str = "") -> str:
    return "-" if value is None else f"{value:g}{unit}"


def render_watch(base: str, stats: dict[str, Any]) -> str:
    """One screen of `blazar watch`."""
    stamp = time.strftime("%H:%M:%S", time.localtime(stats.get("time") or time.time()))
    by_model: dict[str, list[dict[str, Any]]] = {}
    for inst in stats.get("instances", []):
        if not inst.get("retired"):
            by_model.setdefault(inst["model"], []).append(inst)
    models = stats.get("models") or {}
    rows = []
    for name in sorted(set(by_model) | set(models)):
        insts = by_model.get(name, [])
        row = models.get(name, {})
        recent = row.get("recent") or {}
        states = ",".join(sorted({i["state"] for i in insts})) or "-"
        rows.append(
            [
                name,
                f"{sum(1 for i in insts if i['state'] == 'ready')}/{len(insts)}",
                states,
                sum(i["in_flight"] for i in insts),
                max((i["queued"] for i in insts), default=0),
                _value(recent.get("requests_per_second")),
                _value(recent.get("ttft_ms"), " ms"),
                _value(recent.get("tokens_per_second")),
                int(row.get("requests") or 0),
                int(row.get("errors") or 0),
                _ratio(row),
            ]
        )
    headers = [
        "MODEL",
        "READY",
        "STATE",
        "IN FLIGHT",
        "QUEUED",
        "REQ/S",
        "TTFT",
        "TOK/S",
        "REQUESTS",
        "ERRORS",
        "CACHE HIT",
    ]
    lines = [f"blazar watch  {base}  {stamp}  (last minute; Ctrl-C to stop)", ""]
    lines.append(table(headers, rows) if rows else "No model is served yet.")
    rejected = {k: v for k, v in (stats.get("rejected") or {}).items() if v}
    if rejected:
        lines.append("")
        lines.append("refused: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(rejected.items())))
    for buster in stats.get("cache_busters") or []:
        lines.append(
            f"cache busting: {buster['client']} on {buster['model']} ({buster['count']}x): "
            "`blazar doctor` says how to fix it"
        )
    return "\n".join(lines)


@click.command("watch")
@URL_OPTION
@click.option(
    "--interval",
    type=click.FloatRange(0.2),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option("--once", is_flag=True, help="Print one screen and exit.")
@pass_context
def watch(ctx: Context, url: str | None, interval: float, once: bool) -> None:
    """A live view of the gateway: each model's instances, load, request rate, time to
    first token, tokens/s and queue, refreshed in place until Ctrl-C."""
    base = daemon_url(ctx.paths, url)
    live = not once and sys.stdout.isatty()
    try:
        while True:
            screen = render_watch(base, call(base, "/api/blazar/stats", timeout=10))
            if live:
                click.echo("\x1b[H\x1b[2J" + screen, nl=True)  # home, clear, redraw
            else:
                click.echo(screen)
            if once:
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return


COMMANDS = [why, watch]
