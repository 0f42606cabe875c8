"""The `blazar` entry point: the root command group and error handling.

Library code raises `BlazarError`s; the root group is the only place they
become a one-line `Error: ...` on stderr and exit code 1.

Command groups load lazily: the root knows each command only by the module and
attribute in `COMMANDS`, and imports that module when the command is asked for,
so `blazar --version` imports no command module and `blazar list` only
`blazar.cli.models`. Keep this module's own imports to click and the small
error types; heavy libraries (pydantic, gguf/numpy, sqlite-utils, aiohttp,
huggingface_hub) are imported by the commands that use them.
"""

from __future__ import annotations

import gc
import importlib
from typing import Any

import click

from blazar import __version__
from blazar.errors import BlazarError
from specs.names import InvalidName

# Every top-level command: name -> "module:attribute". `blazar --help` and the
# generated docs/cli.md list these; a test checks the table against each module's
# COMMANDS.
COMMANDS: dict[str, str] = {
    "apply": "blazar.cli.manifest:apply",
    "bench": "blazar.cli.engines:bench",
    "completions": "blazar.cli.shell:completions",
    "config": "blazar.cli.config:config",
    "cache": "blazar.cli.cache:cache",
    "coreside": "blazar.cli.coreside:coreside",
    "cp": "blazar.cli.imperative:cp",
    "create": "blazar.cli.imperative:create",
    "diff": "blazar.cli.manifest:diff",
    "doctor": "blazar.cli.doctor:doctor",
    "drafts": "blazar.cli.tune:drafts",
    "engine": "blazar.cli.engines:engine",
    "fit": "blazar.cli.models:fit",
    "image": "blazar.cli.image:image",
    "import": "blazar.cli.models:import_",
    "keys": "blazar.cli.keys:keys",
    "launch": "blazar.cli.serve:launch",
    "list": "blazar.cli.models:list_",
    "login": "blazar.cli.shell:login",
    "logout": "blazar.cli.shell:logout",
    "lora": "blazar.cli.lora:lora",
    "migrate": "blazar.cli.migrate:migrate",
    "mmproj": "blazar.cli.vision:mmproj",
    "ps": "blazar.cli.serve:ps",
    "pull": "blazar.cli.imperative:pull",
    "push": "blazar.cli.shell:push",
    "quantize": "blazar.cli.quantize:quantize",
    "remotes": "blazar.cli.fleet:remotes",
    "render": "blazar.cli.fleet:render",
    "rm": "blazar.cli.imperative:rm",
    "run": "blazar.cli.serve:run_",
    "schema": "blazar.cli.manifest:schema",
    "search": "blazar.cli.hub:search",
    "serve": "blazar.cli.serve:serve",
    "session": "blazar.cli.sessions:session",
    "show": "blazar.cli.models:show",
    "snapshot": "blazar.cli.snapshot:snapshot",
    "signin": "blazar.cli.shell:signin",
    "signout": "blazar.cli.shell:signout",
    "status": "blazar.cli.manifest:status",
    "stop": "blazar.cli.serve:stop",
    "tts": "blazar.cli.audio:tts",
    "tune": "blazar.cli.tune:tune",
    "ui": "blazar.cli.ui:ui",
    "upgrade": "blazar.cli.upgrade:upgrade",
    "watch": "blazar.cli.observe:watch",
    "whisper": "blazar.cli.audio:whisper",
    "why": "blazar.cli.observe:why",
}


def load_command(name: str) -> click.Command:
    """Import the module that defines command `name` and return the command."""
    module, _, attribute = COMMANDS[name].partition(":")
    command = getattr(importlib.import_module(module), attribute)
    if not isinstance(command, click.Command):
        raise TypeError(f"{COMMANDS[name]} is not a click command")
    return command


class BlazarGroup(click.Group):
    """The root group: commands from `COMMANDS`, imported on first use, and domain
    errors reported as one clear line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *super().list_commands(ctx)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in COMMANDS:
            command = load_command(cmd_name)
            self.add_command(command, cmd_name)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (BlazarError, InvalidName) as exc:
            raise click.ClickException(str(exc)) from exc


@click.group(cls=BlazarGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="blazar")
def cli() -> None:
    """Blazar: declare the models and engines a host should have, and serve them."""


def main() -> None:
    try:
        cli(prog_name="blazar")
    finally:
        # The process exits next. Freezing spares it the collector's last pass over every
        # object the command's imports made (pydantic's schemas: about 25 ms of a `blazar
        # diff`). Objects are still freed by reference counting and atexit hooks still run;
        # only cyclic garbage is left to the OS, and the store is closed before this.
        gc.freeze()


if __name__ == "__main__":  # `python -m blazar.cli.main`, as serve and quickstart fall back to
    main()
