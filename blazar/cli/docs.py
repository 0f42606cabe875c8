"""Render the CLI reference (docs/cli.md) from the commands' own help.

`python -m blazar.cli.docs > docs/cli.md` regenerates it; a test fails when the
committed file is stale, so the reference never drifts from the code.
"""

from __future__ import annotations

import click

from blazar.cli.main import cli

HEADER = """# CLI reference

Generated from `blazar --help` by `python -m blazar.cli.docs > docs/cli.md`;
a test fails when this file is stale.
"""


def _walk(ctx: click.Context, path: list[str]) -> list[tuple[list[str], str]]:
    """Help texts of a command and its subcommands, each in a context chained to its parent
    (so settings such as `-h` reach every level, as when a user types the command)."""
    found = [(path, ctx.command.get_help(ctx))]
    group = ctx.command
    if isinstance(group, click.Group):
        # list_commands/get_command, not .commands: the root group loads its commands lazily
        for name in sorted(group.list_commands(ctx)):
            sub = group.get_command(ctx, name)
            assert sub is not None, name
            found += _walk(click.Context(sub, info_name=name, parent=ctx), [*path, name])
    return found


def render() -> str:
    root = click.Context(cli, info_name="blazar", terminal_width=100, **cli.context_settings)
    parts = [HEADER]
    for path, text in _walk(root, ["blazar"]):
        parts.append(f"## `{' '.join(path)}`\n\n```\n{text}\n```\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(), end="")
