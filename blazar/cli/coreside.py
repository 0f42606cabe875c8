"""`blazar coreside [MODEL...]`: which models can be resident at once on this host, where,
and what loading MODEL now would evict.

It asks the running daemon (`GET /api/blazar/coreside?load=MODEL`, its live pools and
measured footprints); with none running it computes the same answer from the store and
the manifest (nothing loaded, footprints measured by an earlier serve or estimated by
`fit`). The answer is one value (`blazar.serve.supervisor.scheduler.coreside`): `--json`
prints it and the view below is rendered from that JSON, so both say the same.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.format import echo_json, human_bytes, table
from blazar.cli.serve import URL_OPTION, call, daemon_url, health, no_daemon
from blazar.errors import NotFound


@click.command("coreside")
@click.argument("models", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="The answer as one JSON object.")
@click.option(
    "--manifest",
    "manifest_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="With no serve running: the manifest to read (default: yours).",
)
@URL_OPTION
@pass_context
def coreside(
    ctx: Context,
    models: tuple[str, ...],
    as_json: bool,
    manifest_path: Path | None,
    url: str | None,
) -> None:
    """Which models can be resident at once, and where, from their footprints (measured
    once a child of them ran, else estimated: marked which) and the memory budget; the
    groups. With MODELs: whether they fit together (if not, by how much per device) and
    what loading each now would evict."""
    base = daemon_url(ctx.paths, url)
    if health(base) is not None:
        query = urllib.parse.urlencode([("load", m) for m in models])
        answer = call(base, "/api/blazar/coreside" + (f"?{query}" if query else ""), timeout=30)
    elif url is not None:
        raise no_daemon(base, ConnectionError("nothing answers"))
    else:
        answer = local(ctx, manifest_path or ctx.paths.manifest, models)
    if as_json:
        echo_json(answer)
        return
    click.echo(render(answer))


def local(ctx: Context, manifest_path: Path, models: tuple[str, ...]) -> dict[str, Any]:
    """The answer with no serve running: from the store, the manifest and this host's
    devices; nothing is loaded."""
    from blazar.host.hardware import memory_devices
    from blazar.reconcile.apply import load_or_empty
    from blazar.serve.supervisor.build import build_runtimes
    from blazar.serve.supervisor.runtime import resolve
    from blazar.serve.supervisor.scheduler import Declared, Groups, Memory, budgets, footprints
    from blazar.serve.supervisor.scheduler import coreside as answer

    manifest = load_or_empty(manifest_path)
    runtimes = build_runtimes(ctx.store, manifest)
    devices = memory_devices()
    kind = "gpu" if any(d.kind == "gpu" for d in devices) else "cpu"
    names = []
    for model in models:
        try:
            names.append(resolve(runtimes, model)[0].name)
        except KeyError:
            served = ", ".join(sorted(runtimes)) or "none"
            raise NotFound(
                f"model '{model}' is not served here (models: {served}); `blazar list` shows "
                "what is held, `blazar pull` fetches one"
            ) from None
    memory = Memory(
        budgets(devices, manifest.serving.memory_budget),
        footprints(runtimes.values(), ctx.store.footprints(), kind),
        min_residency=manifest.serving.min_residency,
        pinned=Declared.of(manifest).devices,
        groups=Groups.of(manifest),
    )
    found = answer(
        sorted(runtimes.values(), key=lambda r: r.name),
        [],
        memory,
        names,
        max_loaded=manifest.serving.max_loaded_models,
        source="store",
    )
    return found.to_json()


def _size(n: int) -> str:
    return human_bytes(n)


def _fit_line(fit: dict[str, Any], what: str) -> list[str]:
    if fit["fits"]:
        where = ", ".join(f"{m} on {'+'.join(d)}" for m, d in fit["placement"].items())
        return [f"{what}: they fit ({where or 'nothing to place'})."]
    lines = [f"{what}: they do NOT fit."]
    lines += [f"  {c}" for c in fit["conflicts"]]
    lines += [
        f"  {_size(over)} over the budget on {device} (serving.memory_budget)"
        for device, over in sorted(fit["over"].items())
    ]
    return lines


def render(answer: dict[str, Any]) -> str:
    """The human view of a coreside answer (its JSON)."""
    source = "the running serve" if answer["source"] == "serve" else "the store (no serve runs)"
    lines = [f"Memory budget (serving.memory_budget), from {source}:"]
    lines += [
        f"  {d['device']}: {_size(d['budget'])} of {_size(d['total'])}, {_size(d['used'])} in use"
        for d in answer["devices"]
    ]
    lines.append("")
    rows = [
        [
            m["model"],
            f"{_size(m['footprint'])} {m['footprint_source']}",
            "never fits" if m["never_fits"] else "+".join(m["devices"]) or None,
            "loaded" if m["loaded"] else None,
            ", ".join(f"{g['name']} ({g['kind']})" for g in m["groups"]) or None,
            "yes" if m["pinned"] else None,
            _size(m["pegged"]) if m.get("pegged") else None,
        ]
        for m in answer["models"]
    ]
    if rows:
        headers = ["MODEL", "FOOTPRINT", "DEVICES", "STATE", "GROUPS", "PINNED", "PEGGED"]
        lines.append(table(headers, rows))
    pegs = answer.get("pegs") or {}
    if pegs.get("models"):
        held = ", ".join(f"{m} {_size(b)}" for m, b in pegs["models"].items())
        lines.append(
            f"Warm pegs: {held}; {_size(pegs['used'])} of {_size(pegs['budget'])} "
            "(serving.warm_peg_budget)"
        )
    else:
        lines.append("No model is served here.")
    for group in answer["groups"]:
        lines.append(f"Group {group['name']} ({group['kind']}): {', '.join(group['models'])}")
    lines += ["", *_fit_line(answer["all"], "All at once (of an exclusive group, its largest)")]
    if answer["set"] is not None:
        lines += _fit_line(answer["set"], ", ".join(answer["set"]["models"]))
    for load in answer["loads"]:
        name = load["model"]
        if load["loaded"]:
            text = f"'{name}' is loaded (on {'+'.join(load['devices']) or '-'})"
        elif load["refused"]:
            text = load["refused"]
        elif load["waits"]:
            text = (
                f"loading '{name}' now would wait: what holds the room it needs is busy, "
                "pinned or loaded less than serving.min_residency ago"
            )
        else:
            gone = [*load["drains"], *(m for m in load["evicts"] if m not in load["drains"])]
            evicts = f"evicts {', '.join(gone)}" if gone else "evicts nothing"
            text = f"loading '{name}' now {evicts} (on {'+'.join(load['devices'])})"
        if load["companions"]:
            text += f"; with it: {', '.join(load['companions'])} (together group)"
        lines.append(text)
    return "\n".join(lines)


COMMANDS = [coreside]
