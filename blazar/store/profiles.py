"""Each model's profile: the settings `blazar tune` measured as the best, kept in the store.

A profile is a row of the `profiles` table (migration m010_tune): the settings that
won (speculative decoding mode and knobs, the draft, slots, batch sizes, threads, cache
type and reuse), the figures behind the choice, the winner's argv and the workload.
Rows are appended, never changed: the newest row of a model is its profile, the older
ones its history, and `blazar tune MODEL --forget` appends an empty one. A profile
belongs to the model file it was measured on (its sha256): a model pulled again from
another file has none until it is tuned again.

`blazar.serve.supervisor.runtime` reads the profiles when it builds each model's runtime
(a field the manifest sets wins over the profile's); `blazar.tune` writes them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from blazar.store.db import Store, utcnow

# The settings a profile may hold, each the manifest field of the same name (batch,
# ubatch and threads are llama-server flags a model's `args` may set instead).
SETTINGS = (
    "spec",
    "draft",
    "draft_max",
    "draft_min",
    "draft_p_min",
    "ngram_size_n",
    "ngram_size_m",
    "ngram_min_hits",
    "slots",
    "batch",
    "ubatch",
    "threads",
    "cache_type",
    "cache_reuse",
)


@dataclass(frozen=True)
class Profile:
    model: str
    sha256: str
    settings: dict[str, Any]
    engine: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    workload: str = ""
    note: str = ""
    time: str = field(default_factory=utcnow)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Profile:
        return cls(
            model=row["model"],
            sha256=row["sha256"] or "",
            settings=json.loads(row["settings"] or "{}"),
            engine=row["engine"] or "",
            figures=json.loads(row["figures"] or "{}"),
            argv=json.loads(row["argv"] or "[]"),
            workload=row["workload"] or "",
            note=row["note"] or "",
            time=row["time"],
        )


class ProfileStore:
    """The `profiles` rows of the store."""

    def __init__(self, store: Store) -> None:
        self.db = store.db

    def record(self, profile: Profile) -> None:
        unknown = set(profile.settings) - set(SETTINGS)
        if unknown:
            raise ValueError(f"not a profile setting: {', '.join(sorted(unknown))}")
        row = {
            "time": profile.time,
            "model": profile.model,
            "sha256": profile.sha256,
            "engine": profile.engine,
            "settings": json.dumps(profile.settings, sort_keys=True),
            "figures": json.dumps(profile.figures, sort_keys=True),
            "argv": json.dumps(profile.argv),
            "workload": profile.workload,
            "note": profile.note,
        }
        with self.db.atomic():
            self.db["profiles"].insert(row)  # type: ignore[union-attr]

    def forget(self, model: str, sha256: str = "") -> None:
        """From now on the model has no profile (an empty one is appended: history stays)."""
        self.record(Profile(model, sha256, {}, note="forget"))

    def current(self, model: str, sha256: str | None = None) -> Profile | None:
        """The model's newest profile, if it has settings (and, with `sha256`, was measured
        on that file)."""
        rows = self.db["profiles"].rows_where("model = ?", [model], order_by="id DESC", limit=1)
        found = [Profile.from_row(r) for r in rows]
        if not found or not found[0].settings:
            return None
        if sha256 is not None and found[0].sha256 and found[0].sha256 != sha256:
            return None
        return found[0]

    def all_current(self) -> dict[str, Profile]:
        """Every model's newest profile that has settings, by model."""
        rows = self.db.execute(
            "SELECT * FROM profiles WHERE id IN (SELECT max(id) FROM profiles GROUP BY model)"
        )
        columns = [c[0] for c in rows.description]
        profiles = (Profile.from_row(dict(zip(columns, r, strict=True))) for r in rows)
        return {p.model: p for p in profiles if p.settings}

    def history(self, model: str) -> list[Profile]:
        rows = self.db["profiles"].rows_where("model = ?", [model], order_by="id")
        return [Profile.from_row(r) for r in rows]
