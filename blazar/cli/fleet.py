"""Fleet commands: `blazar remotes` (and `remotes drain|undrain NAME`), `blazar render kubernetes`.

`remotes` reads `GET /api/failover` on the running daemon (the remotes, their
health, the models each serves and every model's failover chain) and `drain`
posts to it (an admin key once keys are declared). `render kubernetes` writes
the manifest as Kubernetes documents (`blazar.render.kubernetes`); it needs no
daemon. docs/fleet.md tells the whole story.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.format import echo_json, table
from blazar.cli.serve import URL_OPTION, call, daemon_url


@click.group("remotes", invoke_without_command=True)
@URL_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print /api/failover's answer as JSON.")
@click.pass_context
def remotes(click_ctx: click.Context, url: str | None, as_json: bool) -> None:
    """The daemon's remotes (health, last error, counts) and each model's failover chain."""
    if click_ctx.invoked_subcommand is not None:
        return
    ctx = click_ctx.ensure_object(Context)
    found = call(daemon_url(ctx.paths, url), "/api/failover")
    if as_json:
        echo_json(found)
        return
    click.echo(render_remotes(found))


def render_remotes(found: dict[str, Any]) -> str:
    """The human view of `/api/failover`."""
    rows = [
        [
            r["name"],
            r["url"],
            r["kind"],
            "drained" if r["drained"] else r["health"],
            r["forwarded"],
            r["failed"],
            ", ".join(r["models"]) or "-",
            r["last_error"] or "-",
        ]
        for r in found.get("remotes", [])
    ]
    if not rows:
        return "No remotes: declare [remotes.NAME] in the manifest (docs/fleet.md)."
    lines = [
        table(
            ["REMOTE", "URL", "KIND", "HEALTH", "FORWARDED", "FAILED", "MODELS", "LAST ERROR"],
            rows,
        )
    ]
    chains = found.get("chains", {})
    if chains:
        lines.append("")
        for model, members in chains.items():
            said = " -> ".join(
                f"{m['member']} ({'drained' if m.get('drained') else m.get('health', 'unknown')})"
                for m in members
            )
            lines.append(f"{model}: local -> {said}")
    return "\n".join(lines)


def _drain(ctx: Context, url: str | None, name: str, drained: bool) -> None:
    found = call(daemon_url(ctx.paths, url), "/api/failover", {"member": name, "drained": drained})
    state = "drained" if found["drained"] else "back in service"
    click.echo(f"{name}: {state} ({found['health']})")


@remotes.command("drain")
@click.argument("name")
@URL_OPTION
@pass_context
def drain(ctx: Context, name: str, url: str | None) -> None:
    """Send no request to remote NAME (health probes go on) until `undrain`."""
    _drain(ctx, url, name, True)


@remotes.command("undrain")
@click.argument("name")
@URL_OPTION
@pass_context
def undrain(ctx: Context, name: str, url: str | None) -> None:
    """Put remote NAME back in service."""
    _drain(ctx, url, name, False)


@click.group("render")
def render() -> None:
    """Write the manifest in another system's terms."""


@render.command("kubernetes")
@click.argument("path", type=click.Path(path_type=Path, exists=True))
@click.option("--host", "host", metavar="NAME", help="Merge hosts/NAME's overlay first.")
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Write one file per document in this directory (default: all of them to stdout).",
)
@click.option("--name", default="blazar", show_default=True, help="The objects' name.")
@click.option("--image", default=None, help="The container image (default: blazar:VERSION).")
@click.option("--namespace", default=None, help="metadata.namespace of every object.")
@pass_context
def kubernetes(
    ctx: Context,
    path: Path,
    host: str | None,
    output: Path | None,
    name: str,
    image: str | None,
    namespace: str | None,
) -> None:
    """A Deployment running Blazar, its Service, a PersistentVolumeClaim for the model store,
    the manifest as a ConfigMap and the keys' Secret reference, from PATH (docs/fleet.md)."""
    from blazar.reconcile.apply import load
    from blazar.render.kubernetes import Options, documents, to_yaml

    manifest = load(path, host)
    found = documents(manifest, path, ctx.store, Options(name, image, namespace, host))
    if output is None:
        click.echo(to_yaml(found), nl=False)
        return
    output.mkdir(parents=True, exist_ok=True)
    for doc in found:
        target = output / f"{doc['kind'].lower()}.yaml"
        target.write_text(to_yaml([doc]))
        click.echo(f"wrote {target}")


COMMANDS = [remotes, render]
