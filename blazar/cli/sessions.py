"""`blazar session save|restore|list|rm`: KV sessions on a running daemon.

Each command calls the daemon's `/api/blazar/sessions` (`blazar.serve.routes.sessions_api`);
the daemon's address comes as for `blazar ps` (`--url`, `$BLAZAR_URL`, the running
serve, the default). docs/sessions.md says what a session is and when the bank makes one.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.format import echo_json, human_bytes, table
from blazar.cli.serve import URL_OPTION, call, daemon_url

BASE = "/api/blazar/sessions"


@click.group("session")
def session() -> None:
    """Save a model's KV cache (a conversation's prefill) and restore it later."""


@session.command("save")
@click.argument("model")
@click.argument("name")
@click.option("--slot", type=int, default=None, help="The slot to save (default: the last used).")
@URL_OPTION
@pass_context
def save(ctx: Context, model: str, name: str, slot: int | None, url: str | None) -> None:
    """Save a slot of loaded MODEL as session NAME (replacing one of that name)."""
    body: dict[str, Any] = {"model": model, "name": name}
    if slot is not None:
        body["slot"] = slot
    record = call(daemon_url(ctx.paths, url), BASE, body)
    click.echo(
        f"saved {record['name']}: {record['n_tokens']} tokens of {record['model']}, "
        f"{human_bytes(record['size'])}"
    )


@session.command("restore")
@click.argument("model")
@click.argument("name")
@URL_OPTION
@pass_context
def restore(ctx: Context, model: str, name: str, url: str | None) -> None:
    """Restore session NAME into a free slot of MODEL (loading it if needed)."""
    path = f"{BASE}/{quote(name, safe='')}/restore"
    result = call(daemon_url(ctx.paths, url), path, {"model": model})
    click.echo(
        f"restored {result['name']} into slot {result['slot']} of {result['model']} "
        f"({result['n_tokens']} tokens)"
    )


@session.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per session.")
@URL_OPTION
@pass_context
def list_(ctx: Context, as_json: bool, url: str | None) -> None:
    """The saved and banked sessions, most recently used first."""
    rows = call(daemon_url(ctx.paths, url), BASE)["sessions"]
    if as_json:
        for row in rows:
            echo_json(row)
        return
    if not rows:
        click.echo("No sessions yet: `blazar session save MODEL NAME` saves one.")
        return
    headers = ["NAME", "MODEL", "KIND", "TOKENS", "SIZE", "ENGINE", "LAST USED"]
    click.echo(
        table(
            headers,
            [
                [
                    r["name"],
                    r["model"],
                    r["kind"],
                    r["n_tokens"],
                    human_bytes(r["size"]),
                    r["engine_tag"],
                    r["last_used"][:19],
                ]
                for r in rows
            ],
        )
    )


@session.command("rm")
@click.argument("name")
@URL_OPTION
@pass_context
def rm(ctx: Context, name: str, url: str | None) -> None:
    """Remove session NAME and its file."""
    call(daemon_url(ctx.paths, url), f"{BASE}/{quote(name, safe='')}", method="DELETE")
    click.echo(f"removed {name}")


COMMANDS = [session]
