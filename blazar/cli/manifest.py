"""Declarative commands: `blazar diff`, `apply`, `status`, `schema`.

`blazar.reconcile.apply` (and with it the manifest's pydantic models) is imported by
the commands that load a manifest, so `blazar status` does not pay for it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.format import echo_json, table
from reconcilers.plan import Action, Change, Plan, render
from reconcilers.ports import Progress

if TYPE_CHECKING:
    from reconcilers.apply import ApplyReport

PATH_ARG = click.argument("path", required=False, type=click.Path(path_type=Path))
HOST_OPTION = click.option(
    "--host",
    "host",
    metavar="NAME",
    help="Merge the manifest directory's hosts/NAME overlay (default: this machine's name, "
    "when it has one).",
)


@click.command("diff")
@PATH_ARG
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option(
    "--detailed-exitcode",
    is_flag=True,
    help="Exit 0 when there are no changes, 1 on error, 2 when there are changes.",
)
@click.option("--prune", is_flag=True, help="Also plan deleting managed resources not declared.")
@HOST_OPTION
@pass_context
def diff(
    ctx: Context,
    path: Path | None,
    as_json: bool,
    detailed_exitcode: bool,
    prune: bool,
    host: str | None,
) -> None:
    """Show what `apply` would change, as terraform shows a plan, and where the host, the
    manifest and its blazar.lock disagree (drift). PATH: the manifest."""
    from blazar.reconcile.apply import load, manifest_drift, manifest_path, reconcile

    where = manifest_path(ctx.paths, path)
    manifest = load(where, host)
    result = reconcile(ctx.store, ctx.paths, manifest, apply=False, prune=prune)
    drift = manifest_drift(ctx.store, where, manifest, host)
    if as_json:
        click.echo(json.dumps({**result.plan.to_json(), "drift": drift}, indent=2, sort_keys=True))
    else:
        click.echo(render(result.plan))
        if drift:
            click.echo(f"\nDrift from blazar.lock ({len(drift)}):")
            for line in drift:
                click.echo(f"  {line}")
            click.echo(
                "`blazar apply` rewrites the lock from what the host holds (commit it); "
                "`apply --locked` refuses a manifest the lock does not cover."
            )
    if detailed_exitcode and (not result.plan.empty or drift):
        sys.exit(2)


def _progress_for(action: Action) -> Progress | None:
    """A download progress line on a terminal; nothing when output is not a terminal."""
    if not sys.stderr.isatty() or action.change not in (Change.CREATE, Change.REPLACE):
        return None
    if action.kind not in ("model", "projector", "lora"):
        return None

    def progress(done: int, total: int | None) -> None:
        if total:
            line = f"  {action.address}: {done / total:6.1%} of {total / 1e6:,.1f} MB"
        else:
            line = f"  {action.address}: {done / 1e6:,.1f} MB"
        click.echo(f"\r{line}", nl=False, err=True)
        if total and done >= total:
            click.echo("", err=True)

    return progress


def _event(phase: str, action: Action, message: str) -> None:
    if phase == "start":
        click.echo(f"{action.address}: {action.change}...")
    elif phase == "retry":
        click.echo(f"{action.address}: {message}")
    elif phase == "done":
        click.echo(f"{action.address}: {action.change} complete")
    else:
        click.echo(f"{action.address}: FAILED: {message}")


def summarize(plan: Plan, report: ApplyReport) -> None:
    counts = {"add": 0, "change": 0, "destroy": 0}
    for outcome in report.outcomes:
        if outcome.ok:
            change = outcome.action.change
            counts["add"] += change in (Change.CREATE, Change.REPLACE)
            counts["change"] += change is Change.UPDATE
            counts["destroy"] += change in (Change.DELETE, Change.REPLACE)
    click.echo(
        f"\nApply {'complete' if report.ok else 'incomplete'}! Resources: {counts['add']} added, "
        f"{counts['change']} changed, {counts['destroy']} destroyed."
    )
    if not report.ok:
        for outcome in report.failed:
            click.echo(f"Error: {outcome.action.address}: {outcome.error}", err=True)
        sys.exit(1)


@click.command("apply")
@PATH_ARG
@click.option("--yes", "-y", is_flag=True, help="Do not ask before deleting anything.")
@click.option("--prune", is_flag=True, help="Delete managed resources the manifest dropped.")
@click.option("--target", "targets", multiple=True, help="Only this resource (repeatable).")
@click.option("--dry-run", is_flag=True, help="Show the plan and stop.")
@click.option(
    "--locked",
    is_flag=True,
    help="Install exactly what blazar.lock says; refuse, changing nothing, a manifest that "
    "resolves differently (CI, fleet hosts).",
)
@HOST_OPTION
@pass_context
def apply(
    ctx: Context,
    path: Path | None,
    yes: bool,
    prune: bool,
    targets: tuple[str, ...],
    dry_run: bool,
    locked: bool,
    host: str | None,
) -> None:
    """Make the host match the manifest, and write blazar.lock next to it (what it resolved
    to; commit it). PATH: the manifest (default: `blazar config path`)."""
    from blazar.reconcile.apply import load, manifest_path, reconcile, update_lock
    from blazar.reconcile.lockfile import lock_path, read_lock

    where = manifest_path(ctx.paths, path)
    manifest = load(where, host)
    lock = None
    if locked:
        lock = read_lock(lock_path(where))
        if lock is None:
            raise click.ClickException(
                f"--locked: there is no {lock_path(where)}; run `blazar apply` once where "
                "changes are made, and commit the lock it writes"
            )

    def confirm(plan: Plan) -> bool:
        deletes = [a for a in plan.actions if a.change in (Change.DELETE, Change.REPLACE)]
        if not deletes or yes:
            return True
        if not sys.stdin.isatty():
            raise click.ClickException(
                f"the plan deletes {len(deletes)} resource(s) and there is no terminal to ask: "
                "review it with `blazar diff`, then pass --yes"
            )
        return click.confirm("Do you want to perform these actions?", default=False)

    result = reconcile(
        ctx.store,
        ctx.paths,
        manifest,
        apply=not dry_run,
        prune=prune,
        targets=targets,
        confirm=confirm,
        show=lambda plan: click.echo(render(plan) + ("\n" if not plan.empty else "")),
        notify=lambda message: click.echo(message, err=True),
        on_event=_event,
        progress_for=_progress_for,
        locked=lock,
    )
    if result.report is None:
        if not result.plan.empty and not dry_run:
            click.echo("Apply cancelled.")
        elif not dry_run and not locked and not targets:
            _lock(update_lock(ctx.store, where, manifest, host))
        return
    if result.report.ok and not locked and not targets:
        _lock(update_lock(ctx.store, where, manifest, host))
    for note in result.notes:  # what only the models just fetched could tell
        click.echo(f"\n  !   {note.address}\n        # ({note.message})")
    summarize(result.plan, result.report)


def _lock(written: Path | None) -> None:
    if written is not None:
        click.echo(f"wrote {written}")


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per condition.")
@pass_context
def status(ctx: Context, as_json: bool) -> None:
    """Each managed resource's conditions, as the last apply left them."""
    conditions = ctx.store.conditions()
    if as_json:
        for c in conditions:
            echo_json(c.__dict__)
        return
    if not conditions:
        click.echo("No status yet: `blazar apply` reconciles the manifest.")
        return
    rows = [
        [f"{c.kind}s.{c.name}", c.type, c.status, c.reason, c.last_transition, c.message]
        for c in conditions
    ]
    click.echo(table(["RESOURCE", "TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"], rows))


@click.command("schema")
def schema() -> None:
    """Print the manifest's JSON Schema (for editors)."""
    from specs.schema import manifest_schema

    click.echo(json.dumps(manifest_schema(), indent=2, sort_keys=True))


COMMANDS = [diff, apply, status, schema]
