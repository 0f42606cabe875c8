"""`[groups.NAME]`: models that share the host's memory on terms the user declares; part
of `specs.manifest.Manifest`, honoured by the daemon's scheduler
(`blazar.serve.supervisor.scheduler.groups`) and shown by `blazar coreside`.

Two kinds, llama-swap's vocabulary (`blazar migrate llama-swap` maps its `groups`):
`exclusive = true` (llama-swap's `swap`): one of them at a time, loading one unloads
the others; `together = true`: loaded and unloaded as one (a chat model, its embedder
and its reranker). Members must be declared models, and a model is in one exclusive
group at most (`specs.references` checks both over the whole document).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from specs.fields import ModelName
from specs.problems import FieldError
from specs.tables import Table


class Group(Table):
    """Models scheduled as a group: one at a time (exclusive) or all at once (together)."""

    models: list[ModelName] = Field(
        min_length=1,
        description="The group's models (names or aliases of declared models).",
    )
    exclusive: bool = Field(
        default=False,
        description="One at a time: loading one unloads the group's others once their "
        "requests are done (llama-swap's swap). Either this or together.",
    )
    together: bool = Field(
        default=False,
        description="Loaded and unloaded as one: loading one loads the others, evicting or "
        "stopping one unloads them all. Either this or exclusive.",
    )
    description: str | None = Field(default=None, description="What the group is for.")
    enabled: bool = Field(
        default=True, description="false removes it (a host overlay uses it: docs/fleet.md)."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Group:
        if self.exclusive == self.together:
            raise FieldError(
                "together" if self.together else "exclusive",
                "a group is either exclusive (one of its models at a time) or together "
                "(all loaded as one), not both"
                if self.together
                else "a group needs exclusive = true (one of its models at a time) or "
                "together = true (all loaded as one)",
                "set exactly one of them",
            )
        return self

    @property
    def kind(self) -> str:
        return "exclusive" if self.exclusive else "together"
