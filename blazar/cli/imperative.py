"""Imperative commands that edit the manifest, then reconcile just what they touched.

`blazar pull SOURCE` declares a model and applies it; `blazar rm NAME` drops a
model's declaration (if any) and what Blazar holds of it; `blazar create`
declares a model derived from another (`blazar.manifest.derive`, with ollama's Modelfile
read by `blazar.manifest.modelfile`); `blazar cp` gives a model another name (an
alias). Both are thin: the
declare -> targeted reconcile -> restore-on-failure flow is `blazar.manifest.ops`,
which the gateway's `/api/pull` and `/api/delete` share. A pull that fails puts
the manifest back as it was: nothing is half-applied.
"""

from __future__ import annotations

from pathlib import Path

import click

from blazar.cli.context import Context, manifest_option, pass_context
from blazar.cli.manifest import _event, _progress_for
from blazar.manifest import ops as manifest_ops


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
        ctx.paths,
        manifest,
        model,
        fields,
        notify=lambda m: click.echo(m, err=True),
        on_event=_event,
        progress_for=_progress_for,
    )
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
    removed = manifest_ops.remove_model(
        ctx.paths,
        manifest_path or ctx.paths.manifest,
        name,
        notify=lambda m: click.echo(m, err=True),
    )
    if removed.alias_of is not None:
        click.echo(f"removed alias {removed.name} of {removed.alias_of}")
        return
    kept = " (your file was left in place)" if removed.held == "reference" else ""
    where = " and its declaration" if removed.declared else ""
    click.echo(f"removed {removed.name}{where}{kept}")


@click.command("create")
@click.argument("name")
@click.option("--from", "base", default=None, help="The model (or GGUF file) to start from.")
@click.option(
    "--modelfile",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="An ollama Modelfile: FROM, PARAMETER, SYSTEM, ADAPTER (TEMPLATE with --chat-template).",
)
@click.option("--chat-template", default=None, help="A template Blazar ships, Jinja, or a file.")
@click.option("--system", default=None, help="A system prompt for requests that send none.")
@click.option("--param", "params", multiple=True, metavar="K=V", help="A sampling default.")
@click.option("--force", is_flag=True, help="Replace a model already declared with NAME.")
@pass_context
def create(
    ctx: Context,
    name: str,
    base: str | None,
    modelfile: Path | None,
    chat_template: str | None,
    system: str | None,
    params: tuple[str, ...],
    force: bool,
) -> None:
    """Declare model NAME derived from another, as `ollama create` does, and apply it.

    It starts from MODEL's declaration (or a GGUF file) and changes what is given:
    --param k=v (ollama's PARAMETER names; num_ctx sets the context), --system,
    --chat-template. Flags win over the Modelfile. Bytes Blazar holds already are
    linked, not fetched again.
    """
    from blazar.manifest.derive import Derived, create_model
    from blazar.manifest.modelfile import Modelfile, add_param, param_value, parse_modelfile

    read = parse_modelfile(modelfile.read_text(), modelfile) if modelfile else Modelfile()
    if read.template is not None and chat_template is None:
        raise click.ClickException(
            f"{modelfile}:{read.template}: TEMPLATE is a Go template, and Blazar applies "
            "Jinja chat templates: pass --chat-template (a template Blazar ships such as "
            "chatml, Jinja text or a .jinja file) to replace it"
        )
    for item in params:
        key, equals, value = item.partition("=")
        if not equals:
            raise click.UsageError(f"--param {item!r}: write KEY=VALUE, e.g. temperature=0.2")
        key = key.strip().lower()
        add_param(read, key, param_value(key, value, f"--param {key}"))
    origin = base or read.base
    if origin is None:
        raise click.UsageError("give --from MODEL, or a --modelfile with a FROM line")
    from_file = read.base_file if base is None else base.endswith(".gguf")
    if base is not None and from_file:
        origin = str(Path(base).expanduser().resolve())
    derived = Derived(
        chat_template=chat_template,
        system=system if system is not None else read.system,
        params=read.params or None,
        ctx=read.ctx,
        adapters=tuple(read.adapters),
    )
    adapters = create_model(
        ctx.paths,
        ctx.paths.manifest,
        name,
        origin,
        derived,
        base_file=from_file,
        force=force,
        notify=lambda m: click.echo(m, err=True),
    )
    extra = f", with always-on adapters {', '.join(adapters)}" if adapters else ""
    click.echo(f"created {name} from {origin}{extra} (declared in {ctx.paths.manifest})")


@click.command("cp")
@click.argument("source")
@click.argument("destination")
@pass_context
def cp(ctx: Context, source: str, destination: str) -> None:
    """Give model SOURCE another name, DESTINATION (an alias in your manifest).

    Both names then serve the same model; `blazar rm DESTINATION` drops the alias.
    """
    manifest_ops.add_alias(ctx.paths.manifest, source, destination)
    click.echo(f"copied {source} to {destination} (an alias of it in {ctx.paths.manifest})")


COMMANDS = [pull, rm, create, cp]
