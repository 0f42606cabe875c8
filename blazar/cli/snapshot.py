"""`blazar snapshot create|restore|list`: this host's Blazar state as one verified archive.

Thin: `blazar.snapshots` writes, lists, checks and restores archives; this module
only prints. What a snapshot holds and what restore guarantees is in that
package's docstring and docs/store.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.format import echo_json, human_bytes, table


def _counts(counts: dict[str, int]) -> str:
    shown = ("models", "loras", "keys", "sessions", "traces")
    return ", ".join(f"{counts.get(k, 0)} {k}" for k in shown)


@click.group("snapshot")
def snapshot() -> None:
    """Back up and restore Blazar's state: manifest, lock, key hashes and the store.

    \b
    Examples:
      blazar snapshot create                    # into the snapshots directory
      blazar snapshot create /backups --with-models
      blazar snapshot list
      blazar snapshot restore /backups/blazar-20261201T120000Z.tar.gz
    """


@snapshot.command("create")
@click.argument("path", type=click.Path(path_type=Path), required=False)
@click.option("--with-models", is_flag=True, help="Include the model and adapter files too.")
@click.option("--force", is_flag=True, help="Replace an archive already at PATH.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
@pass_context
def create(ctx: Context, path: Path | None, with_models: bool, force: bool, as_json: bool) -> None:
    """Write a snapshot to PATH (a file, or a directory; default: the snapshots directory).

    It holds every file of the config directory (the manifest, blazar.lock), the
    store (model, adapter, key-hash, session and engine records, conditions,
    events, traces; copied consistently even while `blazar serve` runs) and, with
    --with-models, the model files Blazar holds. A sha256 of every member is
    listed inside.

    \b
    Example:
      blazar snapshot create ~/backups/ --with-models
    """
    from blazar.snapshots import create as write

    created = write(
        ctx.paths,
        path,
        with_models=with_models,
        force=force,
        notify=lambda m: click.echo(m, err=True),
    )
    if as_json:
        echo_json({"path": str(created.path), "size": created.size, **created.listing.to_json()})
        return
    files = len(created.listing.files)
    click.echo(
        f"wrote {created.path} ({human_bytes(created.size)}, {files} files: "
        f"{_counts(created.listing.counts)})"
    )


@snapshot.command("restore")
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--force", is_flag=True, help="Replace a manifest or store that holds something (kept first)."
)
@click.option("--json", "as_json", is_flag=True, help="Print what was restored as JSON.")
@pass_context
def restore(ctx: Context, path: Path, force: bool, as_json: bool) -> None:
    """Restore the snapshot at PATH onto this host.

    Every member is checked against the sha256 listed inside before anything
    changes; a damaged archive is refused whole. It never overwrites a manifest
    or a store that holds records without --force, and then first takes a
    snapshot of what it replaces. Stop `blazar serve` first. Records whose files
    are not on this host are dropped: `blazar apply` fetches them again.

    \b
    Example:
      blazar snapshot restore ~/backups/blazar-20261201T120000Z.tar.gz --force
    """
    from blazar.snapshots import restore as put_back

    done = put_back(ctx.paths, path, force=force, notify=lambda m: click.echo(m, err=True))
    if as_json:
        echo_json(
            {
                "path": str(path),
                "config_files": done.config_files,
                "blobs": done.blobs,
                "dropped": done.dropped,
                "kept": done.kept,
                "before": str(done.before) if done.before else None,
                "listing": done.listing.to_json(),
            }
        )
        return
    listing = done.listing
    click.echo(
        f"restored {path} (taken {listing.created} on {listing.host} by Blazar {listing.blazar}):"
        f" {len(done.config_files)} config files, the store ({_counts(listing.counts)})"
        + (f", {done.blobs} model files" if listing.with_models else "")
    )
    for table_name, names in sorted(done.dropped.items()):
        click.echo(
            f"dropped {len(names)} {table_name} records whose files are not on this host: "
            f"{', '.join(names)}"
        )
    if done.dropped:
        click.echo("run `blazar apply` to fetch what the manifest declares again")
    for kept in done.kept:
        click.echo(f"left {kept} in place (it is not in the snapshot)")


@snapshot.command("list")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines: one object a snapshot.")
@pass_context
def list_(ctx: Context, as_json: bool) -> None:
    """The snapshots in Blazar's snapshots directory, newest first.

    \b
    Example:
      blazar snapshot list --json
    """
    from blazar.snapshots import list_snapshots, snapshots_dir

    found = list_snapshots(ctx.paths)
    if as_json:
        for path, listing, problem in found:
            row: dict[str, Any] = {"path": str(path), "size": path.stat().st_size}
            row.update(listing.to_json() if listing else {"problem": problem})
            echo_json(row)
        return
    if not found:
        click.echo(f"no snapshots in {snapshots_dir(ctx.paths)}: `blazar snapshot create`")
        return
    rows = [
        (
            path.name,
            listing.created if listing else "-",
            human_bytes(path.stat().st_size),
            ("yes" if listing.with_models else "no") if listing else "-",
            _counts(listing.counts) if listing else f"unreadable: {problem}",
        )
        for path, listing, problem in found
    ]
    click.echo(table(["NAME", "CREATED", "SIZE", "MODELS", "HOLDS"], rows))


COMMANDS = [snapshot]
