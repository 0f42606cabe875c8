"""Protocol adapters: pure translators between client APIs and llama-server's HTTP API.

The gateway speaks three protocols (OpenAI `/v1/*`, ollama `/api/*`, Anthropic
`/v1/messages`) and forwards to `llama-server` children, which speak OpenAI and
their own native endpoints. The modules here translate requests on the way in and
responses (whole or one stream chunk at a time) on the way out. They do no I/O and
read no clock: the gateway passes times, ids and durations in, sends the
`EngineRequest` they build, and feeds the engine's JSON back through them.

- `ollama` (with `ollama_stream`, `ollama_models`): `/api/*` -> `/v1/chat/completions`,
  `/completion`, `/infill`, `/v1/embeddings`, and the model listing builders.
- `anthropic` (with `anthropic_stream`): validation, pass-through to llama-server's
  native `/v1/messages`, and a normalizer for what the engine gets wrong there.
- `openai`: the OpenAI error envelope the gateway uses for `/v1/*`; `openai_requests`
  (what the pass-through checks and changes), `openai_completions` (legacy completion
  and chat logprob answers reshaped), `openai_responses` with `openai_responses_stream`
  (the Responses API onto `/v1/chat/completions`).
- `model_lists`: `/v1/models` in OpenAI's shapes and Anthropic's.
- `rerank`: `/v1/rerank` checked, and llama-server's scores shaped as Cohere and Jina
  clients read them (best first, `top_n`, `return_documents`).
- `capabilities`: tools and thinking, decided from a model's chat template.
- `sse`: an incremental decoder of the engine's server-sent events.

Images (for a model with a vision projector) are found and put back by each
protocol's `image_refs` and `with_images`, as `ImageRef`s; the gateway checks and
fetches them in between (`blazar.serve.request.images`).

Every refusal is a `ProtocolError` carrying the HTTP status to answer with; each
protocol module turns it into that protocol's error shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EngineRequest", "ImageRef", "LoadOnly", "ProtocolError"]


class ProtocolError(Exception):
    """A request the gateway must refuse: the status to answer with and why.

    `code` is a protocol-specific refinement (an OpenAI error code such as
    `model_not_found`, an Anthropic error type); None lets the protocol's own
    status mapping decide.
    """

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code

    def __repr__(self) -> str:
        return f"ProtocolError({self.status}, {self.message!r}, code={self.code!r})"


@dataclass(frozen=True)
class EngineRequest:
    """One HTTP POST to a llama-server child: its path, JSON body and whether it streams.

    `hints` carries what the response translators need that the engine does not echo
    (for example the `dimensions` an ollama embed request asked for); the gateway
    passes it back unchanged.
    """

    path: str
    body: dict[str, Any]
    stream: bool
    hints: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "stream": self.stream, "body": self.body}
        if self.hints:
            out["hints"] = dict(self.hints)
        return out


@dataclass(frozen=True)
class ImageRef:
    """One image in a request: where it is (for errors, in the protocol's own terms) and
    its URL, a `data:` URL or an http(s) one. Each protocol's `image_refs` lists them in
    order and its `with_images` puts checked `data:` URLs back in the same order
    (`blazar.serve.request.images`)."""

    where: str
    url: str


@dataclass(frozen=True)
class LoadOnly:
    """An ollama request with nothing to generate: load the model (or unload it).

    ollama treats `/api/generate` with an empty prompt and `/api/chat` with no
    messages as "load the model and keep it for keep_alive"; with keep_alive 0 it
    unloads instead. The gateway acts on it and answers with `ollama.load_response`.
    """

    endpoint: str  # "generate" | "chat"
