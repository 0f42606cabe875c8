"""Fork-lane commands: `blazar engine offers` and `blazar engine install --lane ID`, and the
lane table `engine list` prints. `blazar.cli.engines` adds them to the `engine` group."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.format import echo_json, table

if TYPE_CHECKING:
    from blazar.engines.service import Engines

CATALOG_OPTION = click.option(
    "--catalog",
    default=None,
    help="Catalog path or URL (default: $BLAZAR_ENGINE_CATALOG, the manifest's engines.catalog, "
    "else the one shipped with Blazar).",
)


def manifest_routing(ctx: Context) -> tuple[str | None, int]:
    """(engines.catalog, engine_routing.fork_retire_days) of the user's manifest, if valid."""
    from specs.loader import ManifestError, load_manifest

    if not ctx.paths.manifest.exists():
        return None, 14
    try:
        manifest = load_manifest(ctx.paths.manifest)
    except ManifestError:
        return None, 14
    return manifest.engine_catalog, manifest.engine_routing.fork_retire_days


def catalog_location(ctx: Context, given: str | None) -> str | None:
    """The catalog to read: the flag, then the environment (read by `load_catalog`), then
    the manifest."""
    import os

    if given or os.environ.get("BLAZAR_ENGINE_CATALOG"):
        return given
    return manifest_routing(ctx)[0]


@click.command("offers")
@CATALOG_OPTION
@click.option("--json", "as_json", is_flag=True, help="One JSON object per offer (JSON Lines).")
@pass_context
def offers(ctx: Context, catalog: str | None, as_json: bool) -> None:
    """List the catalog's curated fork lanes, each pinned to one commit, and refused entries.

    Each offer: its id, the GGUF architectures it adds, the commit and digest it is
    pinned to, the backends it builds for and how long a build takes. Example:

        blazar engine offers --json
    """
    from blazar.engines.service import Engines

    svc = Engines(ctx.store, ctx.paths)
    found = svc.catalog(catalog_location(ctx, catalog))
    installed = {lane.lane for lane in svc.lanes.all() if svc.records.active(lane.lane)}
    if as_json:
        for offer in found.offers.values():
            echo_json({**offer.to_json(), "installed": offer.id in installed, "refused": None})
        for offer_id, why in found.refused.items():
            echo_json({"id": offer_id, "refused": why})
        return
    if found.note:
        click.echo(f"note: {found.note}", err=True)
    if not found.offers and not found.refused:
        click.echo(f"No offers in the catalog ({found.source}).")
        return
    rows = [
        [
            o.id,
            ", ".join(o.architectures),
            o.short,
            o.digest.split()[0],
            "/".join(o.backends),
            o.build_estimate,
            f"b{o.upstream}" if o.upstream else None,
            "yes" if o.id in installed else "",
            o.repo,
        ]
        for o in found.offers.values()
    ]
    if rows:
        headers = [
            "ID",
            "ADDS",
            "COMMIT",
            "DIGEST",
            "BACKENDS",
            "BUILD",
            "UPSTREAM",
            "INSTALLED",
            "REPO",
        ]
        click.echo(table(headers, rows))
    for offer_id, why in found.refused.items():
        click.echo(f"refused: offer {offer_id!r}: {why}")
    click.echo(f"(catalog: {found.source})")


@click.command("install")
@click.option("--lane", "lane_id", default=None, help="The offer's id (`blazar engine offers`).")
@click.option(
    "--kind",
    default=None,
    help="Instead of a fork lane: an engine kind (mistralrs, llamacpp, whisper, piper, sdcpp), "
    "its newest version (or --version; sdcpp: the sdist checked, 0.4.7) installed as `engine "
    "update` does; sdcpp takes --backend cuda too (a CUDA toolkit is needed).",
)
@click.option("--version", default=None, help="With --kind: this version, not the newest.")
@click.option("--backend", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--jobs", "-j", type=int, default=None, help="Parallel build jobs (default: cores).")
@CATALOG_OPTION
@pass_context
def install(
    ctx: Context,
    lane_id: str | None,
    kind: str | None,
    version: str | None,
    backend: str,
    jobs: int | None,
    catalog: str | None,
) -> None:
    """Fetch a fork lane at its pinned commit, verify it, build it and make it a lane; or
    install an engine of a kind.

    The build is `engine build`'s (cmake; CUDA architectures and host compiler
    detected). Models whose architecture the fork adds are routed to it.

    Examples:

        blazar engine install --lane ik --backend cpu
        blazar engine install --kind mistralrs
    """
    from blazar.engines.service import Engines

    if (lane_id is None) == (kind is None):
        raise click.UsageError("give --lane ID (`blazar engine offers`) or --kind KIND")
    svc = Engines(ctx.store, ctx.paths)
    if kind is not None:
        outcome = svc.update(kind, version=version, progress=click.echo, backend=backend)
        click.echo(f"{outcome.kind}: {outcome.message}")
        return
    assert lane_id is not None
    offer = svc.catalog(catalog_location(ctx, catalog)).get(lane_id)
    record = svc.install_fork(offer, backend, jobs=jobs, log=click.echo)
    outcome = svc.adopt(record)
    adds = ", ".join(offer.architectures)
    click.echo(f"{offer.id}: {outcome.message}; models of architecture {adds} run on it")


def lane_state(state: str, since: str, retire_days: int, now: datetime) -> str:
    """active | retiring in N days | retired."""
    if state != "retiring":
        return state
    from reconcilers.engines import days_left
    from reconcilers.ports import ObservedLane

    left = days_left(ObservedLane("", "", "fork", state, since), now, retire_days)
    return f"retiring in {left} day{'s' if left != 1 else ''}" if left else "retiring (due)"


def lane_rows(ctx: Context, svc: Engines) -> list[dict[str, Any]]:
    """Every lane with its state in words and why, for `engine list`."""
    retire_days = manifest_routing(ctx)[1]
    now = datetime.now(UTC)
    rows = []
    for lane in svc.lanes.all():
        active = svc.records.active(lane.lane)
        why = lane.reason
        if lane.origin == "fork" and lane.state == "active":
            why = f"adds {', '.join(lane.architectures)}" + (f"; {why}" if why else "")
        rows.append(
            {
                "lane": lane.lane,
                "kind": lane.kind,
                "origin": lane.origin,
                "state": lane_state(lane.state, lane.since, retire_days, now),
                "since": lane.since or None,
                "active": active.tag if active else None,
                "architectures": list(lane.architectures),
                "why": why or None,
            }
        )
    return rows


def echo_lanes(rows: list[dict[str, Any]]) -> None:
    headers = ["LANE", "KIND", "ORIGIN", "ACTIVE", "STATE", "WHY"]
    cells = [[r["lane"], r["kind"], r["origin"], r["active"], r["state"], r["why"]] for r in rows]
    click.echo(table(headers, cells))
