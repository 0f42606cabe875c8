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
    from blazar.manifest.edit import ManifestFile

    value = ManifestFile(manifest_path or ctx.paths.manifest).get(key)
    click.echo(value if isinstance(value, str) else json.dumps(value, sort_keys=True))


@config.command("set")
@click.argument("pairs", nargs=-1, required=True, metavar="KEY VALUE [KEY VALUE]...")
@manifest_option
@pass_context
def config_set(ctx: Context, pairs: tuple[str, ...], manifest_path: Path | None) -> None:
    """Set each KEY to its VALUE in the manifest, keeping its comments and layout.

    VALUE is read as a TOML value when it is one (8192, true, "text", [1, 2]) and
    as a string otherwise. Several pairs are set together: the manifest with all of
    them is validated once, as a whole, and written once (or not at all), so fields
    that need each other go in one call:

        blazar config set serving.tls_cert cert.pem serving.tls_key key.pem
    """
    from blazar.errors import InvalidManifest
    from blazar.manifest.edit import ManifestError, ManifestFile, parse_value

    if len(pairs) % 2:
        raise click.UsageError(
            f"{len(pairs)} arguments: give KEY VALUE pairs, a value for each key "
            f"({pairs[-1]!r} has none), e.g. `blazar config set serving.port 11436`"
        )
    path = manifest_path or ctx.paths.manifest
    manifest = ManifestFile(path)
    keys = pairs[0::2]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise click.UsageError(f"{', '.join(repeated)} given twice: set each key once")
    for key, value in zip(keys, pairs[1::2], strict=True):
        manifest.set(key, parse_value(value))
    try:
        manifest.save()
    except ManifestError as exc:
        raise InvalidManifest(
            f"not written: the change would make the manifest invalid:\n{exc}"
        ) from None
    for key in keys:
        click.echo(f"{key} = {json.dumps(manifest.get(key))}  ({path})")


COMMANDS = [config]
