"""The `blazar` entry point: the root command group and error handling.

Library code raises `BlazarError`s; the root group is the only place they
become a one-line `Error: ...` on stderr and exit code 1.
"""

from __future__ import annotations

from typing import Any

import click

from blazar import __version__
from blazar.cli import config, engines, imperative, keys, manifest, models, serve
from blazar.errors import BlazarError
from specs.names import InvalidName


class BlazarGroup(click.Group):
    """A click group that reports domain errors as one clear line."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (BlazarError, InvalidName) as exc:
            raise click.ClickException(str(exc)) from exc


@click.group(cls=BlazarGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="blazar")
def cli() -> None:
    """Blazar: declare the models and engines a host should have, and serve them."""


cli.add_command(config.config)
for command in [
    *models.COMMANDS,
    *imperative.COMMANDS,
    *manifest.COMMANDS,
    *engines.COMMANDS,
    *keys.COMMANDS,
    *serve.COMMANDS,
]:
    cli.add_command(command)


def main() -> None:
    cli(prog_name="blazar")
