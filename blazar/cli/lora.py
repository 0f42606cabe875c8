"""`blazar lora add|list|rm`: LoRA adapters in your manifest, reconciled at once.

`add` declares `[loras.NAME]` (tomlkit, comments kept) and fetches the adapter
through the flow `blazar pull` uses (`manifest_ops.apply_lora`: a failure puts
the manifest back); `rm` drops the declaration and Blazar's copy
(`manifest_ops.remove_lora`); `list` shows what is declared and held. A running
`blazar serve` picks each change up from the manifest: requests then name
`MODEL+NAME` to turn an adapter on for themselves (docs/serve.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.format import echo_json, human_bytes, table
from blazar.cli.manifest import _event, _progress_for
from blazar.errors import InvalidInput
from blazar.manifest import ops as manifest_ops
from specs.sources import InvalidSource, default_name, parse_source


@click.group("lora")
def lora() -> None:
    """LoRA adapters: add one to a model, list them, remove one.

    A request for MODEL+NAME turns adapter NAME on for that request only
    (MODEL+NAME:0.5 at another scale, MODEL+none with every adapter off).
    """


def adapter_source(source: str) -> str:
    """A source as the manifest keeps it: a plain path becomes a file:// URI."""
    if "://" in source:
        return source
    path = Path(os.path.abspath(Path(source).expanduser()))
    if not path.is_file():
        raise InvalidInput(
            f"no such file: {path}; SOURCE is a .gguf path, file:///abs/path.gguf, "
            "hf://owner/repo/file.gguf or https://host/file.gguf (with --sha256)"
        )
    return path.as_uri()


def adapter_name(source: str) -> str:
    """The adapter's default name: its file (or repo) name, as a model's would be, untagged."""
    try:
        return default_name(parse_source(source)).split(":", 1)[0]
    except InvalidSource as exc:
        raise InvalidInput(str(exc)) from None


@lora.command("add")
@click.argument("model")
@click.argument("source")
@click.option("--name", default=None, help="Adapter name (default: from the file name).")
@click.option("--scale", type=float, default=None, help="Scale it is applied at (default 1.0).")
@click.option(
    "--always-on", is_flag=True, help="Apply it to every request (MODEL+none turns it off)."
)
@click.option("--sha256", default=None, help="Expected sha256 (required for https:// sources).")
@pass_context
def add(
    ctx: Context,
    model: str,
    source: str,
    name: str | None,
    scale: float | None,
    always_on: bool,
    sha256: str | None,
) -> None:
    """Declare a LoRA adapter for MODEL in your manifest and fetch it now.

    SOURCE: a .gguf path, file:///path.gguf, hf://owner/repo/file.gguf, or
    https://host/file.gguf with --sha256.
    """
    source = adapter_source(source)
    name = name or adapter_name(source)
    fields: dict[str, Any] = {"model": model, "source": source}
    if sha256:
        fields["sha256"] = sha256
    if scale is not None:
        fields["scale"] = scale
    if always_on:
        fields["always_on"] = True
    manifest_ops.apply_lora(
        ctx.paths,
        ctx.paths.manifest,
        name,
        fields,
        notify=lambda m: click.echo(m, err=True),
        on_event=_event,
        progress_for=_progress_for,
    )
    how = "on for every request" if always_on else f"request it as {model}+{name}"
    click.echo(f"added adapter {name} for {model} (declared in {ctx.paths.manifest}); {how}")


@lora.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per adapter (JSON Lines).")
@pass_context
def list_(ctx: Context, as_json: bool) -> None:
    """List the adapters declared in your manifest and held in the store."""
    rows = adapter_rows(ctx)
    if as_json:
        for row in rows:
            echo_json(row)
        return
    if not rows:
        click.echo("No LoRA adapters yet: `blazar lora add MODEL SOURCE` adds one.")
        return
    click.echo(
        table(
            ["NAME", "MODEL", "SCALE", "ALWAYS ON", "REQUEST AS", "SIZE", "STATE"],
            [
                [
                    r["name"],
                    r["model"],
                    f"{r['scale']:g}",
                    "yes" if r["always_on"] else "no",
                    r["request_as"],
                    human_bytes(r["size"]) if r["size"] is not None else None,
                    _state(r),
                ]
                for r in rows
            ],
        )
    )


def _state(row: dict[str, Any]) -> str:
    if row["declared"] and row["held"]:
        return "ready"
    return "declared, not fetched (`blazar apply`)" if row["declared"] else "held, not declared"


def adapter_rows(ctx: Context) -> list[dict[str, Any]]:
    """Each adapter the manifest declares or the store holds, merged by name."""
    from blazar.reconcile.apply import load_or_empty

    manifest = load_or_empty(ctx.paths.manifest)
    held = {r.name: r for r in ctx.store.list_loras()}
    rows = []
    for name in sorted({*manifest.loras, *held}):
        spec, record = manifest.loras.get(name), held.get(name)
        if spec is not None:
            model = manifest.resolve_model(spec.model) or spec.model
            scale, always_on, source = spec.scale, spec.always_on, spec.source
        else:
            assert record is not None
            model, source = record.model, record.source
            scale = float(record.settings.get("scale", 1.0))
            always_on = bool(record.settings.get("always_on", False))
        rows.append(
            {
                "name": name,
                "model": model,
                "scale": scale,
                "always_on": always_on,
                "request_as": f"{model}+{name}",
                "declared": spec is not None,
                "held": record is not None,
                "source": source,
                "path": record.path if record else None,
                "size": record.size if record else None,
                "sha256": record.sha256 if record else None,
            }
        )
    return rows


@lora.command("rm")
@click.argument("name")
@pass_context
def rm(ctx: Context, name: str) -> None:
    """Remove adapter NAME: its declaration and Blazar's copy (never your file).

    A running `blazar serve` restarts the model without it; requests already
    using it finish first, on the instances that still have it loaded.
    """
    removed = manifest_ops.remove_lora(
        ctx.paths, ctx.paths.manifest, name, notify=lambda m: click.echo(m, err=True)
    )
    where = " and its declaration" if removed.declared else ""
    click.echo(f"removed adapter {removed.name}{where}")


COMMANDS = [lora]
