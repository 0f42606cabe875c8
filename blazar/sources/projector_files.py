"""Which file of a Hugging Face repo is a model's vision projector (its mmproj GGUF).

`blazar.sources.hf.fetch_hf` asks `select_projector` when it fetches with kind
`projector` (`models.NAME.mmproj`: `hf://owner/repo`, `hf://owner/repo/file.gguf`,
or `auto`, the model's own repo). Pure: names in, names out.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from blazar.sources.base import FetchError, quant_of
from specs.sources import HFSource

PROJECTOR = "projector"  # fetch's kind for a model's mmproj file
PREFERENCE = ("F16", "BF16", "F32", "Q8_0")  # when a repo holds several


def is_projector(name: str) -> bool:
    """A repo file named the way llama.cpp's converters name projectors (mmproj-*.gguf)."""
    base = PurePosixPath(name).name.lower()
    return base.endswith(".gguf") and "mmproj" in base


def select_projector(source: HFSource, names: list[str]) -> list[str]:
    """The projector file a source means: the one it names, else the repo's only mmproj
    file, else its F16 one (then BF16, F32, Q8_0)."""
    ggufs = sorted(n for n in names if n.lower().endswith(".gguf"))
    listing = f"its .gguf files are: {', '.join(ggufs[:40])}" if ggufs else "it holds no .gguf"
    if source.filename is not None:
        if source.filename not in names:
            raise FetchError(f"{source.repo} has no file {source.filename!r}; {listing}")
        return [source.filename]
    found = [n for n in ggufs if is_projector(n)]
    if not found:
        raise FetchError(
            f"{source.repo} holds no vision projector (no mmproj*.gguf file); {listing}. "
            "Find the model's mmproj file and give its source as mmproj"
        )
    if len(found) == 1:
        return found
    for quant in PREFERENCE:
        preferred = [n for n in found if quant_of(n) == quant]
        if len(preferred) == 1:
            return preferred
    raise FetchError(
        f"{source.repo} holds several projectors ({', '.join(found)}): name one, as "
        f"hf://{source.repo}/<file>.gguf"
    )
