"""`blazar engine use --kind KIND`: the kind of engine chat models that name none run on.

Chat models run on llama.cpp lanes unless the manifest says otherwise: a model's own
`engine`, or `engine_routing.chat_kind` for every chat model that names none. This
edits that one key in the user's manifest (tomlkit: comments and order kept, the
whole manifest validated before it is written), so the manifest stays the one source
of truth and a running `blazar serve` re-routes the models on its next pass. The
speech kinds are the only ones serving their models, so for them there is nothing
to switch. The CLI calls `use_kind`.
"""

from __future__ import annotations

from pathlib import Path

from blazar.engines.kinds import KINDS, PACKAGE_KINDS, canonical_kind, unknown_kind
from blazar.errors import InvalidInput, NotFound
from blazar.manifest.edit import ManifestError, ManifestFile

KEY = "engine_routing.chat_kind"
CHAT_KINDS = ("llamacpp", "mistralrs")


def use_kind(manifest: Path, kind: str, *, installed: bool) -> str:
    """Make `kind` the default engine kind of the models it serves; what changed, in
    words. `installed`: whether an engine of that kind is installed (a default nothing
    can serve is refused)."""
    kind = canonical_kind(kind)
    if kind not in KINDS:
        raise InvalidInput(unknown_kind(kind))
    if kind not in CHAT_KINDS:
        serves = PACKAGE_KINDS[kind]
        return f"{kind} is the only kind that serves {serves} models: it is their default already"
    if not installed:
        how = "update" if kind == "llamacpp" else "install --kind mistralrs"
        raise InvalidInput(
            f"no {kind} engine is installed, so chat models could not run on it: "
            f"`blazar engine {how}` installs one, then run this again"
        )
    edit = ManifestFile(manifest)
    try:
        before = edit.get(KEY)
    except NotFound:  # not set: llama.cpp
        before = "llamacpp"
    if before == kind:
        return f"chat models that name no engine run on {kind} already"
    if kind == "llamacpp":
        edit.unset(KEY)  # the default: no key at all
    else:
        edit.set(KEY, kind)
    try:
        edit.save()
    except ManifestError as exc:
        raise InvalidInput(f"not written: the manifest would be invalid:\n{exc}") from None
    return (
        f"chat models that name no engine now run on {kind} (was {before}); a model's own "
        f"`engine` still wins ({KEY} in {manifest})"
    )
