"""What a chat model's engine speaks, and what a mistralrs lane's models are told.

A llama.cpp child speaks llama-server's API: OpenAI's routes, Anthropic's
`/v1/messages` and its own (`/completion`, `/slots`, `/lora-adapters`, ...). A
mistralrs child (`blazar.engines.launchers.mistralrs_launcher`) speaks only OpenAI's
(`/v1/chat/completions`, `/v1/completions`, `/v1/models`): its runtime's `dialect`
is `OPENAI`, which the request pipeline reads to translate ollama and Anthropic
requests for it, as it does for OpenAI-only remotes. What such a lane cannot do is
refused with these messages, before any spawn where the gateway can tell (an adapter
named in the model, a session, embeddings), and by the launcher for what only the
request body says (`REFUSED` there). The serve runtime (`build.build_runtimes`),
the scheduler and the sessions call these; pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from blazar.engines.ledger import EngineRecord, EngineStore
    from blazar.store.db import ModelRecord
    from reconcilers.ports import ObservedLane
    from specs.models import Model

NATIVE, OPENAI = "llama-server", "openai"  # `ModelRuntime.dialect`, as the pipeline reads it
MISTRALRS = "mistralrs"  # the lane (and kind) of every mistral.rs engine
INSTALL = "blazar engine install --kind mistralrs"


class Launched(Protocol):
    """What the launcher's flags are made of (a `ModelRuntime`)."""

    @property
    def path(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def ctx(self) -> int: ...
    @property
    def chat_template(self) -> str | None: ...
    @property
    def extra_args(self) -> tuple[str, ...]: ...


def mistralrs_args(runtime: Launched, threads: int) -> tuple[str, ...]:
    """The mistralrs launcher's flags for an instance (the supervisor adds --host/--port):
    one sequence at a time, as the package's Runner allows; the declared chat template
    as Jinja text, as llama-server gets it."""
    out = [
        "--model",
        runtime.path,
        "--ctx-size",
        str(runtime.ctx),
        "--parallel",
        "1",
        "--alias",
        runtime.name,
    ]
    if runtime.chat_template is not None:
        out += ["--chat-template", runtime.chat_template]
    if not any(a.split("=")[0] in ("--threads", "-t") for a in runtime.extra_args):
        out += ["--threads", str(threads)]
    return (*out, *runtime.extra_args)


# What a runtime on an OpenAI-only engine differs in: one sequence at a time (the package's
# Runner refuses concurrent calls), no prompt preflight (it has no /tokenize).
OPENAI_FIELDS: dict[str, Any] = {"slots": 1, "preflight": "off", "dialect": OPENAI}


def openai_engine(
    record: ModelRecord,
    spec: Model | None,
    lane: str,
    engines: EngineStore,
    lanes: Sequence[ObservedLane],
) -> tuple[EngineRecord | None, str | None]:
    """(the engine, why it cannot serve) for a chat model on the mistralrs lane, or a
    safetensors model routed to `lane` (another: refused)."""
    engine = engines.active(lane) if lane == MISTRALRS else None
    loads = next((o.support for o in lanes if o.lane == lane and o.active), {})
    embeddings = bool(spec and spec.embeddings)
    why = refusal(record.ref.short, lane, bool(engine), embeddings, loads, record.architecture)
    return engine, why


def refusal(
    name: str,
    lane: str,
    installed: bool,
    embeddings: bool,
    loads: Mapping[str, bool] | None = None,
    architecture: str | None = None,
) -> str | None:
    """Why a model on the mistralrs lane (or a safetensors model on `lane`) cannot be
    served, before any spawn; None when it can. `loads`: what the lane's load probe found
    it loads, by GGUF architecture; `architecture`: the model's."""
    if lane != MISTRALRS:
        return safetensors_refusal(name, lane)
    if not installed:
        return no_engine_refusal(name)
    if architecture is not None and (loads or {}).get(architecture) is False:
        return (
            f"model '{name}' has architecture '{architecture}', which the mistralrs lane does "
            f"not load (its load probe said so): remove models.{name}.engine to serve it from "
            "a llamacpp lane"
        )
    return embeddings_refusal(name) if embeddings else None


def safetensors_refusal(name: str, lane: str) -> str:
    """A safetensors model routed to a llama.cpp lane, which loads GGUF only."""
    return (
        f"model '{name}' is a safetensors model, and the {lane} lane serves GGUF models "
        f"only: serve with a mistralrs lane: `{INSTALL}`, then set models.{name}.engine = "
        f"'{MISTRALRS}' (or `blazar engine use --kind mistralrs` for every chat model) and "
        "apply"
    )


def no_engine_refusal(name: str) -> str:
    return (
        f"model '{name}' runs on the mistralrs lane and no mistralrs engine is installed: "
        f"run `{INSTALL}` (or declare [engines.mistralrs] kind = 'mistralrs' and apply), "
        "then retry"
    )


def embeddings_refusal(name: str) -> str:
    return (
        f"model '{name}' is declared embeddings = true, and mistralrs lanes serve chat and "
        f"completions only: remove models.{name}.engine (a llamacpp lane serves embeddings) "
        "or embeddings"
    )


def adapters_refusal(name: str) -> str:
    return (
        f"model '{name}' is served by a mistralrs lane, which applies no LoRA adapters per "
        "request (Blazar's adapters are llama.cpp GGUF adapters): ask for the model without "
        f"'+adapter', or serve it from a llamacpp lane (remove models.{name}.engine)"
    )


def sessions_refusal(name: str) -> str:
    return (
        f"model '{name}' is served by a mistralrs lane, which keeps no KV slots to save or "
        f"restore: sessions need a llamacpp lane (remove models.{name}.engine)"
    )
