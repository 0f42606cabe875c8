"""The runtimes the gateway serves, built from the store (models held, the engine lanes,
adapters, projectors, profiles) overlaid with the manifest's declarations
(`blazar.serve.supervisor.runtime` holds what a runtime is and how it is resolved).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypedDict

from blazar.engines.lanes import observe as observe_lanes
from blazar.engines.ledger import EngineRecord, EngineStore
from blazar.launch import cache_settings
from blazar.launch.served_template import AppliedTemplate, model_template
from blazar.launch.tuning import with_tuning
from blazar.models.gguf import rope_facts
from blazar.serve.supervisor import dialects
from blazar.serve.supervisor.runtime import Adapter, ModelRuntime
from blazar.store.db import LoraRecord, ModelRecord, Store
from blazar.store.profiles import ProfileStore
from reconcilers.desired import routing_of
from reconcilers.ports import ObservedLane, OfferView
from reconcilers.routing import FASTEST, route
from specs.manifest import Manifest
from specs.models import Model
from specs.names import parse_name
from specs.serving import Serving


def build_runtimes(
    store: Store,
    manifest: Manifest,
    offers: tuple[OfferView, ...] = (),
    *,
    slot_dir: Path | None = None,
) -> dict[str, ModelRuntime]:
    """Every model the gateway can serve now, keyed by its short name; `offers` (the
    catalog's) name the lane to install in a refusal; `slot_dir` is where their sessions
    are saved (`Paths.sessions`), or None for none."""
    serving = manifest.serving
    engines = EngineStore(store)
    declared = {parse_name(k).short: k for k in manifest.models}
    loras = store.list_loras()
    projectors = {p.model: p for p in store.list_projectors() if p.vision}
    lanes, routing = observe_lanes(store), routing_of(manifest)
    decoded = decode_by_lane(engines, lanes) if routing.policy == FASTEST else {}
    runtimes: dict[str, ModelRuntime] = {}
    by_name = {r.ref.short: r for r in store.list_models()}
    profiles = ProfileStore(store).all_current()
    for record in by_name.values():
        name = record.ref.short
        key = declared.get(name)
        spec = manifest.models[key] if key is not None else None
        if record.kind != "chat" or (spec is not None and spec.kind != "chat"):
            lane = routing.pins.get(name) or routing.defaults.get(name) or ""
            runtimes[name] = audio_runtime(record, spec, serving, engines, lane)
            continue
        pin = routing.pins.get(name)
        lane = pin or routing.defaults.get(name, manifest.engine_routing.chat_kind)
        if lane == dialects.MISTRALRS or record.is_set:  # an engine of OpenAI's API only
            engine, refusal = dialects.openai_engine(record, spec, lane, engines, lanes)
            runtime = _runtime(
                name,
                record.path,
                record.facts,
                spec,
                serving,
                engine,
                [],
                model_template(manifest, key, record.facts),
                refusal,
            )
            runtimes[name] = replace(
                runtime,
                **dialects.OPENAI_FIELDS,
                sha256=record.sha256,
                singleflight=serving.singleflight,
            )
            continue
        decided = route(
            name,
            record.architecture,
            lanes,
            offers,
            pin=pin,
            default=lane,
            mode=routing.mode,
            policy=routing.policy,
            decode=decoded.get(record.sha256),
        )
        engine = engines.get(decided.lane, decided.tag) if decided.lane and decided.tag else None
        if engine is None and decided.refusal is None:
            continue  # nothing to run it with yet: `blazar engine update` or apply
        template = model_template(manifest, key, record.facts)
        runtime = _runtime(
            name,
            record.path,
            record.facts,
            spec,
            serving,
            engine,
            loras,
            template,
            decided.refusal,
        )
        runtime = replace(runtime, engine_route=decided.why)
        held = projectors.get(name)
        if held is not None and (spec is None or spec.mmproj is not None):
            # With its projector while the manifest declares one (or does not declare the
            # model at all): a projector left from an earlier mmproj is not loaded.
            runtime = replace(runtime, projector=held.path)
        runtime = _with_sessions(runtime, record.sha256, spec, serving, slot_dir)
        runtimes[name] = with_tuning(runtime, spec, profiles.get(name), manifest, by_name, store)
    return runtimes


def decode_by_lane(
    engines: EngineStore, lanes: Sequence[ObservedLane]
) -> dict[str, dict[str, float]]:
    """For `engine_routing.policy = "fastest"`: sha256 of a model file -> lane -> the
    latest dense decode tokens/s the bench history holds for it on the lane's active engine
    (a figure of another build or decoding mode says nothing of what would serve it)."""
    active = {(lane.lane, lane.active) for lane in lanes if lane.active}
    found: dict[str, dict[str, float]] = {}
    for row in engines.bench_history():  # oldest first: the latest figure wins
        if (row.get("spec") or "off") == "off" and (row["kind"], row["tag"]) in active:
            found.setdefault(row["sha256"], {})[row["kind"]] = float(row["decode_tps"])
    return found


# The lane each kind of speech model runs on by default, and the command that installs it.
SPEECH_LANES = {"transcription": "whisper", "speech": "piper", "image": "sdcpp"}


def audio_runtime(
    record: ModelRecord, model: Model | None, serving: Serving, engines: EngineStore, lane: str
) -> ModelRuntime:
    """A transcription or speech model's runtime: its set's directory, served by the active
    engine of its lane (whisper, piper); refused (400, before any spawn) with what to run
    when no such engine is installed or the manifest declares another kind than it holds."""
    name, kind = record.ref.short, record.kind
    lane = lane or SPEECH_LANES.get(kind, "")
    engine = engines.active(lane) if lane else None
    refusal = None
    if model is not None and model.kind != kind:
        refusal = (
            f"model '{name}' is declared kind = '{model.kind}' but holds a {kind} model: fix "
            f"models.{name}.kind (or its source) in the manifest and apply"
        )
    elif engine is None and lane == "sdcpp":  # built from an sdist: minutes, said up front
        refusal = (
            f"model '{name}' is an image model and no sdcpp engine is installed: run "
            "`blazar engine install --kind sdcpp` (or declare [engines.sdcpp] kind = 'sdcpp' "
            "and apply; either builds sd-server: minutes), then retry"
        )
    elif engine is None:
        refusal = (
            f"model '{name}' is a {kind} model and no {lane} engine is installed: run "
            f"`blazar engine update --kind {lane}` (or declare [engines.{lane}] kind = "
            f"'{lane}' and apply), then retry"
        )
    built = ModelRuntime(
        name=name,
        path=record.path,
        ctx=0,
        **_declared(model, serving, engine),
        has_template=False,
        chat_template=None,
        embeddings=False,
        pooling=None,
        extra_args=audio_args(model, kind),
        sha256=record.sha256,
        preflight="off",
        facts={**record.facts, "size": record.size},
        engine_lane=lane if engine else "",
        refusal=refusal,
        kind=kind if model is None or model.kind == kind else model.kind,
        image_caps=image_caps(model),
    )
    if kind == "image":  # sd-server draws one picture at a time: more slots would queue there
        built = replace(built, slots=1)
    return built


def image_caps(model: Model | None) -> tuple[int, int, int]:
    """An image model's largest width, height and step count (the manifest's caps, else
    the fields' defaults)."""
    if model is None:
        return (1024, 1024, 50)
    width, height = model.image_max_size.split("x")
    return (int(width), int(height), model.image_max_steps)


def audio_args(model: Model | None, kind: str) -> tuple[str, ...]:
    """What an audio model's declaration adds to its engine child's command line: a
    speech model's `deterministic` and any model's `args`; served and `--local` alike."""
    if model is None:
        return ()
    return (("--deterministic",) if model.deterministic and kind == "speech" else ()) + tuple(
        model.args
    )


class _Declared(TypedDict):
    aliases: tuple[str, ...]
    slots: int
    replicas: int
    pin: bool
    keep_alive: float
    engine_tag: str
    command: tuple[str, ...]


def _declared(model: Model | None, serving: Serving, engine: EngineRecord | None) -> _Declared:
    """What every model's runtime takes from its declaration (or the serving defaults,
    for a model the manifest does not declare) and from the engine that runs it."""
    keep_alive = (
        serving.keep_alive if model is None or model.keep_alive is None else model.keep_alive
    )
    return {
        "aliases": tuple(model.aliases) if model else (),
        "slots": (model.slots if model and model.slots else None) or serving.default_slots,
        "replicas": model.replicas if model else 0,
        "pin": model.pin if model else False,
        "keep_alive": float(keep_alive),
        "engine_tag": engine.tag if engine else "",
        "command": tuple(engine.command) if engine else (),
    }


def _runtime(
    name: str,
    path: str,
    facts: dict[str, Any],
    model: Model | None,
    serving: Serving,
    engine: EngineRecord | None,
    loras: list[LoraRecord],
    template: AppliedTemplate,
    refusal: str | None = None,
) -> ModelRuntime:
    train_ctx = facts.get("context_length")
    ctx = (model.ctx if model and model.ctx else None) or serving.default_ctx
    if isinstance(train_ctx, int) and train_ctx > 0:
        ctx = min(ctx, train_ctx)
    adapters = tuple(
        Adapter(
            lo.name,
            lo.path,
            float(lo.settings.get("scale", 1.0)),
            bool(lo.settings.get("always_on", False)),
        )
        for lo in loras
        if lo.model == name
    )
    has_template = bool(facts.get("has_chat_template"))
    return ModelRuntime(
        name=name,
        path=path,
        ctx=ctx,
        **_declared(model, serving, engine),
        has_template=has_template,
        chat_template=template.text if template.declared else None,
        embeddings=model.embeddings if model else False,
        pooling=model.pooling if model else None,
        extra_args=tuple(model.args) if model else (),
        adapters=adapters,
        template_problem=template.problem,
        system=model.system if model else None,
        params=dict(model.params or {}) if model else {},
        max_tokens=output_default(model, serving, has_template=has_template),
        facts=dict(facts),
        engine_lane=engine.kind if engine else "",
        refusal=refusal,
    )


def output_default(model: Model | None, serving: Serving, *, has_template: bool) -> int | None:
    """Pure: the output limit of a request that sets none. The model's `max_tokens`; else
    none where its `params` set `num_predict` (that default applies, `steps.with_defaults`);
    else serving.default_max_tokens for a model whose GGUF carries no chat template. Such a
    model is a base model, which rarely stops: the quickstart's Gemma 3 270M wrote 2,038
    tokens over 83 s until its context was full. A template the manifest declares lets it
    chat, not stop, so it is not what decides; 0 turns the default off."""
    if model is not None and model.max_tokens is not None:
        return model.max_tokens
    if model is not None and model.params and "num_predict" in model.params:
        return None
    if has_template:
        return None
    return serving.default_max_tokens or None


def _with_sessions(
    runtime: ModelRuntime,
    sha256: str,
    model: Model | None,
    serving: Serving,
    slot_dir: Path | None,
) -> ModelRuntime:
    """The runtime with its cache settings (checked against the GGUF) and session fields."""
    cache = cache_settings.settings_for(model, serving)
    facts = runtime.facts
    train_ctx = facts.get("context_length")
    # ctx again, as `_runtime` caps it, but up to the YaRN-extended limit with ctx_extend.
    ctx = model.ctx if model and model.ctx else serving.default_ctx
    limit = cache_settings.ctx_limit(cache, train_ctx if isinstance(train_ctx, int) else None)
    ctx = min(ctx, limit) if limit else ctx
    if cache.ctx_extend is not None and "rope_freq_base" not in facts:
        facts = {**facts, **rope_facts(Path(runtime.path))}  # imported before Blazar read them
    found = cache_settings.problems(cache, facts, name=runtime.name, ctx=ctx)
    bank = model.session_bank if model and model.session_bank is not None else serving.session_bank
    return replace(
        runtime,
        ctx=ctx,
        slots=1 if cache.deterministic else runtime.slots,
        sha256=sha256,
        cache=cache,
        settings_problem="; ".join(found) or None,
        slot_dir=str(slot_dir) if slot_dir is not None else None,
        session_bank=bank,
        preflight=preflight_mode(serving.prompt_preflight),
        singleflight=serving.singleflight,
        facts=facts,
    )


def preflight_mode(setting: bool | str) -> str:
    """serving.prompt_preflight as the runtime keeps it: on, strict or off."""
    if setting == "strict":
        return "strict"
    return "on" if setting else "off"
