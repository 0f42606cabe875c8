"""Model commands: import, list, show, fit (of a held model, or of one on the hub before
pulling it: `blazar.cli.hub`)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.format import echo_json, human_bytes, human_count, table
from blazar.errors import NotFound
from blazar.host.hardware import memory_devices
from blazar.models.fit import CACHE_TYPES, estimate
from blazar.store.db import ModelRecord
from blazar.store.reads import read_models
from specs.names import InvalidName, parse_name

if TYPE_CHECKING:  # kept out of `blazar list`'s start: it loads the manifest models
    from blazar.launch.cache_settings import CacheSettings
    from blazar.launch.served_template import AppliedTemplate


def model_json(record: ModelRecord) -> dict[str, Any]:
    data = asdict(record)
    data["model"] = record.ref.short
    return data


@click.command("import")
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--name", "name", default=None, help="Name to serve it as: name[:tag].")
@click.option("--copy", is_flag=True, help="Copy the file into the store instead of linking it.")
@click.option("--force", is_flag=True, help="Replace a model that already has this name.")
@click.option("--sha256", default=None, help="Refuse the file unless it has this sha256.")
@click.option(
    "--scan",
    is_flag=True,
    help="List the GGUF models ollama, the Hugging Face cache and LM Studio keep here, "
    "with the command that adopts each.",
)
@click.option("--json", "as_json", is_flag=True, help="With --scan: JSON Lines, one a model.")
@pass_context
def import_(
    ctx: Context,
    path: Path | None,
    name: str | None,
    copy: bool,
    force: bool,
    sha256: str | None,
    scan: bool,
    as_json: bool,
) -> None:
    """Register a local GGUF file as model NAME, or find the models other runtimes have.

    By default the file is hardlinked into Blazar's store when it is on the same
    filesystem, and referenced in place otherwise; --copy copies it. Its size and
    sha256 are verified; the source file is never modified, moved or deleted. The
    first shard of a split model (x-00001-of-00003.gguf) imports all its shards.
    """
    if scan:
        if path is not None or name is not None:
            raise click.UsageError("--scan takes no PATH or --name: it lists what it finds")
        _scan(ctx, as_json)
        return
    if path is None or name is None:
        raise click.UsageError("give PATH and --name NAME (or --scan to find models)")
    ref = parse_name(name)
    shards = _shards(path)
    if shards and copy:
        raise click.UsageError("--copy does not apply to a split model: its shards are linked")
    if shards:
        record = ctx.registry.import_files(
            shards, ref, force=force, names=[s.name for s in shards], sha256=sha256
        )
    else:
        record = ctx.registry.import_file(path, ref, copy=copy, force=force, sha256=sha256)
    click.echo(
        f"imported {record.ref.short}: {record.architecture} {human_count(record.parameters)} "
        f"{record.quantization}, {human_bytes(record.size)} ({record.held})"
    )
    _declare_imported(ctx, record)


def _declare_imported(ctx: Context, record: ModelRecord) -> None:
    """Declare an imported model in the user's manifest (its file and sha256), unless it is
    declared already: its settings can then be set (`blazar config set
    models.NAME.chat_template chatml`, the hint a model without a template gets), and a
    running serve serves it at once (the CLI's pass), not at its next timer pass. The
    bytes are held already, so the pass only records them."""
    from blazar.manifest import ops as manifest_ops

    name = record.ref.short
    manifest = manifest_ops.open_manifest(ctx.paths.manifest)
    if manifest_ops.declared_key(manifest, name) or manifest_ops.alias_owner(manifest, name):
        return
    fields = {"source": record.source, "sha256": record.sha256}
    manifest_ops.apply_model(ctx.paths, ctx.paths.manifest, name, fields)
    click.echo(f"declared models.{name} in {ctx.paths.manifest}")


def _shards(path: Path) -> list[Path]:
    """Every shard of the split model whose first shard is `path`; [] for a single file."""
    from blazar.sources.base import SHARD

    shard = SHARD.match(path.name)
    if shard is None or int(shard["index"]) != 1:
        return []
    total = int(shard["total"])
    files = [
        path.with_name(f"{shard['prefix']}-{i:05d}-of-{total:05d}.gguf")
        for i in range(1, total + 1)
    ]
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise NotFound(f"{path} is shard 1 of {total}, but {', '.join(missing)} are missing")
    return files


def _scan(ctx: Context, as_json: bool) -> None:
    import os

    from blazar.sources.local_stores import scan

    found = scan(os.environ, ctx.store.list_models())
    if as_json:
        for item in found:
            echo_json(item.to_json())
        return
    if not found:
        click.echo(
            "No GGUF models found in ollama's store, the Hugging Face cache or LM Studio's "
            "folders (OLLAMA_MODELS, HF_HUB_CACHE and HF_HOME are honoured)."
        )
        return
    click.echo(
        table(
            ["RUNTIME", "NAME", "QUANT", "SIZE", "HELD", "FROM"],
            [
                [
                    f.runtime,
                    f.name,
                    f.quantization,
                    human_bytes(f.size),
                    f"as {f.held}" if f.held else "",
                    f.origin,
                ]
                for f in found
            ],
        )
    )
    todo = [f for f in found if not f.held]
    if todo:
        click.echo("\nAdopt one (hardlinked when it can be; the original is left as it is):")
        for f in todo:
            click.echo(f"  {f.command}")


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per model (JSON Lines).")
@pass_context
def list_(ctx: Context, as_json: bool) -> None:
    """List the models Blazar holds."""
    records = read_models(ctx.paths.db)  # without sqlite-utils, when the store is migrated
    if records is None:
        records = ctx.store.list_models()
    if as_json:
        for record in records:
            echo_json(model_json(record))
        return
    if not records:
        click.echo("No models yet: `blazar import PATH --name NAME` adds one.")
        return
    click.echo(
        table(
            ["NAME", "ARCH", "PARAMS", "QUANT", "SIZE", "HELD", "SHA256", "ADDED"],
            [
                [
                    r.ref.short,
                    r.architecture,
                    human_count(r.parameters),
                    r.quantization,
                    human_bytes(r.size),
                    r.held,
                    r.sha256[:12],
                    r.added_at,
                ]
                for r in records
            ],
        )
    )


_SHOW_FACTS = [
    ("architecture", "architecture"),
    ("parameters", "parameters"),
    ("quantization", "quantization"),
    ("context_length", "context length"),
    ("embedding_length", "embedding length"),
    ("block_count", "layers"),
    ("head_count", "heads"),
    ("head_count_kv", "kv heads"),
    ("vocab_size", "vocab size"),
    ("tokenizer_model", "tokenizer"),
]


@click.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the record and facts as JSON.")
@click.option(
    "--manifest",
    "manifest_path",
    type=click.Path(path_type=Path),
    default=None,
    help="The manifest it is served with, for its chat template (default: your manifest).",
)
@pass_context
def show(ctx: Context, name: str, as_json: bool, manifest_path: Path | None) -> None:
    """Show one model's facts and the chat template it is served with."""
    record = ctx.store.get_model(parse_name(name))
    template = _applied_template(ctx, record, manifest_path)
    if as_json:
        data = model_json(record)
        data["chat_template"] = asdict(template)
        echo_json(data)
        return
    facts = record.facts
    lines = [("model", record.ref.short)]
    if record.is_set:  # a set of files (docs/audio.md; a safetensors model): kind and files
        _show_set(record)
        return
    for key, label in _SHOW_FACTS:
        value = facts.get(key)
        if key == "parameters" and value is not None:
            value = f"{human_count(value)} ({value:,})"
        lines.append((label, "-" if value is None else str(value)))
    lines += [
        ("chat template", _template_line(template)),
        ("size", f"{human_bytes(record.size)} ({record.size:,} bytes)"),
        ("sha256", record.sha256),
        ("path", f"{record.path} ({record.held})"),
        ("source", record.source),
        ("added", record.added_at),
    ]
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        click.echo(f"  {label.ljust(width)}   {value}")


def _show_set(record: ModelRecord) -> None:
    """A transcription model or voice: its kind and files, no GGUF facts."""
    files = record.facts.get("files") or {}
    lines = [
        ("model", record.ref.short),
        ("kind", record.kind),
        ("files", ", ".join(sorted(files))),
        ("size", f"{human_bytes(record.size)} ({record.size:,} bytes)"),
        ("sha256", f"{record.sha256} (of its files' sha256 listing)"),
        ("path", f"{record.path} ({record.held})"),
        ("source", record.source),
        ("added", record.added_at),
    ]
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        click.echo(f"  {label.ljust(width)}   {value}")


def _applied_template(ctx: Context, record: ModelRecord, path: Path | None) -> AppliedTemplate:
    """What `blazar serve` applies: the manifest's chat_template, else the GGUF's own."""
    from blazar.errors import InvalidManifest
    from blazar.launch.served_template import AppliedTemplate, model_template
    from blazar.reconcile.apply import load

    path = path or ctx.paths.manifest
    if not path.exists():
        return model_template(None, None, record.facts)
    try:
        manifest = load(path)
    except InvalidManifest:
        unknown = f"unknown: {path} has problems (`blazar diff {path}` lists them)"
        return AppliedTemplate("unknown", unknown, None)
    return model_template(manifest, manifest.resolve_model(record.ref.short), record.facts)


def _template_line(template: AppliedTemplate) -> str:
    if template.problem:
        return f"{template.source}, unusable: {template.problem}"
    return template.source


@click.command("fit")
@click.argument("target")
@click.option(
    "--ctx",
    "ctx_size",
    type=int,
    default=None,
    help="Context length (default: the manifest's ctx x slots, else 4096).",
)
@click.option(
    "--cache-type",
    type=click.Choice(CACHE_TYPES),
    default=None,
    help="KV cache element type (default: the manifest's cache_type, else f16).",
)
@click.option(
    "--manifest",
    type=click.Path(path_type=Path),
    default=None,
    help="The manifest whose settings count (default: yours).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the estimate and its terms.")
@pass_context
def fit(
    ctx: Context,
    target: str,
    ctx_size: int | None,
    cache_type: str | None,
    manifest: Path | None,
    as_json: bool,
) -> None:
    """Estimate the memory a model needs and whether this machine has it.

    TARGET is a model Blazar holds, or one on Hugging Face before it is pulled:
    owner/repo[:QUANT], hf://owner/repo[:QUANT] or a short name such as
    qwen3-0.6b. For those, file sizes come from the hub and the layers, heads
    and context from the GGUF header (range requests: its first megabytes
    only); every quantization is shown and the largest that fits suggested.
    A model declared in the manifest is estimated as serve starts it: its ctx
    times its slots, cache_type, ctx_extend and cache_ram_mb (and `[serving]`'s
    defaults); a vision projector it holds (mmproj) counts too.
    """
    from dataclasses import replace

    from blazar.launch import cache_settings

    record = _held(ctx, target)
    if record is None:
        from blazar.cli.hub import fit_remote, hub_target

        source = hub_target(target)
        if source is None:
            raise NotFound(
                f"model '{target}' is not in the store (`blazar list` shows what is), nor a "
                "model on Hugging Face: give owner/repo[:QUANT], hf://owner/repo[:QUANT] or a "
                "short name such as qwen3-0.6b"
            )
        fit_remote(
            source, target, ctx_size=ctx_size, cache_type=cache_type or "f16", as_json=as_json
        )
        return
    if record.kind == "image":
        _fit_image(record, as_json)
        return
    settings, declared_ctx = _declared(manifest or ctx.paths.manifest, record.ref.short)
    if cache_type is not None:
        settings = replace(settings, cache_type=cache_type)
    projector = ctx.store.find_projector(record.ref.short)
    report = estimate(
        record.ref.short,
        record.facts,
        memory_devices(),
        ctx=ctx_size or declared_ctx,
        cache_type=settings.kv_type,
        ctx_extend=settings.ctx_extend,
        cache_ram_mb=settings.cache_ram_mb,
        projector=projector.size if projector is not None else 0,
    )
    report.notes.extend(
        f"the engine would refuse this: {problem}"
        for problem in cache_settings.problems(
            settings, record.facts, name=record.ref.short, ctx=report.ctx
        )
    )
    if as_json:
        echo_json(asdict(report))
        return
    verdict = "fits" if report.fits else "does NOT fit"
    if report.beyond_training:
        verdict = (
            f"{'fits in memory' if report.fits else 'does NOT fit'}, but is beyond the model's "
            f"training context of {report.context_length}: use ctx {report.context_length} or "
            f"less, or set ctx_extend (YaRN: `blazar config set models.{report.model}.ctx_extend "
            f"{-(-report.ctx // (report.context_length or 1))}`)"
        )
    click.echo(f"{report.model} at ctx {report.ctx} ({report.cache_type} KV cache) {verdict}")
    click.echo(f"  weights    {human_bytes(report.weights)}")
    click.echo(f"  kv cache   {human_bytes(report.kv)} ({human_bytes(report.kv_per_token)}/token)")
    click.echo(f"  compute    {human_bytes(report.compute)} (estimate)")
    if report.projector:
        click.echo(f"  projector  {human_bytes(report.projector)} (mmproj: images)")
    if report.prompt_cache:
        click.echo(f"  prompt cache {human_bytes(report.prompt_cache)} (cache_ram_mb, at most)")
    click.echo(f"  needed     {human_bytes(report.needed)}")
    click.echo(f"  available  {human_bytes(report.available)} on {report.budget_device}")
    click.echo(f"  largest ctx that fits: {report.max_ctx}")
    for note in report.notes:
        click.echo(f"  note: {note}")


def _fit_image(record: ModelRecord, as_json: bool) -> None:
    """An image model's estimate: its files (every part: the diffusion model, the text
    encoders, the autoencoder), which sd-server loads whole. Its compute buffers grow with
    the picture's size and are not estimated: the scheduler measures the instance once it
    has loaded, and counts that from then on."""
    devices = memory_devices()
    device = max(devices, key=lambda d: d.free)
    fits = record.size <= device.free
    if as_json:
        echo_json(
            {
                "model": record.ref.short,
                "kind": "image",
                "weights": record.size,
                "needed": record.size,
                "available": device.free,
                "budget_device": f"{device.kind}:{device.index} ({device.name})",
                "fits": fits,
                "notes": ["compute buffers are measured after the first load, not estimated"],
            }
        )
        return
    click.echo(f"{record.ref.short} (an image model) {'fits' if fits else 'does NOT fit'}")
    click.echo(f"  weights    {human_bytes(record.size)} (every part's file)")
    click.echo("  compute    not estimated: it grows with the picture; measured after a load")
    click.echo(f"  available  {human_bytes(device.free)} on {device.kind}:{device.index}")


def _held(ctx: Context, name: str) -> ModelRecord | None:
    try:
        ref = parse_name(name)
    except InvalidName:
        return None
    return ctx.store.find_model(ref)


def _declared(path: Path, model: str) -> tuple[CacheSettings, int | None]:
    """The model's cache settings and engine context (ctx x slots) as the manifest at
    `path` declares them; the defaults when it does not declare the model."""
    from blazar.launch import cache_settings
    from blazar.reconcile.apply import load_or_empty

    manifest = load_or_empty(path)
    key = manifest.resolve_model(model)
    spec = manifest.models[key] if key is not None else None
    settings = cache_settings.settings_for(spec, manifest.serving)
    if key is None:
        return settings, None
    slots = 1 if settings.deterministic else manifest.slots_for(key)
    return settings, manifest.ctx_for(key) * slots


COMMANDS = [import_, list_, show, fit]
