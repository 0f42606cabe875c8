"""What the gateway can serve: each model's runtime settings and its engine's arguments.

Built from the store (models held, the engine lanes, adapters) overlaid with
the manifest's declarations. Each model's engine is routed by its GGUF
architecture (`reconcilers.routing`): a model no installed engine supports is
still listed, with the teaching `refusal` its requests get (a 400) before any
spawn. The rest: the manifest's declarations (ctx, slots, replicas, pins,
keep_alive, templates). A model the store holds but the manifest does not
declare is served with the defaults of `[serving]`; a profile (`blazar tune`) fills what
the manifest leaves unset (`blazar.tuning`). The effective arguments of an instance are
a pure function of its runtime, so hot reload restarts exactly the instances whose
arguments changed. A declared chat template is read here (`blazar.chat_templates`) and
passed to the engine as Jinja text, so an edited template file changes them too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypedDict

from blazar import cache_settings
from blazar.cache_settings import CacheSettings
from blazar.chat_templates import AppliedTemplate, model_template
from blazar.engines.lanes import observe as observe_lanes
from blazar.engines.records import EngineRecord, EngineStore
from blazar.gguf_info import rope_facts
from blazar.profiles import ProfileStore
from blazar.protocols.capabilities import TemplateCapabilities, template_capabilities
from blazar.serve.supervisor import dialects
from blazar.store import LoraRecord, ModelRecord, Store
from blazar.tuning import Tuning, with_tuning
from reconcilers.desired import routing_of
from reconcilers.ports import OfferView
from reconcilers.routing import route
from specs.manifest import Manifest
from specs.models import Model
from specs.names import AdapterChoice, Requested, parse_name, parse_requested
from specs.serving import Serving


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter the model's instances load (at scale 0: off until a request asks)."""

    name: str
    path: str
    scale: float  # applied when a request turns it on without a scale of its own
    always_on: bool = False  # on for every request that does not choose its adapters


@dataclass(frozen=True)
class ModelRuntime:
    """One servable model and how its instances are started."""

    name: str  # short form: name or name:tag
    path: str
    aliases: tuple[str, ...]
    ctx: int  # per request (per slot)
    slots: int
    replicas: int  # warm instances kept up; 0 loads on demand (one instance)
    pin: bool
    keep_alive: float  # seconds; -1 forever; 0 unload after each request
    engine_tag: str
    command: tuple[str, ...]
    has_template: bool  # the GGUF carries one
    chat_template: str | None  # the declared template's Jinja text, applied instead
    embeddings: bool
    pooling: str | None
    extra_args: tuple[str, ...]
    adapters: tuple[Adapter, ...] = ()
    template_problem: str | None = None  # why the declared template cannot be used
    system: str | None = None  # a system prompt for chat requests that send none
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)  # request defaults
    # Sessions and the prompt cache (docs/sessions.md).
    sha256: str = ""  # of the model file: a session saved from another file is refused
    cache: CacheSettings = field(default_factory=CacheSettings)
    settings_problem: str | None = None  # why `cache` cannot serve this GGUF: never spawned
    slot_dir: str | None = None  # --slot-save-path: where sessions are saved and restored
    session_bank: bool = False
    preflight: str = "on"  # on | strict | off (serving.prompt_preflight)
    dialect: str = "llama-server"  # what its engine's HTTP API speaks: llama-server | openai
    singleflight: bool = False
    facts: dict[str, object] = field(default_factory=dict, compare=False, hash=False)
    # -- engine routing (fork lanes) --
    engine_lane: str = ""  # the lane serving it: llamacpp, or a fork's id
    refusal: str | None = None  # no engine supports it: what its requests are told (400)
    kind: str = "chat"  # chat | transcription (a whisper lane) | speech (a piper lane)
    tuning: Tuning = field(default_factory=Tuning)  # speculative decoding, profile (tune.md)
    projector: str | None = None  # the vision projector's path (--mmproj): it reads images

    @property
    def has_vision(self) -> bool:
        """Images reach it (a projector is loaded); without one they are refused (400)."""
        return self.projector is not None

    @property
    def instances(self) -> int:
        return max(1, self.replicas)

    @property
    def can_chat(self) -> bool:
        if self.template_problem is not None:
            return False  # not the GGUF's template either: the manifest asked for another
        return self.has_template or self.chat_template is not None

    @property
    def template_text(self) -> str | None:
        """The Jinja text chats are rendered with: the manifest's, else the GGUF's."""
        if not self.can_chat:
            return None
        if self.chat_template is not None:
            return self.chat_template
        gguf = self.facts.get("chat_template")
        return gguf if isinstance(gguf, str) else None

    @property
    def capabilities(self) -> TemplateCapabilities:
        """What its template lets the model do (tools, thinking); `/api/show` says the same."""
        return template_capabilities(self.template_text)

    def chat_refusal(self, way_out: str = "") -> str | None:
        """Why chat requests are refused (None when they are not), and how to fix it.

        `way_out` is a protocol's alternative, such as "use /v1/completions, or ".
        """
        if self.can_chat:
            return None
        where = f"models.{self.name}.chat_template"
        if self.template_problem is not None:
            return (
                f"model '{self.name}' cannot chat: {self.template_problem}: {way_out}fix "
                f"{where} in the manifest"
            )
        return (
            f"model '{self.name}' has no chat template (its GGUF carries none) and the "
            f"manifest declares none: {way_out}set {where} in the manifest to a template "
            f"Blazar ships, Jinja text or a .jinja file (e.g. `blazar config set {where} "
            "chatml`) and apply"
        )

    def args(self) -> tuple[str, ...]:
        """llama-server flags for an instance (the supervisor adds --host/--port); a speech
        lane's launcher flags for a transcription or speech model."""
        if self.dialect == dialects.OPENAI:  # the mistralrs launcher's own flags
            return dialects.mistralrs_args(self, default_threads())
        if self.kind != "chat":
            own = "--threads" in self.extra_args
            count = () if own else ("--threads", str(default_threads()))
            return ("--model", self.path, "--parallel", str(self.slots), *count, *self.extra_args)
        out = [
            "--model", self.path,
            *(("--mmproj", self.projector) if self.projector is not None else ()),
            "--ctx-size", str(self.ctx * self.slots),  # llama-server divides it among slots
            "--parallel", str(self.slots),
            "--alias", self.name,
            "--metrics",
            "--jinja",
        ]  # fmt: skip
        if self.chat_template is not None:
            # As Jinja text: given a name, llama.cpp's --jinja renders every prompt as the
            # name itself (all but chatml), so Blazar ships the built-in templates as Jinja.
            out += ["--chat-template", self.chat_template]
        if self.embeddings:
            out.append("--embeddings")
            if self.pooling:
                out += ["--pooling", self.pooling]
        for adapter in self.adapters:  # loaded off; each request says which are on (lora_field)
            out += ["--lora-scaled", f"{adapter.path}:0"]
        train_ctx = self.facts.get("context_length")
        out += cache_settings.flags(
            self.cache, train_ctx=train_ctx if isinstance(train_ctx, int) else None
        )
        if self.slot_dir is not None:
            out += ["--slot-save-path", self.slot_dir]
        out += self.tuning.flags()
        if not any(a.split("=")[0] in ("--threads", "-t") for a in self.extra_args):
            threads = str(self.tuning.threads or default_threads())
            out += ["--threads", threads, "--threads-batch", threads]
        out += self.extra_args
        return tuple(out)

    def adapter_index(self, name: str) -> int | None:
        for index, adapter in enumerate(self.adapters):
            if adapter.name == name:
                return index
        return None

    def lora_field(self, chosen: tuple[AdapterChoice, ...] | None) -> list[dict[str, Any]] | None:
        """llama-server's per-request `lora` list for the adapters a request chose (None:
        the always-on ones), or None when the body needs none.

        The engine applies exactly the adapters listed, at their scales, to that request
        only, and every other adapter at scale 0; so the list is sent whenever an adapter
        may be on. A model without adapters, or a plain request to a model without
        always-on ones, sends none, and its body passes through untouched.
        """
        if not self.adapters:
            return None
        if chosen is None:
            on = [{"id": i, "scale": a.scale} for i, a in enumerate(self.adapters) if a.always_on]
            return on or None
        out = []
        for choice in chosen:
            index = self.adapter_index(choice.name)
            if index is None:
                raise KeyError(choice.name)  # the scheduler checked; a bug if it happens
            scale = self.adapters[index].scale if choice.scale is None else choice.scale
            out.append({"id": index, "scale": scale})
        return out

    @property
    def variants(self) -> tuple[str, ...]:
        """The names of the model with each adapter on (`model+adapter`), for listings."""
        return tuple(f"{self.name}+{a.name}" for a in self.adapters)


def default_threads() -> int:
    """Threads per instance unless `args` sets them: half the cores, at least one.

    llama.cpp's threads spin while they wait for each other; several instances
    each taking every core starve one another (observed on two cores: decode
    100x slower once two busy children used two threads each).
    """
    return max(1, (os.cpu_count() or 1) // 2)


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
            runtime = _runtime(name, record.path, record.facts, spec, serving, engine, [],
                               model_template(manifest, key, record.facts), refusal)  # fmt: skip
            runtimes[name] = replace(runtime, **dialects.OPENAI_FIELDS, sha256=record.sha256,
                                     singleflight=serving.singleflight)  # fmt: skip
            continue
        decided = route(
            name, record.architecture, lanes, offers, pin=pin, default=lane, mode=routing.mode
        )
        engine = engines.get(decided.lane, decided.tag) if decided.lane and decided.tag else None
        if engine is None and decided.refusal is None:
            continue  # nothing to run it with yet: `blazar engine update` or apply
        template = model_template(manifest, key, record.facts)
        runtime = _runtime(
            name, record.path, record.facts, spec, serving, engine, loras, template,
            decided.refusal,
        )  # fmt: skip
        held = projectors.get(name)
        if held is not None and (spec is None or spec.mmproj is not None):
            # With its projector while the manifest declares one (or does not declare the
            # model at all): a projector left from an earlier mmproj is not loaded.
            runtime = replace(runtime, projector=held.path)
        runtime = _with_sessions(runtime, record.sha256, spec, serving, slot_dir)
        runtimes[name] = with_tuning(runtime, spec, profiles.get(name), manifest, by_name, store)
    return runtimes


# The lane each kind of speech model runs on by default, and the command that installs it.
SPEECH_LANES = {"transcription": "whisper", "speech": "piper"}


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
    elif engine is None:
        refusal = (
            f"model '{name}' is a {kind} model and no {lane} engine is installed: run "
            f"`blazar engine update --kind {lane}` (or declare [engines.{lane}] kind = "
            f"'{lane}' and apply), then retry"
        )
    return ModelRuntime(
        name=name,
        path=record.path,
        ctx=0,
        **_declared(model, serving, engine),
        has_template=False,
        chat_template=None,
        embeddings=False,
        pooling=None,
        extra_args=(
            ("--deterministic",) if model and model.deterministic and kind == "speech" else ()
        )
        + (tuple(model.args) if model else ()),
        sha256=record.sha256,
        preflight="off",
        facts={**record.facts, "size": record.size},
        engine_lane=lane if engine else "",
        refusal=refusal,
        kind=kind if model is None or model.kind == kind else model.kind,
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
    return ModelRuntime(
        name=name,
        path=path,
        ctx=ctx,
        **_declared(model, serving, engine),
        has_template=bool(facts.get("has_chat_template")),
        chat_template=template.text if template.declared else None,
        embeddings=model.embeddings if model else False,
        pooling=model.pooling if model else None,
        extra_args=tuple(model.args) if model else (),
        adapters=adapters,
        template_problem=template.problem,
        system=model.system if model else None,
        params=dict(model.params or {}) if model else {},
        facts=dict(facts),
        engine_lane=engine.kind if engine else "",
        refusal=refusal,
    )


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


def name_index(runtimes: Mapping[str, ModelRuntime]) -> dict[str, ModelRuntime]:
    """Every name and alias a model is served under -> its runtime (the first wins)."""
    index: dict[str, ModelRuntime] = {}
    for runtime in runtimes.values():
        for name in (runtime.name, *runtime.aliases):
            index.setdefault(name, runtime)
    return index


def resolve(
    runtimes: Mapping[str, ModelRuntime],
    requested: str,
    index: Mapping[str, ModelRuntime] | None = None,
) -> tuple[ModelRuntime, Requested]:
    """(runtime, what was asked of it) for a requested `model`, `model:tag` or alias, with
    `+adapter` and `#replica` parts (`specs.names.parse_requested`); KeyError when no model
    has that name, InvalidName when the name is malformed. `index` (`name_index` of the
    same runtimes) makes it one dictionary lookup, not a walk over every model."""
    asked = parse_requested(requested)
    base = asked.model
    names = index if index is not None else name_index(runtimes)
    found = names.get(base) or names.get(base.removesuffix(":latest"))
    if found is None:
        raise KeyError(requested)
    return found, asked


def model_path(runtime: ModelRuntime) -> Path:
    return Path(runtime.path)
