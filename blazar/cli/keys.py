"""`blazar keys add|list|rm`: API keys in the manifest; only their sha256 is written down.

`keys add` prints the key once, alone on stdout (everything else goes to stderr),
so `KEY=$(blazar keys add ci)` works. The manifest edits and the checks (the last
key is not removed without `--force`) are `blazar.manifest.keys`, which the gateway's
`/api/keys` shares; a running `blazar serve` applies a change without a restart.
"""

from __future__ import annotations

from pathlib import Path

import click

from blazar.cli.context import Context, manifest_option, pass_context
from blazar.cli.format import echo_json, table
from blazar.errors import InvalidInput
from blazar.manifest import keys as api_keys


@click.group("keys")
def keys() -> None:
    """API keys: once one is declared, every route but /health needs one."""


def _models(text: str | None) -> list[str]:
    if text is None:
        return ["*"]
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise InvalidInput("--models is empty: name models separated by commas, or omit it")
    return names


@keys.command("add")
@click.argument("name", required=False)
@click.option(
    "--scope",
    type=click.Choice(api_keys.SCOPES),
    default="inference",
    show_default=True,
    help="inference: models and listings; admin: also pull, create, delete, stop, keys.",
)
@click.option("--models", default=None, help="Models it may use, comma-separated (default: all).")
@click.option("--rpm", type=click.IntRange(min=1), default=None, help="Requests per minute.")
@click.option("--description", default=None, help="Who or what the key is for.")
@manifest_option
@pass_context
def add(
    ctx: Context,
    name: str | None,
    scope: str,
    models: str | None,
    rpm: int | None,
    description: str | None,
    manifest_path: Path | None,
) -> None:
    """Make key NAME: print it once (on stdout, alone) and declare only its sha256.

    Without NAME the key is named key-1 (key-2, ... when taken), and the name is said."""
    manifest = manifest_path or ctx.paths.manifest
    chosen = name is None
    if name is None:
        name = api_keys.unused_name(manifest)
    secret = api_keys.add_key(
        ctx.paths,
        manifest,
        name,
        scope=scope,
        models=_models(models),
        rpm=rpm,
        description=description,
    )
    named = f" (named {name}: `blazar keys rm {name}` removes it)" if chosen else ""
    click.echo(
        f"key {name} ({scope}) declared in {manifest}{named}; it is shown only now:", err=True
    )
    click.echo(secret)


@keys.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per key.")
@manifest_option
@pass_context
def list_(ctx: Context, as_json: bool, manifest_path: Path | None) -> None:
    """The declared keys: name, scope, models, rpm, created, last used; never a key."""
    manifest = api_keys.declared(manifest_path or ctx.paths.manifest)
    infos = api_keys.list_keys(manifest, ctx.store.key_usage())
    if as_json:
        for info in infos:
            echo_json(info.to_dict())
        return
    if not infos:
        click.echo("No key is declared: the gateway answers anyone who reaches it.")
        return
    rows = [
        [i.name, i.scope, ",".join(i.models), i.rpm, i.created, i.last_used or "never"]
        for i in infos
    ]
    click.echo(table(["NAME", "SCOPE", "MODELS", "RPM", "CREATED", "LAST USED"], rows))


@keys.command("rm")
@click.argument("name")
@click.option("--force", is_flag=True, help="Remove it even if it is the last key.")
@manifest_option
@pass_context
def rm(ctx: Context, name: str, force: bool, manifest_path: Path | None) -> None:
    """Remove key NAME; the last key only with --force (the gateway then needs none)."""
    manifest = manifest_path or ctx.paths.manifest
    api_keys.remove_key(ctx.paths, manifest, name, force=force)
    click.echo(f"removed key {name} from {manifest}", err=True)


COMMANDS = [keys]
