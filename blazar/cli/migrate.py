"""`blazar migrate ollama|llama-swap|config`: another runtime's models, or the user guide's
flat config.toml, as a manifest to diff and apply.

Thin: `blazar.migrate` reads the other runtime and renders the manifest; this
module writes it (to `-o FILE`, or stdout) and lists what did not map on
stderr (or everything as one JSON object with `--json`). `migrate config --merge`
writes the settings into the user's manifest instead (`ManifestFile.merge`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.format import echo_json

if TYPE_CHECKING:
    from blazar.migrate import Migrated
    from blazar.migrate.flat_config import FlatConfig

OUTPUT = click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the manifest to FILE (default: print it).",
)
FORCE = click.option("--force", is_flag=True, help="Replace FILE if it exists.")
AS_JSON = click.option(
    "--json", "as_json", is_flag=True, help="Print the manifest and what did not map as JSON."
)


@click.group("migrate")
def migrate() -> None:
    """Write a manifest from another runtime's models (ollama's store, a llama-swap config)
    or from the user guide's flat config.toml.

    \b
    Examples:
      blazar migrate ollama -o ollama.toml && blazar diff ollama.toml && blazar apply ollama.toml
      blazar migrate llama-swap ~/llama-swap/config.yaml -o swap.toml
      blazar migrate config --merge
    """


def _finish(
    migrated: Migrated,
    command: str,
    output: Path | None,
    force: bool,
    as_json: bool,
    *,
    as_given: bool = False,
    then: str | None = None,
) -> None:
    from blazar.migrate import render, write

    if output is not None and output.suffix.lower() != ".toml":
        raise click.UsageError(f"-o {output}: the manifest is TOML; name the file *.toml")
    text = render(migrated, command, str(output or "migrated.toml"), as_given=as_given)
    if output is not None:
        write(output, text, force=force)
    if as_json:
        echo_json({"manifest": text, "path": str(output) if output else None, **migrated.to_json()})
        return
    if output is None:
        click.echo(text, nl=False)
    models = len(migrated.resources.get("models", {}))
    where = f"wrote {output}" if output else "the manifest above"
    click.echo(
        f"{where}: {models} models, {len(migrated.unmapped)} settings not mapped "
        "(listed in its header)",
        err=True,
    )
    for item in migrated.unmapped:
        click.echo(f"  not mapped: {item.line()}", err=True)
    file = output or "FILE"
    click.echo(then or f"next: `blazar diff {file}`, then `blazar apply {file}`", err=True)


@migrate.command("ollama")
@click.option(
    "--store",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="ollama's models directory (default: $OLLAMA_MODELS, else ~/.ollama/models).",
)
@OUTPUT
@FORCE
@AS_JSON
def ollama(store: Path | None, output: Path | None, force: bool, as_json: bool) -> None:
    """Every model of a local ollama store as manifest entries.

    Each model is declared from ollama's own blob (`ollama://name:tag` with its
    sha256): applying hardlinks the blob into Blazar's store, never copying,
    moving or changing it. PARAMETER num_ctx becomes ctx, the sampling
    parameters `params`, SYSTEM `system`, ADAPTER an always-on LoRA adapter;
    TEMPLATE (a Go template), projectors, MESSAGE and LICENSE are listed as not
    mapped.

    \b
    Example:
      blazar migrate ollama -o ollama.toml
      blazar diff ollama.toml && blazar apply ollama.toml
    """
    from blazar.migrate.ollama import migrate_store

    migrated = migrate_store(os.environ, store)
    _finish(migrated, "blazar migrate ollama", output, force, as_json)


@migrate.command("llama-swap")
@click.argument("config", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@OUTPUT
@FORCE
@AS_JSON
def llama_swap(config: Path, output: Path | None, force: bool, as_json: bool) -> None:
    """A llama-swap config.yaml's models as manifest entries.

    Mapped: each model whose cmd runs llama-server (-m/-hf, ctx, slots, sampling,
    cache, flash attention, embeddings and loading flags as fields; --lora as
    always-on adapters; other llama-server flags as args), ttl as keep_alive,
    aliases, globalTTL, preload (replicas = 1), apiKeys (their sha256), peers
    (remotes) and groups (max_loaded_models, pins). What does not map is listed,
    with why.

    \b
    Example:
      blazar migrate llama-swap config.yaml -o swap.toml
      blazar diff swap.toml && blazar apply swap.toml
    """
    from blazar.migrate.llama_swap import migrate_config

    migrated = migrate_config(config, os.environ)
    _finish(migrated, f"blazar migrate llama-swap {config}", output, force, as_json)


@migrate.command("config")
@click.argument("path", required=False, type=click.Path(path_type=Path, dir_okay=False))
@OUTPUT
@click.option(
    "--merge",
    is_flag=True,
    help="Write the settings into your manifest (validated whole, comments kept) instead.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace FILE if it exists; with --merge, let the file's values win where your "
    "manifest sets another.",
)
@AS_JSON
@pass_context
def flat_config(
    ctx: Context, path: Path | None, output: Path | None, merge: bool, force: bool, as_json: bool
) -> None:
    """The user guide's flat config.toml (PATH, default ~/.config/blazar/config.toml) as
    manifest content. Blazar does not read that file; this carries its settings over.

    Each of the guide's names becomes its manifest key, as `blazar config set` reads
    them (port -> serving.port, slots -> serving.default_slots,
    model_overrides.NAME.pin -> models.NAME.pin; docs/manifest.md has the table);
    [[keys]] and [[remotes]] entries become [keys.NAME] and [remotes.NAME] (a key
    written in the file is kept as its sha256 only). What does not map is listed,
    with why.

    \b
    Examples:
      blazar migrate config -o settings.toml && blazar diff settings.toml
      blazar migrate config --merge          # into your manifest, then remove the file
    """
    from blazar.migrate.flat_config import as_migrated, for_manifest, read_flat_config
    from blazar.reconcile.apply import load_or_empty

    source = path or ctx.paths.flat_config
    if merge and output is not None:
        raise click.UsageError("--merge writes into your manifest: give -o FILE or --merge")
    manifest_path = ctx.paths.manifest
    flat = for_manifest(read_flat_config(source), load_or_empty(manifest_path))
    if merge:
        _merge(flat, manifest_path, force, as_json)
        return
    then = (
        "next: check it (`blazar diff FILE` shows what it declares); `blazar migrate config "
        "--merge` writes these settings into your manifest, which is what `blazar serve` reads"
    )
    migrated = as_migrated(flat, load_or_empty(manifest_path))
    command = f"blazar migrate config {source}"
    _finish(migrated, command, output, force, as_json, as_given=True, then=then)


def _merge(flat: FlatConfig, manifest_path: Path, force: bool, as_json: bool) -> None:
    """Write the settings into the user's manifest, one validated edit: a key the manifest
    sets to another value is refused (nothing written) unless `force`."""
    from blazar.errors import Conflict, InvalidManifest
    from blazar.manifest.edit import ManifestError, ManifestFile
    from specs.problems import format_path

    edit = ManifestFile(manifest_path)
    conflicts = edit.merge(flat.settings.items(), force=force)
    if conflicts and not force:
        raise Conflict(
            f"not written: {manifest_path} sets {len(conflicts)} of these keys to other "
            "values:\n  " + "\n  ".join(conflicts) + "\n--force lets the file's values win; "
            "or change them with `blazar config set`"
        )
    try:
        edit.save()
    except ManifestError as exc:
        raise InvalidManifest(
            f"not written: {flat.origin}'s settings would make the manifest invalid:\n{exc}"
        ) from None
    keys = [format_path(parts) for parts in flat.settings]
    if as_json:
        echo_json(
            {
                "path": str(manifest_path),
                "written": keys,
                "replaced": conflicts,
                "unmapped": [asdict(u) for u in flat.unmapped],
                "notes": flat.notes,
            }
        )
        return
    for parts, value in flat.settings.items():
        click.echo(f"{format_path(parts)} = {json.dumps(value, default=str)}")
    click.echo(
        f"merged {len(keys)} settings of {flat.origin} into {manifest_path}"
        + (f" ({len(conflicts)} replaced)" if conflicts else ""),
        err=True,
    )
    for item in flat.unmapped:
        click.echo(f"  not mapped: {item.line()}", err=True)
    click.echo("then remove the flat file: Blazar does not read it", err=True)


COMMANDS = [migrate]
