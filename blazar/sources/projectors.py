"""Vision projectors: the mmproj GGUF beside a model that lets it read images.

`models.NAME.mmproj` declares one (`specs.models.check_projector`); the projectors
reconciler's real port (`blazar.reconcile.ports.StoreProjectors`) fetches it like a model file
and calls `import_projector`, which checks that the file is a projector (a GGUF of
architecture `clip`) made for the model (its `clip.vision.projection_dim` is the
model's embedding width, when both say), places it in the blob store verified, and
records it (`blazar.store.db.ProjectorRecord`). The serve runtime passes its path to
the engine as `--mmproj`; `/api/show` then reports the `vision` capability and
`blazar fit` counts its bytes. `auto_source` says where `mmproj = "auto"` looks.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from blazar.errors import InvalidInput
from blazar.models.hashing import sha256_file
from blazar.models.registry import Registry
from blazar.store.db import ProjectorRecord
from specs.models import AUTO_PROJECTOR
from specs.names import ModelName
from specs.sources import HFSource, Source, parse_source

CLIP = "clip"  # general.architecture of every llama.cpp mmproj file


def projector_facts(path: Path) -> dict[str, Any]:
    """What the file says of itself: projector type, output width, what it encodes.

    Raises InvalidInput for a GGUF that is not a projector (NotGGUF for no GGUF)."""
    from blazar.models.gguf import read_header  # gguf's constants: loaded only when needed

    _, meta, _, _ = read_header(path)
    arch = meta.get("general.architecture")
    if arch != CLIP:
        raise InvalidInput(
            f"{path} is a {arch or 'GGUF'} model, not a vision projector (an mmproj GGUF has "
            f"general.architecture {CLIP!r}); give the repo's mmproj-*.gguf file"
        )
    kind = meta.get("clip.projector_type") or meta.get("clip.vision.projector_type")
    vision = meta.get("clip.has_vision_encoder")
    audio = meta.get("clip.has_audio_encoder")
    width = meta.get("clip.vision.projection_dim")
    return {
        "projector_type": kind if isinstance(kind, str) else None,
        "projection_dim": width if isinstance(width, int) else None,
        "vision": bool(vision) if isinstance(vision, bool) else not bool(audio),
        "audio": bool(audio),
    }


def check_fits(facts: dict[str, Any], model_width: int | None, model: str, where: str) -> None:
    """Pure: refuse a projector made for another model (its output width differs)."""
    width = facts.get("projection_dim")
    if isinstance(width, int) and isinstance(model_width, int) and width != model_width:
        raise InvalidInput(
            f"{where} projects images to {width} dimensions, but model '{model}' has "
            f"{model_width}: it is the projector of another model; use the mmproj file "
            "published with this model"
        )
    if not facts.get("vision", True):
        raise InvalidInput(
            f"{where} is an audio projector ({facts.get('projector_type')}), not a vision "
            "one; Blazar passes images only"
        )


def import_projector(
    registry: Registry,
    src: Path,
    model: ModelName,
    *,
    source: str,
    settings: dict[str, Any],
    resolved: dict[str, str] | None = None,
) -> ProjectorRecord:
    """Register `src` as the projector of `model` (held already), replacing any other."""
    store = registry.store
    base = store.get_model(model)
    facts = projector_facts(src)
    check_fits(facts, base.facts.get("embedding_length"), model.short, source)
    sha256, size = sha256_file(src)
    placed = registry.place(src, sha256, size)  # verified before it is visible
    previous = store.find_projector(model.short)
    record = ProjectorRecord(
        model=model.short,
        path=str(placed),
        size=size,
        sha256=sha256,
        source=source,
        facts={**facts, **({"resolved": dict(resolved)} if resolved else {})},
        settings=dict(settings),
    )
    store.put_projector(record)
    if previous is not None and previous.path != record.path:
        registry.release(previous.path)
    return record


def adopt_projector(registry: Registry, model: str, source: str, settings: dict[str, Any]) -> None:
    """Record a held projector's declaration again (the same bytes)."""
    record = registry.store.find_projector(model)
    if record is None:
        raise InvalidInput(f"no projector is held for model '{model}'")
    registry.store.put_projector(replace(record, source=source, settings=dict(settings)))


def remove_projector(registry: Registry, model: str) -> None:
    """Forget a model's projector and release its blob once nothing else points at it."""
    record = registry.store.find_projector(model)
    if record is None:
        return
    registry.store.delete_projector(model)
    registry.release(record.path)


def auto_source(model_source: str) -> HFSource:
    """Where `mmproj = "auto"` looks: the model's Hugging Face repo at its revision (a
    short name resolved to its repo first). InvalidInput for a model from elsewhere."""
    parsed: Source = parse_source(model_source)
    if not isinstance(parsed, HFSource):
        from blazar.sources import resolve_registry
        from specs.sources import RegistrySource

        if not isinstance(parsed, RegistrySource):
            raise InvalidInput(
                f'mmproj = "{AUTO_PROJECTOR}" needs a model from Hugging Face, and this one '
                f"comes from {model_source}: give the projector's own source"
            )
        parsed = resolve_registry(parsed.name)
    return HFSource(parsed.repo, revision=parsed.revision)
