"""`blazar config ...`: where Blazar's configuration lives."""

from __future__ import annotations

import click

from blazar.cli.context import Context, pass_context


@click.group()
def config() -> None:
    """Blazar's configuration: the user's manifest."""


@config.command("path")
@pass_context
def config_path(ctx: Context) -> None:
    """Print the path of the user's manifest (the file imperative commands edit)."""
    click.echo(str(ctx.paths.manifest))
