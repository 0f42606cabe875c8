"""`blazar cache stats [--json]` and `blazar cache clear [MODEL] [--key NAME]`: the response
cache of the running serve (docs/cache.md), through its admin API
(`blazar.serve.routes.cache_api`). The human view is rendered from the same JSON."""

from __future__ import annotations

from typing import Any

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.format import echo_json, human_bytes, table
from blazar.cli.serve import URL_OPTION, call, daemon_url


@click.group("cache")
def cache() -> None:
    """The response cache (exact and semantic): its figures, and clearing it."""


@cache.command("stats")
@click.option("--json", "as_json", is_flag=True, help="The figures as one JSON object.")
@URL_OPTION
@pass_context
def stats(ctx: Context, as_json: bool, url: str | None) -> None:
    """Entries, bytes, hits and misses per tier, evictions, the hit ratio, per model."""
    answer = call(daemon_url(ctx.paths, url), "/api/blazar/cache", timeout=30)
    if as_json:
        echo_json(answer)
        return
    click.echo(render(answer))


@cache.command("clear")
@click.argument("model", required=False)
@click.option("--key", default=None, help="Only this API key's entries.")
@URL_OPTION
@pass_context
def clear(ctx: Context, model: str | None, key: str | None, url: str | None) -> None:
    """Delete the cached answers (of MODEL, of an API key, or all)."""
    body = {k: v for k, v in (("model", model), ("key", key)) if v is not None}
    answer = call(daemon_url(ctx.paths, url), "/api/blazar/cache/clear", body, timeout=30)
    click.echo(f"cleared {answer['cleared']} cached answers")


def render(answer: dict[str, Any]) -> str:
    """The human view of `GET /api/blazar/cache`."""
    ratio = answer.get("hit_ratio")
    hits, misses = answer["hits"], answer["misses"]
    lines = [
        f"cache: {'on' if answer.get('enabled') else 'off'}, {answer['entries']} entries, "
        f"{human_bytes(answer['bytes'])}",
        f"hits: exact {hits['exact']}, semantic {hits['semantic']}; misses: {misses['exact']}"
        f" (semantic lookups without a hit: {misses['semantic']}); bypassed: "
        f"{answer['bypasses']}; hit ratio: {'-' if ratio is None else f'{ratio:.1%}'}",
    ]
    evictions = answer.get("evictions") or {}
    if evictions:
        lines.append(
            "evicted: " + ", ".join(f"{n} ({why})" for why, n in sorted(evictions.items()))
        )
    rows = [[m["model"], str(m["entries"]), human_bytes(m["bytes"])] for m in answer["models"]]
    if rows:
        lines.append(table(["MODEL", "ENTRIES", "BYTES"], rows))
    return "\n".join(lines)


COMMANDS = [cache]
