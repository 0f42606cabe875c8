"""What every command needs: resolved paths and an open store, made on first use.

The store (sqlite-utils) and the registry (gguf) are imported when a command
first asks for them, not when the CLI starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import click

from blazar.paths import Paths, resolve_paths

if TYPE_CHECKING:
    from blazar.models.registry import Registry
    from blazar.store.db import Store


@dataclass
class Context:
    _paths: Paths | None = field(default=None)

    @cached_property
    def paths(self) -> Paths:
        return self._paths or resolve_paths()

    @cached_property
    def store(self) -> Store:
        """The store, opened on first use and closed when the command ends."""
        from blazar.store.db import Store

        store = Store(self.paths.db)
        command = click.get_current_context(silent=True)
        if command is not None:
            command.find_root().call_on_close(store.close)
        return store

    @cached_property
    def registry(self) -> Registry:
        from blazar.models.registry import Registry

        return Registry(self.store, self.paths)


pass_context = click.make_pass_decorator(Context, ensure=True)


# `--manifest PATH` on the commands that edit a manifest: another file than the user's.
manifest_option = click.option(
    "--manifest",
    "manifest_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The manifest to edit (default: yours, `blazar config path`).",
)
