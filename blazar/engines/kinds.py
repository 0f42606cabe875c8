"""The kinds of engine Blazar installs, and what it says about the kinds it does not.

A kind is a server with a contract Blazar knows how to start, supervise and talk
to (docs/engines.md). `blazar engine update|install --kind KIND` and the manifest's
`[engines.NAME] kind` take one of `KINDS`; for a name that is none of them,
`unknown_kind` says which kinds exist, why a kind people ask for is not offered
(`NOT_OFFERED`: each reason is a fact about that server, checked when it was
written), and how to ask for it. Pure; `blazar.engines.service` and the CLI call it.
"""

from __future__ import annotations

# Each kind Blazar installs, in words: what it serves and how it is installed.
KINDS = {
    "llamacpp": "llama.cpp: chat, completions and embeddings from GGUF; fork lanes too",
    "mistralrs": "mistral.rs: chat and completions from GGUF or safetensors, OpenAI's API only",
    "whisper": "faster-whisper: speech to text",
    "piper": "piper-tts: text to speech",
    "sdcpp": "stable-diffusion.cpp's sd-server: images from text (and edits), built from source",
}

# The kinds whose servers speak only OpenAI's API (llama.cpp's speak ollama's shapes through
# the gateway, Anthropic's `/v1/messages` and their own too): the gateway translates for them.
OPENAI_ONLY = frozenset({"mistralrs"})
# The kinds installed from one PyPI package (blazar.engines.audio), and the model kind each
# serves.
PACKAGE_KINDS = {"whisper": "transcription", "piper": "speech", "mistralrs": "chat"}

# The kinds built from a source tree with cmake, and the model kind each serves
# (blazar.engines.sdcpp).
SOURCE_KINDS = {"sdcpp": "image"}

# Kinds people ask for that Blazar has no lane for, and why.
NOT_OFFERED = {
    "sglang": "SGLang serves from GPUs through PyTorch; its CPU backend is built from "
    "source for Intel Xeon only, so a lane could not be installed and tested the way the "
    "others are",
    "vllm": "vLLM serves from GPUs through PyTorch; its CPU backend must be built from "
    "source per CPU family, so a lane could not be installed the way the others are",
    "mlx": "MLX (mlx-lm) runs only on Apple silicon under macOS; Blazar's lanes are "
    "installed and tested on Linux",
    "exllamav2": "ExLlamaV2 runs only on CUDA GPUs and loads EXL2/GPTQ models, not GGUF",
    "tgi": "Text Generation Inference ships as a CUDA container, not a package a lane can install",
    "ollama": "ollama is a model server with a store of its own, not an engine: "
    "`blazar import --scan` adopts its models",
}
ALIASES = {
    "sd.cpp": "sdcpp",
    "stable-diffusion.cpp": "sdcpp",
    "mistral.rs": "mistralrs",
    "llama.cpp": "llamacpp",
    "mlx-lm": "mlx",
    "faster-whisper": "whisper",
    "piper-tts": "piper",
    "text-generation-inference": "tgi",
}
HOW_TO_ASK = (
    "To ask for a kind, open an issue on Blazar's tracker saying which models you would "
    "serve with it and on what hardware; meanwhile a server of that kind that speaks "
    "OpenAI's API can serve through Blazar as a remote (`[remotes.NAME] url = ...`, "
    "docs/fleet.md)"
)


def canonical_kind(name: str) -> str:
    """`mistral.rs` -> `mistralrs`; any other name as given, lowercased."""
    lowered = name.strip().lower()
    return ALIASES.get(lowered, lowered)


def unknown_kind(name: str, lanes: tuple[str, ...] = ()) -> str:
    """Why `name` is no engine Blazar installs, which kinds exist, and what to do.

    `lanes` are the fork lanes installed (they take `--lane ID` too)."""
    kind = canonical_kind(name)
    offered = "; ".join(f"{k} ({what})" for k, what in KINDS.items())
    forks = f"; installed fork lanes: {', '.join(lanes)}" if lanes else ""
    if kind in NOT_OFFERED:
        head = f"Blazar has no {kind} engine lane: {NOT_OFFERED[kind]}"
    else:
        head = (
            f"{name!r} is no engine kind Blazar knows (a llama.cpp fork is a fork lane: "
            "`blazar engine offers` lists the catalog's)"
        )
    return f"{head}. The kinds Blazar installs: {offered}{forks}. {HOW_TO_ASK}"
