"""Blazar's short model names: `qwen3-0.6b` means a GGUF repo on Hugging Face.

`resolve_registry` turns a `RegistrySource` name from a manifest or
`blazar pull` into the `HFSource` it stands for; `blazar.sources.fetch` and
`plan_fetch` call it. A tag after the name picks another quantization of the
same repo: `qwen3-4b:q8_0` is `hf://Qwen/Qwen3-4B-GGUF:Q8_0`. The table is
small on purpose: each entry is a repo of single-file GGUFs that the
`:QUANT` selection resolves to exactly one file.
"""

from __future__ import annotations

import difflib

from blazar.sources.base import FetchError
from specs.sources import HFSource, InvalidSource, parse_source

REGISTRY: dict[str, str] = {
    "gemma3-270m": "hf://unsloth/gemma-3-270m-it-GGUF:Q4_K_M",
    "gemma3-1b": "hf://unsloth/gemma-3-1b-it-GGUF:Q4_K_M",
    "llama3.2-1b": "hf://bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
    "llama3.2-3b": "hf://bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M",
    "qwen2.5-0.5b": "hf://Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M",
    "qwen3-0.6b": "hf://Qwen/Qwen3-0.6B-GGUF:Q8_0",
    "qwen3-1.7b": "hf://Qwen/Qwen3-1.7B-GGUF:Q8_0",
    "qwen3-4b": "hf://Qwen/Qwen3-4B-GGUF:Q4_K_M",
    "smollm2-135m": "hf://bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M",
}


class UnknownModelName(FetchError):
    """A short model name that is not in Blazar's table."""


def resolve_registry(name: str) -> HFSource:
    """Return the hf:// source a short name stands for; raise UnknownModelName if none."""
    base, _, tag = name.strip().lower().partition(":")
    target = REGISTRY.get(base)
    if target is None:
        close = difflib.get_close_matches(base, REGISTRY, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UnknownModelName(
            f"unknown model name {name!r}: {hint}known names are {', '.join(sorted(REGISTRY))}; "
            "or give a source such as hf://owner/repo:QUANT"
        )
    source = parse_source(target)
    assert isinstance(source, HFSource)
    if not tag:
        return source
    try:
        override = parse_source(f"hf://{source.repo}:{tag.upper()}")
    except InvalidSource as exc:
        raise UnknownModelName(f"bad quantization {tag!r} in {name!r}: {exc}") from exc
    assert isinstance(override, HFSource)
    return override
