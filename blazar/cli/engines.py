"""Engine commands: `blazar engine list|update|build|use|rollback|rm|offers|install` and
`blazar bench` (the fork-lane commands live in `blazar.cli.forks`)."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from blazar.cli import forks
from blazar.cli.context import Context, pass_context
from blazar.cli.format import echo_json, table
from blazar.engines.base import KIND, METHODS
from blazar.engines.ledger import EngineRecord
from blazar.engines.service import DEFAULT_GATE, Engines, UpdateOutcome
from blazar.errors import InvalidInput

DEFAULT_SOURCE = "https://github.com/ggml-org/llama.cpp"


def engines(ctx: Context) -> Engines:
    return Engines(ctx.store, ctx.paths)


def _gate_default() -> float:
    raw = os.environ.get("BLAZAR_ENGINE_GATE")
    if raw is None:
        return DEFAULT_GATE
    try:
        return float(raw)
    except ValueError:
        raise InvalidInput(
            f"BLAZAR_ENGINE_GATE={raw!r} is not a number; use a fraction such as 0.10"
        ) from None


def lane_settings(ctx: Context, kind: str) -> tuple[str | None, float | None, str | None]:
    """(feed, gate, install method) declared for the lane in the user's manifest, if any.

    Flags and environment variables win over these; a missing or invalid
    manifest contributes nothing here (`blazar diff` reports its problems).
    """
    from specs.loader import ManifestError, load_manifest

    if not ctx.paths.manifest.exists():
        return None, None, None
    try:
        manifest = load_manifest(ctx.paths.manifest)
    except ManifestError:
        return None, None, None
    for engine in manifest.engines.values():
        if engine.lane_name == kind:
            feed = str(engine.feed) if engine.feed else None
            return feed, engine.rollback_on_drop, engine.install
    return None, None, None


def engine_json(svc: Engines, record: EngineRecord) -> dict[str, Any]:
    data = asdict(record)
    data["bench"] = svc.records.last_bench(record.kind, record.tag)
    return data


@click.group("engine")
def engine() -> None:
    """Inference engines: install, update behind a regression gate, switch, roll back."""


@engine.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per engine (JSON Lines).")
@click.option("--lanes", "lanes_only", is_flag=True, help="Only the lanes, with state and why.")
@pass_context
def list_(ctx: Context, as_json: bool, lanes_only: bool) -> None:
    """List installed engines, the active one per lane, and their last bench figures; then
    the lanes (mainstream and forks) with their state (active, retiring in N days,
    retired) and why."""
    svc = engines(ctx)
    records = svc.records.installed()
    lanes = forks.lane_rows(ctx, svc)
    if as_json:
        for row in lanes if lanes_only else [engine_json(svc, r) for r in records]:
            echo_json(row)
        return
    if lanes_only:
        forks.echo_lanes(lanes)
        return
    if not records and not lanes:
        click.echo("No engines yet: `blazar engine update` installs the newest llama.cpp.")
        return
    rows = []
    for r in records:
        bench = svc.records.last_bench(r.kind, r.tag)
        figures = (
            f"{bench['decode_tps']:.1f} tg/s, {bench['prompt_tps']:.1f} pp/s" if bench else None
        )
        if bench and r.kind in ("whisper", "piper"):  # audio seconds per second of work
            figures = f"{bench['decode_tps']:.1f}x real time"
        if bench and r.kind == "sdcpp" and bench["decode_tps"] > 0:  # images per second
            figures = f"{1 / bench['decode_tps']:.2f} s/image (64x64, 1 step)"
        rows.append(
            [
                r.kind,
                r.tag,
                "*" if r.active else "",
                r.method,
                r.version,
                r.installed_at,
                figures,
                r.path,
            ]
        )
    if rows:
        headers = ["LANE", "TAG", "ACTIVE", "METHOD", "VERSION", "INSTALLED", "BENCH", "PATH"]
        click.echo(table(headers, rows) + "\n")
    forks.echo_lanes(lanes)


def _report(outcome: UpdateOutcome, as_json: bool) -> None:
    if as_json:
        echo_json(asdict(outcome))
        return
    for result in outcome.results:
        if result.kind in ("whisper", "piper"):
            what = "transcribed" if result.kind == "whisper" else "synthesised"
            click.echo(
                f"  {result.tag}: {result.decode_tps:.1f} s of audio {what} per second "
                f"({result.model}, median of {result.runs})"
            )
            continue
        if result.kind == "sdcpp" and result.decode_tps > 0:
            click.echo(
                f"  {result.tag}: {1 / result.decode_tps:.2f} s per 64x64 1-step image "
                f"({result.model}, median of {result.runs})"
            )
            continue
        click.echo(
            f"  {result.tag}: decode {result.decode_tps:.1f} tokens/s, "
            f"prompt {result.prompt_tps:.1f} tokens/s ({result.model}, median of {result.runs})"
        )
    click.echo(f"{outcome.kind}: {outcome.message}")


@engine.command("update")
@click.option(
    "--kind",
    "--lane",
    "kind",
    default=KIND,
    show_default=True,
    help="The lane to update: llamacpp, mistralrs, whisper, piper, or an installed fork lane's id.",
)
@click.option("--all", "all_lanes", is_flag=True, help="Update every installed lane.")
@click.option(
    "--install",
    "method",
    type=click.Choice(["wheel", "release"]),
    default=None,
    help="Install method (default: the manifest's, the active engine's, else wheel).",
)
@click.option("--version", default=None, help="Install this version instead of the newest.")
@click.option(
    "--gate",
    type=float,
    default=None,
    help=f"Largest decode tokens/s drop accepted (default: $BLAZAR_ENGINE_GATE, the manifest's "
    f"rollback_on_drop, else {DEFAULT_GATE}).",
)
@click.option("--bench-model", default=None, help="Model for the gate (default: smallest held).")
@click.option(
    "--feed",
    default=None,
    help="Release feed base URL (default: $BLAZAR_RELEASE_FEED, the manifest's feed, GitHub).",
)
@forks.CATALOG_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@pass_context
def update(
    ctx: Context,
    kind: str,
    all_lanes: bool,
    method: str | None,
    version: str | None,
    gate: float | None,
    bench_model: str | None,
    feed: str | None,
    catalog: str | None,
    as_json: bool,
) -> None:
    """Install the newest engine beside the others and activate it if it is not slower.

    With an engine already active, both run the same fixed workload in one run;
    the new one becomes active only if its decode tokens/s dropped no more than
    the gate. Otherwise the old one stays active and the new one stays
    installed, inactive. A fork lane's newest is the commit its catalog offer
    pins now. `--all` walks every installed lane and prints one line per lane
    (progress goes to stderr).
    """
    manifest_feed, _, manifest_method = lane_settings(ctx, KIND if all_lanes else kind)
    feed = feed or os.environ.get("BLAZAR_RELEASE_FEED") or manifest_feed
    if method is None and manifest_method in ("wheel", "release"):
        method = manifest_method

    def gate_for(lane: str) -> float:
        """The flag, $BLAZAR_ENGINE_GATE, the lane's rollback_on_drop, else the default."""
        chosen = gate
        if chosen is None and "BLAZAR_ENGINE_GATE" not in os.environ:
            chosen = lane_settings(ctx, lane)[1]
        chosen = _gate_default() if chosen is None else chosen
        if not 0 <= chosen < 1:
            raise InvalidInput(f"--gate must be a fraction in [0, 1), got {chosen}")
        return chosen

    max_drop = gate_for(kind)
    svc = engines(ctx)
    location = forks.catalog_location(ctx, catalog)
    if all_lanes:
        installed: set[str] = set(svc.records.kinds())
        for lane in sorted({KIND, *(lane.lane for lane in svc.lanes.all())}):
            if lane not in installed:
                click.echo(f"{lane}: skipped (not installed)")
                continue
            outcome = svc.update(
                lane,
                method=method if lane == KIND else None,
                version=version if lane == KIND else None,
                max_drop=gate_for(lane),
                model=bench_model,
                feed=feed,
                catalog=location,
                progress=lambda line: click.echo(line, err=True),
            )
            if as_json:
                echo_json(asdict(outcome))
            else:
                click.echo(f"{lane}: {outcome.message}")
        return
    outcome = svc.update(
        kind,
        method=method,
        version=version,
        max_drop=max_drop,
        model=bench_model,
        feed=feed,
        progress=click.echo,
        catalog=location,
    )
    _report(outcome, as_json)


@engine.command("build")
@click.argument("backend", type=click.Choice(["cpu", "cuda"]))
@click.option(
    "--source",
    default=DEFAULT_SOURCE,
    show_default=True,
    help="A llama.cpp tree: a directory, a .tar.gz, or a git URL with optional @SHA.",
)
@click.option("--jobs", "-j", type=int, default=None, help="Parallel build jobs (default: cores).")
@click.option("--gate", type=float, default=None, help="As for `engine update`.")
@click.option("--bench-model", default=None, help="Model for the gate (default: smallest held).")
@pass_context
def build(
    ctx: Context,
    backend: str,
    source: str,
    jobs: int | None,
    gate: float | None,
    bench_model: str | None,
) -> None:
    """Build llama-server from source with cmake and install it (slow: minutes)."""
    import tempfile
    from pathlib import Path

    from blazar.engines.source import build_source

    svc = engines(ctx)
    max_drop = _gate_default() if gate is None else gate
    work = Path(tempfile.mkdtemp(prefix="build-", dir=ctx.paths.cache))
    click.echo(f"building llama-server ({backend}) from {source}; log under {work}")
    installed = build_source(ctx.paths.engines, source, backend, work_dir=work, jobs=jobs)
    candidate = svc.add_built(installed)
    click.echo(f"installed {candidate.kind} {candidate.tag} at {candidate.path}")
    _report(svc.adopt(candidate, max_drop=max_drop, model=bench_model), as_json=False)


@engine.command("use")
@click.argument("tag", required=False)
@click.option(
    "--kind",
    default=None,
    help="Instead of a TAG: the kind of engine (llamacpp, mistralrs) chat models that name no "
    "engine run on; it sets engine_routing.chat_kind in your manifest.",
)
@pass_context
def use(ctx: Context, tag: str | None, kind: str | None) -> None:
    """Make engine TAG the active one of its lane; or, with --kind, switch the default lane
    of a kind of model.

    Examples:

        blazar engine use b11549-cpu
        blazar engine use --kind mistralrs    # chat models run on mistral.rs
        blazar engine use --kind llamacpp     # back to llama.cpp
    """
    if (tag is None) == (kind is None):
        raise click.UsageError("give a TAG (`blazar engine list`) or --kind KIND, not both")
    if kind is not None:
        from blazar.engines.kinds import canonical_kind
        from blazar.manifest.engine_kind import use_kind

        installed = engines(ctx).records.active(canonical_kind(kind)) is not None
        click.echo(use_kind(ctx.paths.manifest, kind, installed=installed))
        return
    assert tag is not None
    record, previous = engines(ctx).use(tag)
    if previous and previous.tag == record.tag:
        click.echo(f"{record.kind}: {record.tag} is already active")
    else:
        was = f" (was {previous.tag})" if previous else ""
        click.echo(f"{record.kind}: {record.tag} is now active{was}")


@engine.command("rollback")
@click.option("--kind", default=KIND, show_default=True)
@pass_context
def rollback(ctx: Context, kind: str) -> None:
    """Re-activate the engine that was active before the current one."""
    record, was = engines(ctx).rollback(kind)
    click.echo(f"{kind}: rolled back to {record.tag} (was {was})")


@engine.command("rm")
@click.argument("tag")
@pass_context
def rm(ctx: Context, tag: str) -> None:
    """Remove an installed engine (never the active one, nor one in use)."""
    record = engines(ctx).remove(tag)
    click.echo(f"removed {record.kind} {record.tag}")


@click.command("bench")
@click.argument("model")
@click.option("--engine", "tag", default=None, help="Engine tag (default: the active one).")
@click.option(
    "--spec",
    type=click.Choice(["off", "ngram", "draft"]),
    default="off",
    show_default=True,
    help="Decoding mode: dense, n-gram lookup, or the model's declared draft.",
)
@click.option("--history", is_flag=True, help="Show MODEL's bench history instead.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@pass_context
def bench(
    ctx: Context, model: str, tag: str | None, spec: str, history: bool, as_json: bool
) -> None:
    """Measure prompt and generation tokens/s of MODEL on an engine (a transcription or
    speech model: audio seconds per second of work); keep the figures in the store's
    bench history (`--history` shows it).

    Example: blazar bench gemma3-270m --spec ngram
    """
    from specs.names import parse_name

    svc = engines(ctx)
    if history:
        _history(svc, parse_name(model).short, as_json)
        return
    held = ctx.store.find_model(parse_name(model))
    kind = held.kind if held is not None else "chat"  # unknown: the bench says so below
    lane = {"transcription": "whisper", "speech": "piper"}.get(kind, KIND)
    if tag:
        record = svc.records.find_tag(tag)
    else:
        active = svc.records.active(lane)
        if active is None:
            raise InvalidInput(
                f"no active {lane} engine: `blazar engine update --kind {lane}` installs one"
            )
        record = active
    extra = _spec_args(ctx, model, spec) if spec != "off" else []
    [result] = svc.bench([record], model=model, extra_args=extra, spec=spec)
    if as_json:
        echo_json(asdict(result))
        return
    if lane != KIND:
        click.echo(
            f"{result.model} on {result.tag}: {result.decode_tps:.1f} s of audio per second "
            f"of work ({result.predicted_n / 1000:.1f} s of audio), median of {result.runs}"
        )
        return
    click.echo(
        f"{result.model} on {result.tag} ({spec}): prompt {result.prompt_tps:.1f} tokens/s "
        f"({result.prompt_n} tokens), generation {result.decode_tps:.1f} tokens/s "
        f"({result.predicted_n} tokens), median of {result.runs}"
    )


def _spec_args(ctx: Context, model: str, spec: str) -> list[str]:
    """The flags of a decoding mode for MODEL: the n-gram lookup, or its declared draft."""
    from blazar.launch.tuning import Tuning
    from blazar.models.vocab import draft_problem
    from blazar.reconcile.apply import load_or_empty
    from specs.names import parse_name

    if spec == "ngram":
        return Tuning(spec="ngram").flags()
    manifest = load_or_empty(ctx.paths.manifest)
    declared = manifest.declared_model(model)
    draft = declared.draft if declared else None
    if draft is None:
        raise InvalidInput(
            f"model '{model}' declares no draft: set models.{model}.draft (`blazar drafts "
            f"{model}` lists those that fit), or bench --spec ngram"
        )
    target = ctx.store.get_model(parse_name(model))
    other = ctx.store.get_model(parse_name(manifest.resolve_model(draft) or draft))
    problem = draft_problem(Path(target.path), Path(other.path))
    if problem is not None:
        raise InvalidInput(f"model '{draft}' cannot draft for '{model}': {problem}")
    return Tuning(spec="draft", draft=draft, draft_path=other.path).flags()


def _history(svc: Engines, model: str, as_json: bool) -> None:
    rows = svc.records.bench_history(model)
    if as_json:
        for row in rows:
            echo_json(row)
        return
    if not rows:
        click.echo(f"No bench figures for {model} yet: `blazar bench {model}` measures it.")
        return
    click.echo(
        table(
            ["TIME", "LANE", "ENGINE", "SPEC", "GENERATION TOK/S", "PROMPT TOK/S", "RUNS", "NOTE"],
            [
                [
                    r["time"],
                    r["kind"],
                    r["tag"],
                    r.get("spec") or "off",
                    f"{r['decode_tps']:.1f}",
                    f"{r['prompt_tps']:.1f}",
                    r["runs"],
                    r["note"],
                ]
                for r in rows
            ],
        )
    )


engine.add_command(forks.offers)
engine.add_command(forks.install)

COMMANDS = [engine, bench]
__all__ = ["COMMANDS", "METHODS"]
