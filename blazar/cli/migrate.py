"""`blazar migrate ollama|llama-swap`: another runtime's models as a manifest to diff and apply.

Thin: `blazar.migrate` reads the other runtime and renders the manifest; this
module writes it (to `-o FILE`, or stdout) and lists what did not map on
stderr (or everything as one JSON object with `--json`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from blazar.cli.format import echo_json

if TYPE_CHECKING:
    from blazar.migrate import Migrated

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
    """Write a manifest from another runtime's models: ollama's store, a llama-swap config.

    \b
    Examples:
      blazar migrate ollama -o ollama.toml && blazar diff ollama.toml && blazar apply ollama.toml
      blazar migrate llama-swap ~/llama-swap/config.yaml -o swap.toml
    """


def _finish(
    migrated: Migrated, command: str, output: Path | None, force: bool, as_json: bool
) -> None:
    from blazar.migrate import render, write

    if output is not None and output.suffix.lower() != ".toml":
        raise click.UsageError(f"-o {output}: the manifest is TOML; name the file *.toml")
    text = render(migrated, command, str(output or "migrated.toml"))
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
    click.echo(f"next: `blazar diff {file}`, then `blazar apply {file}`", err=True)


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


COMMANDS = [migrate]
