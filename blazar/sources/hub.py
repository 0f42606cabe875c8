"""What the Hugging Face hub offers, read before anything is downloaded: `search` and `fit`.

`blazar search QUERY` lists GGUF repos (`HfApi.list_models(search=, filter="gguf")`)
and, for each, its quantizations with their sizes (`repo_quants`: one
`model_info(files_metadata=True)` per repo). `blazar fit owner/repo[:QUANT]`
reads one file's GGUF header with HTTP range requests (`remote_facts`: the
first MiB, doubled while the header goes on, never the whole file) for the
layers, heads and context that every quantization of the repo shares.
Both go through `huggingface_hub`, honouring `HF_ENDPOINT` and `HF_TOKEN` the
way `blazar.sources.hf` does (passed explicitly to every call).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import PurePosixPath
from typing import Any

from huggingface_hub import HfApi, get_session, hf_hub_url, hf_raise_for_status
from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # public API

from blazar.models.filesets import is_safetensors_model
from blazar.models.gguf import GGUFFacts, HeaderIncomplete, inspect_prefix
from blazar.sources.base import SHARD, FetchError, quant_of
from blazar.sources.hf import TIMEOUT, _hub, hub_endpoint, hub_token
from specs.sources import HFSource

FIRST_READ = 1 << 20  # the first MiB holds most headers (Gemma 3's 262k-token one: ~4 MiB)
MAX_HEADER = 64 << 20


@dataclass(frozen=True)
class Quant:
    """One quantization a repo offers: its file(s), first shard first, and their bytes."""

    name: str  # Q4_K_M, or the file's name when it names no quantization
    files: tuple[str, ...]
    size: int | None  # None when the hub did not say
    named: bool = True  # `name` is a quantization that `owner/repo:QUANT` selects alone

    def source(self, repo: str) -> str:
        """What `blazar pull` takes for it: owner/repo:QUANT, else the file's hf:// source."""
        return f"{repo}:{self.name}" if self.named else f"hf://{repo}/{self.files[0]}"

    def to_json(self) -> dict[str, Any]:
        return {"quant": self.name, "files": list(self.files), "size": self.size}


@dataclass(frozen=True)
class HubRepo:
    repo: str
    revision: str
    quants: tuple[Quant, ...]
    downloads: int | None = None
    likes: int | None = None
    tags: tuple[str, ...] = field(default=())
    # A safetensors model (config.json, weights, tokenizer.json): its weights' bytes, or None
    # when the repo holds none (a mistralrs lane serves one; llama.cpp needs a GGUF).
    safetensors: int | None = None


def group_quants(sizes: Mapping[str, int | None]) -> list[Quant]:
    """A repo's GGUF files (name -> size) as quantizations, sharded ones as one, vision
    projectors left out; ordered by size, smallest first."""
    groups: dict[str, list[str]] = {}
    for name in sorted(sizes):
        if not name.lower().endswith(".gguf") or PurePosixPath(name).name.lower().startswith(
            "mmproj"
        ):
            continue
        shard = SHARD.match(name)
        if shard is not None and int(shard["index"]) != 1:
            key = f"{shard['prefix']}-00001-of-{shard['total']}.gguf"
        else:
            key = name
        groups.setdefault(key, []).append(name)
    named = {key: quant_of(key) for key in groups}
    counts: dict[str | None, int] = {}
    for quant in named.values():
        counts[quant] = counts.get(quant, 0) + 1
    quants: list[Quant] = []
    for first, files in groups.items():
        quant = named[first]
        unique = quant is not None and counts[quant] == 1  # `:QUANT` selects it alone
        shard = SHARD.match(PurePosixPath(first).name)
        stem = shard["prefix"] if shard else PurePosixPath(first).name.removesuffix(".gguf")
        known = [sizes[f] for f in files]
        total = sum(s for s in known if s is not None) if None not in known else None
        label = quant if unique and quant is not None else stem
        quants.append(Quant(label, tuple(sorted(files)), total, unique))
    return sorted(quants, key=lambda q: (q.size is None, q.size or 0, q.name))


def _api(env: Mapping[str, str]) -> tuple[HfApi, str]:
    endpoint = hub_endpoint(env)
    return HfApi(endpoint=endpoint, token=hub_token(env), library_name="blazar"), endpoint


def repo_quants(repo: str, env: Mapping[str, str], revision: str | None = None) -> HubRepo:
    """A repo's quantizations and their sizes, from one `model_info` call."""
    api, endpoint = _api(env)
    source = HFSource(repo, revision=revision)
    info = _hub(
        lambda: api.model_info(repo, revision=revision, files_metadata=True, timeout=TIMEOUT),
        source,
        endpoint,
    )
    sizes = {s.rfilename: s.size for s in info.siblings or []}
    weights = None
    if is_safetensors_model(sizes):
        weights = sum(
            v or 0 for k, v in sizes.items() if "/" not in k and k.endswith(".safetensors")
        )
    return HubRepo(
        info.id or repo,
        info.sha or revision or "main",
        tuple(group_quants(sizes)),
        downloads=info.downloads,
        likes=info.likes,
        tags=tuple(info.tags or ()),
        safetensors=weights,
    )


def search(query: str, env: Mapping[str, str], *, limit: int) -> list[HubRepo]:
    """GGUF repos matching `query`, most downloaded first, each with its quantizations."""
    api, endpoint = _api(env)
    source = HFSource(query or "search/gguf")
    found = _hub(
        lambda: list(api.list_models(search=query, filter="gguf", sort="downloads", limit=limit)),
        source,
        endpoint,
    )
    return [repo_quants(model.id, env) for model in found]


def choose(repo: HubRepo, quant: str | None) -> Quant:
    """The quantization asked for (by name, whatever its case), else the smallest one."""
    if not repo.quants:
        raise FetchError(f"{repo.repo} holds no GGUF model file")
    if quant is None:
        return repo.quants[0]
    for q in repo.quants:
        if q.name.upper() == quant.upper():
            return q
    names = ", ".join(q.name for q in repo.quants)
    raise FetchError(f"{repo.repo} has no {quant} GGUF file; its quantizations: {names}")


def remote_facts(repo: HubRepo, quant: Quant, env: Mapping[str, str]) -> tuple[GGUFFacts, int]:
    """The GGUF facts of `quant`'s first file and how many bytes were read for them: the
    header through ranged GETs (a MiB, then doubling), never the whole file."""
    endpoint, token = hub_endpoint(env), hub_token(env)
    name = quant.files[0]
    url = hf_hub_url(repo.repo, name, revision=repo.revision, endpoint=endpoint)
    headers = build_hf_headers(token=token, library_name="blazar")
    source = HFSource(repo.repo, filename=name, revision=repo.revision)
    where = f"{name} in {repo.repo}"
    want = FIRST_READ
    while True:
        data, size = _hub(partial(_first_bytes, url, headers, want), source, endpoint, name)
        total = size
        try:
            return inspect_prefix(data, total, where), len(data)
        except HeaderIncomplete:
            if len(data) >= size or want >= MAX_HEADER:
                raise FetchError(
                    f"{where}: its GGUF header is longer than {len(data)} bytes; "
                    "pull it to see its facts"
                ) from None
            want *= 2


def _first_bytes(url: str, headers: dict[str, str], n: int) -> tuple[bytes, int]:
    """The first `n` bytes of a file on the hub and the file's whole size (Content-Range).

    Streamed and closed after `n` bytes, so a server that ignores the range costs no more."""
    request = {**headers, "Range": f"bytes=0-{n - 1}"}
    with get_session().stream(
        "GET", url, headers=request, follow_redirects=True, timeout=TIMEOUT
    ) as response:
        hf_raise_for_status(response)
        data = b""
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) >= n:
                break
    total = response.headers.get("Content-Range", "").rpartition("/")[2]
    if response.status_code != 206 or not total.isdigit():
        raise FetchError(f"{url} does not answer range requests (HTTP {response.status_code})")
    return data[:n], int(total)
