"""Model sources: fetch a model's bytes into verified local GGUF file(s).

The models reconciler's real port and `blazar pull` call `fetch` with a
source from the manifest (parsed by `specs.sources`): a local file, a
Hugging Face repo and quantization, an https URL with a sha256, a model in
ollama's store, or a short name from Blazar's table (`resolve_registry`).
`plan_fetch` says what a fetch would do without the network. Every error is
a `BlazarError`; `TemporaryFetchError` marks the ones worth retrying.
"""

from blazar.sources.base import Fetched, FetchError, FetchPlan, TemporaryFetchError
from blazar.sources.fetching import fetch, plan_fetch
from blazar.sources.shortnames import REGISTRY, UnknownModelName, resolve_registry

__all__ = [
    "REGISTRY",
    "FetchError",
    "FetchPlan",
    "Fetched",
    "TemporaryFetchError",
    "UnknownModelName",
    "fetch",
    "plan_fetch",
    "resolve_registry",
]
