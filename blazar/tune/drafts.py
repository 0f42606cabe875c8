"""`blazar drafts MODEL`: the models that could draft for MODEL, and why the others cannot.

Every chat model the store holds or the manifest declares is a candidate (the model
itself included: it always matches, and is slower than no draft, but proves the
plumbing). A held candidate's vocabulary is compared with the model's
(`blazar.models.vocab.draft_problem`, the check serve and diff make); one only declared is
listed as not pulled. The size ratio is its parameters over the model's: a useful draft
is many times smaller (llama-swap's example: a 0.5B draft for a 32B model).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from blazar.errors import NotFound
from blazar.models.vocab import draft_problem
from blazar.store.db import Store
from specs.manifest import Manifest
from specs.names import parse_name


@dataclass(frozen=True)
class DraftOption:
    name: str
    declared: bool
    held: bool
    fits: bool | None  # vocabularies match; None when it is not held yet
    reason: str | None  # why it cannot draft (or "not pulled")
    parameters: int | None
    ratio: float | None  # its parameters over the model's

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


def draft_options(store: Store, manifest: Manifest, name: str) -> tuple[str, list[DraftOption]]:
    """(the model's short name, every candidate draft: those that fit first, smallest first)."""
    held = {r.ref.short: r for r in store.list_models() if r.kind == "chat"}
    key = manifest.resolve_model(name)
    target = parse_name(key).short if key else parse_name(name).short
    record = held.get(target)
    if record is None:
        raise NotFound(f"model '{name}' is not held: `blazar pull` it first, then list its drafts")
    declared = {
        parse_name(k).short
        for k, m in manifest.models.items()
        if m.kind == "chat" and not m.embeddings
    }
    options = []
    for other in sorted(set(held) | declared):
        found = held.get(other)
        if found is None:
            options.append(DraftOption(other, True, False, None, "not pulled", None, None))
            continue
        if found.settings.get("embeddings"):
            continue
        problem = draft_problem(Path(record.path), Path(found.path))
        ratio = (
            found.parameters / record.parameters if found.parameters and record.parameters else None
        )
        options.append(
            DraftOption(
                other, other in declared, True, problem is None, problem, found.parameters, ratio
            )
        )
    options.sort(key=lambda o: (not o.fits, o.ratio if o.ratio is not None else 1e9, o.name))
    return target, options
