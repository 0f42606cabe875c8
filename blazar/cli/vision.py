"""`blazar mmproj MODEL [SOURCE]`: a model's vision projector in your manifest.

With SOURCE it declares `models.MODEL.mmproj` (tomlkit, comments kept) and fetches
the projector now through the flow `blazar lora add` uses
(`manifest_ops.apply_projector`: a failure puts the manifest back); `--remove`
drops the declaration and Blazar's copy; alone it shows what the model has. A
running `blazar serve` restarts the model's instances with `--mmproj`, and images
then reach it on all three protocols (docs/compatibility.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from blazar.cli.context import Context, manifest_option, pass_context
from blazar.cli.format import echo_json, human_bytes
from blazar.cli.manifest import _event, _progress_for
from blazar.errors import InvalidInput, NotFound
from blazar.manifest import ops as manifest_ops
from specs.models import AUTO_PROJECTOR


def projector_source(source: str) -> str:
    """SOURCE as the manifest keeps it: `auto` and URLs as given, a path as file://."""
    if source == AUTO_PROJECTOR or "://" in source:
        return source
    path = Path(os.path.abspath(Path(source).expanduser()))
    if not path.is_file():
        raise InvalidInput(
            f"no such file: {path}; SOURCE is an mmproj .gguf path, file:///abs/mmproj.gguf, "
            "hf://owner/repo/mmproj-file.gguf, https://host/mmproj.gguf (with --sha256) or "
            '"auto" (the mmproj file in the model\'s own Hugging Face repo)'
        )
    return path.as_uri()


@click.command("mmproj")
@click.argument("model")
@click.argument("source", required=False)
@click.option("--sha256", default=None, help="Expected sha256 (required for https:// sources).")
@click.option("--remove", is_flag=True, help="Drop the model's projector and Blazar's copy.")
@click.option("--json", "as_json", is_flag=True, help="Print the model's projector as JSON.")
@manifest_option
@pass_context
def mmproj(
    ctx: Context,
    model: str,
    source: str | None,
    sha256: str | None,
    remove: bool,
    as_json: bool,
    manifest_path: Path | None,
) -> None:
    """Give MODEL a vision projector (an mmproj GGUF), so it reads images.

    SOURCE: an mmproj .gguf path, file:///abs/mmproj.gguf,
    hf://owner/repo/mmproj-file.gguf, hf://owner/repo (its only mmproj file, or
    its F16 one), https://host/mmproj.gguf with --sha256, or "auto": the mmproj
    file in MODEL's own Hugging Face repo. It is fetched and verified now, and
    checked to be a projector made for MODEL. Without SOURCE, show MODEL's
    projector.

    \b
    Examples:
      blazar mmproj gemma3-4b auto
      blazar mmproj tiny ./mmproj-tiny.gguf
      blazar mmproj gemma3-4b --remove
    """
    manifest = manifest_path or ctx.paths.manifest
    if source is not None or remove:
        if source is not None and remove:
            raise InvalidInput("give SOURCE or --remove, not both")
        declared = None if remove else projector_source(source or "")
        manifest_ops.apply_projector(
            ctx.paths,
            manifest,
            model,
            declared,
            sha256,
            notify=lambda m: click.echo(m, err=True),
            on_event=_event,
            progress_for=_progress_for,
        )
        if declared is None:
            click.echo(f"removed the projector of {model} (declared in {manifest})")
        else:
            click.echo(f"{model} reads images now, with the projector from {declared}")
        return
    row = projector_row(ctx, manifest, model)
    if as_json:
        echo_json(row)
        return
    if row["declared"] is None and row["path"] is None:
        click.echo(f"{model} has no projector: `blazar mmproj {model} SOURCE` gives it one.")
        return
    click.echo(f"{model}: projector {row['declared'] or '(not declared)'}")
    if row["path"] is not None:
        click.echo(f"  file     {row['path']} ({human_bytes(row['size'])})")
        click.echo(f"  sha256   {row['sha256']}")
        click.echo(f"  type     {row['projector_type'] or 'unknown'}")
    else:
        click.echo("  not fetched yet: run `blazar apply`")


def projector_row(ctx: Context, manifest_path: Path, model: str) -> dict[str, Any]:
    """What the manifest declares and the store holds of MODEL's projector."""
    from blazar.reconcile.apply import load_or_empty
    from specs.names import parse_name

    manifest = load_or_empty(manifest_path)
    key = manifest.resolve_model(model)
    short = parse_name(key or model).short
    if key is None and ctx.store.find_model(parse_name(model)) is None:
        raise NotFound(f"model '{model}' is neither declared nor held: `blazar list` shows them")
    held = ctx.store.find_projector(short)
    return {
        "model": short,
        "declared": manifest.models[key].mmproj if key is not None else None,
        "path": held.path if held else None,
        "size": held.size if held else None,
        "sha256": held.sha256 if held else None,
        "source": held.source if held else None,
        "projector_type": held.facts.get("projector_type") if held else None,
    }


COMMANDS = [mmproj]
