"""What every command needs: resolved paths and an open store, made on first use."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import click

from blazar.paths import Paths, resolve_paths
from blazar.registry import Registry
from blazar.store import Store


@dataclass
class Context:
    _paths: Paths | None = field(default=None)

    @cached_property
    def paths(self) -> Paths:
        return self._paths or resolve_paths()

    @cached_property
    def store(self) -> Store:
        return Store(self.paths.db)

    @cached_property
    def registry(self) -> Registry:
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
