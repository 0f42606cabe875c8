"""What the gateway can serve: each model's runtime settings and its engine's arguments.

Built (`blazar.serve.supervisor.build`) from the store (models held, the engine lanes,
adapters) overlaid with the manifest's declarations. Each model's engine is routed by
its GGUF architecture (`reconcilers.routing`): a model no installed engine supports is
still listed, with the teaching `refusal` its requests get (a 400) before any spawn.
The rest: the manifest's declarations (ctx, slots, replicas, pins, keep_alive,
templates). A model the store holds but the manifest does not declare is served with
the defaults of `[serving]`; a profile (`blazar tune`) fills what the manifest leaves
unset (`blazar.launch.tuning`). The effective arguments of an instance are a pure function of
its runtime, so hot reload restarts exactly the instances whose arguments changed. A
declared chat template is read at build time (`blazar.launch.served_template`) and passed to
the engine as Jinja text, so an edited template file changes them too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blazar.launch import cache_settings
from blazar.launch.cache_settings import CacheSettings
from blazar.launch.tuning import Tuning
from blazar.protocols.capabilities import TemplateCapabilities, template_capabilities
from blazar.serve.supervisor import dialects
from specs.names import AdapterChoice, Requested, parse_requested

# How much of a prompt a slot's cache must share for llama-server to give the prompt that
# slot rather than an idle one: its default, 0.1, let a 33-token request sharing only the
# chat template's first 4 tokens take the slot of a 263-token conversation (an adapter
# variant's, beside the dense one: the conversation's cache was gone, and the session bank
# had nothing of it to keep). llama.cpp's earlier default, 0.5, keeps a conversation's
# slot for prompts that continue it or share most of it. `args` overrides it.
SLOT_SIMILARITY = "0.5"


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter the model's instances load (at scale 0: off until a request asks)."""

    name: str
    path: str
    scale: float  # applied when a request turns it on without a scale of its own
    always_on: bool = False  # on for every request that does not choose its adapters


N_PREDICT_FLAGS = ("--n-predict", "-n", "--predict")


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
    # The output limit of a request that sets none (None: the engine's, no limit): a base
    # model's (no GGUF template) never stops by itself (`build.output_default`).
    max_tokens: int | None = None
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
    # why that lane (reconcilers.routing.Route.why), for `ps --json`: not a reason to reload
    engine_route: str = field(default="", compare=False)
    refusal: str | None = None  # no engine supports it: what its requests are told (400)
    kind: str = "chat"  # chat | transcription (whisper) | speech (piper) | image (sdcpp)
    # An image model's caps (image_max_size, image_max_steps): width, height, steps.
    image_caps: tuple[int, int, int] = (1024, 1024, 50)
    tuning: Tuning = field(default_factory=Tuning)  # speculative decoding, profile (tune.md)
    projector: str | None = None  # the vision projector's path (--mmproj): it reads images

    @property
    def has_vision(self) -> bool:
        """Images reach it (a projector is loaded); without one they are refused (400)."""
        return self.projector is not None

    @property
    def slot_ctx(self) -> int:
        """The context one request can use: `ctx`, or with kv_unified every slot's (one KV
        buffer of ctx x slots that any slot may fill). `blazar ps`, the prompt preflight,
        ollama's num_ctx and model listings all say this one figure (ps said 4096 where the
        preflight's 400 said 8192 per slot)."""
        return self.ctx * self.slots if self.cache.kv_unified else self.ctx

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
            "--model",
            self.path,
            *(("--mmproj", self.projector) if self.projector is not None else ()),
            "--ctx-size",
            str(self.ctx * self.slots),  # llama-server divides it among slots
            "--parallel",
            str(self.slots),
            "--alias",
            self.name,
            "--metrics",
            "--jinja",
        ]
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
        if self.max_tokens is not None and self.child_max_tokens == self.max_tokens:
            out += ["--n-predict", str(self.max_tokens)]
        if self.slots > 1 and not any(
            a.split("=")[0] in ("--slot-prompt-similarity", "-sps") for a in self.extra_args
        ):
            out += ["--slot-prompt-similarity", SLOT_SIMILARITY]
        out += self.extra_args
        return tuple(out)

    @property
    def child_max_tokens(self) -> int | None:
        """The output limit the child itself applies to a request that sets none: its
        `--n-predict` (llama-server's global limit counts only where a request gives no
        `n_predict`/`max_tokens`). Blazar starts a chat child with the model's default
        (`max_tokens`), so the relay can carry a request without a limit unchanged
        (`lanes.decide`); `args` naming their own `-n` win, and then the gateway injects."""
        if self.dialect == dialects.OPENAI or self.kind != "chat":
            return None
        own = [a for a in self.extra_args if a.split("=")[0] in N_PREDICT_FLAGS]
        return None if own else self.max_tokens

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
