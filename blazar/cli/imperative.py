"""Imperative commands that edit the manifest, then reconcile just what they touched.

`blazar pull SOURCE` declares a model and applies it; `blazar rm NAME` drops a
model's declaration (if any) and what Blazar holds of it. A pull that fails
puts the manifest back as it was: nothing is half-applied.
"""

from __future__ import annotations

import re

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.manifest import _event, _progress_for
from blazar.errors import BlazarError, InvalidInput, NotFound
from blazar.manifest_edit import ManifestError, ManifestFile
from blazar.reconcile import InvalidManifest, reconcile
from specs.loader import load_manifest_text
from specs.names import parse_name
from specs.sources import (
    FileSource,
    HFSource,
    OllamaSource,
    PyPISource,
    RegistrySource,
    Source,
    parse_source,
)


def default_name(source: Source) -> str:
    """A model name from its source, as ollama would name it."""
    if isinstance(source, RegistrySource):
        return source.name
    if isinstance(source, PyPISource):
        return _clean(source.package.lower().removesuffix("-gguf"))
    if isinstance(source, OllamaSource):
        name = source.name.rsplit("/", 1)[-1]
        return f"{name}:{source.tag}" if source.tag != "latest" else name
    if isinstance(source, HFSource):
        name = source.repo.rsplit("/", 1)[-1].lower().removesuffix("-gguf")
        tag = source.quant or (source.filename or "").rsplit("/", 1)[-1].removesuffix(".gguf")
        return _clean(name) + (f":{_clean(tag.lower())}" if tag else "")
    path = source.path if isinstance(source, FileSource) else source.url
    stem = path.rstrip("/").rsplit("/", 1)[-1].removesuffix(".gguf")
    return _clean(stem.lower())


def _clean(text: str) -> str:
    cleaned = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return cleaned or "model"


@click.command("pull")
@click.argument("source")
@click.option("--name", default=None, help="Model name (default: derived from the source).")
@click.option("--sha256", default=None, help="Expected sha256 (required for https:// sources).")
@pass_context
def pull(ctx: Context, source: str, name: str | None, sha256: str | None) -> None:
    """Declare a model in your manifest and fetch it now.

    SOURCE: hf://owner/repo:QUANT, hf://owner/repo/file.gguf, https://.../x.gguf,
    ollama://name:tag, file:///path.gguf, or a short name such as qwen3-0.6b.
    """
    try:
        parsed = parse_source(source)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    model = parse_name(name or default_name(parsed)).short
    manifest = ManifestFile(ctx.paths.manifest)
    fields: dict[str, str] = {"source": source}
    if sha256:
        fields["sha256"] = sha256
    manifest.remove_resource("models", model)
    manifest.add_resource("models", model, fields)
    try:
        manifest.save()
    except ManifestError as exc:
        raise InvalidManifest(f"not pulled: {exc}") from None
    try:
        loaded = load_manifest_text(manifest.text(), str(ctx.paths.manifest))
        result = reconcile(
            ctx.store, ctx.paths, loaded, apply=True, targets=[model],
            notify=lambda m: click.echo(m, err=True), on_event=_event, progress_for=_progress_for,
        )  # fmt: skip
    except BaseException:
        manifest.restore()
        raise
    if result.report is not None and not result.report.ok:
        manifest.restore()
        errors = "; ".join(o.error or "" for o in result.report.failed)
        raise BlazarError(f"pull of {model} failed, the manifest is unchanged: {errors}")
    if result.report is None:
        click.echo(f"{model} is up to date")
    click.echo(f"pulled {model} (declared in {ctx.paths.manifest})")


@click.command("rm")
@click.argument("name")
@pass_context
def rm(ctx: Context, name: str) -> None:
    """Remove a model: its declaration in your manifest, its record, and Blazar's own
    link or copy; never your original file."""
    ref = parse_name(name)
    manifest = ManifestFile(ctx.paths.manifest)
    declared = manifest.declares("models", ref.short)
    held = ctx.store.find_model(ref)
    if not declared and held is None:
        raise NotFound(
            f"model '{ref.short}' is neither declared nor in the store: `blazar list` shows models"
        )
    if declared:
        manifest.remove_resource("models", ref.short)
        try:
            manifest.save()
        except ManifestError as exc:
            raise InvalidManifest(
                f"not removed: {ref.short} is still referenced in the manifest:\n{exc}"
            ) from None
    if held is not None:
        ctx.registry.remove(ref)
        ctx.store.delete_conditions("model", ref.short)
    kept = " (your file was left in place)" if held and held.held == "reference" else ""
    where = " and its declaration" if declared else ""
    click.echo(f"removed {ref.short}{where}{kept}")


COMMANDS = [pull, rm]
