"""Imperative commands that edit the manifest, then reconcile just what they touched.

`blazar pull SOURCE` declares a model and applies it; `blazar rm NAME` drops a
model's declaration (if any) and what Blazar holds of it. Both are thin: the
declare -> targeted reconcile -> restore-on-failure flow is `blazar.manifest_ops`,
which the gateway's `/api/pull` and `/api/delete` share. A pull that fails puts
the manifest back as it was: nothing is half-applied.
"""

from __future__ import annotations

from pathlib import Path

import click

from blazar import manifest_ops
from blazar.cli.context import Context, manifest_option, pass_context
from blazar.cli.manifest import _event, _progress_for


@click.command("pull")
@click.argument("source")
@click.option("--name", default=None, help="Model name (default: derived from the source).")
@click.option("--sha256", default=None, help="Expected sha256 (required for https:// sources).")
@manifest_option
@pass_context
def pull(
    ctx: Context, source: str, name: str | None, sha256: str | None, manifest_path: Path | None
) -> None:
    """Declare a model in your manifest and fetch it now.

    SOURCE: hf://owner/repo:QUANT, hf://owner/repo/file.gguf, https://.../x.gguf,
    ollama://name:tag, file:///path.gguf, or a short name such as qwen3-0.6b.
    """
    manifest = manifest_path or ctx.paths.manifest
    model, fields = manifest_ops.source_declaration(source, name, sha256)
    result = manifest_ops.apply_model(
        ctx.paths, manifest, model, fields,
        notify=lambda m: click.echo(m, err=True), on_event=_event, progress_for=_progress_for,
    )  # fmt: skip
    if result.report is None:
        click.echo(f"{model} is up to date")
    click.echo(f"pulled {model} (declared in {manifest})")


@click.command("rm")
@click.argument("name")
@manifest_option
@pass_context
def rm(ctx: Context, name: str, manifest_path: Path | None) -> None:
    """Remove a model: its declaration in your manifest, its record, and Blazar's own
    link or copy; never your original file."""
    removed = manifest_ops.remove_model(ctx.paths, manifest_path or ctx.paths.manifest, name)
    if removed.alias_of is not None:
        click.echo(f"removed alias {removed.name} of {removed.alias_of}")
        return
    kept = " (your file was left in place)" if removed.held == "reference" else ""
    where = " and its declaration" if removed.declared else ""
    click.echo(f"removed {removed.name}{where}{kept}")


COMMANDS = [pull, rm]
