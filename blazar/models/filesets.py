"""Models of several files: a faster-whisper (CTranslate2) model, a piper voice, a
safetensors chat model.

A chat model is one GGUF (or its shards), or a safetensors model directory
(config.json, *.safetensors, tokenizer.json: only a mistralrs lane serves it); a
transcription or speech model is a directory of files. The store records such a
model as a *verified set*: every file's sha256, and the set's own digest, which is
what `sha256` means for it in the manifest: the sha256 of its `sha256sum` listing
(one `<sha256>  <name>` line per file, sorted by name), so one file changed changes
the digest. The
registry (`blazar.models.registry.Registry.import_set`) places the files in
`blobs/sha256-<digest>.set/`, each verified, and renames the directory into
place only when all are: a half-made set is never visible. The model sources
(`blazar.sources`) and the serve runtime use `kind_of` to tell what a set is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

SET_SUFFIX = ".set"
TRANSCRIPTION, SPEECH, CHAT, IMAGE = "transcription", "speech", "chat", "image"
# What each kind is, in words, for the errors that say a source holds something else.
DESCRIBED = {
    CHAT: "a GGUF model, or a safetensors model (config.json, *.safetensors, tokenizer.json)",
    TRANSCRIPTION: "a faster-whisper model (config.json, model.bin, tokenizer.json)",
    SPEECH: "a piper voice (NAME.onnx and NAME.onnx.json)",
    IMAGE: "a stable-diffusion.cpp model: one checkpoint, or files named for their parts "
    "(model.*, diffusion_model.*, vae.*, taesd.*, clip_l.*, clip_g.*, t5xxl.*, llm.*)",
}
# An image model's parts: the file stems the sdcpp launcher maps onto sd-server's flags
# (blazar/engines/launchers/sd_launcher.py PARTS), and the weights' suffixes it reads.
IMAGE_PARTS = ("model", "diffusion_model", "vae", "taesd", "clip_l", "clip_g", "t5xxl", "llm")
IMAGE_WEIGHTS = (".gguf", ".safetensors", ".ckpt", ".pt", ".pth", ".bin")


def set_digest(hashes: Mapping[str, str]) -> str:
    """The digest of a set: sha256 of its `sha256sum` listing, files sorted by name."""
    listing = "".join(f"{hashes[name]}  {name}\n" for name in sorted(hashes))
    return hashlib.sha256(listing.encode()).hexdigest()


SAFETENSORS = "safetensors"
# The files of a safetensors model a server reads; the rest of such a repo (README, the
# original checkpoint, ONNX exports, images) is not fetched.
_WEIGHTS = (".safetensors", ".safetensors.index.json")
_MODEL_FILES = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
}


def is_safetensors_model(names: Iterable[str]) -> bool:
    """config.json, weights in safetensors and tokenizer.json, at the top of the set."""
    top = {name for name in names if "/" not in name}
    return (
        "config.json" in top
        and "tokenizer.json" in top
        and any(n.endswith(".safetensors") for n in top)
    )


def safetensors_files(names: Iterable[str]) -> list[str]:
    """The files of a safetensors model among a repo's `names` (top level only)."""
    return sorted(n for n in names if "/" not in n and (n in _MODEL_FILES or n.endswith(_WEIGHTS)))


def safetensors_facts(directory: Path) -> dict[str, object]:
    """What a safetensors model's JSON files say: its format, model type, training context
    and chat template (config.json, tokenizer_config.json); unreadable ones say nothing."""

    def read(name: str) -> dict[str, object]:
        try:
            data = json.loads((directory / name).read_text("utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    config, tokenizer = read("config.json"), read("tokenizer_config.json")
    template = tokenizer.get("chat_template")
    if not isinstance(template, str) and (directory / "chat_template.jinja").is_file():
        template = (directory / "chat_template.jinja").read_text("utf-8", errors="replace")
    facts: dict[str, object] = {"format": SAFETENSORS}
    if isinstance(config.get("model_type"), str):
        facts["model_type"] = config["model_type"]
    if isinstance(config.get("max_position_embeddings"), int):
        facts["context_length"] = config["max_position_embeddings"]
    facts["has_chat_template"] = isinstance(template, str) and bool(template)
    if isinstance(template, str) and template:
        facts["chat_template"] = template
    return facts


def is_image_set(names: Iterable[str]) -> bool:
    """Weights files at the top of the set, either one checkpoint or files named for their
    parts with a whole model or a diffusion model among them."""
    names = list(names)
    if not names or any("/" in n or not n.endswith(IMAGE_WEIGHTS) for n in names):
        return False
    stems = {n.split(".", 1)[0] for n in names}
    if len(names) == 1:
        return True
    return stems <= set(IMAGE_PARTS) and bool(stems & {"model", "diffusion_model"})


def kind_of(names: Iterable[str]) -> str | None:
    """transcription, speech, chat (one GGUF, or a safetensors model), image (files named
    for their parts; one checkpoint is an image model only when declared one:
    `is_image_set`), or None for files that make none of them."""
    names = list(names)
    base = {name.rsplit("/", 1)[-1] for name in names}
    if len(base) == 1 and next(iter(base)).endswith(".gguf"):
        return CHAT
    if is_safetensors_model(names):
        return CHAT
    if len(names) > 1 and is_image_set(names):
        return IMAGE
    vocabulary = any(n.startswith("vocabulary.") for n in base) or "tokenizer.json" in base
    if {"model.bin", "config.json"} <= base and vocabulary:
        return TRANSCRIPTION
    if any(n.endswith(".onnx") and f"{n}.json" in base for n in base):
        return SPEECH
    return None


def voice_file(directory: Path) -> Path | None:
    """The piper voice's .onnx file in a set's directory (the one with a .onnx.json)."""
    found = sorted(p for p in directory.rglob("*.onnx") if p.with_name(p.name + ".json").is_file())
    return found[0] if found else None


def is_set(path: Path) -> bool:
    """A set's directory in the blob store (or any directory a record points at)."""
    return path.is_dir()
