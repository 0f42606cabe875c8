"""`blazar config ...`: the user's manifest, read and edited by dotted keys.

`get` and `set` import the manifest editor (tomlkit, and the manifest's pydantic
models to validate) themselves; `config path` needs neither.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from blazar.cli.context import Context, manifest_option, pass_context


@click.group()
def config() -> None:
    """Blazar's configuration: the user's manifest."""


@config.command("path")
@pass_context
def config_path(ctx: Context) -> None:
    """Print the path of the user's manifest (the file imperative commands edit)."""
    click.echo(str(ctx.paths.manifest))


@config.command("get")
@click.argument("key")
@manifest_option
@pass_context
def config_get(ctx: Context, key: str, manifest_path: Path | None) -> None:
    """Print the value at KEY (dotted; quote a segment with dots: models."qwen3:0.6b".ctx)."""
    from blazar.manifest_edit import ManifestFile

    value = ManifestFile(manifest_path or ctx.paths.manifest).get(key)
    click.echo(value if isinstance(value, str) else json.dumps(value, sort_keys=True))


@config.command("set")
@click.argument("key")
@click.argument("value")
@manifest_option
@pass_context
def config_set(ctx: Context, key: str, value: str, manifest_path: Path | None) -> None:
    """Set KEY to VALUE in the manifest, keeping its comments and layout.

    VALUE is read as a TOML value when it is one (8192, true, "text", [1, 2]) and
    as a string otherwise. The whole manifest is validated before it is written.
    """
    from blazar.manifest_edit import ManifestError, ManifestFile, parse_value
    from blazar.reconcile import InvalidManifest

    path = manifest_path or ctx.paths.manifest
    manifest = ManifestFile(path)
    manifest.set(key, parse_value(value))
    try:
        manifest.save()
    except ManifestError as exc:
        raise InvalidManifest(
            f"not written: the change would make the manifest invalid:\n{exc}"
        ) from None
    click.echo(f"{key} = {json.dumps(manifest.get(key))}  ({path})")


COMMANDS = [config]
