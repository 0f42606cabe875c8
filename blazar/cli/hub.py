"""Choosing a model on Hugging Face before pulling it: `blazar search` and `blazar fit REPO`.

`search QUERY` lists GGUF repos with their quantizations, sizes and what is
already pulled; `fit owner/repo[:QUANT]` (called by `blazar fit` for a target
Blazar does not hold) reads one GGUF header with range requests and prints the
fit of every quantization on this machine, marking the largest that fits and
the `blazar pull` that gets it. The hub calls are `blazar.sources.hub`; the
estimate is `blazar.models.fit.estimate`, the one local models get.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.format import echo_json, human_bytes, table
from blazar.errors import InvalidInput
from blazar.models.fit import FitReport, estimate
from specs.sources import (
    HFSource,
    InvalidSource,
    RegistrySource,
    expand_shorthand,
    parse_source,
)

if TYPE_CHECKING:  # huggingface_hub loads with it: only for the commands that call the hub
    from blazar.sources.hub import HubRepo, Quant


def pulled_quants(ctx: Context) -> set[tuple[str, str]]:
    """(repo, quantization) pairs, lower case, of the models Blazar holds from the hub."""
    from blazar.sources import UnknownModelName, resolve_registry
    from blazar.sources.base import quant_of

    found = set()
    for record in ctx.store.list_models():
        try:
            source = parse_source(record.source)
            if isinstance(source, RegistrySource):
                source = resolve_registry(source.name)
        except (InvalidSource, UnknownModelName):
            continue
        if isinstance(source, HFSource):
            quant = source.quant or quant_of(source.filename or "") or ""
            found.add((source.repo.lower(), quant.lower()))
            if source.filename:
                found.add((source.repo.lower(), source.filename.lower()))
    return found


@click.command("search")
@click.argument("query")
@click.option("--limit", type=click.IntRange(1, 100), default=10, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per repo (JSON Lines).")
@pass_context
def search(ctx: Context, query: str, limit: int, as_json: bool) -> None:
    """Search Hugging Face for GGUF models (HF_ENDPOINT and HF_TOKEN are honoured).

    Each repo is listed with its quantizations and file sizes; those already
    pulled are marked. `blazar fit owner/repo` says which fits this machine.
    """
    from blazar.sources import hub

    repos = hub.search(query, os.environ, limit=limit)
    pulled = pulled_quants(ctx)

    def is_pulled(repo: str, quant: Quant) -> bool:
        return bool(
            {(repo.lower(), quant.name.lower()), (repo.lower(), quant.files[0].lower())} & pulled
        )

    if as_json:
        for repo in repos:
            quants = [
                {**q.to_json(), "pulled": is_pulled(repo.repo, q), "pull": q.source(repo.repo)}
                for q in repo.quants
            ]
            echo_json(
                {
                    "repo": repo.repo,
                    "revision": repo.revision,
                    "downloads": repo.downloads,
                    "likes": repo.likes,
                    "quants": quants,
                }
            )
        return
    if not repos:
        click.echo(f"No GGUF repos match {query!r}.")
        return
    rows = []
    for repo in repos:
        for i, q in enumerate(repo.quants):
            rows.append(
                [
                    repo.repo if i == 0 else "",
                    q.name,
                    human_bytes(q.size) if q.size is not None else None,
                    "pulled" if is_pulled(repo.repo, q) else "",
                    f"blazar pull {q.source(repo.repo)}",
                ]
            )
        if not repo.quants:
            rows.append([repo.repo, "(no GGUF model file)", None, "", ""])
    click.echo(table(["REPO", "QUANT", "SIZE", "HELD", "PULL WITH"], rows))
    click.echo("`blazar fit owner/repo` shows which fit this machine.")


def hub_target(target: str) -> HFSource | None:
    """The hub repo (and quantization) a `fit` target names, or None when it names none."""
    from blazar.sources import UnknownModelName, resolve_registry

    try:
        source = parse_source(expand_shorthand(target))
    except InvalidSource:
        return None
    if isinstance(source, RegistrySource):
        try:
            return resolve_registry(source.name)
        except UnknownModelName:
            return None
    return source if isinstance(source, HFSource) else None


LANE_HINT = "serve with a mistralrs lane: `blazar engine install --kind mistralrs`"


def _fit_safetensors(repo: HubRepo, target: str, as_json: bool) -> None:
    """`fit` for a repo holding a safetensors model and no GGUF: what it weighs, and the
    lane that serves it (llama.cpp's estimate reads a GGUF header, which it has none of)."""
    weights = repo.safetensors or 0
    pull = f"blazar pull hf://{repo.repo} --name NAME"
    if as_json:
        echo_json(
            {
                "target": target,
                "repo": repo.repo,
                "revision": repo.revision,
                "format": "safetensors",
                "weights_bytes": weights,
                "quants": [],
                "lane": "mistralrs",
                "hint": LANE_HINT,
                "command": pull,
            }
        )
        return
    click.echo(
        f"{repo.repo} ({repo.revision[:12]}) holds a safetensors model ({human_bytes(weights)} "
        "of weights) and no GGUF, so llama.cpp cannot serve it and no memory estimate is "
        f'made: {LANE_HINT}, then `{pull}` with engine = "mistralrs" in the manifest'
    )


def fit_remote(
    source: HFSource, target: str, *, ctx_size: int | None, cache_type: str, as_json: bool
) -> None:
    """`blazar fit` for a model on the hub: every quantization against this machine."""
    from blazar.host.hardware import memory_devices
    from blazar.sources import hub

    repo = hub.repo_quants(source.repo, os.environ, source.revision)
    if not repo.quants and repo.safetensors is not None:  # no GGUF: a safetensors model
        _fit_safetensors(repo, target, as_json)
        return
    wanted = source.quant
    if source.filename is not None:
        wanted = next((q.name for q in repo.quants if source.filename in q.files), None)
    header = hub.choose(repo, wanted)
    facts, read = hub.remote_facts(repo, header, os.environ)
    devices = memory_devices()
    reports: list[tuple[Quant, FitReport]] = []
    for quant in repo.quants:
        shaped = {**facts.to_dict(), "size": quant.size or 0}
        reports.append(
            (quant, estimate(quant.name, shaped, devices, ctx=ctx_size, cache_type=cache_type))
        )
    fitting = [(q, r) for q, r in reports if r.fits and q.size is not None]
    best = max(fitting, key=lambda qr: qr[0].size or 0)[0] if fitting else None
    command = f"blazar pull {best.source(repo.repo)}" if best else None
    first = reports[0][1] if reports else None
    if as_json:
        echo_json(
            {
                "target": target,
                "repo": repo.repo,
                "revision": repo.revision,
                "header": {"file": header.files[0], "bytes_read": read},
                "facts": {k: v for k, v in facts.to_dict().items() if k != "chat_template"},
                "ctx": first.ctx if first else None,
                "cache_type": cache_type,
                "device": first.budget_device if first else None,
                "available": first.available if first else None,
                "quants": [_quant_json(q, r, q is best, q.name == wanted) for q, r in reports],
                "suggested": {"quant": best.name, "command": command} if best else None,
            }
        )
        return
    click.echo(
        f"{repo.repo} ({repo.revision[:12]}): {facts.architecture}, {facts.block_count} layers, "
        f"{facts.head_count_kv} kv heads, context {facts.context_length}; "
        f"read {human_bytes(read)} of {header.files[0]}'s header"
    )
    if first is None:
        raise InvalidInput(f"{repo.repo} holds no GGUF model file")
    click.echo(
        f"fit at ctx {first.ctx} ({cache_type} KV cache), {human_bytes(first.available)} "
        f"free on {first.budget_device}:"
    )
    rows = [
        [
            q.name + (" (asked)" if q.name == wanted else ""),
            human_bytes(q.size) if q.size is not None else None,
            human_bytes(r.needed),
            ("yes" if r.fits else "no") + ("  <- largest that fits" if q is best else ""),
        ]
        for q, r in reports
    ]
    click.echo(table(["QUANT", "SIZE", "NEEDED", "FITS"], rows))
    if command:
        click.echo(f"suggested: {command}")
    else:
        click.echo("none fits: try a smaller --ctx, --cache-type q8_0, or a smaller model")


def _quant_json(quant: Quant, report: FitReport, best: bool, asked: bool) -> dict[str, Any]:
    data = asdict(report)
    fit = {k: data[k] for k in ("needed", "kv", "compute", "fits", "max_ctx")}
    return {**quant.to_json(), **fit, "largest_fit": best, "asked": asked}


COMMANDS = [search]
